"""User Triton kernels as data (spec §8 ``triton_kernels``): what a graph's kernel launches are,
what they wrote in the failing run, and what runs them on replay.

Dynamo puts a user kernel into a graph as ``triton_kernel_wrapper_mutation(kernel_idx=…)``, an
index into a side table of the recording process. The capture side records each kernel the
graph launches (source as text with its sha256, parameters, constexprs, autotuning
configurations, the non-tensor arguments of each call site) and, where the source runs the graph
on real data anyway, each launch's tensor arguments by content and the tensors it wrote, as they
were after it.

On replay a launch is bound to one of two things, never to whatever this process's side table
holds at the recorded index (``format.schema.rules.triton`` makes every launch name a recorded kernel):

* the user's own kernel, brought with ``--import MODULE`` and matched by the digest of its source
  (and equal autotuning configurations): the launch is the original one, so a bug in how a
  compiler handles user kernels reproduces;
* otherwise a stand-in: an operator of the namespace ``reproarchive_triton`` that writes the
  recorded results into its tensor arguments when they hold the recorded inputs, and raises for
  any other input. The rest of the graph compiles, reproduces and minifies around it.

The source in an archive is never compiled, launched or imported: a stand-in is a table of
tensors, and a real kernel is only ever the user's object.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from typing import Any, Callable, Iterable, Sequence

import torch

from reproarchive.codec.custom_ops import tensor_key
from reproarchive.codec.graphs import encode_arg
from reproarchive.codec.stand_ins import define_operator
from reproarchive.compat.dispatch import HigherOrderOperator, OpOverload, triton_kernel_side_table
from reproarchive.errors import NotReplayableHereError, PackError, Rule
from reproarchive.format.schema import (
    DictArg,
    GraphRecord,
    NodeRecord,
    SubgraphEntry,
    TritonCall,
    TritonConfig,
    TritonKernelRecord,
)
from reproarchive.format.schema.rules.triton import LAUNCH_TARGETS, source_digest

MUTATION, FUNCTIONAL = "triton_kernel_wrapper_mutation", "triton_kernel_wrapper_functional"
MUTATION_TARGET = "torch.ops.higher_order.triton_kernel_wrapper_mutation"
STAND_IN_NAMESPACE = "reproarchive_triton"
_PLAIN = (type(None), bool, int, float, str)


def is_launch(target: Any) -> bool:
    return isinstance(target, HigherOrderOperator) and target.name() in (MUTATION, FUNCTIONAL)


def _side_table():
    return triton_kernel_side_table()


# --------------------------------------------------------------------------------------------
# what a kernel is (capture side)


def _jit_function(kernel: Any) -> Any:
    """The JIT function under autotuning and heuristics wrappers (each keeps it as ``fn``)."""
    fn, seen = kernel, 0
    while not isinstance(getattr(fn, "src", None), str) and hasattr(fn, "fn") and seen < 8:
        fn, seen = fn.fn, seen + 1
    if not isinstance(getattr(fn, "src", None), str):
        raise TypeError(f"{type(kernel).__name__} is not a Triton kernel (no source)")
    return fn


def _plain(value: Any) -> Any:
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)  # a dtype or an enum of Triton's: its name, informative


def _configs(kernel: Any) -> tuple[TritonConfig, ...]:
    out = []
    for config in getattr(kernel, "configs", None) or ():
        out.append(TritonConfig(kwargs={str(k): _plain(v) for k, v in dict(getattr(config, "kwargs", {})).items()},
                                **{k: getattr(config, k) for k in ("num_warps", "num_stages", "num_ctas")
                                   if isinstance(getattr(config, k, None), int)}))
    return tuple(out)


def describe(kernel: Any) -> TritonKernelRecord:
    """The record of ``kernel`` without call sites or launches (``index`` 0 until packed)."""
    fn = _jit_function(kernel)
    python_fn = getattr(fn, "fn", None)
    names = [str(n) for n in getattr(fn, "arg_names", ())]
    constexprs = [names[i] for i in getattr(fn, "constexprs", ()) if isinstance(i, int) and i < len(names)]
    return TritonKernelRecord(
        index=0, name=str(getattr(python_fn, "__name__", None) or getattr(fn, "__name__", "kernel")),
        source=fn.src, digest=source_digest(fn.src), arg_names=tuple(names), constexprs=tuple(constexprs),
        module=getattr(python_fn, "__module__", None), configs=_configs(kernel),
        autotune_key=tuple(str(k) for k in getattr(kernel, "keys", None) or ()))


@dataclasses.dataclass
class LiveTritonCall:
    """One launch in memory: the call site's constants (values), the tensor arguments before
    the launch by content, and the tensors it wrote as they were after it."""

    constants: dict[str, Any]
    arguments: dict[str, str]
    written: dict[str, torch.Tensor]


@dataclasses.dataclass
class LiveTritonKernel:
    """A kernel of a graph in memory, beside the graph's custom ops (``LiveCustomOp``): its
    record (without call sites and launches) and its launches."""

    record: TritonKernelRecord
    calls: list[LiveTritonCall] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return f"triton:{self.record.name}:{self.record.digest}"


def has_launches(gm: Any) -> bool:
    return any(is_launch(n.target) or _stand_in_of(n.target) is not None
               for m in gm.modules() if isinstance(getattr(m, "graph", None), torch.fx.Graph)
               for n in m.graph.nodes if n.op == "call_function")


#: Allocations whose contents are whatever the memory held: a kernel's output buffer.
_ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
UNINITIALIZED = " uninitialized"


def fresh_buffers(node: torch.fx.Node) -> set[str]:
    """The tensor arguments of a launch node that it is the first to use after their allocation
    by ``torch.empty*``: output buffers whose contents before the launch mean nothing, so a
    stand-in must not match on them (a replay's buffer holds other garbage)."""
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    fresh = set()
    for name, arg in dict(node.kwargs.get("kwargs") or {}).items():
        if not isinstance(arg, torch.fx.Node) or arg.op not in ("call_function", "call_method"):
            continue
        target = arg.target if isinstance(arg.target, str) else getattr(arg.target, "__name__", "")
        if target.partition(".")[0] in _ALLOCATIONS and min(arg.users, key=order.__getitem__) is node:
            fresh.add(name)
    return fresh


def _matches(recorded: str, key: str) -> bool:
    """A recorded argument against one at replay: by content, or by dtype and shape for a buffer
    recorded as uninitialized."""
    if recorded.endswith(UNINITIALIZED):
        return key.partition(" sha256:")[0] == recorded.removesuffix(UNINITIALIZED)
    return recorded == key


def recorded_launch(target: Any, kwargs: dict, run: Callable[[], Any], live: dict[str, LiveTritonKernel], *,
                    fresh: set[str] = frozenset()) -> Any:
    """Run one launch of a graph being run on real data and record it in ``live`` (by digest):
    the tensors it changed are what it wrote; ``fresh`` output buffers are keyed by dtype and
    shape only (``<dtype>[<shape>] uninitialized``)."""
    table = _side_table()
    kernel = table.get_kernel(kwargs["kernel_idx"])
    constants = dict(table.get_constant_args(kwargs["constant_args_idx"]))
    tensors = {k: v for k, v in kwargs["kwargs"].items() if isinstance(v, torch.Tensor)}
    before = {k: tensor_key(v) for k, v in tensors.items()}
    keys = {k: tensor_key(tensors[k], content=False) + UNINITIALIZED if k in fresh else v for k, v in before.items()}
    out = run()
    after = out if target.name() == FUNCTIONAL else tensors  # the functional form returns new tensors
    written = {k: v.detach().clone() for k, v in after.items()
               if isinstance(v, torch.Tensor) and k in before and tensor_key(v) != before[k]}
    record = describe(kernel)
    entry = live.setdefault(record.digest, LiveTritonKernel(record))
    call = LiveTritonCall({k: _plain(v) for k, v in constants.items()}, keys, written)
    if all((c.constants, c.arguments) != (call.constants, call.arguments) for c in entry.calls):
        entry.calls.append(call)
    return out


# --------------------------------------------------------------------------------------------
# into the archive: launches renumbered to the archive's own records


def archive_records(graph: GraphRecord, live: Iterable[Any], encode_tensor: Callable[[torch.Tensor], Any]
                    ) -> tuple[GraphRecord, tuple[TritonKernelRecord, ...] | None]:
    """The graph record with each launch naming the archive's kernel records, and those records.

    A launch of a traced graph names this process's side table; a stand-in (a loaded archive's
    launch) names the record it came from. Both become ``kernel_idx`` = the kernel's index in
    the archive (first use, one per source digest) and ``constant_args_idx`` = its call site
    among the kernel's ``constants``. ``live``: recorded launches (``LiveTritonKernel``; other
    entries are ignored); ``encode_tensor`` stores a written tensor in the storage table."""
    known = {k.record.digest: k for k in live if isinstance(k, LiveTritonKernel)}
    kernels: dict[str, tuple[TritonKernelRecord, list[dict]]] = {}

    def number(record: TritonKernelRecord, constants: dict) -> tuple[int, int]:
        if record.digest not in kernels:
            kernels[record.digest] = (dataclasses.replace(record, index=len(kernels), constants=(), calls=()), [])
        entry, sites = kernels[record.digest]
        plain = {str(k): _plain(v) for k, v in constants.items()}
        if plain not in sites:
            sites.append(plain)
        return entry.index, sites.index(plain)

    def node(rec: NodeRecord) -> NodeRecord:
        if rec.op != "call_function":
            return rec
        if rec.target in LAUNCH_TARGETS:
            kernel, constants = _side_table_launch(rec)
            k, c = number(known_record(describe(kernel)), constants)
            return dataclasses.replace(rec, kwargs={**rec.kwargs, "kernel_idx": k, "constant_args_idx": c})
        stand_in = _stand_in_of_name(rec.target)
        if stand_in is None:
            return rec
        k, c = number(stand_in.record, stand_in.constants)
        arguments = DictArg(tuple(zip(stand_in.names, rec.args)))
        return NodeRecord(op=rec.op, name=rec.name, target=MUTATION_TARGET, meta=rec.meta, stack=rec.stack, kwargs={
            "kernel_idx": k, "constant_args_idx": c, "grid": stand_in.grid,
            "tma_descriptor_metadata": stand_in.tma, "kwargs": arguments})

    def known_record(record: TritonKernelRecord) -> TritonKernelRecord:
        return known[record.digest].record if record.digest in known else record

    def walk(g: GraphRecord) -> GraphRecord:
        state = tuple(dataclasses.replace(e, graph=walk(e.graph)) if isinstance(e, SubgraphEntry) else e
                      for e in g.module_state)
        return dataclasses.replace(g, nodes=tuple(node(n) for n in g.nodes), module_state=state)

    graph = walk(graph)
    if not kernels:
        return graph, None
    return graph, _kernel_records(kernels, known, encode_tensor)


def _side_table_launch(rec: NodeRecord) -> tuple[Any, dict]:
    """The kernel and constants a traced launch names in this process's side table, which only
    the process that traced the graph holds."""
    table = _side_table()
    kernel_idx, constants_idx = rec.kwargs.get("kernel_idx"), rec.kwargs.get("constant_args_idx")
    try:
        return table.get_kernel(kernel_idx), table.get_constant_args(constants_idx)
    except (AssertionError, KeyError, TypeError):
        raise PackError(f"node {rec.name} launches Triton kernel {kernel_idx!r}, which this process's side "
                        "table does not hold (a dump's graph loses its kernels)",
                        "capture it in the process that traces it: torch.compile(..., "
                        "backend=reproarchive.capture(BACKEND)) records the kernels") from None


def _kernel_records(kernels: dict[str, tuple[TritonKernelRecord, list[dict]]], known: dict[str, LiveTritonKernel],
                    encode_tensor: Callable[[torch.Tensor], Any]) -> tuple[TritonKernelRecord, ...]:
    """The numbered kernels with their call sites and the recorded calls made at those sites
    (a call at a site no graph of the archive launches is left out)."""
    out = []
    for digest, (record, sites) in kernels.items():
        calls = []
        for call in known[digest].calls if digest in known else ():
            if call.constants in sites:
                calls.append(TritonCall(constants=sites.index(call.constants), arguments=dict(call.arguments),
                                        written={k: encode_tensor(v) for k, v in call.written.items()}))
        out.append(dataclasses.replace(record, constants=tuple(sites), calls=tuple(calls)))
    return tuple(out)


# --------------------------------------------------------------------------------------------
# out of the archive: each launch bound to the user's kernel or to a stand-in


@dataclasses.dataclass
class _StandIn:
    """The operator standing in for one call site of one recorded kernel."""

    name: str
    record: TritonKernelRecord
    constants: dict[str, Any]
    names: tuple[str, ...]           # its tensor arguments, in the order the operator takes them
    written: tuple[str, ...]         # the ones it writes
    grid: Any                        # the launch's grid and TMA metadata, as records (for packing)
    tma: Any
    calls: list[LiveTritonCall] = dataclasses.field(default_factory=list)
    library: Any = None

    def kernel(self, *tensors: torch.Tensor) -> None:
        key = {n: tensor_key(t) for n, t in zip(self.names, tensors)}
        for call in self.calls:
            if call.constants == self.constants and all(_matches(v, key.get(n, "")) for n, v in call.arguments.items()):
                for name, value in call.written.items():
                    tensors[self.names.index(name)].copy_(value)
                return
        raise RuntimeError(
            f"stand-in for Triton kernel {self.record.name}: no launch with these inputs was recorded "
            f"({len(self.calls)} recorded); its kernel is not here, so it cannot compute new values "
            "(bring it with --import MODULE)")


#: operator name -> the stand-in registered in this process (a later load replaces its calls).
_STAND_INS: dict[str, _StandIn] = {}


def _stand_in_of(target: Any) -> _StandIn | None:
    if isinstance(target, OpOverload) and target.namespace == STAND_IN_NAMESPACE:
        return _STAND_INS.get(target._opname)
    return None


def _stand_in_of_name(name: str) -> _StandIn | None:
    prefix = f"torch.ops.{STAND_IN_NAMESPACE}."
    return _STAND_INS.get(name[len(prefix):].partition(".")[0]) if name.startswith(prefix) else None


def brought_kernels(modules: Iterable[str]) -> dict[str, list[Any]]:
    """The Triton kernels defined at the top level of the user's modules (``--import``), by
    source digest. Only modules the user named are looked at."""
    found: dict[str, list[Any]] = {}
    for name in modules:
        module = sys.modules.get(name)
        for value in list(vars(module).values()) if module is not None else ():
            if type(value).__module__.partition(".")[0] != "triton":
                continue
            try:
                record = describe(value)
            except TypeError:
                continue
            found.setdefault(record.digest, []).append(value)
    return found


class LaunchBinder:
    """Binds each launch of a graph being decoded (``codec.graphs.GraphDecoder``): to the user's
    kernel of the same source digest and configurations where one was brought, else to a
    stand-in answering from the recorded launches. ``stand_ins`` names the kernels stood in for."""

    def __init__(self, records: Sequence[TritonKernelRecord], brought: dict[str, list[Any]],
                 calls: dict[str, list[LiveTritonCall]] | None = None):
        self._records = {r.index: r for r in records}
        self._brought = brought
        self._calls = calls or {}
        self.stand_ins: list[str] = []

    def real_kernel(self, record: TritonKernelRecord) -> Any | None:
        for kernel in self._brought.get(record.digest, ()):
            if _configs(kernel) == record.configs:
                return kernel
        return None

    def bind(self, target_name: str, args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
        record = self._records[kwargs["kernel_idx"]]
        constants = dict(record.constants[kwargs["constant_args_idx"]])
        kernel = self.real_kernel(record)
        if kernel is not None:
            table = _side_table()
            bound = {**kwargs, "kernel_idx": table.add_kernel(kernel),
                     "constant_args_idx": table.add_constant_args(constants)}
            return getattr(torch.ops.higher_order, target_name.rpartition(".")[2]), args, bound
        if target_name != MUTATION_TARGET:
            raise NotReplayableHereError(
                f"the graph launches Triton kernel {record.name} in its functional form, which only the kernel "
                "itself can run: it is not here", "bring it: --import MODULE (the module that defines it)",
                rule=Rule.CALL_TARGET)
        names = tuple(k for k, v in kwargs["kwargs"].items() if isinstance(v, torch.fx.Node))
        recorded = [c for c in self._calls.get(record.digest, ()) if c.constants == constants]
        written = sorted({n for c in recorded for n in c.written}) if recorded else names
        stand_in = _stand_in(record, constants, names, tuple(n for n in names if n in written))
        stand_in.calls = recorded
        stand_in.grid, stand_in.tma = encode_arg(kwargs.get("grid")), encode_arg(kwargs.get("tma_descriptor_metadata"))
        if record.name not in self.stand_ins:
            self.stand_ins.append(record.name)
        op = getattr(getattr(torch.ops, STAND_IN_NAMESPACE), stand_in.name).default
        return op, tuple(kwargs["kwargs"][n] for n in names), {}


def _stand_in(record: TritonKernelRecord, constants: dict, names: tuple[str, ...],
              written: tuple[str, ...]) -> _StandIn:
    identity = json.dumps([record.digest, constants, names, written], sort_keys=True, default=str)
    name = "k_" + hashlib.sha256(identity.encode()).hexdigest()[:20]
    if name in _STAND_INS:
        return _STAND_INS[name]
    stand_in = _StandIn(name, record, constants, names, written, grid=None, tma=None)
    params = ", ".join(f"Tensor(a{i}!) t{i}" if n in written else f"Tensor t{i}" for i, n in enumerate(names))
    stand_in.library = define_operator(STAND_IN_NAMESPACE, f"{name}({params}) -> ()", stand_in.kernel,
                                       lambda *tensors: None)  # it writes its arguments, returns nothing
    _STAND_INS[name] = stand_in
    return stand_in


def differences(records: Sequence[TritonKernelRecord] | None, brought: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Rows for ``doctor``: each recorded kernel the user did not bring, or brought another version of."""
    rows = []
    by_name: dict[str, list[str]] = {}
    for digest, kernels in brought.items():
        for kernel in kernels:
            by_name.setdefault(describe(kernel).name, []).append(digest)
    for record in records or ():
        recorded = f"{record.module or '?'}.{record.name} {record.digest[:19]}..."
        if any(_configs(k) == record.configs for k in brought.get(record.digest, ())):
            continue
        if record.digest in brought:
            current = "brought with other autotuning configurations: `run` stands in for it"
        elif record.name in by_name:
            current = (f"another version here ({by_name[record.name][0][:19]}...): `run` stands in for it from its "
                       f"{len(record.calls)} recorded launch(es)")
        else:
            current = (f"not here: `run` stands in for it from its {len(record.calls)} recorded launch(es); "
                       "bring it with --import MODULE")
        rows.append({"what": "triton kernel", "name": record.name, "recorded": recorded, "current": current,
                     "important": True})
    return rows
