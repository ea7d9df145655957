"""Replay hands the backend what the original run handed it: a non-leaf input stays non-leaf.

PyTorch's ``non_leaf_compile_error_TESTING_ONLY`` backend fails only when an input is a
non-leaf tensor, so an archive captured from it reproduces only if the replayed input still
has autograd history when the compiler sees it (a replay that rebuilt every input as a leaf
reported "passed"). The bytes on disk carry ``is_leaf``; nothing else is needed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import reproarchive
from reproarchive.format.schema import Records
from reproarchive.replay.outcome import REPRODUCED
from reproarchive.replay.settings import ReplaySettings

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

BACKEND = "non_leaf_compile_error_TESTING_ONLY"


def fn(x, y):
    return torch.relu(x) * y


def capture_non_leaf(tmp_path, mutate=False):
    x = torch.randn(3, requires_grad=True) * 2  # non-leaf: the result of an autograd op
    y = torch.randn(3)
    compiled = torch.compile(mutating if mutate else fn,
                             backend=reproarchive.capture(BACKEND, path=tmp_path / "a.tar.zst"))
    with pytest.raises(Exception, match="TestingOnlyCompileError"):
        compiled(x, y)
    return tmp_path / "a.tar.zst"


def mutating(x, y):
    x.mul_(2)  # legal on a non-leaf; a view of a leaf that requires grad would refuse it
    return torch.relu(x) * y


def test_loaded_non_leaf_input_has_autograd_history(tmp_path):
    repro = reproarchive.load(capture_non_leaf(tmp_path))
    x, y = repro.args
    assert x.requires_grad and not x.is_leaf and x.grad_fn is not None
    assert y.is_leaf and not y.requires_grad
    assert repro.index.inputs[0].is_leaf is False


def test_non_leaf_compile_error_reproduces(tmp_path):
    path = capture_non_leaf(tmp_path)
    outcome = reproarchive.run(path)
    assert outcome.status == REPRODUCED, outcome.to_dict()
    assert outcome.exit_code == 1


def test_the_backend_sees_non_leaf_inputs_and_in_place_ops_on_them_run(tmp_path, monkeypatch):
    """A backend that only records: the non-leaf arrives non-leaf, the leaf as a leaf; and an
    in-place op on the non-leaf input runs forward and backward, as it did originally."""
    from reproarchive.replay import runner

    repro = reproarchive.load(capture_non_leaf(tmp_path, mutate=True))
    outcome = runner.replay_graph(repro.gm, repro.args, ReplaySettings(backend="eager"),
                                  Records(failure=repro.records.failure))
    assert outcome.observed is None and outcome.ran_backward, outcome.to_dict()

    seen = []

    def recording(gm, example_inputs):
        seen.append([(t.is_leaf, t.requires_grad, t.grad_fn is not None) for t in example_inputs])
        return gm

    monkeypatch.setattr(runner, "resolve_backend", lambda name: recording)
    runner.replay_graph(repro.gm, repro.args, ReplaySettings(backend="recording"),
                        Records(failure=repro.records.failure))
    assert seen == [[(False, True, True), (True, False, False)]]


def test_accuracy_replay_compares_gradients_of_non_leaf_inputs(tmp_path):
    """Accuracy runs take gradients through the non-leaf inputs too (kept with retain_grad)."""
    from reproarchive.replay import runner

    repro = reproarchive.load(capture_non_leaf(tmp_path))
    outcome = runner.replay_graph(repro.gm, repro.args, ReplaySettings(backend="aot_eager", accuracy=True))
    names = [o.name for o in outcome.accuracy.outputs]
    assert outcome.observed is None and any(str(n).startswith("grad") for n in names), outcome.to_dict()


def test_non_leaf_compile_error_captured_from_a_program_reproduces(tmp_path):
    """The other two ways: ``capture --`` of a program whose compiled function gets a non-leaf
    input, and ``pack`` of the PyTorch dump it kept. (PyTorch's after_aot hook never sees this
    Dynamo-level backend, so the dump is after_dynamo.)"""
    import subprocess
    import sys
    import textwrap

    (tmp_path / "prog.py").write_text(textwrap.dedent(f"""
        import torch
        def fn(x, y):
            return torch.relu(x) * y
        x = torch.randn(3, requires_grad=True) * 2
        torch.compile(fn, backend={BACKEND!r})(x, torch.randn(3))
    """))
    out = tmp_path / "archives"
    out.mkdir()
    cli = [sys.executable, "-c", "from reproarchive.cli import main; main()"]
    done = subprocess.run([*cli, "capture", "--keep-dumps", "-o", str(out), "--", sys.executable, "prog.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    archives = sorted(out.glob("*.tar.zst"))
    assert done.returncode == 1 and len(archives) == 1, done.stderr[-3000:]
    assert reproarchive.run(archives[0]).status == REPRODUCED

    kept = next(line.split(" in ", 1)[1].strip() for line in done.stderr.splitlines() if "dumps kept in" in line)
    (launcher,) = sorted(Path(kept).glob("torch_compile_debug/run_*/minifier/minifier_launcher.py"))
    try:
        packed = reproarchive.pack_dump(launcher, tmp_path / "packed.tar.zst")
    finally:
        shutil.rmtree(kept, ignore_errors=True)
    assert packed.failure["exception_type"].endswith("TestingOnlyCompileError")
    assert reproarchive.run(packed.archive).status == REPRODUCED
