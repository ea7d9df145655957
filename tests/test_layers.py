"""The tree shows the layers, and data flows one way (docs/development.md, "The tree, and the layers").

Every import in the library and the CLI is read from the source, function-level imports
included (a lazy import is still a dependency), and checked against the layer order:

    errors, package_version, progress, child  <  format  <  compat  <  codec, context  <  archive  <  replay, store
                                      <  sources, minifier, standalone, triage, bisect, references, documents,
                                         spec_files  <  cli, testing

``testing`` (the conformance suites third parties subclass) shares the top layer with the CLI:
it may import any package below it, never the CLI, and nothing imports it, so neither
``import reproarchive`` nor the CLI reaches it or pytest. It and the CLI are the only modules
that may import pytest and click respectively; no library module imports pytest at all.

``compat`` is torch's private surface behind one module per concern (``tests/test_private_torch.py``):
it imports only torch, the standard library and ``reproarchive.errors``, and the CLI may use it
beside the public surface (the demo patches Inductor's config).
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {
    "reproarchive.errors": 0, "reproarchive.package_version": 0, "reproarchive.progress": 0, "reproarchive.child": 0,
    "reproarchive.lazy_names": 0,
    "reproarchive.format": 1,
    "reproarchive.compat": 2,
    "reproarchive.codec": 3, "reproarchive.context": 3,
    "reproarchive.archive": 4,
    "reproarchive.replay": 5, "reproarchive.store": 5,
    "reproarchive.sources": 6, "reproarchive.minifier": 6, "reproarchive.standalone": 6, "reproarchive.triage": 6,
    "reproarchive.bisect": 6,
    "reproarchive.references": 6, "reproarchive.documents": 6, "reproarchive.spec_files": 6,
    "reproarchive._internal": 6,
    "reproarchive.cli": 7, "reproarchive.testing": 7,
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "reproarchive").rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        found[".".join(p for p in rel.parts if p != "__init__")] = path
    for path in (ROOT / "cli").rglob("*.py"):
        rel = path.relative_to(ROOT / "cli").with_suffix("")
        found[".".join(["reproarchive", "cli", *[p for p in rel.parts if p != "__init__"]])] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Modules ``name`` imports (resolved; ``from pkg import sub`` counts as ``pkg.sub``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {m for m in out if m == "reproarchive" or m.startswith(("reproarchive.", "click"))}


def _layer(module: str) -> int | None:
    for prefix, level in sorted(LAYERS.items(), key=lambda kv: -len(kv[0])):
        if module == prefix or module.startswith(prefix + "."):
            return level
    return None


@functools.cache
def _graph() -> dict[str, set[str]]:
    """Every module's imports: parsed when a test asks (every test process collects this file,
    and only one runs it)."""
    return {name: _imports(name, path) for name, path in MODULES.items()}


def test_every_module_has_a_layer():
    assert [m for m in MODULES if m != "reproarchive" and _layer(m) is None] == []


def test_imports_only_go_down():
    wrong = []
    for name, imports in _graph().items():
        own = _layer(name)
        for target in imports:
            level = _layer(target)
            if level is not None and own is not None and level > own:
                wrong.append(f"{name} (layer {own}) imports {target} (layer {level})")
    assert wrong == []


def test_library_never_imports_click_or_the_package_init():
    wrong = []
    for name, imports in _graph().items():
        if name.startswith("reproarchive.cli") or name == "reproarchive":
            continue
        wrong += [f"{name} imports {t}" for t in imports
                  if t == "reproarchive" or t.startswith(("click", "reproarchive.cli"))]
    assert wrong == []


def test_nothing_imports_the_testing_package():
    """Only test code imports ``reproarchive.testing``: the library's and the CLI's import paths
    never reach it (it imports pytest, a test extra)."""
    wrong = [f"{name} imports {t}" for name, imports in _graph().items() if not name.startswith("reproarchive.testing")
             for t in imports if t == "reproarchive.testing" or t.startswith("reproarchive.testing.")]
    assert wrong == []


def _absolute_imports(path) -> list[str]:
    """Every module ``path`` imports by absolute name, at any depth (functions included)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            out.append(node.module or "")
    return out


def test_only_the_testing_package_imports_pytest():
    wrong = []
    for name, path in MODULES.items():
        if name.startswith("reproarchive.testing"):
            continue
        wrong += [f"{name} imports {t}" for t in _absolute_imports(path) if t.split(".")[0] in ("pytest", "_pytest")]
    assert wrong == []


def test_cli_uses_only_the_public_surface():
    """The CLI uses the public verbs and errors and, for what only it asks, ``reproarchive._internal``."""
    allowed = {"reproarchive", "reproarchive.errors", "reproarchive._internal"}
    wrong = []
    for name, imports in _graph().items():
        if name.startswith("reproarchive.cli"):
            wrong += [f"{name} imports {t}" for t in imports
                      if t.startswith("reproarchive") and t not in allowed
                      and not t.startswith(("reproarchive.cli", "reproarchive.compat"))]
    assert wrong == []


#: What torch's compiler itself runs on that a compat module may reach, and which module.
COMPAT_BEYOND_TORCH = {"triton": ("reproarchive.compat.absent_gpu",)}  # Triton's driver and targets


def test_compat_imports_only_torch_the_standard_library_and_errors():
    wrong = []
    for name, path in MODULES.items():
        if not name.startswith("reproarchive.compat"):
            continue
        wrong += [f"{name} imports {t}" for t in _absolute_imports(path)
                  if t.split(".")[0] not in sys.stdlib_module_names and t.split(".")[0] != "torch"
                  and name not in COMPAT_BEYOND_TORCH.get(t.split(".")[0], ())
                  and t != "reproarchive.errors" and not t.startswith("reproarchive.compat")]
    assert wrong == []


def test_no_import_cycles():
    internal = {n: {t for t in ts if t in MODULES and t != n} for n, ts in _graph().items()}
    # packages import their submodules; an __init__ edge is not a cycle of code
    internal = {n: {t for t in ts if not t.startswith(n + ".")} for n, ts in internal.items()}
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(internal.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(internal):
        if node not in state:
            visit(node, [node])
    assert cycles == []
