"""Dynamo's private surface: the backend registry, its config and exceptions, the repro hooks,
guards, sources, ``debug_utils``, ``clone_input`` and ``torch.compile``'s inductor wrapper.

A replay finds a backend by name in Dynamo's registry (``torch._dynamo.backends.registry``); a
capture makes ``"inductor"`` the way ``torch.compile`` does (``torch._TorchCompileInductorWrapper``)
and raises Dynamo's ``AccuracyError`` for an accuracy failure, as PyTorch's hook does; the crash
guard of ``capture --`` wraps the after_dynamo hook's ``WrapBackendDebug`` when torch loads
``torch._dynamo.repro.after_dynamo`` and calls the hook's own dump functions, steered by Dynamo's
``repro_after`` / ``repro_level``; exceptions Dynamo uses to steer tracing are told apart from
failures (``torch._dynamo.exc``); a replay with a symbolic shape policy installs the fake mode in a
``TracingContext`` as Dynamo does, with sources that print as the recorded ones
(``ConstantSource``); a job capture notes the compile id (``CompileContext``); the accuracy check
casts a graph to fp64 with ``debug_utils``; inputs are copied with ``clone_input`` (same strides).

Checked with 2.11.0, 2.13.0 and 2.15.0: every name resolves in all three with the same meaning. The registry
changed inside (2.13 keeps a backend's tags on the function as ``_tags``, 2.15 in a table of its
own) and 2.15's ``InvalidBackend`` suggests close names; ``list_backends(exclude_tags=())`` and
``lookup_backend`` answer the same in all three.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

CHECKED_WITH = ("2.11.0", "2.13.0", "2.15.0")

PRIVATE_NAMES = (
    "torch._TorchCompileInductorWrapper",
    "torch._dynamo",
    "torch._dynamo.backends.registry.list_backends",
    "torch._dynamo.backends.registry.lookup_backend",
    "torch._dynamo.config",
    "torch._dynamo.config.patch",
    "torch._dynamo.config.repro_after",
    "torch._dynamo.config.repro_forward_only",
    "torch._dynamo.config.repro_level",
    "torch._dynamo.debug_utils.AccuracyError",
    "torch._dynamo.debug_utils.cast_dtype_args_to_fp64",
    "torch._dynamo.exc",
    "torch._dynamo.repro.after_dynamo",
    "torch._dynamo.repro.after_dynamo.dump_backend_state",
    "torch._dynamo.repro.after_dynamo.dump_to_minify_after_dynamo",
    "torch._dynamo.repro.after_dynamo.minifier_dir",
    "torch._dynamo.reset",
    "torch._dynamo.source.ConstantSource",
    "torch._dynamo.utils.clone_input",
    "torch._guards.CompileContext",
    "torch._guards.CompileContext.current_compile_id",
    "torch._guards.TracingContext",
    "torch._guards.TracingContext.try_get",
    "torch._guards.tracing",
)

#: Dynamo, imported by name ahead of a request in a forked child (torch with it).
MODULE = "torch._dynamo"

#: The module of the after_dynamo repro hook, whose ``WrapBackendDebug`` the crash guard wraps.
REPRO_HOOK_MODULE = "torch._dynamo.repro.after_dynamo"


def __getattr__(name: str) -> Any:
    """``AccuracyError``: what PyTorch's accuracy hook raises."""
    if name == "AccuracyError":
        from torch._dynamo.debug_utils import AccuracyError

        return AccuracyError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- backends ------------------------------------------------------------------------------------


def lookup_backend(name: str) -> Callable:
    """The compiler function Dynamo's registry has under ``name`` (raises when none)."""
    from torch._dynamo.backends.registry import lookup_backend as lookup

    return lookup(name)


def registered_backends() -> list[str]:
    """Every name Dynamo's registry knows, whatever its tags (debug and experimental included)."""
    from torch._dynamo.backends.registry import list_backends

    return list_backends(exclude_tags=())


def inductor_wrapper(mode: str | None, options: dict | None) -> Any:
    """``"inductor"`` as ``torch.compile(backend="inductor", mode=, options=)`` makes it."""
    import torch

    return torch._TorchCompileInductorWrapper(mode, options, None)


def reset() -> None:
    """Forget every compiled graph and cache of Dynamo's."""
    import torch._dynamo

    torch._dynamo.reset()


# -- config and exceptions -----------------------------------------------------------------------


