"""The library modules the exported scripts carry (``standalone.shared_blocks.BUNDLED``) can run there:
a script runs where only PyTorch is installed, so each imports the standard library and torch
only, and its names do not clash with the script's own. The scripts then run the replay's own
code, not a copy written again (``tests/replay/test_backend_meta.py`` checks they do the same)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

from reproarchive.standalone.shared_blocks import BUNDLED, bundled_source, loading_block

TEMPLATES = Path(__file__).resolve().parents[2] / "reproarchive" / "standalone"


def _imported_roots(tree: ast.AST) -> set[str]:
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def _defined(tree: ast.Module) -> set[str]:
    names = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


@pytest.mark.parametrize("module", BUNDLED)
def test_a_bundled_module_imports_the_standard_library_and_torch_only(module):
    text = Path(importlib.util.find_spec(module).origin).read_text(encoding="utf-8")
    outside = _imported_roots(ast.parse(text)) - set(sys.stdlib_module_names) - {"torch"}
    assert not outside, f"{module} imports {sorted(outside)}, which an exported script cannot"


@pytest.mark.parametrize("module", BUNDLED)
def test_the_scripts_carry_the_module_text_without_clashing_names(module):
    carried = bundled_source(module)
    assert carried in loading_block()
    assert "from __future__" not in carried and "PRIVATE_NAMES" not in carried
    own = set()
    for template in TEMPLATES.glob("*.template"):
        text = template.read_text(encoding="utf-8")
        try:
            own |= _defined(ast.parse(text))
        except SyntaxError:  # a template with ``str.format`` slots: its names by a plain scan
            own |= {line.split("(")[0][4:] for line in text.splitlines() if line.startswith("def ")}
    clash = _defined(ast.parse(carried)) & own
    assert not clash, f"{module} defines {sorted(clash)}, which a script template defines too"
