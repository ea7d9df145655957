"""The rules of the index (spec §5 rules 6, 7 and 9, §6–§8): decode and encode, one checker per
spec section, every refusal tagged with its rule id (``errors.Rule``).

``decode_index`` turns the index member's bytes into a ``schema.Index`` and checks every rule in
the order the spec lists them; code that holds an ``Index`` never re-checks a field or reads a
raw map. ``encode_index`` is its mirror and runs the same checks, so a writer cannot produce an
index this reader refuses. The converters check types (rule R6-1); the checkers below check
values, ranges and references, each under the rule of its own section.

Only rules that are properties of the bytes live here (this layer knows nothing of torch).
What depends on the torch doing the reading (is this call target allowed by its effects, does
this torch know this device type) is checked by ``reproarchive.codec`` when records become
torch objects; the *shape* of a call-target or method name is written here once and used there.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from typing import Any, Union

from reproarchive.errors import IndexSchemaError, LimitExceededError, Rule, SchemaViolation, UnsafeArchiveError
from reproarchive.format import index_codec
from reproarchive.format.digests import DIGEST_RE
from reproarchive.format.job_rules import check_job, job_node_count
from reproarchive.format.layout import (
    DEFAULT_LIMITS,
    INDEX_MEMBER,
    LAYOUT_MEMBER,
    MAX_FRAME_SIZE,
    MIN_FRAME_SIZE,
    Limits,
    check_member_name,
    is_blob_name,
)
from reproarchive.format.plain import decoder_for, encode
from reproarchive.format.schema import (
    DERIVED_KINDS,
    DTYPES,
    FORMAT_NAME,
    MAX_ATTRIBUTE_PATH_LENGTH,
    MAX_EXTENT,
    MAX_GRAPH_DEPTH,
    MAX_RANK,
    MAX_TARGET_LENGTH,
    MAX_VALUE_DEPTH,
    SCALAR_KINDS,
    SHAPE_DIM_KINDS,
    SHAPE_INPUT_KINDS,
    SYMBOL_KINDS,
    ContainerRecord,
    CustomOpRecord,
    DerivedValue,
    DictArg,
    DigestAlgorithm,
    FailureRecord,
    Fidelity,
    GraphRecord,
    Index,
    JobRecord,
    ModuleEntry,
    NodeOp,
    NodeRef,
    Records,
    RngRecord,
    ScalarValue,
    SequenceValue,
    ShapePolicy,
    SliceArg,
    Stage,
    StorageRecord,
    SubclassValue,
    SubgraphEntry,
    SymValue,
    TensorEntry,
    TensorValue,
    TritonKernelRecord,
    TupleArg,
    Value,
)
from reproarchive.format.triton_rules import check_triton_kernels

IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DEVICE_RE = re.compile(r"^[a-z][a-z0-9_]*(?::[0-9]{1,4})?$")
_QUALIFIED_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")

_STAGES = frozenset(Stage)
_NODE_OPS = frozenset(NodeOp)
_ALGORITHMS = frozenset(DigestAlgorithm)
_HOSTILE = "the archive is hostile or damaged; refusing to build its graph"


# -- reading and writing -------------------------------------------------------------------------


def decode_index(data: bytes, limits: Limits, version: tuple[int, int]) -> Index:
    """Index member bytes -> a checked ``Index``, rules in the order of spec §5.1–§8.

    ``version`` is the footer's (major, minor); the index must agree with it. Raises
    ``IndexSchemaError`` (or ``LimitExceededError``, ``UnsafeArchiveError``) naming the first
    rule that fails.
    """
    raw = index_codec.decode_index(data, max_memory=limits.max_index_memory)
    try:
        return _checked(raw, limits, version)
    except SchemaViolation as exc:
        raise IndexSchemaError(f"index field {exc.where} is invalid: {exc.problem}",
                               "the archive is damaged or was written by a broken tool",
                               rule=exc.rule or Rule.FIELD_TYPES) from None


def encode_index(index: Index, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """The mirror of ``decode_index``: the same rules, then canonical msgpack (spec §5.1).
    Raises ``SchemaViolation``; ``pack`` reports it as a ``PackError``."""
    raw = encode(index)
    _checked(raw, limits, _parse_version(index.version))
    return index_codec.encode_index(raw)


def _parse_version(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor)


def _checked(raw: Any, caps: Limits, version: tuple[int, int]) -> Index:
    if not isinstance(raw, dict):
        raise SchemaViolation("the index is not a map", rule=Rule.INDEX_HEADER)
    # §5 rule 6: format and version
    if raw.get("format") != FORMAT_NAME:
        raise SchemaViolation(f"names format {str(raw.get('format'))[:40]!r}, expected {FORMAT_NAME!r}",
                              ("format",), Rule.INDEX_HEADER)
    if raw.get("version") != f"{version[0]}.{version[1]}":
        raise SchemaViolation("disagrees with the footer's format version", ("version",), Rule.INDEX_HEADER)
    # §5 rule 7: the member list (counts first, before anything is walked)
    container = _section(raw, "container", ContainerRecord)
    if len(container.members) > caps.max_members:
        raise LimitExceededError(f"archive declares {len(container.members)} members, more than the limit "
                                 f"{caps.max_members}", rule=Rule.MEMBERS)
    check_container(container, caps)
    # §6.1 digests
    algorithm = raw.get("digest_algorithm")
    if algorithm not in _ALGORITHMS:
        raise SchemaViolation(f"unknown digest algorithm {str(algorithm)[:20]!r}", ("digest_algorithm",),
                              Rule.DIGEST_ALGORITHM)
    # §6.2 storages
    storages = _section(raw, "storages", tuple[StorageRecord, ...])
    if len(storages) > caps.max_members:
        raise LimitExceededError(f"index declares {len(storages)} storages, more than the limit {caps.max_members}",
                                 rule=Rule.STORAGE_TOTAL)
    check_storages(storages, container, caps)
    # §6.3 inputs
    inputs = _section(raw, "inputs", tuple[Value, ...])
    if len(inputs) > caps.max_members:
        raise LimitExceededError(f"index declares {len(inputs)} inputs, more than the limit {caps.max_members}",
                                 rule=Rule.INPUTS)
    for i, value in enumerate(inputs):
        if isinstance(value, DerivedValue):
            check_derived(value, inputs, ("inputs", i))
        else:
            check_value(value, storages, ("inputs", i), 0)
    # §5 rule 9, §7 graph (the node count first, before anything is decoded)
    nodes = _raw_node_count(raw.get("graph"), 0) + job_node_count(raw.get("job"), _raw_node_count)
    if nodes > caps.max_nodes:
        raise LimitExceededError(f"the graph has {nodes} nodes, more than the limit {caps.max_nodes}",
                                 rule=Rule.INDEX_ORDER)
    graph = _section(raw, "graph", GraphRecord)
    check_graph(graph, storages, ("graph",), 0)
    placeholders = sum(1 for n in graph.nodes if n.op == NodeOp.PLACEHOLDER)
    if placeholders != len(inputs):
        raise SchemaViolation(f"the graph has {placeholders} placeholders but the index stores {len(inputs)} inputs",
                              ("inputs",), Rule.INPUTS)
    # §8 records
    hints = typing.get_type_hints(Records, include_extras=True)
    records = Records(**{f.name: _section(raw, f.name, hints[f.name]) for f in dataclasses.fields(Records)})
    if records.parent is not None and not DIGEST_RE.match(records.parent):
        raise SchemaViolation("is not <algorithm>:<hex digest>", ("parent",), Rule.DIGEST_SYNTAX)
    if records.failure is not None:
        check_failure(records.failure)
    custom_ops = _section(raw, "custom_ops", tuple[CustomOpRecord, ...] | None)
    if sum(len(op.calls) for op in custom_ops or ()) > caps.max_members:
        raise LimitExceededError(f"index records more than {caps.max_members} custom-op calls",
                                 rule=Rule.STORAGE_TOTAL)
    for i, op in enumerate(custom_ops or ()):
        for j, call in enumerate(op.calls):
            for k, value in enumerate(call.outputs):
                check_value(value, storages, ("custom_ops", i, "calls", j, "outputs", k), 0)
    execution = records.execution
    for i in (execution.inference_inputs or ()) if execution is not None else ():
        if not 0 <= i < len(inputs):
            raise SchemaViolation(f"names input {i}, but the index stores {len(inputs)} inputs",
                                  ("execution", "inference_inputs"), Rule.INPUTS)
    if records.shapes is not None:
        check_shapes(records.shapes, inputs)
    # §8 job (1.3): the ranks of a multi-rank job
    job = _section(raw, "job", JobRecord | None)
    if job is not None:
        check_job(job, storages, inputs, caps, check_value, check_graph,
                  lambda rank_records, rank_inputs: _check_rank_records(rank_records, rank_inputs, storages))
    if records.rng is not None:
        check_rng(records.rng, storages)
    # §8 triton_kernels (1.4): after the job, whose graphs may launch them too
    triton_kernels = _section(raw, "triton_kernels", tuple[TritonKernelRecord, ...] | None)
    index = Index(container=container, digest_algorithm=algorithm, storages=storages, inputs=inputs, graph=graph,
                  records=records, format=FORMAT_NAME, version=raw["version"], job=job, custom_ops=custom_ops,
                  triton_kernels=triton_kernels)
    check_triton_kernels(index, caps, check_value)
    return index


def _raw_node_count(graph: Any, depth: int) -> int:
    """Nodes of a graph and its subgraphs as the msgpack decoded them, before any checking
    (a malformed graph counts what it can; the schema names its defect afterwards)."""
    if not isinstance(graph, dict) or depth > MAX_GRAPH_DEPTH:
        return 0
    nodes = graph.get("nodes")
    count = len(nodes) if isinstance(nodes, list) else 0
    state = graph.get("module_state")
    for entry in state if isinstance(state, list) else ():
        if isinstance(entry, dict) and entry.get("kind") == "graph":
            count += _raw_node_count(entry.get("graph"), depth + 1)
    return count


def _section(raw: dict, key: str, tp: Any):
    if key not in raw:
        if _allows_none(tp):
            return None
        raise SchemaViolation("is missing").at(key)
    try:
        return decoder_for(tp)(raw[key])
    except SchemaViolation as exc:
        raise exc.at(key) from None


def _allows_none(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType) and type(None) in typing.get_args(tp)


# -- §5 rule 7: the member list ------------------------------------------------------------------


def check_container(container: ContainerRecord, caps: Limits) -> None:
    def bad(problem: str, *path) -> SchemaViolation:
        return SchemaViolation(problem, ("container", *path), Rule.MEMBERS)

    if not MIN_FRAME_SIZE <= container.frame_size <= MAX_FRAME_SIZE:
        raise bad(f"{container.frame_size} is outside [{MIN_FRAME_SIZE}, {MAX_FRAME_SIZE}]", "frame_size")
    if not container.members:
        raise bad("must list at least the layout member", "members")
    seen: set[str] = set()
    total = 0
    for i, m in enumerate(container.members):
        check_member_name(m.name)
        if m.name in seen or m.name == INDEX_MEMBER:
            raise UnsafeArchiveError(f"member {m.name!r} appears twice", "the archive is unsafe or damaged",
                                     rule=Rule.MEMBERS)
        seen.add(m.name)
        for key in ("size", "first_frame", "frames"):
            if getattr(m, key) < 0:
                raise bad(f"member {m.name!r} has a negative {key}", "members", i)
        if m.name.startswith("blobs/") and not is_blob_name(m.name):
            raise bad(f"member {m.name!r} is under blobs/ but is not named <algorithm>/<hex digest>")
        total += m.size
        if total > caps.max_total_bytes:
            raise LimitExceededError(f"members declare more than {caps.max_total_bytes} bytes in total",
                                     rule=Rule.MEMBERS)
    if container.members[0].name != LAYOUT_MEMBER:
        raise bad(f"the first member is {container.members[0].name!r}, not {LAYOUT_MEMBER!r}")


# -- §6.2 storages -------------------------------------------------------------------------------


def check_storages(storages: tuple[StorageRecord, ...], container: ContainerRecord, caps: Limits) -> None:
    sizes = {m.name: m.size for m in container.members}
    declared = 0
    for i, st in enumerate(storages):
        try:
            _check_storage(st, sizes)
        except SchemaViolation as exc:
            raise exc.at(i).at("storages") from None
        declared += st.size
        if declared > caps.max_total_bytes:
            raise LimitExceededError(f"storages declare more than {caps.max_total_bytes} bytes in total",
                                     "the archive is hostile or damaged", rule=Rule.STORAGE_TOTAL)


def _check_storage(st: StorageRecord, sizes: dict[str, int]) -> None:
    if not 0 <= st.size < MAX_EXTENT:
        raise SchemaViolation(f"size {st.size} is negative or impossibly large", rule=Rule.STORAGE_SIZE)
    if not DEVICE_RE.match(st.device):
        raise SchemaViolation(f"{st.device[:40]!r} is not a device name", rule=Rule.STORAGE_DEVICE)
    if st.fidelity == Fidelity.REAL:
        if (st.digest is None) == (st.fill is None):
            raise SchemaViolation("a real storage has exactly one of digest or fill", rule=Rule.STORAGE_FIDELITY)
        if st.fill is not None and st.fill != 0:
            raise SchemaViolation("fill must be 0", rule=Rule.STORAGE_FIDELITY)
    elif st.fidelity == Fidelity.ABSENT:
        if st.digest is not None or st.fill is not None:
            raise SchemaViolation("an absent storage has neither digest nor fill", rule=Rule.STORAGE_FIDELITY)
    else:
        raise SchemaViolation(f"fidelity must be 'real' or 'absent', not {st.fidelity[:20]!r}",
                              rule=Rule.STORAGE_FIDELITY)
    if st.digest is not None:
        m = DIGEST_RE.match(st.digest)
        if not m:
            raise SchemaViolation(f"malformed digest {st.digest[:80]!r}", rule=Rule.DIGEST_SYNTAX)
        name = f"blobs/{m.group(1)}/{m.group(2)}"
        if name not in sizes:
            raise SchemaViolation(f"refers to blob {name}, which the archive does not hold", rule=Rule.STORAGE_BLOB)
        if sizes[name] != st.size:
            raise SchemaViolation(f"declares {st.size} bytes but blob {name} has {sizes[name]}", rule=Rule.STORAGE_BLOB)


# -- §6.3 values ---------------------------------------------------------------------------------


def view_extent(shape, stride, offset: int) -> int:
    """Elements of storage a view touches (0 for an empty view)."""
    if any(s == 0 for s in shape):
        return 0
    return offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def check_value(value: Any, storages, path: tuple, depth: int) -> None:
    if depth > MAX_VALUE_DEPTH:
        raise SchemaViolation(f"values nest deeper than {MAX_VALUE_DEPTH}", path, Rule.VALUE_DEPTH)
    if isinstance(value, TensorValue):
        check_tensor(value, storages, path)
    elif isinstance(value, ScalarValue):
        _check_kind(value.value, SCALAR_KINDS[value.kind], (*path, "value"))
    elif isinstance(value, SymValue):
        _check_kind(value.hint, SYMBOL_KINDS[value.kind], (*path, "hint"))
    elif isinstance(value, SequenceValue):
        for j, item in enumerate(value.items):
            check_value(item, storages, (*path, j), depth + 1)
    elif isinstance(value, SubclassValue):
        if function_name_problem(value.cls) is not None:
            raise SchemaViolation(f"subclass name {str(value.cls)[:60]!r} is not a qualified class name",
                                  (*path, "cls"), Rule.VALUE_KIND)
        if len(value.attrs) != len(value.items) or not all(IDENTIFIER_RE.match(a) for a in value.attrs):
            raise SchemaViolation("a subclass needs one identifier per inner value", (*path, "attrs"), Rule.VALUE_KIND)
        for j, item in enumerate(value.items):
            check_value(item, storages, (*path, "items", j), depth + 1)
    elif isinstance(value, DerivedValue):  # only the index's own inputs may be one (check_derived)
        raise SchemaViolation(f"a {value.kind} value is only allowed as one of the index's inputs", path,
                              Rule.DERIVED_INPUT)


def check_derived(value: DerivedValue, inputs, path: tuple) -> None:
    """(R6.3-10) A ``size``/``stride`` input names another input of the index that is a tensor
    or subclass, and one of that input's dimensions."""
    if not 0 <= value.input < len(inputs) or inputs[value.input] is value:
        raise SchemaViolation(f"names input {value.input}, which is not another of the {len(inputs)} inputs",
                              (*path, "input"), Rule.DERIVED_INPUT)
    source = inputs[value.input]
    if not isinstance(source, (TensorValue, SubclassValue)):
        raise SchemaViolation(f"names input {value.input}, a {source.kind}; only a tensor has a {value.kind}",
                              (*path, "input"), Rule.DERIVED_INPUT)
    rank = len(source.shape) if isinstance(source, TensorValue) else len(source.size)
    if not 0 <= value.dim < rank:
        raise SchemaViolation(f"dimension {value.dim} is out of range for input {value.input} of rank {rank}",
                              (*path, "dim"), Rule.DERIVED_INPUT)


