"""Randomness travels with the graph (spec §8 ``rng``): the generator states the failing call
started from are recorded, every replay and minifier candidate starts from them, and accuracy on
a graph with random ops is judged under a rule fair to randomness.

The backends (``support.state_backends``) are cheap ``module:function`` compilers: one runs the
graph as eager does and fails with a checksum of its output (so a replay's draws can be compared
with the failing run's), one is ``aot_eager`` with a planted accuracy bug.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import fx

import reproarchive
from reproarchive.archive.packing import pack
from reproarchive.codec.rng import random_ops
from reproarchive.replay.accuracy import PLAIN_RULE
from reproarchive.replay.outcome import REPRODUCED
from support import state_backends
from support.captures import kept
from support.state_backends import SEEN, backend, name, run_then_fail, sigmoid_one_percent_high

pytestmark = pytest.mark.usefixtures("fresh_dynamo")
VECTORS = Path(__file__).resolve().parents[2] / "spec" / "vectors"


def _dropout_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 4)).train()


def _capture_dropout(path):
    """A training-mode dropout graph whose first call fails after drawing its mask."""
    SEEN.clear()
    compiled = torch.compile(_dropout_model(), backend=reproarchive.capture(name(run_then_fail), path=path))
    x = torch.randn(4, 8)
    torch.rand(13)  # the generator is wherever the program left it, not at a seed
    with pytest.raises(RuntimeError, match="planted failure"):
        compiled(x)
    return path, SEEN[0]


def _replayed_output(path):
    outcome = reproarchive.run(path, isolate=False)
    assert outcome.status == REPRODUCED, outcome.to_dict()
    return outcome, SEEN[-1]


def test_random_ops_are_read_from_the_operator_and_a_dropout_that_cannot_draw_is_not_one():
    def f(x):
        return (F.dropout(x, 0.5, True), F.dropout(x, 0.5, False), torch.rand_like(x), x.bernoulli_(0.5),
                torch.relu(x))

    assert random_ops(fx.symbolic_trace(f)) == ("bernoulli_", "dropout", "rand_like")
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.ops.aten.native_dropout.default, (x, 0.5, True)))
    assert random_ops(fx.GraphModule(torch.nn.Module(), g)) == ("native_dropout",)
    assert random_ops(fx.symbolic_trace(lambda x: torch.relu(x) + 1)) == ()
    traced = fx.symbolic_trace(torch.nn.Sequential(torch.nn.Dropout2d(0.2), torch.nn.ReLU()))
    assert random_ops(traced) == ("dropout2d",)
    assert random_ops(traced.eval()) == ()  # an evaluation-mode module draws nothing


def test_dropout_replays_bit_identical_with_the_recorded_state_and_differ_without(tmp_path):
    path, original = _capture_dropout(tmp_path / "a.tar.zst")
    repro = reproarchive.load(path)
    assert repro.records.rng.random_ops == ("dropout",) and list(repro.rng_states) == ["cpu"]
    assert "random ops: dropout; RNG state recorded (cpu)" == reproarchive.verify(path).randomness

    torch.rand(7)  # this process's generator is not where the failing run's was
    first, a = _replayed_output(path)
    torch.rand(7)  # a replay does not depend on where this process's generator is
    _, b = _replayed_output(path)
    assert torch.equal(a, original) and torch.equal(b, original)
    assert "the recorded RNG state (cpu) is restored" in first.randomness
    assert not any("RNG" in w for w in first.warnings)
    torch.rand(7)
    caller = torch.get_rng_state()
    reproarchive.run(path, isolate=False)
    assert torch.equal(torch.get_rng_state(), caller)  # the caller's generator is left as it was

    # the same archive packed without the states: what a source that cannot see them writes
    stateless = pack(repro.gm, list(repro.args), tmp_path / "no-state.tar.zst", records=repro.records)
    assert reproarchive.load(stateless).records.rng.generators == ()
    without, c = _replayed_output(stateless)
    torch.rand(7)
    _, d = _replayed_output(stateless)
    assert not torch.equal(c, d) and not torch.equal(c, original)
    assert any("draws other random numbers than the failing run" in w for w in without.warnings)


def test_an_archive_without_the_record_replays_as_before_and_says_the_rng_is_unknown(tmp_path):
    outcome = reproarchive.run(VECTORS / "basic-1.2.tar.zst", isolate=False)
    assert outcome.randomness == ("the graph draws no random numbers; RNG unknown: the archive does not record "
                                  "the RNG state")
    assert reproarchive.inspect(VECTORS / "basic-1.2.tar.zst").randomness.startswith("RNG unknown")
    # a graph that draws, from an archive that could not record the state: said as a warning
    repro = reproarchive.load(VECTORS / "rng-1.3.tar.zst")
    old = pack(repro.gm, list(repro.args), tmp_path / "old.tar.zst",
               records=dataclasses.replace(repro.records, rng=None))
    assert reproarchive.load(old).records.rng.generators == ()  # pack still names the random ops


def test_minified_archive_keeps_the_state_its_candidates_were_judged_from(tmp_path):
    path, original = _capture_dropout(tmp_path / "a.tar.zst")
    report = reproarchive.minify_archive(path, tmp_path / "min.tar.zst", isolate=False, max_time=60)
    small = reproarchive.load(report.output)
    assert torch.equal(small.rng_states["cpu"], reproarchive.load(path).rng_states["cpu"])
    assert reproarchive.run(report.output, isolate=False).status == REPRODUCED


def _dropout_sigmoid(x, w1, w2):
    return torch.sigmoid(F.dropout(x @ w1, 0.5, True)) @ w2


def _capture_accuracy(path, compiler):
    compiled = torch.compile(_dropout_sigmoid, backend=reproarchive.capture(compiler, path=path, accuracy=True))
    torch.manual_seed(1)
    return compiled, (torch.randn(8, 16), torch.randn(16, 32), torch.randn(32, 4))


def test_accuracy_bug_in_a_dropout_graph_is_found_and_minified_without_a_false_positive(tmp_path):
    from torch._dynamo.debug_utils import AccuracyError

    # no bug: the same graph, compiled through AOTAutograd as the buggy one is: no archive
    compiled, args = _capture_accuracy(tmp_path / "ok", "aot_eager")
    compiled(*args)
    assert kept(tmp_path / "ok") == []

    torch._dynamo.reset()
    compiled, args = _capture_accuracy(tmp_path / "bug", name(sigmoid_one_percent_high))
    with pytest.raises(AccuracyError):
        compiled(*args)
    (path,) = (tmp_path / "bug").glob("*.tar.zst")
    outcome = reproarchive.run(path, isolate=False)
    assert outcome.status == REPRODUCED, outcome.to_dict()
    assert outcome.accuracy_rule.startswith("fair to randomness (dropout)") and outcome.accuracy_rule != PLAIN_RULE
    report = reproarchive.minify_archive(path, tmp_path / "min.tar.zst", isolate=False, max_time=120)
    small = reproarchive.load(report.output)
    assert "torch.sigmoid" in small.index.graph.op_histogram()
    assert small.index.graph.op_count() <= 2, small.index.graph.op_histogram()
    assert reproarchive.run(report.output, isolate=False).status == REPRODUCED


def test_doctor_lists_a_difference_in_every_execution_field(tmp_path):
    from reproarchive.format.schema import AutocastState, ExecutionRecord

    gm = fx.symbolic_trace(lambda x: x + 1)
    record = ExecutionRecord(grad_enabled=False, inference_mode=True, deterministic=True,
                             deterministic_warn_only=True, default_dtype="float64", float32_matmul_precision="medium",
                             autocast=(AutocastState(device_type="cpu", enabled=True, dtype="bfloat16"),))
    with torch.inference_mode():
        x = torch.ones(2)
    path = pack(gm, [x], tmp_path / "a.tar.zst", records={"backend": "eager", "execution": record})
    rows = {r["name"]: r["recorded"] for r in reproarchive.doctor(path).differences if r["what"] == "execution"}
    assert rows == {"grad_enabled": False, "inference_mode": True, "deterministic": True,
                    "deterministic_warn_only": True, "default_dtype": "float64", "float32_matmul_precision": "medium",
                    "autocast cpu": "bfloat16", "inference inputs": [0]}


def _state_archive(folder: Path, case: str) -> tuple[Path, object, str]:
    """An archive whose failure needs ``case``'s state; the compiler; what its failure says."""
    if case == "rng":
        path, original = _capture_dropout(folder / "a.tar.zst")
        return path, run_then_fail, f"output checksum {state_backends.checksum(original)}"
    compiler = (state_backends.fails_under_cpu_autocast if case == "autocast"
                else state_backends.fails_in_inference_mode)
    expected = "compiled under CPU autocast" if case == "autocast" else "compiled code run in inference mode"
    state = torch.autocast("cpu", dtype=torch.bfloat16) if case == "autocast" else torch.inference_mode()
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w: torch.relu(x @ w) + 1,
                             backend=reproarchive.capture(name(compiler), path=folder / "a.tar.zst"))
    with state, pytest.raises(RuntimeError, match=expected):
        compiled(torch.randn(4, 8), torch.randn(8, 3))
    return folder / "a.tar.zst", compiler, expected


