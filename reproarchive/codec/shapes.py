"""The dynamic-shape policy of a compile <-> the ``shapes`` record (spec §8), side by side.

``policy_of`` reads what Dynamo hands a backend: each placeholder's fake value (a FakeTensor
whose sizes are SymInts, or a SymInt) and the ShapeEnv they share, plus the real inputs (the
``mark_dynamic`` / ``mark_unbacked`` marks are attributes of the user's tensors). For every
input dimension it records static / backed / unbacked, the expression, hint, value range,
source, equal dimensions and the decision that made it so; for the compile, the ShapeEnv's
symbols, guards (rendered over the inputs' sources, as Dynamo renders them) and deferred
runtime asserts.

``fakes_for`` goes the other way for a replay: a fresh ShapeEnv and FakeTensorMode, and one
fake value per input made with the recorded per-dimension policy (``DimDynamic`` and range per
dimension, the recorded sources, so that symbol names and guard text come out as Dynamo's did),
not with blanket symbolic tracing: static stays static, unbacked stays unbacked, equal
dimensions share a symbol and independent ones do not. Expressions come back through
``codec.symbolic_text`` only.

The policy a TORCH_TRACE log or a dumped script tells is read in ``codec.logged_shapes``.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from reproarchive.codec.shape_guards import (
    as_handed,
    entry_shape_guards,
    fixed_by_compile,
    noted_entry,
    placeholder_facts,
    policy_guards,
    rendered_guards,
    restricted_entry,
    source_named,
)
from reproarchive.codec.symbolic_text import parse
from reproarchive.compat.fake import (
    dynamo_shape_env_settings,
    free_unbacked_symbols,
    input_symbols,
    is_fake_tensor,
    new_fake_mode,
    new_shape_env,
    new_symint,
    symbolic_context,
)
from reproarchive.errors import UnsafeArchiveError
from reproarchive.format.schema import ConfigRecord, ShapeDim, ShapeInput, ShapePolicy, ShapeSymbol

STATIC, BACKED, UNBACKED = "static", "backed", "unbacked"
_DYNAMO_SETTINGS = ("assume_static_by_default", "automatic_dynamic_shapes", "capture_dynamic_output_shape_ops",
                    "capture_scalar_outputs", "specialize_int", "specialize_float")


# --------------------------------------------------------------------------------------------
# torch -> record


def policy_of(gm: Any, inputs: Sequence[Any], config: ConfigRecord | None = None) -> ShapePolicy | None:
    """The shape policy of ``gm``'s placeholders (their ``example_value``), or None when they
    carry no fake values (a graph that did not come from Dynamo). Never raises: a policy that
    cannot be read is left out of the archive, never in place of the user's failure."""
    try:
        return _policy_of(gm, list(inputs), config)
    except Exception:  # noqa: BLE001 - recording is best effort; the archive says nothing then
        return None


def _policy_of(gm: Any, inputs: list[Any], config: ConfigRecord | None) -> ShapePolicy | None:
    values, sources, shape_env = placeholder_facts(gm)
    if shape_env is None:
        return None
    dynamo = dict((config.modules.get("torch._dynamo.config") or {}) if config is not None else {})
    dynamic_default = dynamo.get("assume_static_by_default") is False
    records = [r for r in (_input_record(shape_env, i, value, real, source, dynamic_default)
                           for i, (value, real, source) in enumerate(zip(values, inputs + [None] * len(values),
                                                                         sources)))
               if r is not None]
    settings = {k: v for k, v in dataclasses.asdict(shape_env.settings).items() if isinstance(v, (bool, int, str))}
    settings.update({k: dynamo[k] for k in _DYNAMO_SETTINGS if isinstance(dynamo.get(k), (bool, int, str))})
    return ShapePolicy(
        recorded_from="fake_tensors", inputs=linked(records), symbols=_symbols(shape_env),
        guards=tuple(policy_guards(shape_env, values, sources)),
        shape_guards=tuple(str(g.expr) for g in shape_env.guards),
        runtime_asserts=tuple(str(ra.expr) for ras in shape_env.deferred_runtime_asserts.values() for ra in ras),
        settings=settings, entry=noted_entry(gm),
    )