def _check_kind(value: Any, expected: type, path: tuple) -> None:
    """A scalar of the kind its record says (an int stands for a float; a bool never for an int)."""
    ok = type(value) is expected or expected is float and type(value) is int
    if not ok:
        raise SchemaViolation(f"expected {expected.__name__ if expected is not type(None) else 'nil'}, "
                              f"got {type(value).__name__}", path, Rule.VALUE_KIND)


def check_tensor(t: TensorValue, storages, path: tuple) -> None:
    def bad(problem: str, rule: Rule):
        return SchemaViolation(problem, path, rule)

    if not 0 <= t.storage < len(storages):
        raise bad(f"storage {t.storage} does not exist", Rule.TENSOR_STORAGE)
    info = DTYPES.get(t.dtype)
    if info is None:
        raise bad(f"unknown dtype {t.dtype[:40]!r} (written by a newer reproarchive or torch?)", Rule.TENSOR_DTYPE)
    itemsize, klass = info
    if len(t.shape) != len(t.stride) or len(t.shape) > MAX_RANK:
        raise bad(f"shape and stride must have the same rank (at most {MAX_RANK})", Rule.TENSOR_GEOMETRY)
    if any(not 0 <= v < MAX_EXTENT for v in t.shape + t.stride) or not 0 <= t.offset < MAX_EXTENT:
        raise bad("sizes, strides and the offset must be non-negative and below 2^62", Rule.TENSOR_GEOMETRY)
    if math.prod(t.shape) >= MAX_EXTENT:
        raise bad("the view has more elements than a tensor can index", Rule.TENSOR_GEOMETRY)
    need = view_extent(t.shape, t.stride, t.offset) * itemsize
    if need > storages[t.storage].size:
        raise bad(f"the view needs {need} bytes but its storage has {storages[t.storage].size}", Rule.TENSOR_FITS)
    if not t.is_leaf and not t.requires_grad:
        raise bad("a non-leaf tensor must require grad", Rule.TENSOR_GRAD)
    if t.requires_grad and klass not in ("float", "complex"):
        raise bad("only floating and complex tensors can require grad", Rule.TENSOR_GRAD)
    if not all(0 <= d < len(t.shape) for d, _ in t.dynamic):
        raise bad("a dynamic dimension is out of range", Rule.TENSOR_DYNAMIC)


