"""Which callables a stored graph may name, how names become callables, and what may flow
where in a graph (spec §7.3).

A graph record names its call targets as qualified strings. Resolving them is the one place
where an archive could make us call something (``torch.load``, ``os.system`` via ``getattr``
chains, a GraphModule method handed to ``max(key=...)``), so resolution is an attribute walk
from four roots, never an import or ``eval``, and what a name resolves to is then judged by its
effects (``codec.effects``), never by its name. The graph as a whole is checked too: attribute
and method access only on tensors and plain values, and callables (subgraphs) only as the
arguments of higher-order operators.
"""

from __future__ import annotations

import builtins
import functools
import math
import operator
import types
from typing import Any

import torch

from reproarchive.codec import effects
from reproarchive.codec.custom_ops import TORCH_NAMESPACES
from reproarchive.codec.state_functions import STATE_FUNCTIONS, state_function
from reproarchive.compat import fx_meta
from reproarchive.compat.dispatch import (
    INDUCTOR_PRIMS_PREFIX,
    HigherOrderOperator,
    OpOverload,
    OpOverloadPacket,
    load_inductor_prims,
    load_triton_kernel_wrap,
)
from reproarchive.errors import NotReplayableHereError, Rule, UnsafeArchiveError
from reproarchive.format.schema import (
    CallRoot,
    ConstantArg,
    GraphRecord,
    ModuleEntry,
    NodeRef,
    SubgraphEntry,
    TensorEntry,
)
from reproarchive.format.schema.rules.graph import iter_arg_values
from reproarchive.format.schema.rules.names import function_name_problem, method_name_problem
from reproarchive.format.schema.rules.triton import LAUNCH_TARGETS

ROOTS = tuple(root.value for root in CallRoot)


def qualified_name(target: Any) -> str:
    """The name a graph record stores for a call_function target."""
    if isinstance(target, OpOverload):
        return f"torch.ops.{target.namespace}.{target._opname}.{target._overloadname}"
    if isinstance(target, OpOverloadPacket):
        return f"torch.ops.{target._qualified_op_name.replace('::', '.')}"
    if isinstance(target, HigherOrderOperator):
        return f"torch.ops.higher_order.{target.name()}"
    name = fx_meta.qualified_name(target)
    if name.startswith("_operator."):
        name = "operator." + name[len("_operator.") :]
    if "." not in name:
        name = "builtins." + name
    return name


def _unsafe(name: str, why: str, rule: Rule = Rule.CALL_TARGET) -> UnsafeArchiveError:
    return UnsafeArchiveError(
        f"graph calls {name[:120]!r}, which is not allowed ({why})",
        "an archive may only call tensor operations (spec 7.3); refusing to load it", rule=rule,
    )


def check_function_name(name: object) -> str:
    """The shape of a call_function target name, without resolving it: a qualified name
    (``schema.rules.names.function_name_problem``) under one of the four roots."""
    problem = function_name_problem(name)
    if problem is not None:
        raise _unsafe(str(name), problem, Rule.NODE_FUNCTION_NAME)
    parts = name.split(".")
    if parts[0] not in ROOTS or len(parts) < 2:
        raise _unsafe(name, f"module {parts[0]!r} is not allowed")
    return name


_ROOT_MODULES = {"operator": operator, "math": math, "builtins": builtins, "torch": torch}


class _Missing(LookupError):
    """A name this torch cannot resolve; ``found``: its longest resolvable prefix."""

    def __init__(self, name: str, found: str):
        super().__init__(name)
        self.found = found


def _walk(name: str) -> Any:
    """Attribute walk from an allowed root; raises LookupError when a segment is missing.

    A module reached on the way must be the module of that name: ``torch._refs.torch`` is the
    ``torch`` module imported inside ``torch._refs``, an alias that would let a name reach any
    attribute of any module (``torch._refs.torch.load``).
    """
    parts = name.split(".")
    obj: Any = _ROOT_MODULES[parts[0]]
    path = parts[0]
    for part in parts[1:]:
        try:
            obj = getattr(obj, part)
        except (AttributeError, RuntimeError):
            raise _Missing(name, path) from None
        path = f"{path}.{part}"
        if isinstance(obj, types.ModuleType) and obj.__name__ != path:
            raise _unsafe(name, f"{path} is an alias of module {obj.__name__}")
    return obj


