"""Setting torch's live config modules from a record, and putting every setting back.

``applied_config`` (config.py) is the one caller. The work on torch's ``ConfigModule``
internals (the user override, ``hide``, the hash and dict caches, the environment's forced
values) lives here, apart from the record's own snapshot and diff, because it is what moves
between torch releases.
"""

from __future__ import annotations

import contextvars
import copy
import importlib
import sys
from dataclasses import dataclass, field
from typing import Any

from reproarchive.compat.config_modules import config_module_type, unset_sentinel
from reproarchive.context.admission import CONFIG_MODULES, setting_problem
from reproarchive.format.schema import ConfigRecord


def _config_module_named(name: str) -> Any:
    """A torch config module by name: one of ours, or one already imported. Never an import
    of an arbitrary name from an archive (importing runs the module's code)."""
    if name in CONFIG_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            return None
    mod = sys.modules.get(name)
    ConfigModule = config_module_type()
    if ConfigModule is None:  # pragma: no cover
        return None
    return mod if isinstance(mod, ConfigModule) else None


def _restore_type(value: Any, kind: str | None) -> Any:
    if kind == "tuple" and isinstance(value, list):
        return tuple(value)
    if kind == "set" and isinstance(value, list):
        return set(value)
    return value


_UNSET = object()


def _torch_unset() -> Any:
    """torch's "no environment override" sentinel, imported only when a config is applied, so
    that comparing two recorded configs (``diff``) does not import torch."""
    return unset_sentinel(_UNSET)  # an older torch has none: nothing is ever forced by env


def _user_override(entry: Any) -> Any:
    """A config entry's user override: a ContextVar since torch 2.12, a plain attribute before."""
    override = entry.user_override
    return override.get() if isinstance(override, contextvars.ContextVar) else override


def _set_user_override(entry: Any, value: Any) -> None:
    if isinstance(entry.user_override, contextvars.ContextVar):
        entry.user_override.set(value)
    else:
        entry.user_override = value


@dataclass
class Application:
    """One ``applied_config``: what it reads of the record for every setting (worked out once),
    the report it fills, and what it must undo on exit."""

    record: ConfigRecord
    only_changed: bool
    result: Any  # config.AppliedConfig; naming the class would import config.py, which imports this
    undo: list[tuple[Any, str, Any, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.skip = {(u.module, u.key) for u in self.record.unrepresentable}
        self.machine = {(u.module, u.key) for u in self.record.machine_specific}
        self.changed_keys = {(m, k) for m, vals in self.record.changed.items() for k in vals}

    def module(self, mod_name: str, values: dict[str, Any]) -> None:
        """Every recorded setting of one module (or the changed ones only) that this torch has."""
        result = self.result
        mod = _config_module_named(mod_name)
        if mod is None:
            if self.record.changed.get(mod_name):  # a module left at its defaults loses nothing
                result.missing_modules.append(mod_name)
            return
        config = getattr(mod, "_config", None)
        if not isinstance(config, dict):
            result.missing_modules.append(mod_name)
            return
        wanted = self.record.changed.get(mod_name, {}) if self.only_changed else values
        for key, value in wanted.items():
            self._setting(mod, mod_name, config, key, value)

    def _setting(self, mod: Any, mod_name: str, config: dict[str, Any], key: str, value: Any) -> None:
        """One setting, unless it is not data, not this machine's, or a default left alone."""
        result, full = self.result, f"{mod_name}.{key}"
        if (mod_name, key) in self.skip:
            result.unrepresentable.append(full)
            return
        if (mod_name, key) in self.machine:
            result.machine_specific.append(full)
            return
        entry = config.get(key)
        if entry is None:
            result.missing.append(full)
            return
        why = setting_problem(key, value, entry.default)
        if why is not None:
            if (mod_name, key) in self.changed_keys:  # a default left as it is needs no warning
                result.unsafe.append(full)
                result.reasons[full] = why
            return
        if getattr(entry, "alias", None) is not None:
            return
        if getattr(entry, "deprecated", False) and (mod_name, key) not in self.changed_keys:
            return  # "does nothing"; setting it would only print a FutureWarning
        value = _restore_type(copy.deepcopy(value), self.record.types.get(mod_name, {}).get(key))
        prior_override = _user_override(entry)
        prior_hide = getattr(entry, "hide", False)
        try:
            setattr(mod, key, value)
        except Exception as exc:
            result.failed.append({"key": full, "error": f"{type(exc).__name__}: {exc}"})
            return
        self.undo.append((mod, key, prior_override, prior_hide))
        result.applied.append(full)
        forced = getattr(entry, "env_value_force", _torch_unset())
        if forced is not _torch_unset() and forced != value:
            result.forced_by_env.append(full)

    def restore(self) -> None:
        """Every touched setting back to exactly its previous state, "not set by the user"
        included, and the module's caches told, so the inductor cache key sees no trace."""
        for mod, key, prior_override, prior_hide in reversed(self.undo):
            entry = mod._config[key]
            _set_user_override(entry, prior_override)
            entry.hide = prior_hide
            dirty = getattr(mod, "_hash_dirty_var", None)
            if dirty is not None:
                dirty.set(True)
            mark = getattr(mod, "_mark_get_dict_dirty", None)
            if mark is not None:
                mark(key)
