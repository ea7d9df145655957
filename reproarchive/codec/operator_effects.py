"""What an operator can touch, read from its schema: the operator part of the effect rule
(spec §7.3, ``codec.effects``).

Every argument and result is a tensor or a plain value (numbers, bools, dtypes, devices,
layouts, memory formats, and lists/optionals of these); a string argument is only an enum
*selector* or an assertion *message* (``SELECTOR_ARGUMENTS``, values checked per node); an
operator that returns nothing writes one of its tensor arguments, or checks a value
(``CHECK_OPERATORS``). Schemas cannot show a few effects (process-group internals reaching the
network, the profiler's global state): those namespaces and operators are ``SCHEMA_BLIND``.

Functional collectives (``COLLECTIVE_NAMESPACES``, spec §7.3 and §8 ``job``) have a declared
effect instead: tensors in, tensors out, exchanged with the other ranks of a process group
named by a string. They are allowed by that effect; what they need to *run* (every rank
launched, the group recreated under its recorded name) is a replay's concern
(``codec.collectives``), so ``verify`` and ``inspect`` accept them.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from reproarchive.compat.dispatch import OpOverload, OpOverloadPacket, dispatcher_op_names

#: String arguments that select how a tensor computation runs (an enum, an einsum equation) or
#: carry an assertion's message, by argument name, with the pattern a value must match. Any
#: other string argument (a file name, a process group, a profiler label) refuses the operator.
_TOKEN = re.compile(r"^[A-Za-z0-9_]{0,32}$")
_EQUATION = re.compile(r"^[A-Za-z.,\->\s]{0,256}$")
_MESSAGE = re.compile(r"^[^\x00-\x08\x0b-\x1f\x7f]{0,2000}$", re.DOTALL)
SELECTOR_ARGUMENTS: dict[str, re.Pattern] = {
    **{name: _TOKEN for name in (
        "approximate", "rounding_mode", "mode", "padding", "norm", "UPLO", "driver", "ord", "p", "indexing",
        "interpolation", "side", "reduce", "padding_side", "pad_mode", "activation", "algorithm", "attr",
        "unary_attr", "binary_attr", "unary_algorithm", "post_op_name", "post_op_algorithm", "binary_post_op",
        "unary_post_op", "unary_post_op_algorithm",
    )},
    "equation": _EQUATION,
    "assert_msg": _MESSAGE,
    "api_name": _TOKEN,
}

#: Effects no schema shows: operators whose types look like a tensor computation but which
#: act elsewhere.
SCHEMA_BLIND: dict[str, str] = {
    # namespaces
    "c10d": "process-group objects and collectives outside the functional API (network)",
    "symm_mem": "symmetric-memory communication between processes (network)",
    "_dtensor": "distributed tensors (network)",
    "profiler": "starts and stops the process-wide profiler",
    "debugprims": "loads tensors by name from a debugging store",
    "debug_mode_ops": "annotates a process-wide debug mode",
    "prim": "TorchScript interpreter internals (Python calls, RPC, printing)",
    "static_runtime": "TorchScript static-runtime internals",
    "onnx": "ONNX export markers",
    # operators
    "aten::backward": "runs the autograd engine (accumulates into .grad, calls hooks)",
    "aten::_backward": "runs the autograd engine (accumulates into .grad, calls hooks)",
    "aten::dist_backward": "distributed autograd (network)",
    "aten::get_gradients": "distributed autograd (network)",
    "aten::set_data": "replaces a tensor's data outside autograd (tensor identity)",
}

#: Functional collectives: their string arguments name a process group or a reduction; any
#: other string argument (``batch_p2p_ops``' op list) refuses the operator as everywhere else.
COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "_c10d_functional_autograd"})
GROUP_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")
COLLECTIVE_ARGUMENTS: dict[str, re.Pattern] = {"group_name": GROUP_NAME, "reduce_op": _TOKEN}


def is_collective(schema: Any) -> bool:
    """Whether an operator schema is a functional collective (``COLLECTIVE_NAMESPACES``)."""
    return schema.name.split("::")[0] in COLLECTIVE_NAMESPACES


def _selectors(schema: Any) -> dict[str, re.Pattern]:
    return {**SELECTOR_ARGUMENTS, **COLLECTIVE_ARGUMENTS} if is_collective(schema) else SELECTOR_ARGUMENTS


#: Operators that return nothing, write no tensor, and take no tensor, yet only check a value
#: (symbolic-shape assertions in graphs with dynamic shapes). Any other such operator can only
#: have changed global state (``aten::manual_seed``, ``aten::set_grad_enabled``).
CHECK_OPERATORS = {"aten::_assert_scalar", "aten::sym_constrain_range", "aten::sym_constrain_range_for_size"}

_PLAIN_KINDS = {
    "TensorType", "IntType", "SymIntType", "FloatType", "SymFloatType", "BoolType", "SymBoolType", "ComplexType",
    "NumberType", "ScalarTypeType", "LayoutType", "MemoryFormatType", "DeviceObjType", "NoneType",
}


def _type_problem(t: Any, *, optional: bool = False) -> str | None:
    kind = t.kind()
    if kind in _PLAIN_KINDS:
        return None
    if kind == "OptionalType":
        return _type_problem(t.getElementType(), optional=True)
    if kind == "ListType":
        return _type_problem(t.getElementType())
    if kind == "TupleType":
        for e in t.elements():
            if (why := _type_problem(e)) is not None:
                return why
        return None
    if kind == "GeneratorType" and optional:
        return None  # a graph cannot hold a generator: the value is always None (the global RNG)
    return f"takes or returns a {t.annotation_str if hasattr(t, 'annotation_str') else t}"


#: The names aten gives its dimension-name arguments (``sum.dim_DimnameList``'s ``dim``,
#: ``transpose.Dimname``'s ``dim0``, ``flatten.named_out_dim``'s ``out_dim``, ...).
_DIMENSION_ARGUMENTS = frozenset({"dim", "dims", "dim0", "dim1", "dim2", "start_dim", "end_dim", "out_dim",
                                  "outdim", "names"})


def _dimension_names(schema: Any, name: str, t: Any) -> bool:
    """Whether an argument of type ``t`` is a named-tensor dimension name (``Dimname``, a list
    of them, optional). Its value names a dimension, nothing outside the tensor, so such an
    overload (``sum.dim_DimnameList``) is a tensor computation; refusing it refused every
    binding that reaches it (``torch.sum``) on the torches that still have those overloads.

    torch 2.11 (seen on a GPU machine) types a ``Dimname`` as ``str`` both in the argument's
    type and in the schema's printed text, so where the type does not say it, aten's own
    naming does: an aten overload named for dimension names (``dimname``, ``names``,
    ``named``) whose string argument has a dimension's name. This reads torch's registry, not
    the archive: the archive names only the binding (``torch.sum``)."""
    text = str(t)
    if "Dimname" in text:
        return True
    element = t.getElementType() if t.kind() in ("OptionalType", "ListType") else t
    if element.kind() in ("OptionalType", "ListType"):
        element = element.getElementType()
    if element.kind() != "StringType":
        return False
    if re.search(r"\bDimname(\[\d*\])?\??\s+" + re.escape(name) + r"\b", str(schema)) is not None:
        return True
    return (str(schema.name).startswith("aten::") and name in _DIMENSION_ARGUMENTS
            and re.search(r"dimname|names|named", getattr(schema, "overload_name", ""), re.IGNORECASE) is not None)


def schema_problem(schema: Any) -> str | None:
    """Why an operator schema is not a tensor computation with contained effects (None: it is)."""
    writes = False
    reads_tensor = False
    selectors = _selectors(schema)
    for a in schema.arguments:
        t = a.real_type
        if a.alias_info is not None and a.alias_info.is_write:
            writes = True
        if "Tensor" in str(t):
            reads_tensor = True
        base = t.getElementType() if t.kind() == "OptionalType" else t
        if base.kind() == "AnyType" and a.name in COLLECTIVE_ARGUMENTS and is_collective(schema):
            continue  # a group name (a string in a graph; ``string_argument_problem`` checks it)
        if _dimension_names(schema, a.name, t):
            continue  # a named-tensor overload: the string only names a dimension of a tensor
        if base.kind() == "StringType":
            if a.name not in selectors:
                return f"takes a string argument {a.name!r} that is not an enum selector or message"
            continue
        if (why := _type_problem(t)) is not None:
            return f"argument {a.name!r} {why}"
    for r in schema.returns:
        if (why := _type_problem(r.real_type)) is not None:
            return f"result {why}"
    if "..." in str(schema):
        return "takes or returns a variable number of untyped values"
    if not schema.returns and not writes and not reads_tensor and schema.name not in CHECK_OPERATORS:
        return "returns nothing and writes no tensor: its only effect is on global state"
    return None


def _blind(schema: Any) -> str | None:
    namespace = schema.name.split("::")[0]
    return SCHEMA_BLIND.get(namespace) or SCHEMA_BLIND.get(schema.name)


@functools.cache
def overload_problem(op: OpOverload) -> str | None:
    return _blind(op._schema) or schema_problem(op._schema)


@functools.lru_cache(maxsize=1)
def _dispatcher_ops() -> frozenset[str]:
    """Operators registered with the dispatcher (``aten::add.Tensor``); the rest of a packet's
    overloads are TorchScript builtins (string, list and dict functions) only a packet reaches."""
    return frozenset(dispatcher_op_names())


def _overloads(packet: OpOverloadPacket, *, dispatcher_only: bool):
    native = _dispatcher_ops()
    for name in packet.overloads():
        qualified = packet._qualified_op_name + ("" if name == "default" else f".{name}")
        if dispatcher_only and qualified not in native:
            continue
        try:
            yield name, getattr(packet, name)
        except (AttributeError, RuntimeError):
            continue


@functools.cache
def packet_problem(packet: OpOverloadPacket, dispatcher_only: bool = False) -> str | None:
    """A packet picks its overload from the arguments at run time: every overload it can reach
    must pass. Called directly, a packet reaches TorchScript builtins too; a Python binding
    (``torch.add``) reaches only the dispatcher's overloads."""
    for name, op in _overloads(packet, dispatcher_only=dispatcher_only):
        if (why := overload_problem(op)) is not None:
            return f"overload {name}: {why}"
    return None


def string_argument_problem(op: OpOverload, args: tuple, kwargs: dict) -> str | None:
    """A selector or message value a node passes to an operator, checked against its pattern."""
    arguments = op._schema.arguments
    positional = [a for a in arguments if not a.kwarg_only]
    bound = list(zip(positional, args)) + [(a, kwargs[a.name]) for a in arguments if a.name in kwargs]
    selectors = _selectors(op._schema)
    for a, value in bound:
        pattern = selectors.get(a.name)
        if a.name in COLLECTIVE_ARGUMENTS and is_collective(op._schema) and not isinstance(value, str):
            return f"its {a.name!r} argument is not a process-group name"
        if pattern is not None and isinstance(value, str) and not pattern.match(value):
            return f"its {a.name!r} argument {value[:40]!r} is not a selector value"
    return None