def _input_record(shape_env, i: int, value: Any, real: Any, source: str | None,
                  dynamic_default: bool) -> ShapeInput | None:
    """One input's policy from its fake value, or None for an input that has none."""
    if isinstance(value, torch.Tensor):
        marks = _marks(real)
        dims = tuple(_dim(shape_env, s, _real_size(real, d), f"{source}.size()[{d}]" if source else None,
                          _origin(d, marks, dynamic_default), marks["ranges"].get(d))
                     for d, s in enumerate(value.shape))
        return ShapeInput(input=i, kind="tensor", source=source, dims=dims)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        plain = real if isinstance(real, (int, float, bool)) else None
        dim = _dim(shape_env, value, plain, source, "dynamic=True" if dynamic_default else "automatic", None)
        return ShapeInput(input=i, kind=type(value).__name__.lower(), source=source, dims=(dim,))
    return None


def linked(records: list[ShapeInput]) -> tuple[ShapeInput, ...]:
    """The records with each symbolic dimension's ``equal_to`` filled in, and a symbolic scalar
    that is a tensor's size (Dynamo's ``s77`` placeholder) given that dimension's origin."""
    where: dict[str, list[str]] = {}
    origin: dict[str, str | None] = {}
    for r in records:
        for d, dim in enumerate(r.dims):
            if dim.kind != STATIC:
                where.setdefault(dim.expr, []).append(f"{r.input}.{d}")
                if r.kind == "tensor":
                    origin.setdefault(dim.expr, dim.origin)

    def linked(r: ShapeInput, d: int, dim: ShapeDim) -> ShapeDim:
        if dim.kind == STATIC:
            return dim
        return dataclasses.replace(
            dim, equal_to=tuple(x for x in where[dim.expr] if x != f"{r.input}.{d}"),
            origin=origin.get(dim.expr, dim.origin) if r.kind != "tensor" else dim.origin)

    return tuple(dataclasses.replace(r, dims=tuple(linked(r, d, dim) for d, dim in enumerate(r.dims)))
                 for r in records)


def _marks(real: Any) -> dict[str, Any]:
    """What the user asked of this tensor: ``torch._dynamo.mark_dynamic`` (with min/max),
    ``maybe_mark_dynamic`` and ``mark_unbacked`` leave these attributes on it."""
    ranges = {r.dim: (r.min, r.max) for r in getattr(real, "_dynamo_dynamic_range", ()) or ()}
    return {"dynamic": set(getattr(real, "_dynamo_dynamic_indices", ()) or ()),
            "weak": set(getattr(real, "_dynamo_weak_dynamic_indices", ()) or ()),
            "unbacked": set(getattr(real, "_dynamo_unbacked_indices", ()) or ()), "ranges": ranges}


def _origin(d: int, marks: dict[str, Any], dynamic_default: bool) -> str:
    if d in marks["unbacked"]:
        return "mark_unbacked"
    if d in marks["dynamic"]:
        return "mark_dynamic"
    if d in marks["weak"]:
        return "maybe_mark_dynamic"
    return "dynamic=True" if dynamic_default else "automatic"


def _real_size(real: Any, d: int) -> int | None:
    if isinstance(real, torch.Tensor) and not _is_fake(real) and d < real.dim():
        size = real.shape[d]
        return None if isinstance(size, torch.SymInt) else int(size)  # a ragged size (``j1``) has no value
    return None


def _is_fake(t: torch.Tensor) -> bool:
    return is_fake_tensor(t) or t.device.type == "meta"


