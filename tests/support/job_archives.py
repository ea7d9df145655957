"""Small multi-rank job archives for the replay, minify and export tests, packed with
``pack_job`` as a captured job's parts are merged (the capture tests make them from real jobs).

Each job's failure is PyTorch's own, so that a replay, a minified archive and an exported script
reproduce it without a test-only operator:

* ``rank_one_fails``: two ranks compile the same collective graph, except that rank 1 took a
  branch with a ``relu``; the recorded backend (``relu_compile_error_TESTING_ONLY``, one of
  PyTorch's bug injectors) refuses a graph with a ``relu``, so rank 1's compile fails;
* ``rank_one_skips``: rank 1 skips the ``all_reduce`` that rank 0 waits in (a hang), and rank
  0 recorded the collective timeout gloo raised;
* ``spmd_accuracy``: both ranks compile one graph with a ``relu``, which the recorded backend
  (``relu_accuracy_error_TESTING_ONLY``) compiles wrong: an accuracy failure, recorded on rank 1;
* ``dtensor_input``: a DTensor input (its local shard, placements and mesh recorded);
* ``dropout_accuracy``: both ranks draw a dropout mask after an ``all_reduce``, recorded in
  accuracy mode under inductor with their generator states, and neither failed.
"""

from __future__ import annotations

import dataclasses
import operator
from pathlib import Path

import torch
import torch.fx as fx

import reproarchive
from reproarchive.archive.job_archive import RankCapture
from reproarchive.context.failure import record_from_exception, signature
from reproarchive.format.schema import (
    CollectiveRecord,
    FailureRecord,
    ProcessGroupRecord,
    RankOutcome,
    RankRecord,
    Records,
)

RELU_BACKEND = "relu_compile_error_TESTING_ONLY"
WORLD = ProcessGroupRecord(name="0", ranks=(0, 1), backend="gloo", index=0)
c10d = torch.ops._c10d_functional


def collective_graph(*, relu: bool = False, skip_all_reduce: bool = False) -> fx.GraphModule:
    """x -> all_reduce -> (relu) -> * w -> all_gather -> sum: what Dynamo hands a backend."""
    g = fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    y = g.call_function(operator.mul, (x, 2))
    if not skip_all_reduce:
        y = g.call_function(c10d.wait_tensor, (g.call_function(c10d.all_reduce, (y, "sum", "0")),))
    if relu:
        y = g.call_function(torch.relu, (y,))
    y = g.call_function(operator.mul, (y, w))
    if not skip_all_reduce:
        y = g.call_function(c10d.wait_tensor, (g.call_function(c10d.all_gather_into_tensor, (y, 2, "0")),))
    g.output((g.call_function(torch.sum, (y,)),))
    return fx.GraphModule(torch.nn.Module(), g)


def _schedule(gm: fx.GraphModule) -> tuple[CollectiveRecord, ...]:
    from reproarchive.replay.ranks import schedule_of

    return tuple(CollectiveRecord(op=c.op, group=c.group, node=c.node) for c in schedule_of(gm))


def _inputs(rank: int, device: str = "cpu") -> list[torch.Tensor]:
    return [torch.arange(4.0, device=device) - rank, torch.linspace(-1, 1, 4, device=device)]


def _part(rank: int, gm: fx.GraphModule, outcome: RankOutcome, backend: str, device: str = "cpu",
          inputs: list | None = None) -> RankCapture:
    record = RankRecord(rank=rank, local_rank=rank, device=device, schedule=_schedule(gm), outcome=outcome)
    failure = outcome.failure if outcome.status != "passed" else None
    inputs = _inputs(rank, device) if inputs is None else inputs
    return RankCapture(gm, inputs, record, Records(backend=backend, failure=failure))


def rank_one_fails(folder: Path, device: str = "cpu", *, absent_on_rank_0: bool = False) -> Path:
    """``device``: where both ranks' inputs live (``cuda:0`` for the GPU check, nccl_check.py);
    ``absent_on_rank_0``: rank 0's ``x`` recorded without its data (as a dump that lost it)."""
    from torch._dynamo.backends.registry import lookup_backend

    failing = collective_graph(relu=True)
    try:
        lookup_backend(RELU_BACKEND)(failing, _inputs(1))
    except Exception as exc:  # noqa: BLE001 - the recorded failure is PyTorch's own error
        failure = record_from_exception(exc, "compile", backend=RELU_BACKEND)
    zero = _inputs(0, device)
    if absent_on_rank_0:
        zero[0] = reproarchive.AbsentTensor(tuple(zero[0].shape), zero[0].dtype, device=device)
    parts = [_part(0, collective_graph(), RankOutcome(status="running", doing="all_reduce on group '0'"),
                   RELU_BACKEND, device, zero),
             _part(1, failing, RankOutcome(status="failed", failure=failure), RELU_BACKEND, device)]
    return reproarchive.pack_job(parts, folder / "rank-one-fails.tar.zst", world_size=2, backend="gloo",
                                 groups=[WORLD])


def rank_one_faults(folder: Path, backend: str) -> Path:
    """Rank 1 recorded a fault on the device (an illegal address, as torch raises it) in its
    forward under ``backend``; rank 0 was waiting in its all_reduce."""
    failure = record_from_exception(torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
                                    "forward", backend=backend)
    parts = [_part(0, collective_graph(), RankOutcome(status="running", doing="all_reduce on group '0'"), backend),
             _part(1, collective_graph(), RankOutcome(status="failed", failure=failure), backend)]
    return reproarchive.pack_job(parts, folder / "rank-one-faults.tar.zst", world_size=2, backend="gloo",
                                 groups=[WORLD])


