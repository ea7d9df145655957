"""``ReplaySettings``: how one replay is to be run, as one checked value.

The same choices (backend, accuracy, only_fwd, current_config, tol, strict_accuracy, device,
max_memory, and the custom-op implementations the user brings: imports, libraries) reach
``run``, an isolated child, every candidate the minifier judges and
``export``. They are checked once, where a person or a program hands them in (the CLI builds
one; the public functions build one from keyword arguments), and then passed unchanged: no
layer below re-checks or re-defaults them. Across a process boundary they travel as plain
data (``to_plain`` / ``from_plain``), never as ``**options``.

``None`` for ``backend`` and ``accuracy`` means "what the archive recorded"; ``for_recorded``
fills them in once the archive is open. ``device`` is what was asked for; whether those
devices exist here depends on the archive, so ``run`` resolves it once against the archive's
devices into a ``codec.devices.DevicePlan``, which load and an isolated child then use as is.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping
from typing import Any

from reproarchive.errors import ReproArchiveError
from reproarchive.replay.backends import choose_backend


@dataclasses.dataclass(frozen=True)
class ReplaySettings:
    """The user's replay choices; a value that exists has been checked (``__post_init__``)."""

    backend: str | None = None  # None: the archive's backend
    accuracy: bool | None = None  # None: whether the archive recorded an accuracy failure
    only_fwd: bool = False
    current_config: bool = False  # this machine's torch config instead of the recorded one
    tol: float | None = None  # None: replay.accuracy.DEFAULT_TOLERANCE
    strict_accuracy: bool = True  # False: judge floating outputs only (PyTorch's --accuracy)
    device: str | Mapping[str, str] | None = None  # a device, or recorded -> target devices
    max_memory: int | None = None  # bytes a load may allocate
    # the user's own implementations of custom ops, brought in before loading (never the archive's)
    imports: tuple[str, ...] = ()  # modules to import (``--import``)
    libraries: tuple[str, ...] = ()  # shared libraries to load (``--load-library``)
    # compile and launch nothing (``replay.compile_only``); None: when the recorded device is absent
    # and the recorded failure is of the compile stage
    compile_only: bool | None = None

    def __post_init__(self) -> None:
        for name in ("imports", "libraries"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
                raise TypeError(f"ReplaySettings.{name} must be a sequence of non-empty strings")
            object.__setattr__(self, name, tuple(value))
        if self.backend is not None and (not isinstance(self.backend, str) or not self.backend.strip()):
            raise ReproArchiveError(f"backend {self.backend!r} is not a backend name",
                                    "name one torch.compile accepts, or module:function")
        for name in ("only_fwd", "current_config", "strict_accuracy"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"ReplaySettings.{name} must be True or False")
        for name in ("accuracy", "compile_only"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise TypeError(f"ReplaySettings.{name} must be True, False or None")
        if self.tol is not None and (isinstance(self.tol, bool) or not isinstance(self.tol, (int, float))
                                     or not math.isfinite(self.tol) or self.tol <= 0):
            raise ReproArchiveError(f"tolerance {self.tol!r} is not a positive number", "pass e.g. --tol 1e-3")
        if self.max_memory is not None and (isinstance(self.max_memory, bool) or not isinstance(self.max_memory, int)
                                            or self.max_memory <= 0):
            raise ReproArchiveError(f"max_memory {self.max_memory!r} is not a positive number of bytes",
                                    "pass e.g. --max-memory 8G")
        object.__setattr__(self, "device", _device_spec(self.device))

    def for_recorded(self, backend: str | None, accuracy: Any) -> ReplaySettings:
        """These settings with the archive's own backend and accuracy mode where none was chosen."""

        return dataclasses.replace(self, backend=choose_backend(self.backend, backend),
                                   accuracy=bool(accuracy) if self.accuracy is None else self.accuracy)

    def replace(self, **changes: Any) -> ReplaySettings:
        return dataclasses.replace(self, **changes)

    def to_plain(self) -> dict[str, Any]:
        """JSON/msgpack-ready: what an isolated child receives."""
        plain = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        plain["imports"], plain["libraries"] = list(self.imports), list(self.libraries)
        if isinstance(self.device, Mapping):
            plain["device"] = dict(self.device)
        return plain

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> ReplaySettings:
        return cls(**data)

    @classmethod
    def given(cls, settings: ReplaySettings | None, options: Mapping[str, Any],
              **defaults: Any) -> ReplaySettings:
        """The settings a public function was handed: a ``ReplaySettings`` value, or keyword
        arguments naming its fields (over ``defaults``), not both."""
        if settings is not None:
            if options:
                raise TypeError(f"pass either a ReplaySettings or {', '.join(sorted(options))}, not both")
            if not isinstance(settings, cls):
                raise TypeError(f"settings must be a ReplaySettings, not {type(settings).__name__}")
            return settings
        return cls(**{**defaults, **options})


def _device_spec(device: Any) -> str | Mapping[str, str] | None:
    """A device name, or a read-only recorded -> target mapping (the value is frozen)."""

    if device is None or isinstance(device, str):
        return device or None
    if isinstance(device, Mapping):
        if not device or not all(isinstance(k, str) and isinstance(v, str) and k and v for k, v in device.items()):
            raise ReproArchiveError(f"device mapping {dict(device)!r} is not RECORDED=TARGET device names",
                                    "write it as e.g. cuda:0=cpu,cuda:1=cpu")
        return types.MappingProxyType(dict(device))
    if type(device).__name__ == "device":  # a torch.device, without importing torch
        return str(device)
    raise ReproArchiveError(f"{device!r} is not a device", "pass a device name (cpu, cuda:1) or a mapping")