def _dim(shape_env, size: Any, real: Any, source: str | None, origin: str, marked: Any) -> ShapeDim:
    if not isinstance(size, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        asked = origin in ("mark_dynamic", "maybe_mark_dynamic", "mark_unbacked", "dynamic=True") or marked
        zero_one = type(size) is int and size in (0, 1) and asked
        return ShapeDim(kind=STATIC, size=int(size) if type(size) is int else None, source=source,
                        origin=origin if zero_one else "static", specialized="0/1" if zero_one else None)
    expr = size.node.expr
    unbacked = bool(_free_unbacked(expr))
    hint = real if real is not None else (None if unbacked else size.node.hint)
    low, high = _range(shape_env, expr)
    return ShapeDim(kind=UNBACKED if unbacked else BACKED, size=_plain_int(hint), expr=str(expr), source=source,
                    min=low, max=high, origin=origin)


def _free_unbacked(expr) -> set:
    return free_unbacked_symbols(expr)


def _range(shape_env, expr) -> tuple[int | None, int | None]:
    try:
        vr = shape_env.bound_sympy(expr)
    except Exception:  # noqa: BLE001 - an expression sympy cannot bound: range unknown
        return None, None
    if vr is None:  # a nested jagged tensor's ragged size (a nested int) has no value range
        return None, None
    return _plain_int(vr.lower), _plain_int(vr.upper)


def _plain_int(value: Any) -> int | None:
    """A finite integer bound or hint as an int; None for unbounded (``int_oo``) or unknown."""
    if type(value) is int or getattr(value, "is_Integer", False) is True:
        as_int = int(value)
        return as_int if abs(as_int) < (1 << 62) else None
    return None


def _backed_values(shape_env) -> dict:
    values = getattr(shape_env, "backed_var_to_val", None)  # torch 2.13's name; var_to_val before
    return values if values is not None else shape_env.var_to_val


def _symbols(shape_env) -> tuple[ShapeSymbol, ...]:
    out = []
    for sym, vr in sorted(shape_env.var_to_range.items(), key=lambda kv: str(kv[0])):
        unbacked = bool(_free_unbacked(sym))
        replaced = shape_env.replacements.get(sym)
        out.append(ShapeSymbol(
            name=str(sym), kind=UNBACKED if unbacked else BACKED, hint=_plain_int(_backed_values(shape_env).get(sym)),
            min=_plain_int(vr.lower), max=_plain_int(vr.upper),
            sources=tuple(s.name for s in shape_env.var_to_sources.get(sym, ()) if isinstance(s.name, str)),
            replaced_by=str(replaced) if replaced is not None and replaced != sym else None))
    return tuple(out)


def is_symbolic(policy: ShapePolicy | None) -> bool:
    """Whether a recorded compile had anything symbolic: a non-static input dimension or a
    symbol of its own (an unbacked size from ``nonzero()``/``.item()``)."""
    if policy is None:
        return False
    return bool(policy.symbols) or any(d.kind != STATIC for r in policy.inputs for d in r.dims)


def restricted(policy: ShapePolicy | None, names_before: Sequence[str], names_after: Sequence[str],
               inputs: Sequence[Any] | None = None, inner: Mapping[str, tuple[ShapeDim | None, ...]] | None = None):
    """``policy`` for a graph whose inputs are ``names_after`` (a minifier candidate), made from
    the graph whose inputs were ``names_before``: an input kept under its placeholder name keeps
    its recorded policy (a symbolic input stays symbolic), renumbered; an input cut from an inner
    value is described by ``inner`` (``codec.inner_shapes``: its dimensions that are an input's
    symbol, with no source of their own), else static. Guards that name a dropped tensor's
    source are left out. With ``inputs`` (the candidate's values) each dimension's ``size`` is
    the size it has now."""
    if policy is None:
        return None
    position = {name: i for i, name in enumerate(names_before)}
    moved = {position[name]: j for j, name in enumerate(names_after) if name in position}
    kept = [r for r in policy.inputs if r.input in moved]
    dropped = [r.source for r in policy.inputs if r.input not in moved and r.source and r.kind == "tensor"]

    def renumbered(ref: str) -> str | None:
        i, _, d = ref.partition(".")
        return f"{moved[int(i)]}.{d}" if i.isdigit() and int(i) in moved else None

    def now(r: ShapeInput, d: int, dim: ShapeDim) -> int | None:
        value = inputs[moved[r.input]] if inputs is not None else None
        if isinstance(value, torch.Tensor) and d < value.dim():
            return _real_size(value, d)
        return int(value) if type(value) is int else dim.size

    inputs_after = tuple(dataclasses.replace(r, input=moved[r.input], dims=tuple(
        dataclasses.replace(dim, size=now(r, d, dim), equal_to=tuple(x for x in map(renumbered, dim.equal_to) if x))
        for d, dim in enumerate(r.dims))) for r in kept)
    cut = _cut_inputs(names_after, {names_before[r.input] for r in kept}, inner or {}, inputs)
    if cut:
        inputs_after = linked([*inputs_after, *cut])
    def kept_guard(text: str) -> bool:
        return not any(src in text for src in dropped)

    guards = tuple(filter(kept_guard, policy.guards))
    still = {name for r in (*kept, *cut) for dim in r.dims if dim.expr for name in _names_in(dim.expr)}
    gone = {name for r in policy.inputs if r.input not in moved for dim in r.dims if dim.expr
            for name in _names_in(dim.expr)} - still

    def holds(text: str) -> bool:  # a relation of a symbol only cut inputs had cannot be re-created
        return not _names_in(text) & gone

    return dataclasses.replace(policy, inputs=tuple(sorted(inputs_after, key=lambda r: r.input)), guards=guards,
                               shape_guards=tuple(filter(holds, policy.shape_guards)),
                               runtime_asserts=tuple(filter(holds, policy.runtime_asserts)),
                               entry=restricted_entry(policy, kept_guard, holds))


def _cut_inputs(names: Sequence[str], described: set[str], inner: Mapping[str, tuple[ShapeDim | None, ...]],
                inputs: Sequence[Any] | None) -> list[ShapeInput]:
    """``restricted``'s records of the inputs that the policy does not describe (cut from inner
    values; a collective's value in a job's graph without collectives) and ``inner`` does."""
    out = []
    for j, name in enumerate(names):
        dims = inner.get(name)
        value = inputs[j] if inputs is not None else None
        if name in described or not dims or (isinstance(value, torch.Tensor) and value.dim() != len(dims)):
            continue
        sizes = [_real_size(value, d) if isinstance(value, torch.Tensor) else None for d in range(len(dims))]
        out.append(ShapeInput(input=j, kind="tensor", dims=tuple(
            dataclasses.replace(dim, size=size if size is not None else dim.size, source=None, equal_to=())
            if dim is not None and _in_range(dim, size) else ShapeDim(kind=STATIC, size=size)
            for dim, size in zip(dims, sizes))))
    return out


def _in_range(dim: ShapeDim, size: int | None) -> bool:
    """Whether a cut input's (maybe cropped) size can be its symbol: out of the recorded range
    (1 where it starts at 2) the compile would have made it static, and so it is."""
    return size is None or ((dim.min is None or size >= dim.min) and (dim.max is None or size <= dim.max))


def _names_in(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_]\w*", text))


def placeholder_names(gm: Any) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op == "placeholder"]