# -- §7 graph: names ------------------------------------------------------------------------------
# FX pastes these strings into the Python code it generates for the rebuilt module, so each
# is a name and nothing else. ``codec.targets`` applies the same two name rules before it
# resolves a target (and then judges what it resolves to by its effects, §7.3).


def function_name_problem(name: object) -> str | None:
    """Why a call_function target is not a qualified name (dotted identifiers, no dunder
    segment after the first, at most 300 characters), or None."""
    if not isinstance(name, str) or len(name) > MAX_TARGET_LENGTH or not _QUALIFIED_RE.match(name):
        return "not a qualified name"
    if any(p.startswith("__") for p in name.split(".")[1:]):
        return "malformed or dunder name"
    return None


def method_name_problem(name: object) -> str | None:
    """Why a call_method target is not a method name (an identifier), or None."""
    return None if isinstance(name, str) and IDENTIFIER_RE.match(name) else "malformed method name"


def check_attribute_path(path: Any) -> str:
    """get_attr / call_module targets and module-state paths: dotted identifiers, no dunders."""
    ok = isinstance(path, str) and 0 < len(path) <= MAX_ATTRIBUTE_PATH_LENGTH and all(
        (p.isdigit() or IDENTIFIER_RE.match(p)) and not p.startswith("__") for p in path.split("."))
    if not ok:
        raise UnsafeArchiveError(f"attribute path {str(path)[:120]!r} is malformed", _HOSTILE, rule=Rule.STATE_PATH)
    return path


