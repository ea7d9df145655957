"""The text both exported scripts carry (``repro.py`` of one graph and of a job): how they load
and compile a recorded graph and enter the recorded state (``*_block.py.template``), the library
modules they run as the replay runs them (``BUNDLED``: their own text, not a copy written
again), and what they judge a failure against."""

from __future__ import annotations

import ast
import importlib.util
from importlib.resources import files
from pathlib import Path
from typing import Any


def failure_literal(failure: Any) -> tuple[str, str, str] | None:
    """What a script judges a failure against, as ``run`` does (``context.failure_signature``)."""
    return None if failure is None else (failure.stage, failure.exception_type, failure.signature)


def loading_block() -> str:
    """``_set_config``, ``_device``, ``_tensor`` and ``_backend``: what both scripts need to load
    and compile a recorded graph, from one text; then the library modules both run as the
    replay does (``BUNDLED``), from their own text."""

    block = files("reproarchive.standalone").joinpath("loading_block.py.template").read_text(encoding="utf-8")
    return block + "".join(f"\n\n# bundled: {name.replace('.', '/')}.py, as the library runs it\n{bundled_source(name)}"
                           for name in BUNDLED)


#: library modules whose text the exported scripts carry: each imports the standard library and
#: torch only (``tests/standalone/test_bundled_code.py``)
BUNDLED = ("reproarchive.compat.subgraph_values", "reproarchive.compat.shape_guard_text",
           "reproarchive.context.failure_signature", "reproarchive.replay.verdict_rule")


def bundled_source(module: str) -> str:
    """``module``'s text as a script carries it: without its docstring, its ``__future__`` import
    and its ``CHECKED_WITH``/``PRIVATE_NAMES`` (the library's own bookkeeping)."""
    text = Path(importlib.util.find_spec(module).origin).read_text(encoding="utf-8")
    tree = ast.parse(text)
    dropped = set()
    for i, stmt in enumerate(tree.body):
        docstring = i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
        future = isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"
        bookkeeping = isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in ("CHECKED_WITH", "PRIVATE_NAMES") for t in stmt.targets)
        if docstring or future or bookkeeping:
            dropped.update(range(stmt.lineno, stmt.end_lineno + 1))
    kept = [line for n, line in enumerate(text.splitlines(keepends=True), 1) if n not in dropped]
    return "".join(kept).strip("\n") + "\n"


def state_block() -> str:
    """``_execution()`` and ``_restore_rng()``: how a script enters the recorded thread state and
    sets the recorded generator states (both scripts, from one text)."""

    return files("reproarchive.standalone").joinpath("state_block.py.template").read_text(encoding="utf-8")
