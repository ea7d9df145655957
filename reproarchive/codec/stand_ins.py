"""Stand-ins: a custom op this process does not have, replayed from its recorded calls.

When an archive's graph calls ``mylib::op`` and ``mylib`` is not loaded here, ``load``
registers an operator under the recorded name and schema whose kernel returns the recorded
outputs for the recorded inputs (matched by the content of every argument,
``custom_ops.argument_key``) and raises for any other input, and whose fake implementation
gives the recorded output shapes, so the rest of the graph compiles, reproduces and minifies.

Nothing from the archive is imported or loaded: the schema string is parsed by torch's own
schema parser and judged by the effect rule of every operator (``operator_effects``); a schema
that writes or aliases its arguments is refused (a table of outputs cannot honour it), and so
is any namespace torch itself uses. The real implementation comes only from the user
(``run --import MODULE`` / ``--load-library PATH``, ``bring_implementations``).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Any, Sequence

import torch

from reproarchive.codec import custom_ops as co
from reproarchive.codec.operator_effects import SCHEMA_BLIND, schema_problem
from reproarchive.compat.dispatch import OpNamespace, parse_schema
from reproarchive.compat.fake import hint_of
from reproarchive.errors import NotReplayableHereError, ReproArchiveError, Rule, UnsafeArchiveError
from reproarchive.format.schema import CustomOpRecord

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")

#: The modules the user brought (``--import``), in order: where their Triton kernels are looked
#: for (``codec.triton_kernels.brought_kernels``); nothing else of this process is.
BROUGHT_MODULES: list[str] = []

#: name -> the stand-in registered in this process (its table is replaced by a later load).
_INSTALLED: dict[str, _StandIn] = {}


class StandInMiss(RuntimeError):
    """A stand-in was called with inputs no recorded call had."""


class _StandIn:
    def __init__(self, name: str, schema: Any):
        self.name, self.schema = name, schema
        self.calls: list[co.LiveCall] = []
        self.library: Any = None

    def kernel(self, *args, **kwargs):
        key = co.argument_key(self.schema, args, kwargs)
        for call in self.calls:
            if call.arguments == key or not call.arguments:  # no arguments recorded: any input (generated)
                device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
                outs = tuple(_fresh(v, device) for v in call.outputs)
                return outs[0] if len(self.schema.returns) == 1 else outs
        raise StandInMiss(
            f"stand-in for custom op {self.name}: no call with these inputs was recorded "
            f"({len(self.calls)} recorded); its library is not loaded here, so it cannot compute new values "
            "(bring it with --import MODULE or --load-library PATH)")

    def fake(self, *args, **kwargs):
        """Matched on shapes and dtypes; in a symbolic compile, on the sizes' hints (the run's
        values), and an output's size that equals a symbolic input size's hint is that symbol:
        the recorded shape, kept symbolic where the inputs were (a stand-in knows no shape
        function, and a fixed size would specialize the compile's symbols)."""
        symbols: dict[int, Any] = {}
        hinted_args = tuple(_hinted(a, symbols) for a in args)
        hinted_kwargs = {k: _hinted(v, symbols) for k, v in kwargs.items()}
        key = co.meta_key(co.argument_key(self.schema, hinted_args, hinted_kwargs, content=False))
        for call in self.calls:
            if co.meta_key(call.arguments) == key or not call.arguments:
                device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
                outs = tuple(_empty_like(v, device, symbols) for v in call.outputs)
                return outs[0] if len(self.schema.returns) == 1 else outs
        raise StandInMiss(f"stand-in for custom op {self.name}: no call with inputs of these shapes and dtypes "
                          "was recorded")


def _hinted(value: Any, symbols: dict[int, Any]) -> Any:
    """``value`` for the shape key: a tensor with symbolic sizes as a meta tensor of their hints
    (each symbol noted in ``symbols`` by its hint); other values as they are."""
    if isinstance(value, (list, tuple)):
        return type(value)(_hinted(v, symbols) for v in value)
    if not isinstance(value, torch.Tensor) or not any(isinstance(d, torch.SymInt) for d in value.shape):
        return value
    shape = []
    for d in value.shape:
        hint = hint_of(d)
        if hint is None:  # an unbacked size: no value to match a recorded call on
            return value
        if isinstance(d, torch.SymInt):
            symbols.setdefault(int(hint), d)
        shape.append(int(hint))
    return torch.empty(shape, dtype=value.dtype, device="meta")


def _fresh(value: Any, device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone() if device is None else value.to(device=device, copy=True)
    if isinstance(value, (list, tuple)):
        return type(value)(_fresh(v, device) for v in value)
    return value


def _empty_like(value: Any, device, symbols: dict[int, Any] | None = None) -> Any:
    if isinstance(value, torch.Tensor):
        device = device if device is not None else value.device
        shape = [(symbols or {}).get(int(d), d) for d in value.shape]
        if any(isinstance(d, torch.SymInt) for d in shape):  # contiguous, in the compile's symbols
            return torch.empty(shape, dtype=value.dtype, device=device)
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=device)
    if isinstance(value, (list, tuple)):
        return type(value)(_empty_like(v, device, symbols) for v in value)
    return value


def _refused(name: str, why: str) -> UnsafeArchiveError:
    return UnsafeArchiveError(f"custom op {name[:120]!r} cannot get a stand-in: {why}",
                              "an archive may only name tensor operations (spec 7.3); refusing to load it",
                              rule=Rule.CALL_TARGET)


def parsed_schema(name: str, schema_text: str) -> Any:
    """The recorded schema, parsed by torch's parser and checked against the rule a stand-in
    can honour: a tensor computation (``operator_effects``) that neither writes nor aliases its
    arguments, in a namespace that is not torch's, named as the record names it."""
    try:
        schema = parse_schema(schema_text)
    except RuntimeError as exc:
        raise _refused(name, f"its schema does not parse ({str(exc).splitlines()[0][:80]})") from None
    namespace, _, rest = schema.name.partition("::")
    overload = name.partition("::")[2].partition(".")[2]
    if (f"{namespace}::{rest}", schema.overload_name or "default") != (name.partition(".")[0], overload):
        raise _refused(name, f"its schema names {schema.name}.{schema.overload_name or 'default'}")
    if (not (_IDENT.match(namespace) and _IDENT.match(rest)) or namespace in co.TORCH_NAMESPACES
            or not isinstance(getattr(torch.ops, namespace, None), OpNamespace)):
        raise _refused(name, f"namespace {namespace!r} is torch's own or not a plain name")
    if (why := SCHEMA_BLIND.get(namespace) or schema_problem(schema)) is not None:
        raise _refused(name, why)
    if any(a.alias_info is not None for a in (*schema.arguments, *schema.returns)):
        raise _refused(name, "it writes or aliases its arguments, which recorded outputs cannot honour")
    return schema


def _registered(name: str) -> bool:
    namespace, _, rest = name.partition("::")
    opname, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, namespace), opname)
        getattr(packet, overload)
        return True
    except (AttributeError, RuntimeError):
        return False


