"""The rules of the ``triton_kernels`` record (spec §8 "triton_kernels", 1.4, rule R8-7): user
Triton kernels as data, checked once when the index is decoded.

A graph that launches a user Triton kernel names it by ``kernel_idx``, an index into the
recording process's side table, which means nothing anywhere else. The archive keeps each kernel
as a record of that index, and these checks make every launch in every graph of the archive name
a recorded kernel and one of its constants entries, so that ``codec.triton_kernels`` can bind each
launch to a stand-in or to the user's own kernel and never to whatever this process's side table
holds at that index. The source digest is recomputed here: the digest is what a user's kernel is
matched by, so it must be the digest of the source the archive shows.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Iterator

from reproarchive.errors import LimitExceededError, Rule, SchemaViolation
from reproarchive.format.layout import Limits
from reproarchive.format.schema import DictArg, GraphRecord, Index, NodeOp, SubgraphEntry, TritonKernelRecord

#: The graph targets that launch a kernel of the side table.
LAUNCH_TARGETS = frozenset({"torch.ops.higher_order.triton_kernel_wrapper_mutation",
                            "torch.ops.higher_order.triton_kernel_wrapper_functional"})

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def source_digest(source: str) -> str:
    """``sha256:<hex>`` of a kernel's source text (UTF-8): what identifies a kernel."""
    return "sha256:" + hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()


def graphs_of(index: Index) -> Iterator[tuple[tuple, GraphRecord]]:
    """Every graph record of the archive with its path: the graph, its subgraphs, the job's."""
    def walk(graph: GraphRecord, where: tuple):
        yield where, graph
        for i, entry in enumerate(graph.module_state):
            if isinstance(entry, SubgraphEntry):
                yield from walk(entry.graph, (*where, "module_state", i, "graph"))

    yield from walk(index.graph, ("graph",))
    for g, graph in enumerate(index.job.graphs if index.job is not None else ()):
        yield from walk(graph, ("job", "graphs", g))


def launch_kwargs(node: Any) -> tuple[Any, Any, Any]:
    """``kernel_idx``, ``constant_args_idx`` and the ``kwargs`` argument of a launch node."""
    return node.kwargs.get("kernel_idx"), node.kwargs.get("constant_args_idx"), node.kwargs.get("kwargs")


def check_triton_kernels(index: Index, caps: Limits, check_value) -> None:
    """R8-7, in order: each record (unique index, identifiers, the digest of its source, calls
    that name its constants and its parameters), then every launch node of every graph."""
    kernels = index.triton_kernels or ()
    by_index: dict[int, TritonKernelRecord] = {}
    if sum(len(k.calls) for k in kernels) > caps.max_members:
        raise LimitExceededError(f"index records more than {caps.max_members} Triton kernel launches",
                                 rule=Rule.STORAGE_TOTAL)
    for i, kernel in enumerate(kernels):
        _check_record(kernel, ("triton_kernels", i), index, check_value)
        if kernel.index in by_index:
            raise _bad(f"kernel index {kernel.index} is recorded twice", "triton_kernels", i, "index")
        by_index[kernel.index] = kernel
    for where, graph in graphs_of(index):
        for n, node in enumerate(graph.nodes):
            if node.op == NodeOp.CALL_FUNCTION and node.target in LAUNCH_TARGETS:
                _check_launch(node, by_index, (*where, "nodes", n))


def _check_record(kernel: TritonKernelRecord, where: tuple, index: Index, check_value) -> None:
    if kernel.index < 0:
        raise _bad("a kernel index is not negative", *where, "index")
    if not _IDENT.match(kernel.name):
        raise _bad(f"{kernel.name[:40]!r} is not an identifier", *where, "name")
    if source_digest(kernel.source) != kernel.digest:
        raise _bad("is not the sha256 of the kernel's source", *where, "digest")
    for j, name in enumerate(kernel.arg_names):
        if not _IDENT.match(name):
            raise _bad(f"{name[:40]!r} is not an identifier", *where, "arg_names", j)
    if len(set(kernel.arg_names)) != len(kernel.arg_names):
        raise _bad("names a parameter twice", *where, "arg_names")
    params = set(kernel.arg_names)
    for j, name in enumerate(kernel.constexprs):
        if name not in params:
            raise _bad(f"{name[:40]!r} is not a parameter of the kernel", *where, "constexprs", j)
    for j, call in enumerate(kernel.calls):
        at = (*where, "calls", j)
        if not 0 <= call.constants < len(kernel.constants):
            raise _bad(f"constants entry {call.constants} does not exist", *at, "constants")
        for name in call.arguments:
            if name not in params:
                raise _bad(f"{name[:40]!r} is not a parameter of the kernel", *at, "arguments")
        for name, value in call.written.items():
            if name not in call.arguments:
                raise _bad(f"{name[:40]!r} is written but not an argument of the call", *at, "written")
            check_value(value, index.storages, (*at, "written", name), 0)


def _check_launch(node: Any, kernels: dict[int, TritonKernelRecord], where: tuple) -> None:
    kernel_idx, constants_idx, arguments = launch_kwargs(node)
    if type(kernel_idx) is not int or kernel_idx not in kernels:
        raise _bad(f"launches Triton kernel {kernel_idx!r}, which the archive does not record (triton_kernels)",
                   *where, "kwargs", "kernel_idx")
    kernel = kernels[kernel_idx]
    if type(constants_idx) is not int or not 0 <= constants_idx < len(kernel.constants):
        raise _bad(f"constants entry {constants_idx!r} of kernel {kernel.name} does not exist",
                   *where, "kwargs", "constant_args_idx")
    if node.args or not isinstance(arguments, DictArg):
        raise _bad("a kernel launch passes its arguments as the map `kwargs`", *where, "kwargs", "kwargs")
    params = set(kernel.arg_names)
    for key, _ in arguments.items:
        if not isinstance(key, str) or key not in params:
            raise _bad(f"{str(key)[:40]!r} is not a parameter of kernel {kernel.name}", *where, "kwargs", "kwargs")


def _bad(problem: str, *path) -> SchemaViolation:
    return SchemaViolation(problem, tuple(path), Rule.TRITON_KERNEL)
