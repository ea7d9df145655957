"""Build the golden test vectors of spec/FORMAT.md §10.

    python spec/vectors/make_vectors.py [--check]

Writes the current version's ``<name>-<version>.tar.zst`` files that are missing and their
entries in ``vectors.json`` (what a reader must get back from each). Values come from
arange/linspace arithmetic, not random generators, so they are the same on every torch version
and platform. An existing vector is never rewritten (spec/FORMAT.md §10), whatever its version:
``--check`` only reports whether the current writer still produces identical bytes (in a
temporary folder). ``python -m reproarchive.spec_files`` checks or writes them with every other
generated file, through ``check`` and ``write``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import operator
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import torch.fx as fx

from reproarchive.format.schema import FORMAT_VERSION as VERSION

HERE = Path(__file__).resolve().parent


def _graph(n_inputs: int, body) -> fx.GraphModule:
    g = fx.Graph()
    xs = [g.placeholder(f"in{i}") for i in range(n_inputs)]
    g.output(body(g, xs))
    return fx.GraphModule(torch.nn.Module(), g)


def basic():
    """Aliasing views, a non-leaf input, a zero storage, equal-content storages, scalars."""
    base = torch.linspace(-2.0, 2.0, 24, dtype=torch.float32)
    base[3] = -0.0
    base[5] = float("nan")
    view_a = base[2:14].view(3, 4)
    view_b = base.view(4, 6).t()  # non-contiguous view of the same storage
    leaf = torch.arange(6, dtype=torch.float64).requires_grad_(True)
    nonleaf = leaf * 2
    zeros = torch.zeros(16, dtype=torch.int64)
    twin_a = torch.arange(8, dtype=torch.int32)
    twin_b = torch.arange(8, dtype=torch.int32)  # same bytes, different storage
    mask = torch.tensor([True, False, True, True])
    inputs = [view_a, view_b, nonleaf, zeros, twin_a, twin_b, mask, 3, 0.5, True, None, (7, 2.5)]

    def body(g, xs):
        relu = g.call_function(torch.relu, (xs[0],))
        s = g.call_function(operator.add, (relu, xs[8]))
        t = g.call_method("sum", (xs[1],), {"dim": 0})
        u = g.call_function(torch.ops.aten.add.Tensor, (xs[4], xs[5]))
        v = g.call_function(operator.mul, (u, xs[7]))
        w = g.call_function(torch.where, (xs[6], xs[6], xs[6]))
        return (s, t, v, w, xs[3], xs[2])

    return _graph(len(inputs), body), inputs


def dtypes():
    """One input per storable dtype, with bit patterns that catch byte-order and width bugs."""
    raw = torch.arange(64, dtype=torch.uint8) * 37 % 251
    inputs = []
    names = []
    from reproarchive.codec.tensors import DTYPES

    for name in sorted(DTYPES):
        dt = DTYPES[name]
        size = dt.itemsize
        n = 64 // size
        t = raw[: n * size].clone().view(dt) if size else None
        if t is None:
            continue
        inputs.append(t)
        names.append(name)
    return _graph(len(inputs), lambda g, xs: tuple(xs)), inputs


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.bn = torch.nn.BatchNorm1d(3)
        with torch.no_grad():
            self.lin.weight.copy_(torch.linspace(-1, 1, 12).view(3, 4))
            self.lin.bias.copy_(torch.tensor([0.5, -0.25, 0.125]))
        self.register_buffer("scale", torch.full((3,), 2.0))
        self.bn.eval()

    def forward(self, x):
        return self.bn(self.lin(x)) * self.scale


def module():
    """call_module (nn.Linear, nn.BatchNorm1d rebuilt without their constructors) and get_attr."""
    gm = fx.symbolic_trace(_Net())
    return gm, [torch.linspace(0, 1, 8).view(2, 4)]


def absent():
    """An input whose data the source never had."""
    from reproarchive.codec.tensors import AbsentTensor

    gm = _graph(2, lambda g, xs: (g.call_function(operator.add, (xs[0], xs[1])),))
    return gm, [AbsentTensor((2, 3), torch.float32), torch.ones(2, 3)]


def stored():
    """Large data frames: one that zstd cannot shrink (stored in raw blocks) and one it can.

    The incompressible bytes are sha256 in counter mode: no random generator, the same bytes
    everywhere. Both inputs fill one 320 KiB frame, above the size from which the writer
    probes frames (format/frames.py).
    """
    import hashlib

    n = 320 << 10
    noise = b"".join(hashlib.sha256(i.to_bytes(8, "little")).digest() for i in range(n // 32))
    noise_t = torch.frombuffer(bytearray(noise), dtype=torch.uint8)
    ramp = torch.arange(n // 8, dtype=torch.int64) % 1000
    return _graph(2, lambda g, xs: (xs[0], g.call_function(operator.add, (xs[1], 1)))), [noise_t, ramp]


def subclass():
    """(1.3) A traceable tensor subclass input (torch's ``TwoTensor``), recorded through its
    flatten protocol: two inner tensors, no context."""
    from torch.testing._internal.two_tensor import TwoTensor

    inner_a = torch.linspace(-1.0, 1.0, 6).view(2, 3)
    inner_b = torch.arange(6, dtype=torch.float32).view(2, 3)
    return _graph(1, lambda g, xs: (g.call_function(torch.relu, (xs[0],)),)), [TwoTensor(inner_a, inner_b)]



def njt():
    """(1.3) A nested jagged tensor and its ragged size ``j1`` as an input of its own, as Dynamo
    passes them: the size is stored as the size of input 1 at dimension 1 (§6.3 ``size``) and
    computed from the rebuilt tensor on load; the graph views the tensor with it."""
    t = torch.nested.nested_tensor([torch.linspace(-1.0, 1.0, 8).view(2, 4), torch.arange(12.0).view(3, 4)],
                                   layout=torch.jagged)

    def body(g, xs):
        view = g.call_method("view", (xs[1], 2, xs[0], 4))
        return (g.call_function(torch.relu, (view,)),)

    return _graph(2, body), [t.size(1), t]


def dynamic():
    """(1.3) A symbolic recording: ``s77`` (the size of ``x``'s first dimension, marked dynamic
    in [2, 64]) passed as an input next to ``x``; ``y`` of the same size at capture but its own
    symbol; an unbacked ``u0`` from ``nonzero()``. The ``shapes`` record says so (§8); from
    1.6 it also says that the backend's compile bounded ``s17`` (``entry``)."""
    x = torch.arange(24, dtype=torch.float32).view(8, 3)
    y = torch.linspace(0.0, 1.0, 24, dtype=torch.float32).view(8, 3)

    def body(g, xs):
        flat = g.call_method("view", (xs[1], -1))
        nz = g.call_method("nonzero", (flat,))
        s = g.call_function(operator.add, (g.call_method("sum", (xs[1], 0)), g.call_method("sum", (xs[2], 0))))
        return (s, g.call_method("view", (nz, -1)))

    return _graph(3, body), [8, x, y]


def _dim(expr, source, **facts) -> dict:
    return {"kind": "backed", "size": 8, "expr": expr, "source": source, "min": 2, **facts}


DYNAMIC_SHAPES = {
    "recorded_from": "fake_tensors",
    "inputs": [
        {"input": 0, "kind": "symint", "source": "L['x'].size()[0]",
         "dims": [_dim("s77", "L['x'].size()[0]", max=64, origin="mark_dynamic", equal_to=["1.0"])]},
        {"input": 1, "kind": "tensor", "source": "L['x']",
         "dims": [_dim("s77", "L['x'].size()[0]", max=64, origin="mark_dynamic", equal_to=["0.0"]),
                  {"kind": "static", "size": 3, "source": "L['x'].size()[1]", "origin": "static"}]},
        {"input": 2, "kind": "tensor", "source": "L['y']",
         "dims": [_dim("s17", "L['y'].size()[0]", origin="automatic"),
                  {"kind": "static", "size": 3, "source": "L['y'].size()[1]", "origin": "static"}]},
    ],
    "symbols": [
        {"name": "s17", "kind": "backed", "hint": 8, "min": 2, "max": 4096, "sources": ["L['y'].size()[0]"]},
        {"name": "s77", "kind": "backed", "hint": 8, "min": 2, "max": 64, "sources": ["L['x'].size()[0]"]},
        {"name": "u0", "kind": "unbacked", "min": 0, "max": 192},
    ],
    "guards": ["2 <= L['x'].size()[0] and L['x'].size()[0] <= 64",
               "2 <= L['y'].size()[0] and L['y'].size()[0] <= 4096"],
    "shape_guards": ["s17 <= 4096"],
    "runtime_asserts": ["u0 >= 0"],
    "settings": {"duck_shape": True, "specialize_zero_one": True, "assume_static_by_default": True,
                 "capture_dynamic_output_shape_ops": True},
    # (1.6) the backend's compile bounded ``s17`` (as Inductor bounds a size it indexes with)
    "entry": {"guards": ["2 <= L['x'].size()[0] and L['x'].size()[0] <= 64", "2 <= L['y'].size()[0]"],
              "shape_guards": 0},
}


def _collective_graph(skip_gather: bool) -> fx.GraphModule:
    """A rank's graph: all_reduce on the world group, then (unless skipped) all_gather on its pair."""
    def body(g, xs):
        ar = g.call_function(torch.ops._c10d_functional.all_reduce, (xs[0], "sum", "0"))
        y = g.call_function(torch.ops._c10d_functional.wait_tensor, (ar,))
        y = g.call_function(operator.mul, (y, xs[1]))
        if not skip_gather:
            ag = g.call_function(torch.ops._c10d_functional.all_gather_into_tensor, (y, 2, "1"))
            y = g.call_function(torch.ops._c10d_functional.wait_tensor, (ag,))
        return (y,)
    return _graph(2, body)


def job():
    """(1.3) A 4-rank job (spec §8 job): sub-groups [0, 1] and [2, 3], a 2x2 DeviceMesh, a DTensor
    input, one weight every rank shares (stored once), rank 2 skipping a collective (its own
    graph, and a schedule that diverges), rank 1 failing, rank 2 timing out, rank 3 crashing;
    (1.5) rank 1's records (the failing rank's, the index's own) differ from the other three's,
    which share one record set."""
    from reproarchive.archive.job_archive import RankCapture
    from reproarchive.format.schema import (
        CollectiveRecord,
        DTensorInput,
        FailureRecord,
        MeshRecord,
        PlacementRecord,
        ProcessGroupRecord,
        RankOutcome,
        RankRecord,
    )

    groups = [ProcessGroupRecord(name="0", ranks=(0, 1, 2, 3), backend="gloo", index=0, desc="default_pg"),
              ProcessGroupRecord(name="1", ranks=(0, 1), backend="gloo", index=1, mesh_dim="tp"),
              ProcessGroupRecord(name="2", ranks=(2, 3), backend="gloo", index=2, mesh_dim="tp"),
              ProcessGroupRecord(name="3", ranks=(0, 2), backend="gloo", index=3, mesh_dim="dp"),
              ProcessGroupRecord(name="4", ranks=(1, 3), backend="gloo", index=4, mesh_dim="dp")]
    mesh = MeshRecord(shape=(2, 2), ranks=(0, 1, 2, 3), dim_names=("dp", "tp"), device_type="cpu")
    weight = torch.linspace(-1.0, 1.0, 4)
    failure = FailureRecord(stage="forward", exception_type="RuntimeError", message="golden vector",
                            signature="forward|RuntimeError|golden vector", backend="eager")
    outcomes = [RankOutcome(status="passed"), RankOutcome(status="failed", failure=failure),
                RankOutcome(status="timeout", doing="waiting in all_reduce on group '0' (collective 1)"),
                RankOutcome(status="crashed", signal="SIGABRT")]
    ranks = []
    for r in range(4):
        pair = "1" if r < 2 else "2"
        schedule = [CollectiveRecord(op="all_reduce", group="0", shapes=((4,),), dtypes=("float32",),
                                     compile_id="0/0", node="all_reduce")]
        if r != 2:
            schedule.append(CollectiveRecord(op="all_gather_into_tensor", group=pair, shapes=((4,),),
                                             dtypes=("float32",), compile_id="0/0", node="all_gather_into_tensor"))
        dtensors = (DTensorInput(input=0, mesh=0, placements=(PlacementRecord(kind="replicate"),
                                                             PlacementRecord(kind="shard", dim=0)),
                                 shape=(8,), stride=(1,)),)
        record = RankRecord(rank=r, local_rank=r, device="cpu", host="sha256:" + "ab" * 32, schedule=tuple(schedule),
                            dtensors=dtensors, outcome=outcomes[r])
        local = torch.arange(4, dtype=torch.float32) + 4 * (r % 2)
        ranks.append(RankCapture(_collective_graph(skip_gather=r == 2), [local, weight], record,
                                 RECORDS if r == 1 else None))
    return ranks, {"world_size": 4, "backend": "gloo", "groups": groups, "meshes": [mesh]}


def _scale_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * alpha + y


# the same provenance (module name) whether this file runs as a script or is imported by a test
_scale_add.__module__ = "spec.vectors.make_vectors"
_scale_add = torch.library.custom_op("reproarchive_vectors::scale_add", mutates_args=())(_scale_add)


@_scale_add.register_fake
def _(x, y, alpha):
    return torch.empty_like(x)


def custom_op():
    """(1.3) A graph calling a custom op twice, once on each pair of inputs: the ``custom_ops``
    record with two recorded calls, whose outputs are storages of the table (one of them equal
    in bytes to an input, so their blob is shared). Loaded where the op is not registered, the
    graph runs on a stand-in."""
    x = torch.arange(6, dtype=torch.float32).view(2, 3)
    y = torch.ones(2, 3)
    zero = torch.zeros(2, 3)

    def body(g, xs):
        a = g.call_function(torch.ops.reproarchive_vectors.scale_add.default, (xs[0], xs[1], 2.0))
        b = g.call_function(torch.ops.reproarchive_vectors.scale_add.default, (xs[1], xs[2], 1.0))
        return (g.call_function(operator.add, (a, b)),)

    return _graph(3, body), [x, y, zero]


def job_custom_op():
    """(1.5) A 2-rank job whose graph calls a custom op on each rank's own input: the job's
    ``custom_ops`` holds the operator once with both ranks' calls (spec §8 ``custom_ops`` of a
    job), so a reader that stands in for it finds each rank's call."""
    from reproarchive.archive.job_archive import RankCapture
    from reproarchive.codec.recorded_calls import record_calls
    from reproarchive.format.schema import FailureRecord, ProcessGroupRecord, RankOutcome, RankRecord

    def body(g, xs):
        return (g.call_function(torch.ops.reproarchive_vectors.scale_add.default, (xs[0], xs[1], 2.0)),)

    failure = FailureRecord(stage="forward", exception_type="RuntimeError", message="golden vector",
                            signature="forward|RuntimeError|golden vector", backend="eager")
    outcomes = [RankOutcome(status="passed"), RankOutcome(status="failed", failure=failure)]
    ranks = []
    for r in range(2):
        gm, inputs = _graph(2, body), [torch.full((2, 3), float(r)), torch.ones(2, 3)]
        ranks.append(RankCapture(gm, inputs, RankRecord(rank=r, local_rank=r, device="cpu", outcome=outcomes[r]),
                                 custom_ops=record_calls(gm, inputs)))  # as a capture records each rank's
    groups = [ProcessGroupRecord(name="0", ranks=(0, 1), backend="gloo", index=0, desc="default_pg")]
    return ranks, {"world_size": 2, "backend": "gloo", "groups": groups}


_STACKS = (
    '  File "./model.py", line 9, in forward\n    return helper(y).relu()\n           ^^^^^^^^^^^^^^^^\n'
    '  File "./model.py", line 3, in helper\n    return torch.sin(x) * 2\n           ^^^^^^^^^^^\n',
    '  File "./model.py", line 9, in forward\n    return helper(y).relu()\n',
)


def stack():
    """(1.7) Nodes' source stacks: two nodes traced in one call share a stack of two frames
    (with the caret lines Python 3.11 prints), a third has one frame without them."""
    def body(g, xs):
        sin = g.call_function(torch.sin, (xs[0],))
        mul = g.call_function(operator.mul, (sin, 2))
        relu = g.call_method("relu", (mul,))
        for node, text in ((sin, _STACKS[0]), (mul, _STACKS[0]), (relu, _STACKS[1])):
            node.meta["stack_trace"] = text
        return (relu,)

    return _graph(1, body), [torch.linspace(-1.0, 1.0, 6).view(2, 3)]


def rng():
    """(1.3) A graph that draws random numbers, and the CPU generator state it starts from
    (``torch.Generator().manual_seed(2024)``: the same bytes everywhere); ``rand_like`` draws
    with the generator alone (no vector library), so its values are the same on every CPU."""
    def body(g, xs):
        return (g.call_function(operator.add, (xs[0], g.call_function(torch.rand_like, (xs[0],)))),)

    state = torch.Generator().manual_seed(2024).get_state()
    return _graph(1, body), [torch.arange(6, dtype=torch.float32).view(2, 3)], {"cpu": state}


def triton():
    """(1.4) A graph launching a user Triton kernel (``tests/support/triton_kernels.scale_kernel``,
    which writes its argument in place) and the launch the failing run made: the
    ``triton_kernels`` record with the kernel's source and digest, its call site's constants and
    what the launch wrote, computed by Triton's own interpreter. Loaded here, the launch runs on
    a stand-in that writes the recorded result. Building it needs the ``triton`` package."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table, triton_kernel_wrapper_mutation
    from triton.runtime.interpreter import InterpretedFunction

    from reproarchive.codec import triton_kernels
    from reproarchive.codec.custom_ops import tensor_key

    sys.path.insert(0, str(HERE.parents[1]))
    from tests.support.triton_kernels import scale_kernel

    x = torch.arange(8, dtype=torch.float32)
    constants = {"n": 8, "s": 3.0, "BLOCK": 8}
    kernel, site = kernel_side_table.add_kernel(scale_kernel), kernel_side_table.add_constant_args(constants)

    def body(g, xs):
        y = g.call_function(torch.clone, (xs[0],))
        g.call_function(triton_kernel_wrapper_mutation, (), {
            "kernel_idx": kernel, "constant_args_idx": site, "grid": [(1, 1, 1)], "tma_descriptor_metadata": {},
            "kwargs": {"x_ptr": y}})
        return (g.call_function(operator.add, (y, 1.0)),)

    written = x.clone()
    InterpretedFunction(scale_kernel.fn).run(written, 8, 3.0, BLOCK=8, grid=(1,), warmup=False)
    live = triton_kernels.LiveTritonKernel(triton_kernels.describe(scale_kernel), [
        triton_kernels.LiveTritonCall(constants, {"x_ptr": tensor_key(x)}, {"x_ptr": written})])
    return _graph(1, body), [x], None, [live]


CASES = {"basic": basic, "dtypes": dtypes, "module": module, "absent": absent, "stored": stored, "dynamic": dynamic,
         "subclass": subclass, "custom-op": custom_op,
         "rng": rng, "njt": njt, "triton": triton, "stack": stack}
#: records a case adds to RECORDS (from the version that introduced it)
CASE_RECORDS = {"dynamic": {"shapes": DYNAMIC_SHAPES}}
JOB_CASES = {"job": job, "job-custom-op": job_custom_op}  # (1.3) multi-rank jobs: 1.3 and later only
RECORDS = {
    "failure": {"stage": "compile", "exception_type": "RuntimeError", "message": "golden vector",
                "traceback": "", "signature": "compile|RuntimeError|golden vector", "backend": "eager",
                "accuracy": None},
    "system": {"note": "golden vector"},
    # 1.2: a typed source (§8); the key it does not declare stays in the record as written
    "source": {"kind": "capture", "stage": "compile", "fwd_only": False, "note": "golden vector"},
}


def tensor_facts(t: torch.Tensor) -> dict:
    data = (t.detach().contiguous().view(torch.uint8) if t.numel() and t.dtype.itemsize
            else torch.empty(0, dtype=torch.uint8))
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "offset": t.storage_offset(),
        "requires_grad": t.requires_grad,
        "is_leaf": t.is_leaf,
        "sha256": hashlib.sha256(bytes(data.flatten().tolist())).hexdigest(),
    }


def value_facts(v):
    if isinstance(v, torch.Tensor) and type(v) is not torch.Tensor and hasattr(v, "__tensor_flatten__"):
        attrs, _ = v.__tensor_flatten__()
        return {"subclass": f"{type(v).__module__}.{type(v).__qualname__}",
                "inner": [value_facts(getattr(v, a).as_subclass(torch.Tensor)) for a in attrs]}
    if isinstance(v, torch.Tensor):
        return tensor_facts(v)
    if isinstance(v, (tuple, list)):
        return [value_facts(x) for x in v]
    return {"value": v}


def build(name: str, path: Path) -> dict:
    pack_case(name, path)
    return expectations(name, path)


def pack_case(name: str, path: Path) -> None:
    """Write case ``name``'s vector of the current version at ``path``."""
    import reproarchive

    if name in JOB_CASES:
        ranks, job_facts = JOB_CASES[name]()
        reproarchive.pack_job(ranks, path, **job_facts)
        return
    gm, inputs, *states = CASES[name]()
    if name == "dynamic":
        inputs[0] = _symint(inputs[0], "L['x'].size()[0]")
    reproarchive.pack(gm, inputs, path, backend="eager", snapshot=False, rng_states=states[0] if states else None,
                      **({'custom_ops': states[1]} if len(states) > 1 else {}), **RECORDS, **CASE_RECORDS.get(name, {}))


def _symint(hint: int, source: str):
    """A SymInt with ``hint``, named as Dynamo names the symbol read from ``source``."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    env, src = ShapeEnv(), ConstantSource(source)
    return env.create_symintnode(env.create_symbol(hint, src, DimDynamic.DYNAMIC), hint=hint, source=src)


def job_expectations(path: Path) -> dict:
    """What a reader must get back from a job vector: the primary rank as ``load``'s facts
    (its graph calls collectives, so it is not run), and every rank's inputs and records."""
    import reproarchive
    from reproarchive.format.plain import to_plain

    job = reproarchive.load_job(path)
    primary = job.rank(job.primary_rank)
    ranks = [{"rank": r.rank, "inputs": [value_facts(a) for a in r.args],
              "graph": r.record.graph, "ops": sum(n.op == "call_function" for n in r.gm.graph.nodes),
              "schedule": [to_plain(c) for c in r.schedule], "outcome": to_plain(r.outcome),
              "dtensors": [to_plain(d) for d in r.dtensors]} for r in job.ranks]
    if job.index.custom_ops:  # the job's custom ops: each once, with every rank's calls
        ops_facts = {"custom_ops": [{"name": op.name, "calls": [list(c.arguments) for c in op.calls]}
                                      for op in job.index.custom_ops]}
    else:
        ops_facts = {}
    if job.job.records:  # (1.5) each rank's own records: which set, and what it says
        for facts, r in zip(ranks, job.ranks):
            facts["records"] = {"set": r.record.records, "backend": r.records.backend,
                                "failure": r.records.failure is not None}
    return {
        "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "index_digest": job.digest,
        "fidelity": primary.fidelity,
        "inputs": [value_facts(a) for a in primary.args],
        "storage_aliases": _aliases(primary.args),
        "job": {"world_size": job.world_size, "backend": job.backend, "failing_rank": job.failing_rank,
                "primary_rank": job.primary_rank, "graphs": len(job.job.graphs),
                "groups": [to_plain(g) for g in job.groups], "meshes": [to_plain(m) for m in job.meshes],
                "ranks": ranks, **ops_facts},
    }


def expectations(name: str, path: Path) -> dict:
    import reproarchive

    if name in JOB_CASES:
        return job_expectations(path)
    repro = reproarchive.load(path)
    facts = {
        "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "index_digest": repro.digest,
        "fidelity": repro.fidelity,
        "inputs": [value_facts(a) if f != "absent" else {"absent": True} for a, f in zip(repro.args, repro.fidelity)],
        "storage_aliases": _aliases(repro.args),
    }
    for i, rec in enumerate(repro.index.inputs):  # (1.3) a size of another input, computed from it
        if type(rec).__name__ == "DerivedValue":
            of = getattr(repro.args[rec.input], rec.kind)(rec.dim)
            facts["inputs"][i] = {"derived": [rec.kind, rec.input, rec.dim], "equals": bool(repro.args[i] == of)}
    stacks = {n.name: n.meta["stack_trace"] for n in repro.gm.graph.nodes if "stack_trace" in n.meta}
    if stacks:  # (1.7) each node's stack, as the tracer printed it
        facts["stacks"] = stacks
    if repro.records.shapes is not None:
        from reproarchive.format.plain import to_plain

        facts["shapes"] = to_plain(repro.records.shapes)
    if "absent" not in repro.fidelity:
        from reproarchive.codec.rng import restore_rng

        with torch.random.fork_rng(devices=[]):
            restore_rng(repro.rng_states)  # (1.3) the recorded generator state, where there is one
            out = repro.gm(*repro.args)
        facts["outputs"] = [output_facts(o) for o in (out if isinstance(out, tuple) else [out])]
    return facts


def output_facts(t) -> dict:
    """What running a vector's graph gives: the values, not their bytes.

    A graph's outputs are computed, and matrix kernels round differently on different CPUs
    (AVX2, AVX-512, AMX), so floating-point ones are compared with a tolerance; other dtypes
    (integers, bits, complex) keep their exact digest."""
    facts = value_facts(t)
    if "subclass" in facts:
        return dict(facts, inner=[output_facts(getattr(t, a)) for a in t.__tensor_flatten__()[0]])
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return facts
    del facts["sha256"]
    return dict(facts, values=t.detach().double().flatten().tolist())


def _aliases(args) -> list[list[int]]:
    """Groups of input positions sharing one storage (what aliasing must preserve)."""
    groups: dict[int, list[int]] = {}
    for i, a in enumerate(args):
        if type(a) is torch.Tensor or type(a) is torch.nn.Parameter:
            groups.setdefault(a.untyped_storage()._cdata, []).append(i)
    return sorted(g for g in groups.values() if len(g) > 1)


def current() -> dict[str, str]:
    """The current version's vector file names, each with its case."""
    return {f"{name}-{VERSION}.tar.zst": name for name in (*CASES, *JOB_CASES)}


def _manifest(vectors: Path) -> dict:
    path = vectors / "vectors.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _unbuildable(name: str) -> str | None:
    """Why case ``name`` cannot be built on this machine, or None."""
    import importlib.util

    if name == "triton" and importlib.util.find_spec("triton") is None:
        return "building it needs the triton package"
    return None


def not_rebuilt(spec_dir: Path = HERE.parent) -> dict[str, str]:
    """The current version's vectors this machine cannot build byte for byte, and why (the skips
    of tests/format/test_vectors.py): a case that cannot be built here, and a vector written
    with another zstd library or torch, whose bytes differ for reasons not the writer's."""
    import zstandard

    import reproarchive

    vectors, manifest = spec_dir / "vectors", _manifest(spec_dir / "vectors")
    zstd_here, torch_here = ".".join(map(str, zstandard.ZSTD_VERSION)), torch.__version__.split("+")[0]
    out = {}
    for fname, name in current().items():
        if (why := _unbuildable(name)) is not None:
            out[fname] = why
        elif not (vectors / fname).exists() or fname not in manifest:
            continue
        elif (zstd := manifest[fname].get("zstd_library")) != zstd_here:
            out[fname] = f"written with zstd {zstd}, this is {zstd_here}"
        elif (made_with := reproarchive.inspect(vectors / fname).to_plain()["created_by"]["torch"]) != torch_here:
            out[fname] = f"written with torch {made_with}, this is {torch_here}"
    return out


def check(spec_dir: Path = HERE.parent) -> list[str]:
    """The current version's vectors (and their entries in vectors.json) that are missing or that
    the writer no longer makes byte for byte, one line each; built in a temporary folder.
    Older versions' vectors are frozen, and those ``not_rebuilt`` names are not built."""
    vectors, manifest = spec_dir / "vectors", _manifest(spec_dir / "vectors")
    skip = not_rebuilt(spec_dir)
    stale = []
    with tempfile.TemporaryDirectory() as tmp:
        for fname, name in current().items():
            path = vectors / fname
            if not path.exists():
                stale.append(f"{path}: missing")
                continue
            if fname not in manifest:
                stale.append(f"{vectors / 'vectors.json'}: no entry for {fname}")
            elif manifest[fname].get("file_sha256") != _sha256(path):
                stale.append(f"{vectors / 'vectors.json'}: the entry for {fname} is not of that file "
                             "(a golden vector is never rewritten: restore the file)")
            if fname in skip:
                continue
            pack_case(name, Path(tmp) / fname)
            if (Path(tmp) / fname).read_bytes() != path.read_bytes():
                stale.append(f"{path}: the writer now makes other bytes (a golden vector is never rewritten, "
                             "spec/FORMAT.md §10: a change of bytes needs a version bump or vectors of its own)")
    return stale


def write(spec_dir: Path = HERE.parent) -> list[Path]:
    """Write the current version's vectors that are missing, or have no entry in vectors.json
    (never committed), with their entries; never rewrite a golden vector. The files written."""
    import zstandard

    vectors, manifest = spec_dir / "vectors", _manifest(spec_dir / "vectors")
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for fname, name in current().items():
            path = vectors / fname
            if path.exists() and fname in manifest or _unbuildable(name) is not None:
                continue
            pack_case(name, Path(tmp) / fname)
            shutil.copyfile(Path(tmp) / fname, path)
            manifest[fname] = {**expectations(name, path), "format": VERSION,
                               "zstd_library": ".".join(map(str, zstandard.ZSTD_VERSION))}
            written.append(path)
    if written:
        (vectors / "vectors.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        written.append(vectors / "vectors.json")
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="rebuild into a temp dir and compare bytes")
    opts = parser.parse_args(argv)
    for fname, why in not_rebuilt().items():
        print(f"{fname}: not built here: {why}")
    if opts.check:
        stale = check()
        print("\n".join(stale) if stale else f"the vectors of {VERSION} are identical")
        return 1 if stale else 0
    for path in write():
        print(f"{path.name}: written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
