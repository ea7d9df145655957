"""Turning a recorded backend name into the compiler function to replay with.

An archive records the backend as a string. It is either a name that ``torch.compile`` accepts
(looked up in Dynamo's registry, which also covers out-of-tree backends registered through entry
points) or ``module:function`` for a custom compiler function, which PyTorch's own repro scripts
cannot replay at all (they ask the user to edit the script). A backend that cannot be found is
not a failure of the graph: replay must say "cannot run here" (exit 125) so that ``git bisect
run`` skips the commit instead of marking it bad.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from reproarchive.compat.dynamo import lookup_backend, registered_backends
from reproarchive.errors import BackendUnavailableError

CompilerFn = Callable[..., Any]


def is_custom(name: str) -> bool:
    """``module:function`` names a compiler function; anything else is a registered name."""
    return ":" in name


def resolve_backend(name: str | None) -> CompilerFn:
    """Return the compiler function for ``name`` or raise BackendUnavailableError (exit 125)."""
    if not name:
        raise BackendUnavailableError(
            "the archive records no backend to replay with",
            "pass --backend NAME (e.g. inductor, aot_eager, or module:function)",
        )
    if is_custom(name):
        return _import_function(name)
    import torch


    try:
        return lookup_backend(name)
    except Exception:  # InvalidBackend, or a registered entry point that fails to import
        known = ", ".join(registered_backends())
        raise BackendUnavailableError(
            f"backend {name!r} is not known to torch {torch.__version__} on this machine",
            f"use --backend with one of: {known}; or module:function for a custom compiler",
        ) from None


def _import_function(name: str) -> CompilerFn:
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise BackendUnavailableError(
            f"backend {name!r} is not of the form module:function",
            "write it as package.module:function_name",
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise BackendUnavailableError(
            f"backend module {module_name!r} cannot be imported ({err})",
            "install it, or add its folder to PYTHONPATH",
        ) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise BackendUnavailableError(
                f"module {module_name!r} has no attribute {attr!r}",
                "check the function name after the colon",
            ) from None
    if not callable(obj):
        raise BackendUnavailableError(f"backend {name!r} is not callable", "name a compiler function")
    return obj


def choose_backend(explicit: str | None, recorded: str | None) -> str:
    """The backend a replay uses: the user's ``--backend``, else the archive's.

    A recorded ``module:function`` is never imported on the archive's say-so: importing a
    module runs its code, and the archive may come from anyone. The user names it explicitly.
    """
    if explicit:
        return explicit
    if not recorded:
        raise BackendUnavailableError("the archive records no backend", "pass --backend NAME")
    if is_custom(recorded):
        raise BackendUnavailableError(
            f"the archive was compiled with the custom compiler function {recorded!r}, and importing "
            f"module {recorded.partition(':')[0]!r} would run its code",
            f"if you trust it, pass --backend {recorded}",
        )
    return recorded