# -- §7 graph --------------------------------------------------------------------------------------


def check_graph(graph: GraphRecord, storages, path: tuple, depth: int) -> None:
    if depth > MAX_GRAPH_DEPTH:
        raise SchemaViolation(f"subgraphs nest deeper than {MAX_GRAPH_DEPTH}", path, Rule.GRAPH_DEPTH)
    state_paths = _check_module_state(graph, storages, path, depth)
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
                raise UnsafeArchiveError(f"keyword argument name {key[:80]!r} is not an identifier", _HOSTILE,
                                         rule=Rule.NODE_KWARG_NAME)
        for ref in (*iter_arg_refs(node.args), *iter_arg_refs(list(node.kwargs.values()))):
            if ref not in defined:
                raise SchemaViolation(f"argument refers to node {ref[:60]!r}, which is not defined before it", where,
                                      Rule.ARG_REF)
        _check_target(node.op, node.target, state_paths, where)
        outputs += node.op == NodeOp.OUTPUT
        defined.add(node.name)
    if outputs != 1:
        raise SchemaViolation(f"the graph has {outputs} output nodes, expected exactly one", path, Rule.NODE_OUTPUT)


def _check_target(op: str, target: str, state_paths: set[str], where: tuple) -> None:
    refuse = "an archive may only call torch tensor operations; refusing to load it"
    if op == NodeOp.PLACEHOLDER:
        if not IDENTIFIER_RE.match(target.removeprefix("**").removeprefix("*")):
            # pasted into the generated ``def forward(...)`` line
            raise UnsafeArchiveError(f"placeholder target {target[:80]!r} is not a parameter name", _HOSTILE,
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


# -- §8 records ------------------------------------------------------------------------------------


def check_shapes(shapes: ShapePolicy, inputs) -> None:
    """§8 ``shapes``: each entry names a stored input of its kind, a tensor's entry has one
    dimension per dimension of the stored tensor, kinds are the closed sets, and every
    ``equal_to`` names a dimension the record describes."""
    def bad(problem: str, *path) -> SchemaViolation:
        return SchemaViolation(problem, ("shapes", *path), Rule.SHAPE_POLICY)

    described = set()
    for k, entry in enumerate(shapes.inputs):
        if not 0 <= entry.input < len(inputs):
            raise bad(f"names input {entry.input}, but the index stores {len(inputs)} inputs", "inputs", k, "input")
        value = inputs[entry.input]
        if entry.kind not in SHAPE_INPUT_KINDS:
            raise bad(f"kind {entry.kind!r} is not one of {', '.join(SHAPE_INPUT_KINDS)}", "inputs", k, "kind")
        is_tensor = isinstance(value, (TensorValue, SubclassValue))
        rank = len(value.shape) if isinstance(value, TensorValue) else len(value.size) if is_tensor else 1
        # a symbol, or the plain value a source that saw only its hint stored (a trace import),
        # or (1.3) a size or stride of another input (a nested jagged tensor's ragged size)
        plain = {"symint": ("int", *DERIVED_KINDS), "symfloat": ("float",), "symbool": ("bool",)}.get(entry.kind, ())
        matches = is_tensor if entry.kind == "tensor" else getattr(value, "kind", None) in (entry.kind, *plain)
        if not matches or len(entry.dims) != rank:
            raise bad(f"describes {len(entry.dims)} dimension(s) of a {entry.kind}, but input {entry.input} "
                      f"is a {getattr(value, 'kind', 'tensor')} with {rank}", "inputs", k, "dims")
        for d, dim in enumerate(entry.dims):
            if dim.kind not in SHAPE_DIM_KINDS:
                raise bad(f"kind {dim.kind!r} is not one of {', '.join(SHAPE_DIM_KINDS)}", "inputs", k, "dims", d)
            if (dim.kind == "static") == (dim.expr is not None):
                raise bad("a static dimension has no expr, a symbolic one has one", "inputs", k, "dims", d)
            described.add(f"{entry.input}.{d}")
    for k, entry in enumerate(shapes.inputs):
        for d, dim in enumerate(entry.dims):
            for other in dim.equal_to:
                if other not in described:
                    raise bad(f"equal_to names {other!r}, a dimension the record does not describe",
                              "inputs", k, "dims", d, "equal_to")
    for k, symbol in enumerate(shapes.symbols):
        if symbol.kind not in ("backed", "unbacked"):
            raise bad(f"kind {symbol.kind!r} is not backed or unbacked", "symbols", k, "kind")


def _check_rank_records(records: Records, inputs: tuple, storages: tuple[StorageRecord, ...]) -> None:
    """(1.5) A rank's own records, by the rules of the index's (R8-1, R8-2, R8-6)."""
    if records.failure is not None:
        check_failure(records.failure)
    if records.shapes is not None:
        check_shapes(records.shapes, inputs)
    if records.rng is not None:
        check_rng(records.rng, storages)


def check_rng(rng: RngRecord, storages: tuple[StorageRecord, ...]) -> None:
    """(R8-6) Each generator state is a real storage on the host, of a generator on a device."""
    for i, generator in enumerate(rng.generators):
        where = ("rng", "generators", i)
        if not DEVICE_RE.match(generator.device):
            raise SchemaViolation(f"{generator.device[:40]!r} is not a device name", (*where, "device"),
                                  Rule.RNG_STATE)
        if not 0 <= generator.storage < len(storages):
            raise SchemaViolation(f"storage {generator.storage} does not exist", (*where, "storage"), Rule.RNG_STATE)
        storage = storages[generator.storage]
        if not storage.is_real or storage.device != "cpu":
            raise SchemaViolation("a generator state is a real storage on cpu", (*where, "storage"), Rule.RNG_STATE)


def check_failure(failure: FailureRecord) -> None:
    if failure.stage not in _STAGES:
        raise SchemaViolation(f"stage must be one of {', '.join(Stage)}", ("failure", "stage"), Rule.FAILURE_STAGE)