# --------------------------------------------------------------------------------------------
# record -> torch


@dataclasses.dataclass
class ReplayShapes:
    """The fake side of a replay: ``fake_mode`` (with its ShapeEnv), one fake value per input
    (None where the input has no policy), the sources they were made from, and what could not
    be re-created as recorded (``problems``)."""

    fake_mode: Any
    fakes: list[Any]
    sources: list[Any]
    problems: list[str]

    @property
    def shape_env(self):
        return self.fake_mode.shape_env

    def guards(self) -> list[str]:
        return rendered_guards(self.shape_env, self.fakes, self.sources)


#: the ShapeEnv settings a replay takes from the record (the others are Dynamo's, in its config)
SHAPE_ENV_SETTINGS = ("duck_shape", "specialize_zero_one", "allow_dynamic_output_shape_ops", "allow_scalar_outputs",
                      "prefer_deferred_runtime_asserts_over_guards")


def shape_env_settings(policy: ShapePolicy) -> dict[str, bool]:
    return {k: v for k, v in policy.settings.items() if k in SHAPE_ENV_SETTINGS and isinstance(v, bool)}


def replay_shape_env(policy: ShapePolicy | None) -> Any:
    """A fresh ``ShapeEnv`` made as Dynamo made the recorded one: its recorded settings, and
    for those not recorded (a static graph's policy from a dump or a log, no policy) the ones
    Dynamo takes from the config, which the replay has set to the recorded one."""
    return new_shape_env(**{**dynamo_shape_env_settings(), **(shape_env_settings(policy) if policy else {})})