def repro_after() -> str | None:
    """Dynamo's ``repro_after``: where its repro hook runs (``"dynamo"``, ``"aot"``, or None)."""
    from torch._dynamo import config

    return config.repro_after


def repro_level() -> int:
    """Dynamo's ``repro_level``: what its repro hook does (1: dump a failure's state, 2: a
    minifier launcher, 3: dump every graph first, 4: accuracy)."""
    from torch._dynamo import config

    return config.repro_level


def repro_forward_only() -> bool:
    from torch._dynamo import config

    return bool(config.repro_forward_only)


def patched_config(changes: dict[str, Any]) -> contextlib.AbstractContextManager:
    """Dynamo's config with ``changes`` for the ``with`` body."""
    import torch._dynamo.config

    return torch._dynamo.config.patch(changes)


def control_flow_exceptions() -> tuple[type, ...]:
    """Exceptions Dynamo raises to steer tracing (skip a frame, restart, fall back): not failures."""
    try:
        from torch._dynamo import exc
    except ImportError:  # pragma: no cover
        return ()
    return tuple(k for k in (getattr(exc, n, None) for n in ("SkipFrame", "RestartAnalysis", "Unsupported"))
                 if isinstance(k, type))


# -- the after_dynamo repro hook -----------------------------------------------------------------


def backend_debug_class(module: Any) -> Any:
    """The hook's ``WrapBackendDebug`` (the door every backend goes through) in ``module``, or None."""
    return getattr(module, "WrapBackendDebug", None)


def wrapped_backend_name(wrapper: Any) -> Any:
    """The compiler name a ``WrapBackendDebug`` was made with, or None."""
    return getattr(wrapper, "_compiler_name", None)


def original_backend(wrapper: Any) -> Any:
    """The backend behind a ``WrapBackendDebug``: torch.compile's callable wrapper unwrapped."""
    backend = getattr(wrapper, "_torchdynamo_orig_backend", None) or wrapper
    return getattr(backend, "compiler_fn", backend)


def dump_graph_and_inputs(gm: Any, inputs: list[Any], compiler_name: str) -> None:
    """The hook's level-3 dump: a minifier launcher for ``gm`` and its inputs."""
    from torch._dynamo.repro import after_dynamo

    after_dynamo.dump_to_minify_after_dynamo(gm, inputs, compiler_name)


def dump_backend_state(gm: Any, inputs: list[Any], compiler_name: str) -> None:
    """The hook's level-1 dump: a repro script of the failing backend call."""
    from torch._dynamo.repro import after_dynamo

    after_dynamo.dump_backend_state(gm, inputs, compiler_name=compiler_name)


def minifier_dir() -> str:
    """The folder the hook writes its minifier launcher into."""
    from torch._dynamo.repro import after_dynamo

    return after_dynamo.minifier_dir()


# -- guards, sources, debug_utils ----------------------------------------------------------------


def constant_source(name: str) -> Any:
    """A Dynamo source that prints as ``name`` (symbol names derive from source names)."""
    from torch._dynamo.source import ConstantSource

    return ConstantSource(name)


def tracing_with(fake_mode: Any) -> contextlib.AbstractContextManager:
    """A tracing context whose fake mode is ``fake_mode``, installed for the ``with`` body as
    Dynamo installs its own around a backend call."""
    from torch._guards import TracingContext, tracing

    return tracing(TracingContext(fake_mode))


def in_dynamo_trace() -> bool:
    """Whether this thread is inside a Dynamo trace (a backend called by Dynamo runs in one)."""
    from torch._guards import TracingContext

    return TracingContext.try_get() is not None


def current_compile_id() -> Any:
    """The id of the compile Dynamo is in, or None (raises outside Dynamo on some versions)."""
    from torch._guards import CompileContext

    return CompileContext.current_compile_id()


def cast_to_fp64(model: Any) -> Any:
    """``model`` with its dtype arguments (``to(torch.float32)`` ...) made float64, as PyTorch's
    accuracy check does."""
    from torch._dynamo.debug_utils import cast_dtype_args_to_fp64

    return cast_dtype_args_to_fp64(model)


def clone_input(t: Any) -> Any:
    """A copy of tensor ``t`` with the same strides and storage offset (Dynamo's ``clone_input``)."""
    from torch._dynamo.utils import clone_input as clone

    return clone(t)
