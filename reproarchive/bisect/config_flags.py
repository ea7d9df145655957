"""Which of the recorded non-default Inductor settings a failure needs (``bisect compiler``).

A failure captured under a changed setting (``cpp.inject_relu_bug_TESTING_ONLY``, a
``max_autotune``, a custom pass switched on) often fails only with it: a report that names the
stage but not the setting does not reproduce upstream. The stage search cannot tell, since the
recorded config is applied to every one of its replays. This search replays with settings put
back to their defaults: first all of them (if the failure stays, none is needed), then halves,
down to the one setting whose default makes the failure go, or the smallest set found whose
settings are needed together.

Only Inductor's settings are searched (``bisect compiler``'s replays change Inductor's config
inside the recorded one, ``compiler_child.config_change_backend``); a path of the recording
machine, a default that is not a plain value, and other modules' settings are listed as left out.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

INDUCTOR = "torch._inductor.config"
_PLAIN = (type(None), bool, int, float, str)


@dataclasses.dataclass(frozen=True)
class ConfigFlag:
    """One recorded setting that differs from its default, as Python literals."""

    setting: str  # torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY
    recorded: str
    default: str


@dataclasses.dataclass(frozen=True)
class FlagSearch:
    """What the search found. ``status``: "needed" (putting ``needed`` back to their defaults
    makes the recorded failure go), "none needed" (it fails with every searched setting at its
    default), "nothing to search" (no searchable recorded setting), or "not searched" (``reason``)."""

    status: str
    searched: tuple[ConfigFlag, ...] = ()
    needed: tuple[ConfigFlag, ...] = ()
    left_out: tuple[str, ...] = ()  # recorded changed settings not searched, each with why
    reason: str | None = None
    replays: int = 0

    @property
    def text(self) -> str:
        """One phrase for the summary line."""
        if self.status == "needed":
            said = ", ".join(f"{f.setting} = {f.recorded} (default {f.default})" for f in self.needed)
            return f"it needs {said}"
        if self.status == "none needed":
            return f"none of the {len(self.searched)} recorded Inductor setting(s) is needed"
        return self.reason or self.status


def searchable(config: Any) -> tuple[list[tuple[ConfigFlag, str, Any]], list[str]]:
    """(the settings to search: flag, Inductor key, default value; the ones left out, with why)."""
    if config is None:
        return [], []
    machine = {(ref.module, ref.key) for ref in config.machine_specific}
    found, left = [], []
    for module, changed in sorted(config.changed.items()):
        defaults = config.defaults.get(module, {})
        for key, value in sorted(changed.items()):
            name = f"{module}.{key}"
            if module != INDUCTOR:
                left.append(f"{name} (only Inductor's settings are searched)")
            elif (module, key) in machine:
                left.append(f"{name} (a path of the recording machine)")
            elif key not in defaults or not isinstance(defaults[key], _PLAIN):
                left.append(f"{name} (its default is not a plain value)")
            else:
                found.append((ConfigFlag(setting=name, recorded=repr(value), default=repr(defaults[key])),
                              key, defaults[key]))
    return found, left


def search(flags: list[tuple[ConfigFlag, str, Any]], left_out: list[str],
           gone: Callable[[list[tuple[ConfigFlag, str, Any]]], bool]) -> FlagSearch:
    """The search of the module docstring; ``gone(flags)``: whether the recorded failure is gone
    with those settings at their defaults (one replay)."""
    replays = 0

    def without(chosen) -> bool:
        nonlocal replays
        replays += 1
        return gone(chosen)

    searched = tuple(f for f, _, _ in flags)
    if not flags:
        return FlagSearch(status="nothing to search", left_out=tuple(left_out),
                          reason="no recorded Inductor setting differs from its default")
    if not without(flags):
        return FlagSearch(status="none needed", searched=searched, left_out=tuple(left_out), replays=replays)
    chosen = list(flags)
    while len(chosen) > 1:
        first, second = chosen[:len(chosen) // 2], chosen[len(chosen) // 2:]
        if without(first):
            chosen = first
        elif without(second):
            chosen = second
        else:
            break  # it needs settings of both halves: these together
    return FlagSearch(status="needed", searched=searched, needed=tuple(f for f, _, _ in chosen),
                      left_out=tuple(left_out), replays=replays)