@pytest.mark.slow
def test_exported_script_restores_the_state_and_reproduces(tmp_path):
    """The exported script sets the recorded generator state (its failure message carries the
    failing run's checksum) and enters the recorded execution state: a graph run under CPU
    autocast and one under inference mode fail there only. The three scripts run at once."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(Path(state_backends.__file__).parents[1])}
    running = []
    for case in ("rng", "autocast", "inference"):
        path, compiler, expected = _state_archive(tmp_path / case, case)
        reproarchive.export(path, tmp_path / case / "out")
        script = [sys.executable, str(tmp_path / case / "out" / "repro.py"), "--backend", backend(compiler)]
        running.append((case, expected, subprocess.Popen(script, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                         text=True, env=env)))
    for case, expected, proc in running:
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode != 0 and expected in stderr, (case, stderr[-2000:])


@pytest.mark.slow
def test_capture_accuracy_runs_a_correct_dropout_training_loop_to_the_end(tmp_path):
    """Inductor draws its own dropout masks unless ``fallback_random``: without the rule fair to
    randomness this loop stopped with AccuracyError and left an archive."""
    import subprocess

    program = tmp_path / "train.py"
    program.write_text(
        "import torch\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 2))\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "step = torch.compile(m)\n"
        "for i in range(2):\n"
        "    step(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()\n"
        "print('trained to the end')\n")
    cli = str(Path(sys.executable).parent / "reproarchive")
    done = subprocess.run([cli, "capture", "--accuracy", "-o", str(tmp_path / "out"), "--", sys.executable,
                           str(program)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "trained to the end" in done.stdout
    assert list((tmp_path / "out").glob("*.tar.zst")) == []


def test_settings_capture_made_itself_are_not_recorded(tmp_path):
    from reproarchive.context.environment import environment_snapshot
    from reproarchive.sources.program.program_capture import capture_env

    env = capture_env(tmp_path, base={"TORCH_LOGS": "+dynamo", "OMP_NUM_THREADS": "1"})
    assert env["TORCH_COMPILE_DEBUG_DIR"] == str(tmp_path)
    recorded = environment_snapshot(env).variables
    assert "TORCH_COMPILE_DEBUG_DIR" not in recorded and "TORCHDYNAMO_REPRO_AFTER" not in recorded
    assert recorded["TORCH_LOGS"] == "+dynamo" and recorded["OMP_NUM_THREADS"] == "1"  # the user's own


def test_a_recorded_device_state_this_machine_cannot_take_is_a_note_not_a_failure():
    from reproarchive.codec.rng import restore_rng, rng_snapshot

    states = rng_snapshot([torch.ones(2)])
    assert list(states) == ["cpu"] and states["cpu"].dtype == torch.uint8
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    notes = restore_rng({**states, "cuda:0": torch.zeros(16, dtype=torch.uint8)})
    assert notes == ["the recorded RNG state of cuda:0 was not restored: no cuda device here"]
