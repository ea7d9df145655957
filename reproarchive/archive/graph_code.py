"""The graph as code people read: ``inspect --graph``, and the line ``view`` shows per node.

Every archive writer of ours stores ``graph.py``, torch's own ``print_readable`` of the graph
(shapes, strides and devices as annotations) — the form PyTorch engineers already read in
repro scripts and tlparse. That text is kept as it is. An archive without it (another writer;
the member is optional to readers) gets the same structure rendered from the graph records.
Either way the text is only ever shown, never run, and terminal control characters are
replaced so that printing an archive from someone else cannot drive the terminal.
"""

from __future__ import annotations

import os
import re

from reproarchive.format import layout
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import (
    COMPUTE_OPS,
    ComplexArg,
    ConstantArg,
    DictArg,
    EllipsisArg,
    GraphRecord,
    NodeRecord,
    NodeRef,
    SliceArg,
    StackFrame,
    TupleArg,
)

GRAPH_CODE_MEMBER = layout.GRAPH_CODE_MEMBER
#: A larger graph.py is not shown as stored (a hostile archive could declare gigabytes); the
#: code is rendered from the records instead.
MAX_GRAPH_CODE_BYTES = 64 << 20

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
# ``name: "f32[8, 32][32, 1]cpu" = ...`` or ``name = ...`` at the start of a line of print_readable
_ASSIGNMENT = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?::\s*"[^"]*"\s*)?=(?!=)')


def printable(text: str) -> str:
    """``text`` with control characters (ANSI escapes, carriage returns ...) shown as ``?``."""
    return _CONTROL.sub("?", text)


def graph_code(path: str | os.PathLike, *, limits: layout.Limits = layout.DEFAULT_LIMITS) -> str:
    """The readable code of the archive's graph: its ``graph.py``, or code rendered from the
    graph records when the archive has none. Reads the index and that one small member."""
    with ContainerReader(path, limits=limits) as reader:
        return stored_or_rendered_code(reader)


def stored_or_rendered_code(reader: ContainerReader) -> str:
    """``graph.py`` of an open archive (or the records rendered), safe to print."""
    member = reader.members.get(GRAPH_CODE_MEMBER)
    if member is not None and member.size <= MAX_GRAPH_CODE_BYTES:
        return printable(reader.read_member(GRAPH_CODE_MEMBER).decode("utf-8", errors="replace"))
    return render_code(reader.index.graph)


def node_lines(code: str, graph: GraphRecord) -> dict[str, str]:
    """The line of ``code`` that computes each node, by node name; nodes that no line assigns
    (inputs of a graph without Dynamo's aliasing lines, the output) get their rendered line."""
    wanted = {n.name for n in graph.nodes}
    found: dict[str, str] = {}
    for line in code.splitlines():
        m = _ASSIGNMENT.match(line)
        if m and m.group(1) in wanted and m.group(1) not in found:
            found[m.group(1)] = line.strip()
    for node in graph.nodes:
        if node.name not in found:
            found[node.name] = node_line(node)
    return found


def render_code(graph: GraphRecord) -> str:
    """The graph records as FX-style Python (for people; it is never executed)."""
    params = ", ".join(["self", *(n.target for n in graph.placeholders())])
    body = [f"        {node_line(n)}" for n in graph.nodes if n.op != "placeholder"]
    return printable("\n".join(["class GraphModule(torch.nn.Module):", f"    def forward({params}):", *body]) + "\n")


def node_line(node: NodeRecord) -> str:
    """One node as the statement FX would generate for it, with its recorded value's type."""
    args = [_arg(a) for a in node.args] + [f"{k} = {_arg(v)}" for k, v in node.kwargs.items()]
    if node.op == "placeholder":
        return printable(f"{node.name}{_annotation(node)}  # input {node.target}")
    if node.op == "output":
        return printable(f"return {args[0] if args else 'None'}")
    if node.op == "get_attr":
        call = f"self.{node.target}"
    elif node.op == "call_method" and args:
        call = f"{args[0]}.{node.target}({', '.join(args[1:])})"
    elif node.op == "call_module":
        call = f"self.{node.target}({', '.join(args)})"
    else:
        call = f"{node.target}({', '.join(args)})"
    return printable(f"{node.name}{_annotation(node)} = {call}")


#: Where torch's own files are, as a writer redacts them: frames there are torch's code, not the model's.
_TORCH_FILES = "<site-packages>/torch/"


def source_line(stack: tuple[StackFrame, ...]) -> str | None:
    """The model line a node's stack (format 1.7) names, on one line: its innermost frame outside
    torch's own files (``./model.py:12 in forward: y = self.lin(x)``; flex_attention's body is
    traced inside torch, and FX's own tracer records only its own frames), or None."""
    frame = next((f for f in reversed(stack) if not f.file.startswith(_TORCH_FILES)), None)
    if frame is None:
        return None
    return printable(f"{frame.file}:{frame.line} in {frame.name}" + (f": {frame.code}" if frame.code else ""))


def model_lines(graph: GraphRecord) -> list[str]:
    """The distinct model lines (``source_line``) the graph's compute ops came from, in graph
    order: what ``inspect`` lists and a triage culprit names."""
    lines = (source_line(graph.stacks[n.stack]) for n in graph.nodes if n.op in COMPUTE_OPS and n.stack is not None)
    return list(dict.fromkeys(line for line in lines if line is not None))


def _annotation(node: NodeRecord) -> str:
    val = node.meta.get("val") if isinstance(node.meta, dict) else None
    if isinstance(val, dict) and "dtype" in val and isinstance(val.get("shape"), list):
        return f': "{val["dtype"]}[{", ".join(str(s) for s in val["shape"])}]{val.get("device") or ""}"'
    return ""


def _arg(value) -> str:
    if isinstance(value, NodeRef):
        return value.name
    if isinstance(value, TupleArg):
        items = [_arg(v) for v in value.items]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if isinstance(value, list):
        return f"[{', '.join(_arg(v) for v in value)}]"
    if isinstance(value, DictArg):
        return "{" + ", ".join(f"{_arg(k)}: {_arg(v)}" for k, v in value.items) + "}"
    if isinstance(value, SliceArg):
        return f"slice({_arg(value.start)}, {_arg(value.stop)}, {_arg(value.step)})"
    if isinstance(value, ConstantArg):
        if value.kind == "operator":
            return value.name
        return f"torch.device({value.name!r})" if value.kind == "device" else f"torch.{value.name}"
    if isinstance(value, EllipsisArg):
        return "..."
    if isinstance(value, ComplexArg):
        return f"complex({value.real!r}, {value.imag!r})"
    return repr(value)
