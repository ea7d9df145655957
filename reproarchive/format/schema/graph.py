"""The graph (spec §7): nodes, their arguments (§7.2) and module state, part of the schema.

Data only, like every schema module (``schema_check`` refuses anything else here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Union

from reproarchive.format.plain import ArgCodec, PlainData, Tagged, omit_none
from reproarchive.format.schema.sets import COMPUTE_OPS, ConstantKind, Layout, MemoryFormat, NodeOp, TensorKind
from reproarchive.format.schema.values import TensorValue

# -- §7.2 graph arguments ------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeRef:
    name: str


@dataclass(frozen=True)
class TupleArg:
    items: tuple


@dataclass(frozen=True)
class DictArg:
    items: tuple  # (key, value) pairs


@dataclass(frozen=True)
class SliceArg:
    start: Any
    stop: Any
    step: Any


@dataclass(frozen=True)
class ConstantArg:
    """A named torch constant: ``kind`` is ``dtype``, ``device``, ``memory_format`` or ``layout``."""

    kind: ConstantKind
    name: str


@dataclass(frozen=True)
class EllipsisArg:
    pass


@dataclass(frozen=True)
class ComplexArg:
    real: float
    imag: float


#: One graph argument: nil, bool, int64, float, str, a list of arguments, or one of the records above.
Arg = Annotated[Any, ArgCodec(node=NodeRef, tuple=TupleArg, dict=DictArg, slice=SliceArg, constant=ConstantArg,
                              ellipsis=EllipsisArg, complex=ComplexArg,
                              constants={ConstantKind.DTYPE: None, ConstantKind.DEVICE: None,
                                         ConstantKind.MEMORY_FORMAT: MemoryFormat, ConstantKind.LAYOUT: Layout,
                                         ConstantKind.OPERATOR: None})]


# -- §7 graph ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StackFrame:
    """(1.7) One frame of the source stack a node was traced at, as Python's traceback prints it
    (``File "./model.py", line 12, in forward`` / the code / the carets under it). Paths are
    redacted as records are (spec §8); the text never holds a line break (FX pastes it into the
    code it generates)."""

    file: str
    line: int
    name: str
    code: str | None = omit_none()   # the source line, stripped; absent when the source was not found
    marks: str | None = omit_none()  # the caret line under it (spaces, ``^`` and ``~``), as printed


@dataclass(frozen=True)
class NodeRecord:
    op: NodeOp
    name: str
    target: str
    args: tuple[Arg, ...] = ()
    kwargs: dict[str, Arg] = field(default_factory=dict)
    meta: PlainData | None = omit_none()
    stack: int | None = omit_none()  # (1.7) the node's stack: an index into its graph's ``stacks``


@dataclass(frozen=True)
class TensorEntry:
    """A tensor attribute: a ``parameter`` (its requires_grad is the tensor's), a ``buffer``
    (``persistent`` or not) or a plain ``constant``."""

    kind: TensorKind
    path: str
    tensor: TensorValue
    persistent: bool | None = omit_none()


@dataclass(frozen=True)
class SubgraphEntry:
    TAG_KEY: ClassVar[str] = "kind"
    TAG: ClassVar[str] = "graph"
    path: str
    graph: "GraphRecord"


@dataclass(frozen=True)
class ModuleEntry:
    TAG_KEY: ClassVar[str] = "kind"
    TAG: ClassVar[str] = "module"
    path: str
    class_name: str = field(metadata={"key": "class"})
    training: bool = False
    attributes: dict[str, Arg] = field(default_factory=dict)


StateEntry = Annotated[
    Union[TensorEntry, SubgraphEntry, ModuleEntry],
    Tagged("kind", {**{k.value: TensorEntry for k in TensorKind}, "graph": SubgraphEntry, "module": ModuleEntry}),
]


@dataclass(frozen=True)
class GraphRecord:
    nodes: tuple[NodeRecord, ...]
    module_state: tuple[StateEntry, ...] = ()
    # (1.7) the distinct stacks its nodes were traced at, each its frames outermost first
    stacks: tuple[tuple[StackFrame, ...], ...] | None = omit_none()

    def placeholders(self) -> list[NodeRecord]:
        return [n for n in self.nodes if n.op == "placeholder"]

    def op_histogram(self) -> dict[str, int]:
        """Compute nodes by target (methods as ``Tensor.<name>``), largest first: what ``inspect``
        shows and what every op count in reproarchive is taken from."""
        histogram: dict[str, int] = {}
        for n in self.nodes:
            if n.op in COMPUTE_OPS:
                key = f"Tensor.{n.target}" if n.op == "call_method" else n.target
                histogram[key] = histogram.get(key, 0) + 1
        return dict(sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0])))

    def op_count(self) -> int:
        return sum(1 for n in self.nodes if n.op in COMPUTE_OPS)

    def tensors(self):
        """The tensor records of module state, subgraphs included."""
        for entry in self.module_state:
            if isinstance(entry, TensorEntry):
                yield entry.tensor
            elif isinstance(entry, SubgraphEntry):
                yield from entry.graph.tensors()
