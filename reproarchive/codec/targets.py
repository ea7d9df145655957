"""Which callables a stored graph may name, and how names become callables (spec §7.3).

A graph record names its call targets as qualified strings. Resolving them is the one place
where an archive could make us call something dangerous (``torch.load``, ``os.system`` via
``getattr`` chains, ``torch.library`` registration ...), so resolution is an allowlist walk:
only names under the prefixes below, attribute lookups only, never an import, never ``eval``.
"""

from __future__ import annotations

import builtins
import math
import operator
import re
import types
from typing import Any

import torch

from reproarchive.errors import UnsafeArchiveError
from reproarchive.format.schema import GraphRecord, ModuleEntry, SubgraphEntry

# torch namespaces whose members are tensor computations (or Dynamo/AOT bookkeeping with no I/O).
ALLOWED_TORCH_PREFIXES = (
    "torch.ops.",
    "torch._C._nn.",
    "torch._C._fft.",
    "torch._C._linalg.",
    "torch._C._special.",
    "torch._C._nested.",
    "torch._C._VariableFunctions.",
    "torch._C._functorch.",
    "torch.nn.functional.",
    "torch.functional.",
    "torch.fft.",
    "torch.linalg.",
    "torch.special.",
    "torch.nested.",
    "torch.masked.",
    "torch.sparse.",
    "torch._refs.",
    "torch._prims.",
    "torch._prims_common.",
    "torch._higher_order_ops.",
    # functorch transforms that Dynamo graphs call (vmap levels, grad, batch dims); not the
    # whole package, which also holds compilers that write files and config loaders.
    "torch._functorch.predispatch.",
    "torch._functorch.vmap.",
    "torch._functorch.apis.",
    "torch._functorch.eager_transforms.",
    "torch._functorch.autograd_function.",
    "torch.amp.autocast_mode.",
    "torch.autograd.grad_mode.",
    "torch.fx.experimental.sym_node.",
    "torch.fx.experimental.symbolic_shapes.",
    "torch.Tensor.",
)
ALLOWED_TORCH_NAMES = {
    "torch._C._set_grad_enabled",
    "torch._assert",
    "torch._assert_async",
    "torch._check",
    "torch._check_is_size",
    "torch._sym_sqrt",
    "torch._foreach_add",
    "torch._C._log_api_usage_once",
}
# Top-level torch names that do I/O, load code, or change process-wide state.
DENIED_TORCH_TOP = {
    "load", "save", "from_file", "compile", "hub", "jit", "package", "utils", "serialization", "onnx", "export",
    "library", "cuda", "backends", "distributed", "multiprocessing", "set_default_device", "set_default_dtype",
    "set_default_tensor_type", "use_deterministic_algorithms", "set_printoptions", "classes", "profiler",
    "testing", "manual_seed", "seed", "set_rng_state", "set_num_threads", "set_num_interop_threads",
    "set_float32_matmul_precision", "set_warn_always", "set_deterministic_debug_mode", "set_flush_denormal",
    "_dynamo", "_inductor", "_export", "_logging", "fx",
}
DENIED_OP_NAMESPACES = {"debugprims"}

OPERATOR_NAMES = {
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs", "matmul", "getitem",
    "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "invert", "not_", "lshift", "rshift", "truth",
    "index", "contains", "is_", "is_not", "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow",
    "iand", "ior", "ixor", "ilshift", "irshift", "imatmul", "setitem", "concat",
}
BUILTIN_NAMES = {
    "getattr", "len", "abs", "min", "max", "sum", "int", "float", "bool", "round", "pow", "divmod", "range",
    "tuple", "list", "all", "any", "isinstance",
}
# Tensor dunder methods a graph may call with call_method (everything else must be public).
TENSOR_DUNDERS = {
    "__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__", "__mul__", "__rmul__", "__imul__",
    "__truediv__", "__rtruediv__", "__itruediv__", "__floordiv__", "__rfloordiv__", "__ifloordiv__",
    "__mod__", "__rmod__", "__imod__", "__pow__", "__rpow__", "__ipow__", "__matmul__", "__rmatmul__",
    "__and__", "__rand__", "__iand__", "__or__", "__ror__", "__ior__", "__xor__", "__rxor__", "__ixor__",
    "__lshift__", "__rlshift__", "__ilshift__", "__rshift__", "__rrshift__", "__irshift__", "__invert__",
    "__neg__", "__pos__", "__abs__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
    "__getitem__", "__setitem__", "__len__", "__bool__", "__float__", "__int__", "__index__",
}

_SEGMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def qualified_name(target: Any) -> str:
    """The name a graph record stores for a call_function target."""
    from torch.fx.node import _get_qualified_name

    if isinstance(target, torch._ops.OpOverload):
        return f"torch.ops.{target.namespace}.{target._opname}.{target._overloadname}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return f"torch.ops.{target._qualified_op_name.replace('::', '.')}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"torch.ops.higher_order.{target.name()}"
    name = _get_qualified_name(target)
    if name.startswith("_operator."):
        name = "operator." + name[len("_operator.") :]
    if "." not in name:
        name = "builtins." + name
    return name


def _unsafe(name: str, why: str) -> UnsafeArchiveError:
    return UnsafeArchiveError(
        f"graph calls {name[:120]!r}, which is not allowed ({why})",
        "an archive may only call torch tensor operations; refusing to load it",
    )


def check_function_name(name: object) -> str:
    """Allowlist check on a call_function target name, without resolving it."""
    if not isinstance(name, str) or len(name) > 300:
        raise _unsafe(str(name), "not a qualified name")
    parts = name.split(".")
    if not all(_SEGMENT.match(p) for p in parts) or any(p.startswith("__") for p in parts[1:]):
        raise _unsafe(name, "malformed or dunder name")
    root = parts[0]
    if root == "operator":
        if len(parts) != 2 or parts[1] not in OPERATOR_NAMES:
            raise _unsafe(name, "operator function outside the allowlist")
    elif root == "math":
        if len(parts) != 2:
            raise _unsafe(name, "not a math function")
    elif root == "builtins":
        if len(parts) != 2 or parts[1] not in BUILTIN_NAMES:
            raise _unsafe(name, "builtin outside the allowlist")
    elif root == "torch":
        if name.startswith("torch.ops."):
            if len(parts) < 4 or parts[2] in DENIED_OP_NAMESPACES:
                raise _unsafe(name, "operator namespace not allowed")
        elif name in ALLOWED_TORCH_NAMES or any(name.startswith(p) for p in ALLOWED_TORCH_PREFIXES):
            pass
        elif len(parts) == 2 and not parts[1].startswith("_") and parts[1] not in DENIED_TORCH_TOP:
            pass
        else:
            raise _unsafe(name, "torch name outside the allowlist")
    else:
        raise _unsafe(name, f"module {root!r} is not allowed")
    return name


_ROOTS = {"operator": operator, "math": math, "builtins": builtins, "torch": torch}


def _walk(name: str) -> Any:
    """Attribute walk from an allowed root; raises LookupError when a segment is missing.

    A module reached on the way must be the module of that name: ``torch._refs.torch`` is the
    ``torch`` module imported inside ``torch._refs``, an alias that would let an allowed prefix
    reach any attribute of any module (``torch._refs.torch.load``).
    """
    parts = name.split(".")
    obj: Any = _ROOTS[parts[0]]
    path = parts[0]
    for part in parts[1:]:
        try:
            obj = getattr(obj, part)
        except (AttributeError, RuntimeError):
            raise LookupError(name) from None
        path = f"{path}.{part}"
        if isinstance(obj, types.ModuleType) and obj.__name__ != path:
            raise _unsafe(name, f"{path} is an alias of module {obj.__name__}")
    return obj


