"""Inductor's private surface: its config, ``compile_fx`` (the inner compiler and the after_aot
debug wrapper), the compiler bisector and the cache folders.

Settings are patched on ``torch._inductor.config`` (a capture's ``options=``, ``fallback_random``
for a fair accuracy check, a bisection's config change, the demo's bug injector); an after_aot
graph replays through ``compile_fx_inner`` as PyTorch's own after_aot replay does; ``capture
--after aot`` wraps ``compile_fx.wrap_compiler_debug``, the door every graph Inductor compiles
goes through, when torch loads that module (``sources.program.after_aot_hook``); ``bisect compiler``
drives ``torch._inductor.compiler_bisector``, which keeps its state on its class and in module
tables; the redaction and environment records need Inductor's cache folder
(``runtime.cache_dir_utils``).

Checked with 2.11.0, 2.13.0 and 2.15.0: every name resolves in all three with the same meaning (2.15's
bisector raises AssertionError where 2.13's asserted; nothing here depends on either).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

CHECKED_WITH = ("2.11.0", "2.13.0", "2.15.0")

PRIVATE_NAMES = (
    "torch._inductor.compile_fx",
    "torch._inductor.compile_fx.compile_fx_inner",
    "torch._inductor.compiler_bisector",
    "torch._inductor.compiler_bisector.BACKENDS",
    "torch._inductor.compiler_bisector.BACKENDS.get",
    "torch._inductor.compiler_bisector.CompilerBisector",
    "torch._inductor.compiler_bisector.CompilerBisector.bisection_enabled",
    "torch._inductor.compiler_bisector.CompilerBisector.do_bisect",
    "torch._inductor.compiler_bisector.CompilerBisector.get_backend",
    "torch._inductor.compiler_bisector.CompilerBisector.get_bisect_range",
    "torch._inductor.compiler_bisector.CompilerBisector.get_config_change",
    "torch._inductor.compiler_bisector.CompilerBisector.get_run_state",
    "torch._inductor.compiler_bisector.CompilerBisector.get_subsystem",
    "torch._inductor.compiler_bisector.CompilerBisector.in_process_cache",
    "torch._inductor.compiler_bisector.ConfigChange",
    "torch._inductor.compiler_bisector.subsystem_call_counter",
    "torch._inductor.compiler_bisector.subsystem_call_counter.clear",
    "torch._inductor.config",
    "torch._inductor.config.patch",
    "torch._inductor.runtime.cache_dir_utils.cache_dir",
    "torch._inductor.runtime.cache_dir_utils.default_cache_dir",
)

#: The module whose ``wrap_compiler_debug`` ``capture --after aot`` wraps when torch loads it.
COMPILE_FX_MODULE = "torch._inductor.compile_fx"


# -- config --------------------------------------------------------------------------------------


def patched_config(changes: dict[str, Any]) -> contextlib.AbstractContextManager:
    """Inductor's config with ``changes`` (``{"cpp.inject_relu_bug_TESTING_ONLY": ...}``) for the
    ``with`` body."""
    import torch._inductor.config

    return torch._inductor.config.patch(changes)


def config_value(name: str) -> Any:
    """The current value of the Inductor setting ``name`` (dotted: ``cpp.cxx``)."""
    import torch._inductor.config

    return functools.reduce(getattr, name.split("."), torch._inductor.config)


# -- compile_fx ----------------------------------------------------------------------------------


def inner_compiler() -> Callable:
    """Inductor's inner compiler (imported now), ``compile_fx_inner(gm, args)``: for a graph
    traced with ``val`` meta (``fake.retraced``); what it returns takes its arguments as one list."""
    from torch._inductor.compile_fx import compile_fx_inner

    return compile_fx_inner


def debug_wrapper_of(module: Any) -> Any:
    """``compile_fx``'s after_aot debug wrapper (``wrap_compiler_debug``), or None."""
    return getattr(module, "wrap_compiler_debug", None)


def set_debug_wrapper(module: Any, wrapper: Any) -> None:
    """Put ``wrapper`` where ``compile_fx`` looks its debug wrapper up at each call."""
    module.wrap_compiler_debug = wrapper


# -- the compiler bisector -----------------------------------------------------------------------


def import_compiler() -> None:
    """Import Inductor's compiler and its bisector (a fork server's children then share them)."""
    import torch._inductor.compile_fx  # noqa: F401
    import torch._inductor.compiler_bisector  # noqa: F401


def bisector_backends() -> list[str]:
    """The bisector's stages, in order (eager, aot_eager, ..., inductor)."""
    from torch._inductor.compiler_bisector import BACKENDS

    return list(BACKENDS)


def bisector_config_change(stage: str, subsystem: str) -> tuple[str, object] | None:
    """(config field, value) when ``subsystem`` of ``stage`` is a config change the bisector
    tries, else None."""
    from torch._inductor.compiler_bisector import BACKENDS, ConfigChange

    for s in BACKENDS.get(stage, ()):
        if s.name == subsystem and isinstance(s, ConfigChange):
            return s.config_field, s.config_value
    return None


@contextlib.contextmanager
def bisector_state_in(folder: str) -> Iterator[None]:
    """The bisector's state folder set to ``folder`` for the ``with`` body; its class state and
    module tables (enabled flag, folder, inductor's subsystems, call counters) put back after."""
    from torch._inductor import compiler_bisector as pt

    bisector = pt.CompilerBisector
    saved = (bisector.bisection_enabled, bisector.in_process_cache, list(pt.BACKENDS["inductor"]))
    bisector.in_process_cache = folder
    try:
        yield
    finally:
        bisector.bisection_enabled, bisector.in_process_cache, inductor = saved
        pt.BACKENDS["inductor"][:] = inductor
        pt.subsystem_call_counter.clear()


def run_bisector(test: Callable[[], bool]) -> Any:
    """PyTorch's bisection with ``test`` (True: good); its result, or None when nothing failed."""
    from torch._inductor.compiler_bisector import CompilerBisector

    return CompilerBisector.do_bisect(test)


def bisector_position() -> tuple[str, str | None, str | None, Any]:
    """Where the bisection is: (stage, subsystem, run state, bisect range); the stage is
    ``"eager"`` before the bisector has chosen one, the others None where unset (the run state
    only with a subsystem, the range only while bisecting)."""
    from torch._inductor.compiler_bisector import CompilerBisector as bisector

    stage = bisector.get_backend() or "eager"
    subsystem = bisector.get_subsystem()
    state = bisector.get_run_state(stage, subsystem) if subsystem else None
    bounds = bisector.get_bisect_range(stage, subsystem) if state == "bisect" else None
    return stage, subsystem, state, bounds


def enable_bisector(folder: str) -> None:
    """In a bisection's child: the bisector on, its state read from and written to ``folder``."""
    from torch._inductor.compiler_bisector import CompilerBisector

    CompilerBisector.in_process_cache = folder
    CompilerBisector.bisection_enabled = True


def bisector_config_changes(stage: str) -> dict[str, Any]:
    """The config change the bisector is trying for ``stage`` now (empty when none)."""
    from torch._inductor.compiler_bisector import CompilerBisector

    return CompilerBisector.get_config_change(stage) or {}


# -- cache folders -------------------------------------------------------------------------------


def cache_dir() -> str:
    """Inductor's cache folder as this process has it (``TORCHINDUCTOR_CACHE_DIR`` or the default)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir as folder

    return folder()


def default_cache_dir() -> str:
    """Inductor's cache folder when ``TORCHINDUCTOR_CACHE_DIR`` is not set."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir as folder

    return folder()
