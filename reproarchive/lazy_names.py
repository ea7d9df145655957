"""Names a package resolves on first use: importing the package then costs nothing, and
``reproarchive --help`` imports no torch."""

from __future__ import annotations

import importlib
from typing import Any


def resolved(exports: dict[str, str], namespace: dict[str, Any], package: str, name: str) -> Any:
    """``name`` from the module ``exports`` maps it to, kept in ``namespace`` (the package's
    globals) so the next lookup is a plain attribute."""
    module = exports.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    namespace[name] = value
    return value