def dimension_plan(policy: ShapePolicy) -> dict[int, list[tuple[str, Any, str | None]]]:
    """How a replay makes each recorded dimension, as plain data (``export`` writes it into its
    script): input -> one ``(DimDynamic name, constraint, expr)`` per dimension, the constraint
    None, ``"relaxed"`` or ``[min, max]`` (max None: unbounded), as Dynamo passes them: a range
    for ``mark_dynamic(min=, max=)``, a relaxed one for a dimension made dynamic on its own, none
    for duck sizing. Dimensions recorded with the same expression share a symbol by duck sizing
    (``DUCK``); independent ones get one each (``DYNAMIC``), whatever their sizes. A dimension
    whose symbol a guard fixed to a number is static, unless the backend's compile added that
    guard (``codec.shape_guards.as_handed``): Dynamo handed it as a symbol."""
    return _plan(as_handed(policy))


def _plan(policy: ShapePolicy) -> dict[int, list[tuple[str, Any, str | None]]]:
    """``dimension_plan`` of a policy already as handed to the backend."""
    shared = _shared_exprs(policy)
    plan = {}
    for rec in policy.inputs:
        dims = []
        for dim in rec.dims:
            if _static(dim):
                dims.append(("STATIC", None, None))
                continue
            kind = "UNBACKED" if dim.kind == UNBACKED else "DUCK" if dim.expr in shared else "DYNAMIC"
            if dim.origin == "mark_dynamic" and (dim.min is not None or dim.max is not None):
                constraint: Any = [dim.min if dim.min is not None else 0, dim.max]
            else:
                constraint = "relaxed" if kind == "DYNAMIC" else None
            dims.append((kind, constraint, dim.expr))
        plan[rec.input] = dims
    return plan


def _make_inputs(policy: ShapePolicy, args: Sequence[Any], names: Sequence[str], fake_mode, shape_env,
                 fakes: list[Any], sources: list[Any], problems: list[str]) -> dict[str, Any]:
    """``fakes_for``'s inputs, tensors first (their dimensions make the symbols), then the symbolic
    scalars, which reuse a tensor's symbol of the same recorded expression: filled into ``fakes``
    and ``sources``; returns the symbols by recorded expression."""
    by_input = {r.input: r for r in policy.inputs}
    plan = _plan(policy)  # ``fakes_for`` handed it the policy as Dynamo handed the backend
    symbols: dict[str, Any] = {}
    for i, arg in enumerate(args):
        rec = by_input.get(i)
        if not isinstance(arg, torch.Tensor):
            continue
        if rec is None or rec.kind != "tensor":
            # Dynamo fakifies every input: one the policy does not describe (a value a minifier
            # cut from inside the graph) is static, never left for a backend to make dynamic
            fakes[i] = _fake(fake_mode, arg, [("STATIC", None, None)] * arg.dim(), source_named(f"L[{names[i]!r}]"))
            continue
        if len(rec.dims) != arg.dim():
            problems.append(f"input {i} has {arg.dim()} dimensions, the recorded policy {len(rec.dims)}")
            continue
        source = source_named(rec.source or f"L[{names[i]!r}]")
        # guards are rendered over the recorded sources only, as they were recorded
        fakes[i], sources[i] = _fake(fake_mode, arg, plan[i], source), source if rec.source else None
        for dim, size in zip(rec.dims, fakes[i].shape):
            if dim.kind != STATIC and isinstance(size, torch.SymInt) and dim.expr and dim.expr not in symbols:
                symbols[dim.expr] = size
    for i, arg in enumerate(args):
        rec = by_input.get(i)
        if rec is None or rec.kind == "tensor" or not rec.dims:
            continue
        dim = rec.dims[0]
        if _static(dim):
            continue
        value = symbols.get(dim.expr)
        if value is None:
            value = _free_symint(shape_env, arg, dim, source_named(rec.source or f"L[{names[i]!r}]"))
        fakes[i], sources[i] = value, source_named(rec.source) if rec.source else None
    return symbols


_NUMBER = re.compile(r"-?\d+")