def _resolved(name: str) -> Any:
    """The callable a (well-formed) name resolves to, judged by its effects; LookupError when
    this torch has no such name. A custom op's name is resolved afresh each time: its library
    can be destroyed and defined again in this process (a stand-in, the user's ``--import``, a
    test), and a cached operator would then call into the freed registration (a segfault)."""
    parts = name.split(".")
    if len(parts) > 3 and parts[:2] == ["torch", "ops"] and parts[2] not in TORCH_NAMESPACES:
        return _judged(name)
    return _cached(name)


@functools.lru_cache(maxsize=4096)
def _cached(name: str) -> Any:
    """``_judged``, cached: a graph names few distinct targets many times."""
    return _judged(name)


def _judged(name: str) -> Any:
    if name in LAUNCH_TARGETS:  # (1.4) registered by the module that defines them, Dynamo imports it
        load_triton_kernel_wrap()
    elif name.startswith(INDUCTOR_PRIMS_PREFIX):
        load_inductor_prims()
    obj = _walk(name)
    if not callable(obj) or isinstance(obj, types.ModuleType):
        raise _unsafe(name, "not a function")
    why = effects.callable_problem(obj)
    if why is not None:
        raise _unsafe(name, why)
    return obj


def resolve_function(name: object) -> Any:
    """The callable ``name`` names, allowed by its effects; what ``load`` builds a graph with.
    A name this torch cannot resolve is refused when the rule would refuse it whatever it is
    (``effects.unresolved_problem``), and otherwise is not replayable here."""
    check_function_name(name)
    try:
        return _resolved(name)
    except _Missing as missing:
        if name.startswith("torch.ops."):
            err = NotReplayableHereError(
                f"graph calls operator {name}, which is not registered in this process: not replayable here",
                "`reproarchive run` stands in for a custom op the archive recorded (spec 8 custom_ops); "
                "or bring it: --import MODULE / --load-library PATH",
                rule=Rule.CALL_TARGET,
            )
            err.target = name  # what ``checks.check_readable_here`` matches against the recorded custom ops
            raise err from None
        why = effects.unresolved_problem(missing.found)
        if why is not None:
            raise _unsafe(name, why) from None
        raise NotReplayableHereError(
            f"graph calls {name}, which this torch {torch.__version__} does not have: not replayable here",
            "replay with the torch version recorded in the archive (see `reproarchive inspect`)", rule=Rule.CALL_TARGET,
        ) from None


def resolve_operator_value(name: object) -> OpOverload:
    """The operator an ``operator`` argument names (spec §7.2), resolved and judged exactly like a
    call target: a higher-order operator that takes it calls it."""
    fn = resolve_function(name)
    if not isinstance(fn, OpOverload):
        raise _unsafe(name, "an operator argument must name an operator overload (torch.ops.NS.OP.OVERLOAD)")
    return fn


def _operators_passed(node) -> list[str]:
    return [v.name for v in iter_arg_values((node.args, tuple(node.kwargs.values())))
            if isinstance(v, ConstantArg) and v.kind == "operator"]


def _check_operators_passed(node, fn: Any, missing: list | None) -> None:
    """An operator may be passed only to a higher-order operator that calls it, and is judged
    then as if the graph called it itself."""
    names = _operators_passed(node)
    if not names:
        return
    if not (isinstance(fn, HigherOrderOperator) and fn.name() in effects.OPERATOR_TAKERS):
        raise UnsafeArchiveError(
            f"node {node.name} passes operator {names[0][:80]} to {str(node.target)[:80]}, which may only take "
            "tensors and plain values",
            "operators may only be passed to auto_functionalized and with_effects; the archive is hostile or damaged",
            rule=Rule.CALL_TARGET)
    for name in names:
        try:
            resolve_operator_value(name)
        except NotReplayableHereError as err:
            if missing is None:
                raise
            missing.append(err)


def check_method_name(name: object) -> str:
    """call_method targets: Tensor methods and protocol dunders whose effects are allowed."""
    problem = method_name_problem(name)
    if problem is not None:
        raise _unsafe(str(name), problem, Rule.NODE_METHOD_NAME)
    why = effects.method_problem(name)
    if why is not None:
        raise _unsafe(f"Tensor.{name}", why)
    return name


