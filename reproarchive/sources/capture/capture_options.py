"""What ``reproarchive.capture(...)`` is asked for, checked and resolved before any graph comes:
a bad option must fail at the ``capture()`` call, not at the first compile deep inside Dynamo,
and the backend's name and the archives' place must be fixed once, as the program set them
then (its working folder, ``$REPROARCHIVE_DIR``), for every graph after.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reproarchive.compat.dynamo import inductor_wrapper, lookup_backend
from reproarchive.replay import accuracy as _accuracy

DEFAULT_DIR_ENV = "REPROARCHIVE_DIR"
DEFAULT_DIR_NAME = "reproarchives"

_OPTIONS = {"fwd_only", "tolerance", "check_runtime", "on_accuracy", "mode", "options", "use_fp64", "crash",
            "spool"}


def capture_settings(accuracy: bool, options: dict[str, Any]) -> dict[str, Any]:
    """The settings ``capture(accuracy=..., **options)`` asked for, checked (``TypeError`` or
    ``ValueError`` for one it cannot take); the backend's own (``mode``, ``options``) aside."""
    unknown = set(options) - _OPTIONS
    if unknown:
        raise TypeError(f"capture() got unknown option(s) {sorted(unknown)}; known: {sorted(_OPTIONS)}")
    on_accuracy = options.get("on_accuracy", "raise")
    if on_accuracy not in ("raise", "warn"):
        raise ValueError(f"on_accuracy must be 'raise' or 'warn', not {on_accuracy!r}")
    check_runtime = options.get("check_runtime", True)
    if not (isinstance(check_runtime, bool) or check_runtime == "calls"):
        raise ValueError(f"check_runtime must be True, False or 'calls', not {check_runtime!r}")
    if check_runtime == "calls" and accuracy:
        raise ValueError("check_runtime='calls' never runs a graph twice, so it cannot check accuracy: "
                         "pass check_runtime=True or accuracy=False")
    settings = {
        "fwd_only": bool(options.get("fwd_only", False)),
        "tolerance": float(options.get("tolerance", _accuracy.DEFAULT_TOLERANCE)),
        "check_runtime": check_runtime,
        "on_accuracy": on_accuracy,
        "use_fp64": bool(options.get("use_fp64", True)),
        "crash": bool(options.get("crash", True)),
        "spool": bool(options.get("spool", True)),
        "accuracy": bool(accuracy),
    }
    return settings


def resolve_backend(backend: str | Callable, mode: str | None, inductor_options: dict | None):
    """The real compiler callable, the name to record, and inductor config patches.

    The recorded name is what replay passes to torch.compile. A callable is recorded by its
    qualified name; replay can only use it when that name is a registered backend.

    ``"inductor"`` is made as ``torch.compile(backend="inductor")`` makes it (its wrapper), and
    Inductor's compiler is imported here, as ``torch.compile`` imports it when it is called
    (asking the wrapper for its config): through the registry's entry that import, ~2 s on a
    core, came inside the first call, a cost the program without capture pays before it.
    """

    if isinstance(backend, str):
        if backend == "inductor":
            wrapper = inductor_wrapper(mode, inductor_options)
            with warnings.catch_warnings():  # torch's own import-time deprecations are not capture's to raise
                warnings.simplefilter("ignore", DeprecationWarning)
                wrapper.get_compiler_config()  # Inductor imported now, as torch.compile imports it
            return wrapper, "inductor", dict(wrapper.config)
        if mode or inductor_options:
            raise ValueError("capture(): mode= and options= only apply to backend='inductor'")
        return lookup_backend(backend), backend, {}
    if not callable(backend):
        raise TypeError(f"capture(): backend must be a name or a callable, not {type(backend).__name__}")
    if mode or inductor_options:
        raise ValueError("capture(): mode= and options= only apply to backend='inductor'")
    return backend, recorded_name(backend), {}


def recorded_name(backend: Callable) -> str:
    """The name an archive records for a backend callable: its ``compiler_name``, else an
    importable ``module:function`` when there is one (replay resolves that form), else its name.

    A function of the program's own script (``__main__``) is recorded under the name the
    script imports as (``train:my_backend`` for ``python train.py`` or ``python -m train``),
    so that ``reproarchive run --backend train:my_backend`` finds it from the script's folder."""
    name = getattr(backend, "compiler_name", None)
    if isinstance(name, str):
        return name
    module, qualname = getattr(backend, "__module__", None), getattr(backend, "__qualname__", None)
    if module == "__main__":
        module = _main_module_name()
    if module and qualname and "<" not in qualname:
        return f"{module}:{qualname}"
    return getattr(backend, "__name__", None) or type(backend).__qualname__


def _main_module_name() -> str | None:
    """The name the running script would be imported by: ``-m``'s module, else its file's stem."""

    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return spec.name
    stem = Path(getattr(main, "__file__", "") or "").stem
    return stem if stem.isidentifier() else None


def resolve_target(path: str | os.PathLike | None) -> Path:
    if path is None:
        env = os.environ.get(DEFAULT_DIR_ENV)
        return Path(env).absolute() if env else Path.cwd() / DEFAULT_DIR_NAME
    return Path(path).absolute()


def is_file_target(target: Path) -> bool:
    return target.name.endswith((".zst", ".tar")) and not target.is_dir()
