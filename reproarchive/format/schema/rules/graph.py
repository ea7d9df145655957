"""The rules of the graph (spec §7): node names defined once and referred to only after, one
output, call targets that are names, attributes that module state holds, subgraphs nested at
most ``MAX_GRAPH_DEPTH`` deep, stack frames that are one line of text each; and the walks over
graph arguments that the rules and readers share."""

from __future__ import annotations

from typing import Any

from reproarchive.errors import Rule, SchemaViolation, UnsafeArchiveError
from reproarchive.format.schema import (
    MAX_FRAME_TEXT,
    MAX_GRAPH_DEPTH,
    MAX_STACK_FRAMES,
    DictArg,
    GraphRecord,
    ModuleEntry,
    NodeOp,
    NodeRef,
    SliceArg,
    SubgraphEntry,
    TensorEntry,
    TupleArg,
)
from reproarchive.format.schema.rules.names import (
    HOSTILE,
    IDENTIFIER_RE,
    LINE_BREAKING,
    check_attribute_path,
    function_name_problem,
    method_name_problem,
)
from reproarchive.format.schema.rules.values import check_tensor

_NODE_OPS = frozenset(NodeOp)


def check_graph(graph: GraphRecord, storages, path: tuple, depth: int) -> None:
    if depth > MAX_GRAPH_DEPTH:
        raise SchemaViolation(f"subgraphs nest deeper than {MAX_GRAPH_DEPTH}", path, Rule.GRAPH_DEPTH)
    state_paths = _check_module_state(graph, storages, path, depth)
    stacks = _check_stacks(graph.stacks or (), path)
    defined: set[str] = set()
    outputs = 0
    for i, node in enumerate(graph.nodes):
        where = (*path, "nodes", i)
        if node.op not in _NODE_OPS:
            raise SchemaViolation(f"op {node.op[:30]!r} is not an FX op", where, Rule.NODE_OP)
        if not IDENTIFIER_RE.match(node.name):
            raise SchemaViolation(f"node name {node.name[:60]!r} is not an identifier", where, Rule.NODE_NAME)
        if node.name in defined:
            raise SchemaViolation(f"node name {node.name!r} appears twice", where, Rule.NODE_NAME)
        for key in node.kwargs:
            if not IDENTIFIER_RE.match(key):
                raise UnsafeArchiveError(f"keyword argument name {key[:80]!r} is not an identifier", HOSTILE,
                                         rule=Rule.NODE_KWARG_NAME)
        for ref in (*iter_arg_refs(node.args), *iter_arg_refs(list(node.kwargs.values()))):
            if ref not in defined:
                raise SchemaViolation(f"argument refers to node {ref[:60]!r}, which is not defined before it", where,
                                      Rule.ARG_REF)
        _check_target(node.op, node.target, state_paths, where)
        if node.stack is not None and not 0 <= node.stack < stacks:
            raise SchemaViolation(f"stack {node.stack} is not one of the graph's {stacks} stacks", (*where, "stack"),
                                  Rule.NODE_STACK)
        outputs += node.op == NodeOp.OUTPUT
        defined.add(node.name)
    if outputs != 1:
        raise SchemaViolation(f"the graph has {outputs} output nodes, expected exactly one", path, Rule.NODE_OUTPUT)