def install(records: Sequence[CustomOpRecord]) -> list[str]:
    """Stand-ins for the custom ops of ``records`` that this process does not have (or whose
    stand-in an earlier load installed); returns their names. Their calls are given afterwards
    (``set_calls``), once the recorded outputs are decoded: until then any call fails."""
    installed = []
    for record in records:
        name = record.name
        current = _INSTALLED.get(name)
        namespace, _, rest = name.partition("::")
        if not (_IDENT.match(namespace) and all(_IDENT.match(p) for p in rest.split(".", 1))) or "." not in rest:
            raise _refused(name, "it is not a plain ns::op.overload name")
        if current is None and _registered(name):
            continue  # the real op (or one the user brought): used as it is
        schema = parsed_schema(name, record.schema)
        if current is None:
            current = _define(name, schema)
        elif str(current.schema) != str(schema):
            raise NotReplayableHereError(
                f"custom op {name} already has a stand-in with schema {current.schema}, not {schema}",
                "replay this archive in a fresh process", rule=Rule.CALL_TARGET)
        current.calls = []
        installed.append(name)
    return installed


def set_calls(ops: Sequence[co.LiveCustomOp]) -> None:
    """The recorded calls each installed stand-in answers from."""
    for op in ops:
        if op.name in _INSTALLED:
            _INSTALLED[op.name].calls = list(op.calls)


def _define(name: str, schema: Any) -> _StandIn:
    stand_in = _StandIn(name, schema)
    namespace, _, definition = str(schema).partition("::")
    stand_in.library = define_operator(namespace, definition, stand_in.kernel, stand_in.fake)
    _INSTALLED[name] = stand_in
    return stand_in


def define_operator(namespace: str, definition: str, kernel: Any, fake: Any) -> Any:
    """Register ``namespace::definition`` (a schema without its namespace, ``op(Tensor x) -> ()``)
    with ``kernel`` for every backend and ``fake`` for tracing: what a stand-in is (here, and for a
    Triton kernel's launch, ``triton_kernels``). The returned library keeps it registered."""
    lib = torch.library.Library(namespace, "FRAGMENT")  # noqa: TOR901 - the caller keeps it alive
    lib.define(definition)
    name = definition.partition("(")[0]
    lib.impl(name, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{namespace}::{name}", fake, lib=lib)
    return lib


def _withdraw_stand_ins() -> None:
    """Unregister the stand-ins earlier loads in this process installed: the implementation the
    user brings registers the same names, and could not while a stand-in held them (a ``load``
    and then a ``run --import`` in one process failed). A load after this stands in again for
    what is still missing."""
    if not _INSTALLED:
        return
    for stand_in in list(_INSTALLED.values()):
        stand_in.library._destroy()
    _INSTALLED.clear()  # ``codec.targets`` resolves a custom op's name afresh: no stand-in is kept there


def is_stand_in(name: str) -> bool:
    return name in _INSTALLED


# --------------------------------------------------------------------------------------------
# the real implementation, brought by the user


def bring_implementations(imports: Sequence[str] = (), libraries: Sequence[str] = ()) -> None:
    """Import the modules and load the shared libraries the user named (``--import``,
    ``--load-library``), before an archive is loaded. Only ever called with the user's own
    arguments: no name from an archive reaches here."""
    if imports or libraries:
        _withdraw_stand_ins()
    if imports and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # as ``python -m`` would: the user's module next to them
    for module in imports:
        try:
            importlib.import_module(module)
            if module not in BROUGHT_MODULES:
                BROUGHT_MODULES.append(module)
        except Exception as exc:  # noqa: BLE001 - any failure of the user's module is theirs to see
            raise ReproArchiveError(f"--import {module}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
                                    "check the module name and that it imports in this environment") from None
    for path in libraries:
        if str(path) in getattr(torch.ops, "loaded_libraries", ()):
            continue
        try:
            torch.ops.load_library(str(path))
        except (OSError, RuntimeError) as exc:
            raise ReproArchiveError(f"--load-library {path}: {str(exc).splitlines()[0][:200]}",
                                    "check the path of the shared library") from None
