"""Fake tensors and symbolic shapes: ``torch._subclasses.fake_tensor``,
``torch.fx.experimental.symbolic_shapes`` (declared unstable), ``make_fx`` and
``torch.utils._sympy``.

Dynamo hands a backend fake values whose sizes are symbols of a ``ShapeEnv``; the shape codec
reads the policy off them (which dimensions are dynamic, their ranges, the guards relating them)
and a replay makes them again for the real inputs (``codec.shapes.fakes_for``): a ``ShapeEnv``
and a ``FakeTensorMode`` of its own, each input fakified with one ``DimDynamic`` (and constraint)
per dimension, symbolic scalar inputs made as symbols of that environment. A writes analysis runs
a graph on fake copies of its inputs (``replay.input_writes``); an after_aot graph replayed with
Inductor's inner compiler is re-traced with ``make_fx`` first, on fake values, as AOTAutograd
traces it; recorded guards are read back with the integer functions of ``torch.utils._sympy``.

Checked with 2.11.0, 2.13.0 and 2.15.0: every name resolves in all three with the same signature where used
(2.15's ``make_fx`` adds a keyword, ``dynamic_shapes``, not used here).
"""

from __future__ import annotations

import operator
from typing import Any

from reproarchive.compat.tensor_internals import is_traceable_wrapper_subclass

CHECKED_WITH = ("2.11.0", "2.13.0", "2.15.0")

PRIVATE_NAMES = (
    "torch._dynamo.config",
    "torch._dynamo.config.capture_dynamic_output_shape_ops",
    "torch._dynamo.config.capture_scalar_outputs",
    "torch._dynamo.config.prefer_deferred_runtime_asserts_over_guards",
    "torch._subclasses.fake_tensor.FakeTensor",
    "torch._subclasses.fake_tensor.FakeTensorMode",
    "torch._subclasses.fake_tensor.is_fake",
    "torch.fx.experimental.proxy_tensor.make_fx",
    "torch.fx.experimental.symbolic_shapes.DimDynamic",
    "torch.fx.experimental.symbolic_shapes.DimDynamic.DUCK",
    "torch.fx.experimental.symbolic_shapes.DimDynamic.DYNAMIC",
    "torch.fx.experimental.symbolic_shapes.RelaxedUnspecConstraint",
    "torch.fx.experimental.symbolic_shapes.ShapeEnv",
    "torch.fx.experimental.symbolic_shapes.StatelessSymbolicContext",
    "torch.fx.experimental.symbolic_shapes.StrictMinMaxConstraint",
    "torch.fx.experimental.symbolic_shapes.SubclassSymbolicContext",
    "torch.fx.experimental.symbolic_shapes.free_unbacked_symbols",
    "torch.fx.experimental.symbolic_shapes.guard_scalar",
    "torch.utils._sympy.functions",
    "torch.utils._sympy.numbers.int_oo",
    "torch.utils._sympy.value_ranges.ValueRanges",
)


def is_fake_tensor(value: Any) -> bool:
    """Whether ``value`` is a ``FakeTensor`` itself (not a subclass wrapping fake tensors)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(value, FakeTensor)


def is_fake(value: Any) -> bool:
    """Whether ``value`` is fake, a ``FakeTensor`` or a wrapper (functional, subclass) of one."""
    from torch._subclasses.fake_tensor import is_fake as fake

    return fake(value)


def hint_of(value: Any) -> Any:
    """A size's value in this run: an int as it is, a SymInt's hint; None for an unbacked
    symbol (``mark_unbacked``, a data-dependent size), which has none."""
    if isinstance(value, int):
        return value
    return getattr(getattr(value, "node", None), "hint", None)


def is_unbacked(value: Any) -> bool:
    """Whether ``value`` is a SymInt without a hint. A nested int's node has no ``hint`` at all:
    it is not unbacked."""
    import torch

    return isinstance(value, torch.SymInt) and getattr(value.node, "hint", 0) is None


def shape_env_of_fake(value: Any) -> Any:
    """The ``ShapeEnv`` of a ``FakeTensor``'s mode; None for anything else or a static mode."""
    return value.fake_mode.shape_env if is_fake_tensor(value) else None


