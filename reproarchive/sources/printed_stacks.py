"""The model lines of a graph rebuilt from printed code (a TORCH_TRACE log's, a PyTorch dump's),
given back to its nodes.

Printed code loses each node's stack. A TORCH_TRACE log keeps the innermost frame:
``print_readable`` writes it above the lines it traced (``# File: /work/model.py:12 in forward,
code: y = self.lin(x)``); Inductor's ``fx_graph_runnable`` is another print of a graph the log
prints with its comments (``before_post_grad_graph``, or the AOT graph when no pass changed
it). A dump keeps none, but ``capture --`` notes each compiled graph's calls with their stacks
in the process that compiles it (``noted_calls``). The rebuilt graph is traced from the printed
code, so its call nodes come in the order of the printed calls: each gets its frame, or none
when the calls disagree (a line the rebuild keeps no node for), never a frame guessed for
another node. The archive records a node's stack (spec §7.1), the paths redacted when packed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from reproarchive.codec.stacks import NO_STACK_COMMENT, SOURCE_FRAME, format_stack
from reproarchive.compat import fx_meta
from reproarchive.format.schema import StackFrame

_COMMENT = re.compile(rf"^ {{8}}# File: {SOURCE_FRAME}$")
_NO_STACK = f"        {NO_STACK_COMMENT}"
_CALL = re.compile(r"^ {8}(?P<name>[A-Za-z_]\w*)(?:\s*:\s*\"[^\"]*\")?\s*=\s*(?P<value>.+?)(?:;.*)?$")
_PLAIN = re.compile(r"[A-Za-z_]\w*|self(?:\.\w+)+")
_CALL_OPS = ("call_function", "call_method", "call_module")

#: What a rebuild says when the log names source lines it could not give to the graph's nodes.
NOT_MATCHED = "the log's source lines do not match the rebuilt graph's calls one for one: not recorded"


def printed_calls(code: str) -> list[tuple[str, str | None]]:
    """Each call the top graph's ``forward`` prints, in order: the name it assigns and the stack
    text of the frame named above it (as Dynamo prints a node's ``stack_trace``), or None.
    Nested classes (the subgraphs of higher-order operators) are indented deeper and not read."""
    calls: list[tuple[str, str | None]] = []
    current: str | None = None
    inside = False
    for line in code.splitlines():
        if line.startswith("    def forward("):
            inside = True
            continue
        if not inside or not line.strip():
            continue
        if not line.startswith("        "):
            inside = line.startswith("    )")  # the end of a signature printed over several lines
            continue
        if line.startswith(_NO_STACK):
            current = None
        elif found := _COMMENT.match(line):
            current = format_stack((StackFrame(found["file"], int(found["line"]), found["name"], found["code"]),))
        elif (call := _CALL.match(line)) and not _PLAIN.fullmatch(call["value"].strip()):
            calls.append((call["name"], current))
    return calls


def give_stacks(gm: Any, logged: Sequence[str], *, rebuilt_from: str | None = None,
                paths: Callable[[str], str] = str) -> bool:
    """Give ``gm``'s call nodes the frames a ``logged`` graph's code names above their lines
    (``paths`` rewrites the text: the log's own folders). ``rebuilt_from``: the code ``gm`` was
    traced from when it is another print of the graph (``fx_graph_runnable``): the first logged
    print whose calls are its calls, name for name, is read. False, and none given, when no
    print matches the rebuilt graph's calls one for one."""
    names = None if rebuilt_from is None else [name for name, _ in printed_calls(rebuilt_from)]
    for code in logged:
        calls = printed_calls(code)
        if names is None or [name for name, _ in calls] == names:
            return give_calls(gm, calls, paths=paths)
    return False


def give_calls(gm: Any, calls: Sequence[tuple[str, str | None]], *, rebuilt_from: str | None = None,
               paths: Callable[[str], str] = str) -> bool:
    """Give ``gm``'s call nodes, in order, the stacks of ``calls`` (name, stack text or None:
    a graph's calls as its process noted them, or as a log printed them); ``rebuilt_from``: the
    code ``gm`` was traced from, whose calls must be ``calls``, name for name. False, and none
    given, when they do not match one for one."""
    if rebuilt_from is not None and [name for name, _ in printed_calls(rebuilt_from)] != [n for n, _ in calls]:
        return False
    nodes = [n for n in gm.graph.nodes if n.op in _CALL_OPS]
    if len(nodes) != len(calls) or not any(text for _, text in calls):
        return False
    for node, (_, text) in zip(nodes, calls):
        if text is not None:
            fx_meta.set_stack_trace(node, paths(text))
    return True


def noted_calls(gm: Any) -> dict[str, Any]:
    """``gm``'s call nodes and their stacks as a process notes them for a dump packed later
    (``give_noted``): each distinct stack text once."""
    texts: dict[str, int] = {}
    calls = []
    for node in gm.graph.nodes:
        if node.op in _CALL_OPS:
            text = fx_meta.stack_trace_of(node)
            calls.append([node.name, None if not text else texts.setdefault(text, len(texts))])
    return {"texts": list(texts), "calls": calls}


def give_noted(gm: Any, noted: Any, rebuilt_from: str) -> bool:
    """``give_calls`` with what ``noted_calls`` noted (None, or a note of another shape: False)."""
    try:
        texts, calls = noted["texts"], noted["calls"]
        pairs = [(str(name), None if k is None else str(texts[k])) for name, k in calls]
    except (TypeError, KeyError, IndexError, ValueError):
        return False
    return give_calls(gm, pairs, rebuilt_from=rebuilt_from)
