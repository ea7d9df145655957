"""Capture never changes the program: what the program computes under ``capture(...)`` is what
it computes without it, the accuracy check included (issue: a dropout step's loss was 0.1462
under ``capture(accuracy=True)`` against 0.1005 without, because the check forced inductor's
``fallback_random`` on the program's own compile)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import reproarchive


class Step(torch.nn.Module):
    """A training step's forward: a layer, dropout, a loss (random numbers in training mode)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(16, 16)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(torch.relu(self.layer(x))).pow(2).mean()


def _loss_and_grad(backend) -> tuple[float, torch.Tensor]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Step()
    x = torch.randn(32, 16)
    compiled = torch.compile(model, backend=backend)
    loss = compiled(x)
    loss.backward()
    return loss.item(), model.layer.weight.grad.clone()


@pytest.mark.slow
def test_an_accuracy_capture_leaves_a_dropout_step_s_numbers_as_they_are(tmp_path):
    plain_loss, plain_grad = _loss_and_grad("inductor")
    captured_loss, captured_grad = _loss_and_grad(reproarchive.capture("inductor", path=tmp_path, accuracy=True))
    assert captured_loss == plain_loss  # the same draws, by inductor's own RNG code, as without capture
    assert torch.equal(captured_grad, plain_grad)
    # and the check (on its own fallback_random copy) called the correct graph correct
    assert not list(tmp_path.glob("*.tar.zst"))
    torch._dynamo.reset()


def _dropout_then_cond(x):
    x = torch.nn.functional.dropout(x, 0.3, training=True)
    return torch.cond(x.sum() > -1e9, lambda t: torch.relu(t - 0.2) * 2, lambda t: t - 1, (x,)) + 1


@pytest.mark.slow
def test_the_accuracy_check_compiles_its_copy_as_the_program_s_compile_was_made(tmp_path, monkeypatch):
    """A graph that draws random numbers is checked on a copy compiled for the check. Compiled
    on the real inputs, the copy was a static compile, and this graph's static compile fails in
    Inductor ("A subgraph argument other than striding has been modified") where the program's
    symbolic one does not: the capture raised and archived that failure, not the program's.
    Compiled in a fake mode of the compile's own shape policy, the check finds the program's
    accuracy bug, and the archive reproduces it."""
    monkeypatch.setattr(torch._inductor.config.cpp, "inject_relu_bug_TESTING_ONLY", "accuracy")
    x = torch.randn(4, 8)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.reset()
    compiled = torch.compile(_dropout_then_cond, backend=reproarchive.capture("inductor", path=tmp_path, accuracy=True))
    with pytest.raises(Exception, match="compiled result differs from eager"):
        compiled(x)
    monkeypatch.undo()
    torch._dynamo.reset()
    (archive,) = tmp_path.glob("*.tar.zst")
    outcome = reproarchive.run(archive, isolate=False)
    assert (outcome.status, outcome.recorded.stage) == ("reproduced", "accuracy"), outcome.to_dict()
    assert outcome.shapes["symbolic"] and outcome.shapes["guards_match"], outcome.shapes


def _captured(tmp_path: Path, program: str) -> tuple[subprocess.CompletedProcess, Path]:
    """``reproarchive capture --`` of ``program`` (its text) run as a user runs it: how it ended,
    and the one archive it left."""
    (tmp_path / "prog.py").write_text(program)
    cli = str(Path(sys.executable).parent / "reproarchive")
    done = subprocess.run([cli, "capture", "-o", str(tmp_path / "out"), "--json", "--", sys.executable, "prog.py"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "2"},
                          cwd=tmp_path)
    (written,) = json.loads(done.stdout)["archives"]
    return done, tmp_path / "out" / Path(written["archive"]).name


NO_GRAD_IN_PLACE = """
import torch
torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "compile_error"
model = torch.nn.Linear(8, 8)

@torch.compile
def f(x):
    y = torch.sigmoid(model(x))
    y.mul_(2)  # in place on what sigmoid's backward needs: an error only with grad on
    return torch.relu(y)

with torch.no_grad():
    f(torch.randn(4, 8))
"""


