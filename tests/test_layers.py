"""The tree shows the layers, and data flows one way (README, "Development").

Every import in the library and the CLI is read from the source, function-level imports
included (a lazy import is still a dependency), and checked against the layer order:

    errors, version, progress, child  <  format  <  codec, context  <  archive  <  replay, store
                                      <  sources, minifier, standalone, triage, bisect, references, documents  <  cli
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {
    "reproarchive.errors": 0, "reproarchive.version": 0, "reproarchive.progress": 0, "reproarchive.child": 0,
    "reproarchive.format": 1,
    "reproarchive.codec": 2, "reproarchive.context": 2,
    "reproarchive.archive": 3,
    "reproarchive.replay": 4, "reproarchive.store": 4,
    "reproarchive.sources": 5, "reproarchive.minifier": 5, "reproarchive.standalone": 5, "reproarchive.triage": 5,
    "reproarchive.bisect": 5,
    "reproarchive.references": 5, "reproarchive.documents": 5,
    "reproarchive.cli": 6,
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


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_every_module_has_a_layer():
    assert [m for m in MODULES if m != "reproarchive" and _layer(m) is None] == []


def test_imports_only_go_down():
    wrong = []
    for name, imports in GRAPH.items():
        own = _layer(name)
        for target in imports:
            level = _layer(target)
            if level is not None and own is not None and level > own:
                wrong.append(f"{name} (layer {own}) imports {target} (layer {level})")
    assert wrong == []


def test_library_never_imports_click_or_the_package_init():
    wrong = []
    for name, imports in GRAPH.items():
        if name.startswith("reproarchive.cli") or name == "reproarchive":
            continue
        wrong += [f"{name} imports {t}" for t in imports
                  if t == "reproarchive" or t.startswith(("click", "reproarchive.cli"))]
    assert wrong == []


def test_cli_uses_only_the_public_surface():
    allowed = {"reproarchive"}
    wrong = []
    for name, imports in GRAPH.items():
        if name.startswith("reproarchive.cli"):
            wrong += [f"{name} imports {t}" for t in imports
                      if t.startswith("reproarchive") and t not in allowed and not t.startswith("reproarchive.cli")]
    assert wrong == []


def test_no_import_cycles():
    internal = {n: {t for t in ts if t in MODULES and t != n} for n, ts in GRAPH.items()}
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