def _check_identity(name: str, obj: Any) -> None:
    """What a name resolves to must be allowed under its own qualified name too: a bound
    method of a config module (``torch._functorch.config.load_config``) lives in
    ``torch.utils._config_module``, which no allowed prefix covers."""
    if not callable(obj) or isinstance(obj, types.ModuleType):
        raise _unsafe(name, "not a function")
    try:
        real = qualified_name(obj)
    except Exception:
        raise _unsafe(name, "resolves to an object without a qualified name") from None
    if real != name:
        try:
            check_function_name(real)
        except UnsafeArchiveError:
            raise _unsafe(name, f"it is {real[:120]}") from None


def resolve_function(name: str) -> Any:
    check_function_name(name)
    try:
        obj = _walk(name)
    except LookupError:
        if name.startswith("torch.ops."):
            raise UnsafeArchiveError(
                f"operator {name} is not registered in this process",
                "import the library that defines this custom op before loading (or replay where it is installed)",
            ) from None
        raise UnsafeArchiveError(
            f"graph calls {name}, which does not exist in this torch {torch.__version__}",
            "replay with the torch version recorded in the archive (see `reproarchive inspect`)",
        ) from None
    _check_identity(name, obj)
    return obj


def check_function_target(name: object) -> str:
    """For verify/inspect: the allowlist check plus, where the name resolves in this process,
    the identity check; a name this torch lacks passes here (load will say so)."""
    check_function_name(name)
    try:
        obj = _walk(name)
    except LookupError:
        return name
    _check_identity(name, obj)
    return name


def check_method_name(name: object) -> str:
    """call_method targets: public Tensor methods and arithmetic dunders only."""
    if not isinstance(name, str) or not _SEGMENT.match(name):
        raise _unsafe(str(name), "malformed method name")
    if name.startswith("_") and name not in TENSOR_DUNDERS:
        raise _unsafe(name, "private method")
    if not callable(getattr(torch.Tensor, name, None)):
        raise _unsafe(name, "not a Tensor method")
    return name


def check_getattr_args(args: tuple) -> None:
    """``builtins.getattr`` may only read public attributes named by a constant string."""
    if len(args) < 2 or not isinstance(args[1], str) or args[1].startswith("_"):
        raise _unsafe("builtins.getattr", "getattr needs a constant public attribute name")


MODULE_CLASS_PREFIXES = ("torch.nn.modules.", "torch.nn.", "torch.ao.nn.")


def module_class_name(module: torch.nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def resolve_module_class(name: object) -> type:
    if not isinstance(name, str) or not name.startswith(MODULE_CLASS_PREFIXES):
        raise _unsafe(str(name), "module classes must come from torch.nn")
    parts = name.split(".")
    if not all(_SEGMENT.match(p) and not p.startswith("__") for p in parts):
        raise _unsafe(name, "malformed class name")
    try:
        obj = _walk(name)
    except LookupError:
        raise UnsafeArchiveError(f"module class {name} does not exist in this torch", "replay with the recorded torch version") from None
    if not (isinstance(obj, type) and issubclass(obj, torch.nn.Module)):
        raise _unsafe(name, "not an nn.Module class")
    real = f"{obj.__module__}.{obj.__qualname__}"
    if not real.startswith(MODULE_CLASS_PREFIXES):
        raise _unsafe(name, f"it is {real[:120]}, which is not a torch.nn module")
    return obj


def check_graph_targets(record: GraphRecord) -> None:
    """Every call target and module class of a (schema-checked) graph against the allowlist,
    without building anything: what ``verify``, ``inspect`` and ``unpack`` check (``load``
    resolves the same names while it builds). A function name this torch lacks passes here;
    ``load`` will say so."""
    for node in record.nodes:
        if node.op == "call_function":
            check_function_target(node.target)
            if node.target == "builtins.getattr":
                check_getattr_args(node.args)
        elif node.op == "call_method":
            check_method_name(node.target)
    for entry in record.module_state:
        if isinstance(entry, ModuleEntry):
            resolve_module_class(entry.class_name)
        elif isinstance(entry, SubgraphEntry):
            check_graph_targets(entry.graph)