def new_shape_env(**settings: Any) -> Any:
    """A fresh ``ShapeEnv`` (``settings``: its keyword arguments)."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return ShapeEnv(**settings)


def dynamo_shape_env_settings() -> dict[str, bool]:
    """The settings Dynamo makes its ``ShapeEnv`` with under the config now set (a replay sets
    the recorded one first): without ``capture_scalar_outputs`` a fake ``.item()`` raises
    ``DataDependentOutputException``, where a bare ``ShapeEnv()`` makes an unbacked symbol, so a
    compile in a bare one gets past the failure the recorded compile had."""
    import torch._dynamo.config as dynamo

    return {"allow_scalar_outputs": bool(dynamo.capture_scalar_outputs),
            "allow_dynamic_output_shape_ops": bool(dynamo.capture_dynamic_output_shape_ops),
            "prefer_deferred_runtime_asserts_over_guards":
                bool(getattr(dynamo, "prefer_deferred_runtime_asserts_over_guards", False))}


def new_fake_mode(shape_env: Any = None) -> Any:
    """A ``FakeTensorMode`` (of ``shape_env``, if given) that accepts real tensors as inputs."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if shape_env is None:
        return FakeTensorMode(allow_non_fake_inputs=True)
    return FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=True)


def free_unbacked_symbols(expr: Any) -> set:
    """The unbacked symbols (``u0``: sizes only known at run time) ``expr`` contains."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols as free

    return set(free(expr))


def guard_scalar(value: Any) -> Any:
    """A symbolic scalar's value in its ``ShapeEnv`` (guarding on it)."""
    from torch.fx.experimental.symbolic_shapes import guard_scalar as guarded

    return guarded(value)


def _constraint(c: Any) -> Any:
    from torch.fx.experimental.symbolic_shapes import RelaxedUnspecConstraint, StrictMinMaxConstraint
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges

    if c == "relaxed":
        return RelaxedUnspecConstraint(warn_only=True)
    return None if c is None else StrictMinMaxConstraint(warn_only=False, vr=ValueRanges(
        c[0], int_oo if c[1] is None else c[1]))


def symbolic_context(arg: Any, plan: list[tuple[str, Any, str | None]], source: Any) -> Any:
    """The symbolic context that fakifies ``arg`` with one entry of ``plan`` per dimension: a
    ``DimDynamic`` member's name (``STATIC``, ``DYNAMIC``, ``DUCK``, ``UNBACKED``), a constraint
    (None, ``"relaxed"``, or ``[min, max]`` with max None for unbounded) and the recorded
    expression. A traceable wrapper subclass (a nested jagged tensor) gets its inner tensors
    duck-sized."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext, SubclassSymbolicContext


    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic[kind] for kind, _, _ in plan],
                                       constraint_sizes=[_constraint(c) for _, c, _ in plan])
    if is_traceable_wrapper_subclass(arg):
        context = SubclassSymbolicContext(
            dynamic_sizes=context.dynamic_sizes, constraint_sizes=context.constraint_sizes, tensor_source=source,
            inner_contexts={attr: StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DUCK] * getattr(arg, attr).dim())
                            for attr in arg.__tensor_flatten__()[0]})
    return context


def new_symint(shape_env: Any, value: int | None, source: Any, *, unbacked: bool) -> Any:
    """A symbolic int of ``shape_env`` whose symbol no tensor dimension has: unbacked, or a
    dynamic one with ``value`` as its hint."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    if unbacked:
        return shape_env.create_unbacked_symint(source=source)
    return shape_env.create_symintnode(shape_env.create_symbol(value, source, DimDynamic.DYNAMIC), hint=value,
                                       source=source)


def input_symbols(shape_env: Any) -> Any:
    """Around making a graph's inputs: the unbacked symbols made there are bound by the inputs
    that hold them (as Dynamo's own fakified inputs are), not pending for the first operator
    that a trace records (``make_fx`` would bind them to its placeholders and fail)."""
    return shape_env.ignore_fresh_unbacked_symbols()


def retraced(gm: Any, args: list[Any]) -> Any:
    """``gm`` traced again by ``make_fx`` on ``args`` (fake ones inside their fake mode, as
    AOTAutograd traces): every node then carries the meta (``val``) Inductor's inner compiler
    reads. The re-trace takes every output of a higher-order op (flex_attention's third, which
    the graph did not use); Inductor's lowering gives only the ones a graph uses, so the unused
    ones it added are taken out again."""
    from torch.fx.experimental.proxy_tensor import make_fx

    traced = make_fx(gm, tracing_mode="real")(*args)
    unused = [n for n in traced.graph.nodes if n.op == "call_function" and n.target is operator.getitem and not n.users]
    for node in reversed(unused):
        traced.graph.erase_node(node)
    if unused:
        traced.recompile()
    return traced


def sympy_functions() -> Any:
    """The module of the integer functions torch's symbolic shapes print (``FloorDiv``,
    ``ModularIndexing`` ...)."""
    from torch.utils._sympy import functions

    return functions
