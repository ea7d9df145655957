"""The execution state a graph failed under travels with it (spec §8 ``execution``).

Two backends registered here fail only in one thread state: under CPU autocast (at compile
time), and under inference mode (at run time). A graph captured in that state must reproduce
with ``run``; the same archive with its ``execution`` record stripped (rewritten through the
typed ``Records`` and ``pack``) must not, and must say that the state was not recorded: the
record is what makes it reproduce.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

import reproarchive
from reproarchive.archive.packing import pack
from reproarchive.context.execution import applied_execution, execution_snapshot
from reproarchive.errors import IndexSchemaError
from reproarchive.format.schema import AutocastState, ExecutionRecord
from reproarchive.replay.outcome import PASSED, REPRODUCED
from support import hostile_corpus

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

AUTOCAST_BACKEND = "fails_under_cpu_autocast_TESTING"
INFERENCE_BACKEND = "fails_in_inference_mode_TESTING"
NOT_RECORDED = "the execution state (grad mode, autocast, inference mode ...) was not recorded"


def _fails_under_cpu_autocast(gm, example_inputs):
    if torch.is_autocast_enabled("cpu"):
        raise RuntimeError(f"compiled under CPU autocast ({torch.get_autocast_dtype('cpu')})")
    return gm.forward


def _fails_in_inference_mode(gm, example_inputs):
    # At the backend call Dynamo has left inference mode (its inputs are inference tensors);
    # the compiled code runs in it: this one fails at run time, the other at compile time.
    def run(*args):
        if torch.is_inference_mode_enabled():
            raise RuntimeError("compiled code run in inference mode")
        return gm.forward(*args)
    return run


for _name, _fn in ((AUTOCAST_BACKEND, _fails_under_cpu_autocast), (INFERENCE_BACKEND, _fails_in_inference_mode)):
    if _name not in _COMPILER_FNS:
        register_backend(_fn, name=_name)


def fn(x, w):
    return torch.relu(x @ w) + 1


def _capture(path, backend, state):
    compiled = torch.compile(fn, backend=reproarchive.capture(backend, path=path))
    with state:
        x, w = torch.randn(4, 8), torch.randn(8, 3)
        with pytest.raises(Exception, match="compiled "):
            compiled(x, w)
    return path


def _stripped(path, target):
    """The archive at ``path`` without its execution record: every other record kept."""
    repro = reproarchive.load(path)
    records = dataclasses.replace(repro.records, execution=None)
    return pack(repro.gm, list(repro.args), target, records=records)


@pytest.mark.parametrize("backend, state, check", [
    (AUTOCAST_BACKEND, lambda: torch.autocast("cpu", dtype=torch.bfloat16),
     lambda e: AutocastState(device_type="cpu", enabled=True, dtype="bfloat16") in e.autocast),
    (INFERENCE_BACKEND, torch.inference_mode,
     lambda e: e.inference_mode and e.inference_inputs == (0, 1) and e.grad_enabled is False),
])
def test_failure_in_a_thread_state_reproduces_only_with_the_record(tmp_path, backend, state, check):
    path = _capture(tmp_path / "a.tar.zst", backend, state())
    repro = reproarchive.load(path)
    assert check(repro.records.execution), repro.records.execution
    if backend == INFERENCE_BACKEND:
        assert all(a.is_inference() for a in repro.args)  # rebuilt as they were

    outcome = reproarchive.run(path)
    assert outcome.status == REPRODUCED, outcome.to_dict()
    assert not any(NOT_RECORDED in w for w in outcome.warnings)
    assert not torch.is_autocast_enabled("cpu") and not torch.is_inference_mode_enabled()  # restored

    stripped = reproarchive.run(_stripped(path, tmp_path / "stripped.tar.zst"))
    assert stripped.status == PASSED, stripped.to_dict()
    assert sum(NOT_RECORDED in w for w in stripped.warnings) == 1


def test_doctor_lists_the_recorded_state_that_differs_from_a_fresh_process(tmp_path):
    path = _capture(tmp_path / "a.tar.zst", AUTOCAST_BACKEND, torch.autocast("cpu", dtype=torch.bfloat16))
    rows = [r for r in reproarchive.doctor(path).differences if r["what"] == "execution"]
    assert [(r["name"], r["recorded"], r["important"]) for r in rows] == [("autocast cpu", "bfloat16", True)]


def test_record_round_trips_through_pack_and_load(tmp_path):
    gm = torch.fx.symbolic_trace(fn)
    record = ExecutionRecord(grad_enabled=False, inference_mode=True,
                             autocast=(AutocastState(device_type="cpu", enabled=True, dtype="bfloat16"),),
                             deterministic=True, deterministic_warn_only=True, default_dtype="float64",
                             float32_matmul_precision="medium", inference_inputs=(1,))
    with torch.inference_mode():
        w = torch.randn(8, 3)
    path = pack(gm, [torch.randn(4, 8), w], tmp_path / "a.tar.zst",
                records={"backend": "eager", "execution": dataclasses.replace(record, inference_inputs=(0,))})
    repro = reproarchive.load(path)
    assert repro.records.execution == record  # inference_inputs: what the stored inputs are
    assert [a.is_inference() for a in repro.args] == [False, True]


def test_applied_execution_enters_the_record_and_restores_this_thread():
    before = execution_snapshot()
    record = ExecutionRecord(grad_enabled=False, autocast=(AutocastState(device_type="cpu", enabled=True,
                                                                         dtype="bfloat16"),),
                             deterministic=True, deterministic_warn_only=True, default_dtype="float64",
                             float32_matmul_precision="medium")
    with applied_execution(record) as notes:
        inside = execution_snapshot()
    assert notes == []
    assert dataclasses.replace(inside, inference_inputs=(), autocast=record.autocast) == dataclasses.replace(
        record, inference_mode=False, inference_inputs=())
    assert AutocastState(device_type="cpu", enabled=True, dtype="bfloat16") in inside.autocast
    assert execution_snapshot() == before


def test_an_inference_input_that_is_not_an_input_is_refused(tmp_path):
    vector = Path(__file__).resolve().parents[2] / "spec" / "vectors" / "basic-1.3.tar.zst"
    bad = tmp_path / "bad.tar.zst"
    bad.write_bytes(hostile_corpus.rebuild(hostile_corpus.parse(vector.read_bytes()),
                                           lambda index: index.update(execution={"inference_inputs": [99]})))
    with pytest.raises(IndexSchemaError, match="inference_inputs.*names input 99"):
        reproarchive.load(bad)