@pytest.mark.slow
def test_capture_of_a_no_grad_program_records_its_failure_under_its_own_grad_mode(tmp_path):
    """``capture --`` packs PyTorch's dump, which does not say that the program ran under
    ``no_grad``; replayed with grad on, the graph failed with an autograd error the program never
    had ("modified by an inplace operation"), and ``run`` called that REPRODUCED. The guard notes
    each compile's thread state, and the pack and ``run`` replay under it."""
    _, archive = _captured(tmp_path, NO_GRAD_IN_PLACE)
    repro = reproarchive.load(archive)
    assert repro.records.failure.exception_type.endswith("CppCompileError"), repro.records.failure
    assert repro.records.execution is not None and repro.records.execution.grad_enabled is False
    outcome = reproarchive.run(archive)
    assert outcome.status == "reproduced" and "inplace" not in (outcome.observed.message or "")
    assert not any("execution state" in w for w in outcome.warnings)


COND_UNDER_INDUCTOR = """
import torch
torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "{bug}"

@torch.compile(backend="inductor", fullgraph=True)
def f(x):
    return torch.cond(x.sum() > 0, lambda x: torch.relu(x) * 2, lambda x: x - 1, (x,))

f(torch.ones(8, 16))
"""


@pytest.mark.slow
@pytest.mark.parametrize("bug,error,stage", [("compile_error", "CppCompileError", "compile"),
                                             ("runtime_error", "RuntimeError", "forward")])
def test_a_failure_inside_cond_keeps_the_program_s_own_error_and_is_archived(tmp_path, bug, error, stage):
    """PyTorch's after_dynamo dump cannot write a graph whose ``cond`` holds subgraphs
    (``UnsupportedNNModuleError: Cannot convert module to string``). For a compile error its
    hook raised that in place of inductor's error, so the program failed with another error than
    its own and ``capture`` said the failure "was not inside a compiler backend"; a failure of
    the compiled call was "not archived". Both are archived at Dynamo's door instead, with the
    real input, and the program's own error goes on."""
    done, archive = _captured(tmp_path, COND_UNDER_INDUCTOR.format(bug=bug))
    assert done.returncode == 1 and error in done.stderr, done.stderr[-2000:]
    assert "UnsupportedNNModuleError" not in done.stderr.replace("dump of this failure failed (Unsupported", "")
    repro = reproarchive.load(archive)
    assert "cond" in {getattr(n.target, "__name__", "") for n in repro.gm.graph.nodes}
    assert repro.records.failure.stage == stage and repro.records.failure.exception_type.endswith(error)
    assert repro.fidelity == ["real"] and repro.records.execution is not None
    outcome = reproarchive.run(archive)
    assert (outcome.status, outcome.exit_code) == ("reproduced", 1), outcome.to_dict()


DYNAMIC_COMPILE_ERROR = """
import torch
torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "compile_error"

def f(a, b):
    return torch.relu(a @ b + 1).sum(1)

torch.compile(f, dynamic=True)(torch.randn(3, 4), torch.randn(4, 5))
"""


def test_capture_of_a_dynamic_program_records_the_compiles_own_shape_policy(tmp_path):
    """PyTorch's dump writes the symbolic sizes of a ``dynamic=True`` graph, but not their guards
    or where they came from, and nothing for a static graph: every ``run`` of a ``capture --``
    archive said the policy was not recorded, or compared no guards. The crash guard notes the
    policy Dynamo's fake values say when each backend call ends, with the guards the compile
    added, and the pack of the failing compile's dump takes it: the replay's guards are checked
    against the recorded ones."""
    done, archive = _captured(tmp_path, DYNAMIC_COMPILE_ERROR)
    assert done.returncode == 1, done.stderr[-2000:]
    shapes = reproarchive.inspect(archive).to_plain()["shapes"]
    assert shapes["recorded_from"] == "fake_tensors" and shapes["guards"], shapes
    assert {d["origin"] for r in shapes["inputs"] for d in r["dims"]} == {"dynamic=True"}
    outcome = reproarchive.run(archive, isolate=False)
    assert outcome.status == "reproduced", outcome.to_dict()
    assert outcome.shapes["guards_match"] is True, outcome.shapes
    assert not [w for w in outcome.warnings if "shape" in w], outcome.warnings