def _static(dim: ShapeDim) -> bool:
    """Static by the end of the recorded compile: recorded static, or a symbol a guard fixed to a
    number (its expression is that number)."""
    return dim.kind == STATIC or _NUMBER.fullmatch(dim.expr or "") is not None


def fakes_for(policy: ShapePolicy, args: Sequence[Any], names: Sequence[str]) -> ReplayShapes:
    """Fake values for ``args`` made with ``policy`` (``dimension_plan``); ``names`` are the
    placeholders' names, the sources of inputs the policy gives none. Symbol inputs reuse the
    symbol of the tensor dimension with the same recorded expression (Dynamo passes ``s77`` next
    to the tensor whose size it is)."""
    policy = as_handed(policy)
    shape_env = replay_shape_env(policy)
    fake_mode = new_fake_mode(shape_env)
    fakes: list[Any] = [None] * len(args)
    sources: list[Any] = [None] * len(args)
    problems: list[str] = []
    with input_symbols(shape_env):
        symbols = _make_inputs(policy, args, names, fake_mode, shape_env, fakes, sources, problems)
    _restore_equalities(policy, shape_env, {k: v.node.expr for k, v in symbols.items()}, problems)
    return ReplayShapes(fake_mode, fakes, sources, problems)


def _shared_exprs(policy: ShapePolicy) -> set[str]:
    """Expressions recorded for more than one tensor dimension (duck-sized or guarded equal);
    Dynamo's symbolic scalar placeholder of a size does not count, it is that size."""
    seen: dict[str, int] = {}
    for r in policy.inputs:
        for d in r.dims if r.kind == "tensor" else ():
            if d.kind != STATIC:
                seen[d.expr] = seen.get(d.expr, 0) + 1
    return {expr for expr, count in seen.items() if count > 1}


def _fake(fake_mode, arg: torch.Tensor, plan: list[tuple[str, Any, str | None]], source):
    """``arg`` fakified in ``fake_mode`` with one ``dimension_plan`` entry per dimension."""
    context = symbolic_context(arg, plan, source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fake_mode.from_tensor(arg, symbolic_context=context, source=source)


def _free_symint(shape_env, arg: Any, dim: ShapeDim, source):
    """A symbolic scalar input whose symbol no tensor dimension has (a dynamic int argument)."""
    value = int(arg) if isinstance(arg, (int, torch.SymInt)) else dim.size
    return new_symint(shape_env, value, source, unbacked=dim.kind == UNBACKED)


def _restore_equalities(policy: ShapePolicy, shape_env, recorded: dict[str, Any], problems: list[str]) -> None:
    """Re-assert the recorded ShapeEnv guards that relate symbols (``Eq(s1, 2*s0)``: a derived
    dimension); read through the closed grammar, never evaluated. A recorded symbol is the
    replay's symbol of the same dimension (``recorded``): symbols are named after their
    sources, and an input recorded without one (a graph after AOTAutograd) gets another name
    here."""

    names = {str(s): s for s in shape_env.var_to_range}
    names.update({k: v for k, v in recorded.items() if getattr(v, "is_Symbol", False)})
    # symbols Dynamo made while visiting a subclass's inner tensors exist only in its own trace
    ephemeral = {s.name for s in policy.symbols if s.sources and all(x.startswith("<ephemeral") for x in s.sources)}
    # a symbol a guard fixed to a number is replayed as that number (``_static``): nothing to relate
    fixed = {s.name for s in policy.symbols if _NUMBER.fullmatch(s.replaced_by or "")} - set(
        fixed_by_compile(policy).values())  # Dynamo handed those as symbols
    symbols = {s.name for s in policy.symbols}
    for text in entry_shape_guards(policy):
        named = _names_in(text) & symbols
        if ephemeral & _names_in(text) or (named and named <= fixed):
            continue
        try:
            expr = parse(text, names)
        except UnsafeArchiveError as err:
            problems.append(f"recorded guard not re-created: {err}")
            continue
        if expr.free_symbols and expr.free_symbols <= set(names.values()):
            try:
                shape_env.evaluate_expr(expr)
            except Exception as err:  # noqa: BLE001 - the replay's values contradict the guard
                problems.append(f"recorded guard {text!r} does not hold here: {type(err).__name__}")