def check_getattr_args(args: tuple) -> None:
    """``builtins.getattr`` may only read a data attribute (a tensor or plain value) named by a
    constant string: ``shape``, ``dtype``, ``T`` ..., never a method or an object."""
    if not 2 <= len(args) <= 3 or not isinstance(args[1], str):
        raise _unsafe("builtins.getattr", "getattr needs a constant attribute name")
    if args[1] not in effects.data_attributes():
        raise _unsafe("builtins.getattr", f"attribute {args[1][:40]!r} is not data of a tensor or value")


MODULE_CLASS_PREFIXES = ("torch.nn.modules.", "torch.nn.", "torch.ao.nn.")


def module_class_name(module: torch.nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


@functools.lru_cache(maxsize=256)
def resolve_module_class(name: object) -> type:
    """A ``torch.nn`` module class by name, whose ``forward`` passes the composite rule of
    ``codec.effects`` (it is rebuilt without running its constructor, spec §7.4)."""
    if not isinstance(name, str) or not name.startswith(MODULE_CLASS_PREFIXES):
        raise _unsafe(str(name), "module classes must come from torch.nn", Rule.STATE_MODULE)
    if function_name_problem(name) or name.split(".")[0].startswith("__"):
        raise _unsafe(name, "malformed class name", Rule.STATE_MODULE)
    try:
        obj = _walk(name)
    except LookupError:
        raise NotReplayableHereError(f"module class {name} does not exist in this torch {torch.__version__}: "
                                     "not replayable here", "replay with the recorded torch version",
                                     rule=Rule.STATE_MODULE) from None
    if not (isinstance(obj, type) and issubclass(obj, torch.nn.Module)):
        raise _unsafe(name, "not an nn.Module class", Rule.STATE_MODULE)
    real = f"{obj.__module__}.{obj.__qualname__}"
    if not real.startswith(MODULE_CLASS_PREFIXES):
        raise _unsafe(name, f"it is {real[:120]}, which is not a torch.nn module", Rule.STATE_MODULE)
    forward = getattr(obj, "forward", None)
    if isinstance(forward, types.FunctionType) and (why := effects.composite_problem(forward)) is not None:
        raise _unsafe(name, f"its forward: {why}", Rule.STATE_MODULE)
    return obj


# What a graph value can be, as far as the checks below need to know.
VALUE = "value"  # a tensor, a plain value, or a tuple/list of these
SUBGRAPH = "subgraph"  # a GraphModule of the archive: callable, allowlisted node by node
MODULE = "module"  # an nn.Module (get_attr of a module or a container path)
HANDLE = "handle"  # an object a state function returned (an autocast context)


def _state_kinds(record: GraphRecord) -> dict[str, str]:
    kinds: dict[str, str] = {}
    for entry in record.module_state:
        kinds[entry.path] = VALUE if isinstance(entry, TensorEntry) else SUBGRAPH if isinstance(
            entry, SubgraphEntry) else MODULE
        parts = entry.path.split(".")
        for i in range(1, len(parts)):
            kinds.setdefault(".".join(parts[:i]), MODULE)
    return kinds


def _flows(node, kinds: dict[str, str], *, subgraphs_ok: bool, consumer: str | None = None) -> None:
    """Which node values an argument list passes on: only values, subgraphs only to higher-order
    operators, a handle only to the function that consumes it."""
    for value in iter_arg_values((node.args, tuple(node.kwargs.values()))):
        if not isinstance(value, NodeRef):
            continue
        kind = kinds.get(value.name, VALUE)
        if kind == VALUE or kind == SUBGRAPH and subgraphs_ok:
            continue
        if kind == HANDLE and consumer is not None:
            continue
        what = {SUBGRAPH: "a subgraph (callable)", MODULE: "a module", HANDLE: "a state handle"}[kind]
        raise UnsafeArchiveError(
            f"node {node.name} passes {what} {value.name!r} to {str(node.target)[:80]}, which may only take "
            f"tensors and plain values",
            "callables may only go to higher-order operators and attributes only be read from tensors; "
            "the archive is hostile or damaged", rule=Rule.CALL_TARGET,
        )


def _receiver(node, kinds: dict[str, str]) -> None:
    """Attribute and method access only on tensors and plain values."""
    if not node.args:
        raise _unsafe(str(node.target), "no object to act on")
    first = node.args[0]
    if isinstance(first, NodeRef) and kinds.get(first.name, VALUE) != VALUE:
        raise UnsafeArchiveError(
            f"node {node.name} reads "
            f"{str(node.args[1] if node.op == 'call_function' and len(node.args) > 1 else node.target)[:60]!r} "
            f"of {first.name!r}, which is not a tensor or a plain value",
            "attributes and methods may only be used on tensors and plain values; the archive is hostile or damaged",
            rule=Rule.CALL_TARGET,
        )


def check_graph_targets(record: GraphRecord, missing: list[NotReplayableHereError] | None = None) -> None:
    """Every call target, module class and data flow of a (schema-checked) graph, without
    building anything: what ``verify``, ``inspect``, ``unpack`` and ``load`` check before a graph
    is built, with the rule ``load`` applies.

    A target the rule refuses raises ``UnsafeArchiveError`` for all of them. A target this torch
    does not have (a custom op whose library is not loaded, a newer torch's function) is not a
    reason to call the archive damaged or unsafe: with ``missing`` given (``verify``,
    ``inspect``) it is collected there and the check goes on; without (``load``) it raises
    ``NotReplayableHereError``."""
    kinds = _state_kinds(record)
    for node in record.nodes:
        op = node.op
        if op == "placeholder":
            kinds[node.name] = VALUE
        elif op == "get_attr":
            kinds[node.name] = kinds.get(node.target, MODULE)
        elif op == "call_function":
            _check_call_function(node, kinds, missing)
        elif op == "call_method":
            check_method_name(node.target)
            _check_operators_passed(node, None, missing)
            _receiver(node, kinds)
            _flows(node, kinds, subgraphs_ok=False)
            kinds[node.name] = VALUE
        elif op == "call_module":
            if kinds.get(node.target) not in (MODULE, SUBGRAPH):
                raise _unsafe(node.target, "call_module of something that is not a module")
            _check_operators_passed(node, None, missing)
            _flows(node, kinds, subgraphs_ok=False)
            kinds[node.name] = VALUE
        else:  # output
            _check_operators_passed(node, None, missing)
            _flows(node, kinds, subgraphs_ok=False)
    _check_module_state(record, missing)


def _check_call_function(node, kinds: dict[str, str], missing: list[NotReplayableHereError] | None) -> None:
    """One call_function node; the function resolved here is the one ``load`` would call, so
    what ``verify`` passes is what ``run`` runs."""
    try:
        fn = resolve_function(node.target)  # the rule load applies: verify's "ok" is run's
    except NotReplayableHereError as err:
        if missing is None:
            raise
        missing.append(err)
        _check_operators_passed(node, None, missing)
        _flows(node, kinds, subgraphs_ok=False)
        kinds[node.name] = VALUE
        return
    state = state_function(fn)
    _check_operators_passed(node, fn, missing)
    _flows(node, kinds, subgraphs_ok=isinstance(fn, HigherOrderOperator),
           consumer=_consumer(node, kinds, fn))
    if fn is getattr:
        check_getattr_args(node.args)
        _receiver(node, kinds)
    elif isinstance(fn, (OpOverload, OpOverloadPacket)):
        # a packet (Dynamo's graphs call ``torch.ops._c10d_functional.all_reduce``) is
        # checked against its default overload, the one its arguments select
        overload = getattr(fn, "default", None) if isinstance(fn, OpOverloadPacket) else fn
        why = overload and effects.string_argument_problem(overload, node.args, node.kwargs)
        if why:
            raise _unsafe(node.target, why)
    kinds[node.name] = HANDLE if state is not None and state.returns_handle else VALUE


def _check_module_state(record: GraphRecord, missing: list[NotReplayableHereError] | None) -> None:
    """Module classes, by the rule ``load`` applies, and every subgraph's own targets."""
    for entry in record.module_state:
        if isinstance(entry, ModuleEntry):
            try:
                resolve_module_class(entry.class_name)
            except NotReplayableHereError as err:
                if missing is None:
                    raise
                missing.append(err)
        elif isinstance(entry, SubgraphEntry):
            check_graph_targets(entry.graph, missing)


def _consumer(node, kinds: dict[str, str], fn: Any) -> str | None:
    """The target name when ``fn`` is the declared consumer of every handle it is passed."""
    handles = [v.name for v in iter_arg_values((node.args, tuple(node.kwargs.values())))
               if isinstance(v, NodeRef) and kinds.get(v.name) == HANDLE]
    if not handles:
        return None
    for spec in STATE_FUNCTIONS.values():
        if spec.returns_handle and spec.consumer == node.target:
            return node.target
    return None