def every_rank_fails(folder: Path) -> Path:
    """Both ranks compiled the graph with the ``relu`` and failed alike (the same graph, inputs'
    shapes, records and failure: one compile stands for both)."""
    from torch._dynamo.backends.registry import lookup_backend

    failing = collective_graph(relu=True)
    try:
        lookup_backend(RELU_BACKEND)(failing, _inputs(1))
    except Exception as exc:  # noqa: BLE001 - the recorded failure is PyTorch's own error
        failure = record_from_exception(exc, "compile", backend=RELU_BACKEND)
    parts = [_part(r, collective_graph(relu=True), RankOutcome(status="failed", failure=failure), RELU_BACKEND)
             for r in (0, 1)]
    return reproarchive.pack_job(parts, folder / "every-rank-fails.tar.zst", world_size=2, backend="gloo",
                                 groups=[WORLD])


def rank_one_skips(folder: Path) -> Path:
    message = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
               "5000ms for recv operation to complete")
    timeout = FailureRecord(stage="timeout", exception_type="RuntimeError", message=message,
                            signature=signature("timeout", "RuntimeError", message), backend="eager")
    parts = [_part(0, collective_graph(), RankOutcome(status="timeout", failure=timeout,
                                                      doing="all_reduce on group '0'"), "eager"),
             _part(1, collective_graph(skip_all_reduce=True), RankOutcome(status="running"), "eager")]
    return reproarchive.pack_job(parts, folder / "rank-one-skips.tar.zst", world_size=2, backend="gloo",
                                 groups=[WORLD])




def spmd_accuracy(folder: Path, *, absent_on_rank_1: bool = False) -> Path:
    """``absent_on_rank_1``: the failing rank's ``x`` recorded without its data."""
    backend = "relu_accuracy_error_TESTING_ONLY"
    failure = FailureRecord(stage="accuracy", exception_type="AccuracyError",
                            message="compiled result differs from eager",
                            signature=signature("accuracy", "AccuracyError", ""), backend=backend)
    parts = []
    for rank, outcome in ((0, RankOutcome(status="running")), (1, RankOutcome(status="failed", failure=failure))):
        inputs = _inputs(rank)
        if absent_on_rank_1 and rank == 1:
            inputs[0] = reproarchive.AbsentTensor(tuple(inputs[0].shape), inputs[0].dtype, device="cpu")
        part = _part(rank, collective_graph(relu=True), outcome, backend, inputs=inputs)
        parts.append(dataclasses.replace(part, records=dataclasses.replace(part.records, accuracy=True)))
    name = "spmd-accuracy-absent.tar.zst" if absent_on_rank_1 else "spmd-accuracy.tar.zst"
    return reproarchive.pack_job(parts, folder / name, world_size=2, backend="gloo",
                                 groups=[WORLD])


def dropout_accuracy(folder: Path) -> Path:
    g = fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    y = g.call_function(c10d.wait_tensor, (g.call_function(c10d.all_reduce, (x, "sum", "0")),))
    y = g.call_function(torch.nn.functional.dropout, (y, 0.5, True))
    g.output((g.call_function(torch.sum, (g.call_function(operator.mul, (y, w)),)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    parts = []
    for rank in (0, 1):
        part = _part(rank, gm, RankOutcome(status="passed"), "inductor", inputs=[torch.randn(64), torch.randn(64)])
        parts.append(dataclasses.replace(part, records=dataclasses.replace(part.records, accuracy=True),
                                         rng_states={"cpu": torch.get_rng_state()}))
    return reproarchive.pack_job(parts, folder / "dropout-accuracy.tar.zst", world_size=2, backend="gloo",
                                 groups=[WORLD])


MIXED = ("aten.add.Tensor got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to DTensor before "
         "calling distributed operators!")


def dtensor_input(folder: Path) -> Path:
    """Two ranks on a 1-D mesh ``dp``: input 0 is a DTensor sharded on dim 0 (global shape 8, the
    local shard of 4 stored), added to a plain tensor, which DTensor refuses: a failure that only
    a replay which rebuilds the DTensor from its recorded placements and mesh reproduces."""
    from reproarchive.format.schema import DTensorInput, MeshRecord, PlacementRecord

    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    g.output((g.call_function(torch.ops.aten.add.Tensor, (x, y)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    failure = FailureRecord(stage="forward", exception_type="RuntimeError", message=MIXED,
                            signature=signature("forward", "RuntimeError", MIXED), backend="eager")
    sharded = DTensorInput(input=0, mesh=0, placements=(PlacementRecord(kind="shard", dim=0),), shape=(8,),
                           stride=(1,))
    parts = []
    for rank in (0, 1):
        record = RankRecord(rank=rank, local_rank=rank, device="cpu", dtensors=(sharded,),
                            outcome=RankOutcome(status="failed", failure=failure))
        parts.append(RankCapture(gm, [torch.ones(4) * rank, torch.ones(8)], record,
                                 Records(backend="eager", failure=failure)))
    mesh = MeshRecord(shape=(2,), ranks=(0, 1), dim_names=("dp",), device_type="cpu")
    group = ProcessGroupRecord(name="0", ranks=(0, 1), backend="gloo", index=0, mesh_dim="dp")
    return reproarchive.pack_job(parts, folder / "dtensor.tar.zst", world_size=2, backend="gloo", groups=[group],
                                 meshes=[mesh])