def _check_stacks(stacks, path: tuple) -> int:
    """(1.7) Every frame of every stack is text of one line: FX pastes a node's innermost frame
    into the code it generates (``# File: ./model.py:12 in forward, code: ...``), so a line break
    there would be code. The number of stacks."""
    for i, stack in enumerate(stacks):
        where = (*path, "stacks", i)
        if not 0 < len(stack) <= MAX_STACK_FRAMES:
            raise SchemaViolation(f"a stack has {len(stack)} frames; 1 to {MAX_STACK_FRAMES} are allowed", where,
                                  Rule.NODE_STACK)
        for j, frame in enumerate(stack):
            for key in ("file", "name", "code", "marks"):
                text = getattr(frame, key)
                if text is None:
                    continue
                if len(text) > MAX_FRAME_TEXT:
                    raise SchemaViolation(f"{key} is longer than {MAX_FRAME_TEXT} characters", (*where, j, key),
                                          Rule.NODE_STACK)
                if LINE_BREAKING.search(text):
                    raise UnsafeArchiveError(f"stack frame {key} {text[:80]!r} holds a control character", HOSTILE,
                                             rule=Rule.NODE_STACK)
            if frame.marks is not None and frame.marks.strip(" ^~"):
                raise SchemaViolation("marks hold more than spaces, ^ and ~", (*where, j, "marks"), Rule.NODE_STACK)
            if frame.line < 0:
                raise SchemaViolation("line is negative", (*where, j, "line"), Rule.NODE_STACK)
    return len(stacks)


def _check_target(op: str, target: str, state_paths: set[str], where: tuple) -> None:
    refuse = "an archive may only call torch tensor operations; refusing to load it"
    if op == NodeOp.PLACEHOLDER:
        if not IDENTIFIER_RE.match(target.removeprefix("**").removeprefix("*")):
            # pasted into the generated ``def forward(...)`` line
            raise UnsafeArchiveError(f"placeholder target {target[:80]!r} is not a parameter name", HOSTILE,
                                     rule=Rule.NODE_PLACEHOLDER)
    elif op == NodeOp.CALL_FUNCTION:
        if function_name_problem(target):
            raise UnsafeArchiveError(f"graph calls {target[:120]!r}, which is not a qualified name", refuse,
                                     rule=Rule.NODE_FUNCTION_NAME)
    elif op == NodeOp.CALL_METHOD:
        if method_name_problem(target):
            raise UnsafeArchiveError(f"method name {target[:80]!r} is malformed", refuse, rule=Rule.NODE_METHOD_NAME)
    elif op in (NodeOp.GET_ATTR, NodeOp.CALL_MODULE):
        check_attribute_path(target)
        if not any(target == p or p.startswith(target + ".") or target.startswith(p + ".") for p in state_paths):
            raise SchemaViolation(f"refers to attribute {target!r}, which module_state lacks", where,
                                  Rule.NODE_ATTRIBUTE)


def _check_module_state(graph: GraphRecord, storages, path: tuple, depth: int) -> set[str]:
    state_paths: set[str] = set()
    for j, entry in enumerate(graph.module_state):
        where = (*path, "module_state", j)
        check_attribute_path(entry.path)
        if entry.path in state_paths:
            raise SchemaViolation(f"module_state path {entry.path!r} appears twice", where, Rule.STATE_PATH)
        state_paths.add(entry.path)
        if isinstance(entry, TensorEntry):
            check_tensor(entry.tensor, storages, (*where, "tensor"))
        elif isinstance(entry, SubgraphEntry):
            check_graph(entry.graph, storages, (*where, "graph"), depth + 1)
        elif isinstance(entry, ModuleEntry):
            for key in entry.attributes:
                if key.startswith("__"):
                    raise SchemaViolation(f"module {entry.path!r} has a forbidden attribute {key[:40]!r}", where,
                                          Rule.STATE_MODULE)
    return state_paths


def iter_arg_values(value: Any):
    """Every argument value inside an argument (itself included), depth first."""
    yield value
    if isinstance(value, (list, tuple)):
        inner = value
    elif isinstance(value, TupleArg):
        inner = value.items
    elif isinstance(value, DictArg):
        inner = [x for pair in value.items for x in pair]
    elif isinstance(value, SliceArg):
        inner = (value.start, value.stop, value.step)
    else:
        return
    for x in inner:
        yield from iter_arg_values(x)


def iter_arg_refs(value: Any):
    """Names of the nodes an argument refers to."""
    for v in iter_arg_values(value):
        if isinstance(v, NodeRef):
            yield v.name
