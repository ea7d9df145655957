"""The config record: snapshot, apply and diff of torch's compiler config.

PyTorch's repro scripts record only the config values that differ from the defaults, and
silently drop the ones they cannot print (custom passes). A failure that depends on a default
that moved between torch versions then "does not reproduce" on a teammate's machine and
nobody knows why. So an archive records the FULL value of every setting of the compiler config
modules, the changed ones again for people, and every value that cannot be stored listed by
name with the reason (never dropped silently). ``applied_config`` puts a recorded config back
for a replay (data only, never a program or path); ``config_diff`` says what differs.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import os
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from reproarchive.compat.config_modules import config_module_type
from reproarchive.context.admission import COMPARED_MODULES, CONFIG_MODULES, setting_problem
from reproarchive.context.config_apply import _UNSET, Application
from reproarchive.context.redaction import _looks_like_path, _redact_value, redact_paths
from reproarchive.errors import UnrepresentableValue
from reproarchive.format.plain import INT_MAX, INT_MIN
from reproarchive.format.schema import ConfigRecord, SettingRef, UnrepresentableSetting

# ---------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """Convert a config value to plain msgpack data, or raise UnrepresentableValue(reason).

    Tuples become lists and sets sorted lists (their container type is recorded next to the
    value so that ``applied_config`` can restore it). Anything whose meaning would change in
    the conversion (callables, classes, enums, dicts with non-str keys, objects) is refused.
    """
    if value is None or isinstance(value, (bool, str, float)):
        return value
    if isinstance(value, enum.Enum):
        raise UnrepresentableValue(f"enum value {type(value).__qualname__}.{value.name}")
    if isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            raise UnrepresentableValue("integer out of the 64-bit range")
        return int(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [_plain(v) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=repr)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise UnrepresentableValue("dict with non-string keys")
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, type):
        raise UnrepresentableValue(f"class {value.__module__}.{value.__qualname__}")
    if callable(value):
        name = getattr(value, "__qualname__", None) or type(value).__qualname__
        module = getattr(value, "__module__", None) or type(value).__module__
        raise UnrepresentableValue(f"callable {module}.{name} (code is never stored in an archive)")
    raise UnrepresentableValue(f"object of type {type(value).__module__}.{type(value).__qualname__}")


def _container_type(value: Any) -> str | None:
    if isinstance(value, tuple):
        return "tuple"
    if isinstance(value, (set, frozenset)):
        return "set"
    return None


def _short_repr(value: Any, limit: int = 300) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not break a capture
        text = f"<repr failed: {type(exc).__name__}>"
    text = redact_paths(text)
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", text)  # addresses differ every run
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _config_modules(import_required: bool = True) -> dict[str, Any]:
    mods: dict[str, Any] = {}
    for name in CONFIG_MODULES:
        mod = sys.modules.get(name)
        if mod is None and import_required:
            try:
                mod = importlib.import_module(name)
            except ImportError:
                mod = None
        if mod is not None:
            mods[name] = mod
    ConfigModule = config_module_type()
    if ConfigModule is None:  # pragma: no cover - very old torch
        return mods
    for name, mod in list(sys.modules.items()):
        if name not in mods and isinstance(mod, ConfigModule):
            mods[name] = mod
    return dict(sorted(mods.items()))


def _is_changed(mod: Any, key: str, value: Any) -> bool:
    """True when the current value differs from the setting's default.

    ``ConfigModule._is_default`` also calls a setting "not default" when it was merely assigned
    its default value; people reading "changed" want values, so compare values.
    """
    entry = mod._config[key]
    default = entry.default
    if getattr(entry, "justknob", None) is not None and default is not None:
        return value != default
    try:
        return bool(value != default)
    except Exception:  # exotic __eq__ (tensors, arrays): identity is the best we can do
        return value is not default


def config_snapshot() -> ConfigRecord:
    """The full current compiler configuration as plain data.

    Returns ``{"modules": {module: {key: value}}, "changed": {module: {key: value}},
    "defaults": {module: {key: default}} (for the changed keys), "unrepresentable": [{module,
    key, reason, repr}], "types": {module: {key: "tuple"|"set"}}, "machine_specific": [{module,
    key}]}``. Nested config classes appear flattened with dotted keys
    (``"cpp.inject_relu_bug_TESTING_ONLY"``), as ``ConfigModule`` stores them. A value that is
    not plain data is absent from "modules"/"changed" and listed in "unrepresentable" with a
    redacted ``repr``. Values that are absolute paths (cache and debug dirs, the CUTLASS
    checkout) are recorded with the home directory and cwd redacted and listed in
    "machine_specific": they describe the packing machine, so ``applied_config`` never
    applies them. Settings that are aliases of another setting are not recorded twice.
    """
    cwd = os.getcwd()
    path_prefixes = {cwd: "<cwd>"} if cwd not in ("/", "") else {}
    modules: dict[str, dict[str, Any]] = {}
    changed: dict[str, dict[str, Any]] = {}
    defaults: dict[str, dict[str, Any]] = {}
    types: dict[str, dict[str, str]] = {}
    unrepresentable: list[UnrepresentableSetting] = []
    machine_specific: list[SettingRef] = []

    for mod_name, mod in _config_modules().items():
        try:
            values = mod._get_dict()  # skips aliases; reads values without deprecation warnings
        except Exception:
            values = mod.get_config_copy()
        plain_values: dict[str, Any] = {}
        for key in sorted(values):
            value = values[key]
            is_changed = _is_changed(mod, key, value)
            try:
                plain = _plain(value)
            except UnrepresentableValue as why:
                unrepresentable.append(UnrepresentableSetting(mod_name, key, str(why), _short_repr(value), is_changed))
                continue
            if _looks_like_path(plain):
                plain = _redact_value(plain, path_prefixes)
                machine_specific.append(SettingRef(mod_name, key))
            plain_values[key] = plain
            kind = _container_type(value)
            if kind:
                types.setdefault(mod_name, {})[key] = kind
            if is_changed:
                changed.setdefault(mod_name, {})[key] = plain
                try:
                    defaults.setdefault(mod_name, {})[key] = _plain(mod._config[key].default)
                except (UnrepresentableValue, KeyError, AttributeError):
                    defaults.setdefault(mod_name, {})[key] = _short_repr(
                        getattr(mod._config.get(key), "default", None)
                    )
        modules[mod_name] = plain_values

    return ConfigRecord(modules=modules, changed=changed, defaults=defaults, unrepresentable=tuple(unrepresentable),
                        types=types, machine_specific=tuple(machine_specific))


# What torch writes into compilation_metrics' config strings for a value json cannot encode.
_LOGGED_UNSERIALIZABLE = ("Value is not JSON serializable",)


def config_from_values(values: Mapping[str, Mapping[str, Any]]) -> ConfigRecord:
    """A config record, shaped like ``config_snapshot``'s, from full values recorded elsewhere.

    TORCH_TRACE logs record the whole dynamo/inductor/functorch/torch.compiler config of the
    job as JSON (``compilation_metrics``). JSON keeps no tuples or sets and the log no defaults,
    so "changed"/"defaults" are computed against this torch's defaults and container types
    taken from them; a key this torch does not have counts as changed (its default is unknown
    here). Values torch could not encode are listed in "unrepresentable"; absolute paths are
    redacted and listed in "machine_specific", as in a snapshot.
    """
    live = _config_modules()
    cwd = os.getcwd()
    path_prefixes = {cwd: "<cwd>"} if cwd not in ("/", "") else {}
    record: dict[str, Any] = {"modules": {}, "changed": {}, "defaults": {}, "types": {}}
    unrepresentable: list[UnrepresentableSetting] = []
    machine_specific: list[SettingRef] = []
    for mod_name, recorded in values.items():
        entries = getattr(live.get(mod_name), "_config", None) or {}
        plain_values: dict[str, Any] = {}
        for key in sorted(recorded):
            value = recorded[key]
            if isinstance(value, str) and value in _LOGGED_UNSERIALIZABLE:
                unrepresentable.append(UnrepresentableSetting(
                    mod_name, key, "not recorded in the log (not JSON-serializable)", value, changed=True))
                continue
            logged = value
            if _looks_like_path(value):
                value = _redact_value(value, path_prefixes)
                machine_specific.append(SettingRef(mod_name, key))
            plain_values[key] = value
            entry = entries.get(key)
            default = getattr(entry, "default", _UNSET) if entry is not None else _UNSET
            kind = _container_type(default) if default is not _UNSET else None
            if kind:
                record["types"].setdefault(mod_name, {})[key] = kind
            try:
                plain_default = _plain(default) if default is not _UNSET else _UNSET
            except UnrepresentableValue:
                plain_default = _UNSET
            same = plain_default is not _UNSET and (
                plain_default == logged or (kind == "set" and isinstance(logged, list)
                                            and sorted(map(repr, logged)) == sorted(map(repr, plain_default))))
            if not same:
                record["changed"].setdefault(mod_name, {})[key] = value
                if plain_default is not _UNSET:
                    record["defaults"].setdefault(mod_name, {})[key] = plain_default
        record["modules"][mod_name] = plain_values
    return ConfigRecord(**record, unrepresentable=tuple(unrepresentable), machine_specific=tuple(machine_specific))


# ---------------------------------------------------------------------------------------------
# Applying a recorded config
# ---------------------------------------------------------------------------------------------


class AppliedConfig:
    """What ``applied_config`` did, so the caller can warn about what it could not do."""

    def __init__(self) -> None:
        self.applied: list[str] = []  # "module.key"
        self.missing: list[str] = []  # recorded keys this torch does not have
        self.missing_modules: list[str] = []  # recorded modules that cannot be imported here
        self.unrepresentable: list[str] = []  # recorded as unrepresentable: left as they are here
        self.machine_specific: list[str] = []  # paths of the packing machine: left as they are
        self.forced_by_env: list[str] = []  # an env var here forces a value; recorded one ignored
        self.failed: list[dict[str, str]] = []  # setattr raised
        self.unsafe: list[str] = []  # refused by context.admission (program, path, writer, not data)
        self.reasons: dict[str, str] = {}  # why each unsafe setting was refused

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def __repr__(self) -> str:
        return (
            f"AppliedConfig(applied={len(self.applied)}, missing={self.missing}, "
            f"missing_modules={self.missing_modules}, unrepresentable={self.unrepresentable}, "
            f"forced_by_env={self.forced_by_env}, failed={self.failed})"
        )


def safe_to_apply(key: str, value: Any) -> bool:
    """Whether a recorded config value may be applied (``context.admission``, the one filter
    for every replay and export)."""
    return setting_problem(key, value) is None


@contextlib.contextmanager
def applied_config(config_record: ConfigRecord | None, *, only_changed: bool = False) -> Iterator[AppliedConfig]:
    """Apply a recorded config snapshot to the live torch config modules for the ``with`` body.

    Every recorded value is applied (or, with ``only_changed``, only those that differed from
    the defaults on the packing machine), so a default that moved between torch versions does
    not change a replay. Never applied: keys this torch does not have (listed in ``missing``),
    values recorded as unrepresentable (a custom pass cannot come back from data) and
    machine-specific paths. On exit every touched setting is restored to exactly its previous
    state, "not set by the user" included, so ``_is_default`` and the inductor cache key see no
    trace of the replay. Like ``ConfigModule.patch`` this is per-thread (context-local).
    """
    result = AppliedConfig()
    if config_record is None:
        yield result
        return
    application = Application(config_record, only_changed, result)
    try:
        for mod_name, values in config_record.modules.items():
            application.module(mod_name, values)
        for u in config_record.unrepresentable:
            full = f"{u.module}.{u.key}"
            if u.changed and full not in result.unrepresentable:
                result.unrepresentable.append(full)
        yield result
    finally:
        application.restore()


# ---------------------------------------------------------------------------------------------


def comparable_snapshot(recorded: ConfigRecord | None) -> ConfigRecord:
    """This process's config, with every torch config module ``recorded`` names loaded first.

    A config module is recorded when it was imported while packing; in another process it may
    not be imported yet, and comparing then reports each of its settings as lacking here. So
    the modules the record names are imported, but only those on the project's fixed list
    (``admission.COMPARED_MODULES``, torch's own): importing runs a module's code, and an
    archive's names are untrusted (spec section 9). Any other module stays as it is here.
    """
    names = set((recorded.modules if recorded else {}) or {})
    names |= {u.module for u in (recorded.unrepresentable if recorded else ())}
    for name in sorted(names & set(COMPARED_MODULES)):
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - an older or partial torch: then it is not here
                pass
    return config_snapshot()


def config_diff(recorded: ConfigRecord | None, current: ConfigRecord | None) -> list[dict[str, Any]]:
    """Settings whose recorded value differs from the current one; never two equal values.

    Each entry is ``{module, key, recorded, current, status}`` with status:

    * ``"differs"``: both sides have the setting, with different values;
    * ``"unrepresentable"``: a callable or object on either side (compared by redacted ``repr``);
    * ``"missing_here"``: the current side has the module but not this setting (this torch
      lacks it); ``current`` is None meaning "no such setting", not the value None;
    * ``"new_here"``: a setting the recording side did not have, listed only when it is not at
      its default here; ``recorded`` is None meaning "no such setting";
    * ``"not_compared"``: the current side has no such module at all (here: not imported, and
      not one this package may import), so nothing is known about its settings; listed only for
      settings the recording changed from their default, with ``current`` None ("unknown").

    Machine-specific paths are not compared.
    """
    recorded = recorded or ConfigRecord()
    current = current or ConfigRecord()
    rec_mods = recorded.modules
    cur_mods = current.modules
    machine = {(m.module, m.key) for side in (recorded, current) for m in side.machine_specific}
    rec_un = {(u.module, u.key): u.repr for u in recorded.unrepresentable}
    cur_un = {(u.module, u.key): u.repr for u in current.unrepresentable}
    rec_changed = {(m, k) for m, vals in recorded.changed.items() for k in vals}
    rec_changed |= {(u.module, u.key) for u in recorded.unrepresentable if u.changed}
    cur_changed = current.changed
    out: list[dict[str, Any]] = []
    # a config module only the current side has says nothing about the recording
    for mod in sorted(set(rec_mods) | {m for (m, _) in rec_un}):
        rec_vals = rec_mods.get(mod) or {}
        cur_vals = cur_mods.get(mod)
        keys = set(rec_vals) | {k for (m, k) in rec_un if m == mod}
        if cur_vals is not None:
            keys |= set(cur_vals) | {k for (m, k) in cur_un if m == mod}
        for key in sorted(keys):
            if (mod, key) in machine:
                continue
            r_un, c_un = (mod, key) in rec_un, (mod, key) in cur_un
            rv = rec_un.get((mod, key)) if r_un else rec_vals.get(key, _UNSET)
            row = {"module": mod, "key": key, "recorded": None if rv is _UNSET else rv, "current": None}
            if cur_vals is None:
                if (mod, key) in rec_changed:
                    out.append({**row, "status": "not_compared"})
                continue
            cv = cur_un.get((mod, key)) if c_un else cur_vals.get(key, _UNSET)
            if rv is _UNSET and cv is _UNSET:
                continue
            if rv is _UNSET:
                if key in cur_changed.get(mod, {}):
                    out.append({**row, "current": cv, "status": "new_here"})
            elif cv is _UNSET:
                out.append({**row, "status": "missing_here"})
            elif r_un != c_un or not _same(rv, cv):
                out.append({**row, "current": cv, "status": "unrepresentable" if (r_un or c_un) else "differs"})
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal plain values; NaN equals NaN (a recorded ``nan`` setting is not a difference)."""
    if a == b:
        return True
    return isinstance(a, float) and isinstance(b, float) and a != a and b != b
