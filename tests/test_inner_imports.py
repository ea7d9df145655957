"""An import inside a function says why it is not at the top of its module. A reader meets the
module's dependencies at its top; an import hidden in a function is there for one of three
reasons, and this test finds which, from the source alone:

* **cost**: it brings in something heavier than the module itself is at import time (torch or
  another heavy package, or a module of ours that imports one at its top), so the module stays
  light for those who import it without calling that function (``reproarchive --help``, the
  crash guard in every process ``capture --`` starts, the torch-free index readers);
* **cycle**: the module it imports reaches this one through top-level imports;
* **said**: a comment on the import's line, or a line ``# Imports inside functions: ...`` at the
  top level of the module, saying the reason for all of its imports (a module imported by every
  Python process a capture starts keeps even our own light modules out of its start-up).

Anything else belongs at the top of the module."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "# Imports inside functions:"
#: third-party packages whose import costs (torch takes seconds; the others pull large trees)
HEAVY = ("torch", "triton", "sympy", "numpy", "ray", "fsspec", "s3fs", "playwright", "grandalf", "tqdm",
         "blake3", "networkx", "jinja2", "moto", "boto3", "botocore")
#: torch's parts that cost seconds more than ``import torch`` itself
HEAVIER = ("torch._dynamo", "torch._inductor", "torch.distributed", "torch._functorch", "torch._higher_order_ops",
           "torch.export", "torch._export", "torch._subclasses", "torch.fx.experimental", "torch.testing",
           "triton", "ray", "fsspec", "s3fs", "playwright", "grandalf")
#: modules that resolve some names lazily (a module ``__getattr__``): importing a name they do not
#: define at their top level may import torch
LAZY_NAMES = ("reproarchive", "reproarchive.compat.dispatch", "reproarchive.compat.dynamo",
              "reproarchive.compat.distributed")


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.joinpath("reproarchive").rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        found[".".join(p for p in rel.parts if p != "__init__")] = path
    for path in ROOT.joinpath("cli").rglob("*.py"):
        rel = path.relative_to(ROOT / "cli").with_suffix("")
        found[".".join(["reproarchive", "cli", *[p for p in rel.parts if p != "__init__"]])] = path
    return found


MODULES = _modules()


def _targets(name: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


@cache
def _parsed(name: str) -> tuple[frozenset[str], tuple[tuple[ast.AST, tuple[str, ...]], ...], frozenset[str]]:
    """(what ``name`` imports at its top level, its imports inside functions, the names it defines)."""
    path = MODULES[name]
    top: set[str] = set()
    inner: list[tuple[ast.AST, tuple[str, ...]]] = []

    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if in_function:
                    inner.append((child, tuple(_targets(name, path, child))))
                elif not type_checking:
                    top.update(_targets(name, path, child))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, True, type_checking)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                visit(child, in_function, True)
            else:
                visit(child, in_function, type_checking)

    tree = ast.parse(path.read_text())
    visit(tree, False, False)
    defined = {getattr(n, "name", None) for n in tree.body} | {
        t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
        for t in ast.walk(n if isinstance(n, ast.AnnAssign) else n.targets[0]) if isinstance(t, ast.Name)}
    return frozenset(top), tuple(inner), frozenset(d for d in defined if d)


def _parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))} & MODULES.keys()


def _external_cost(module: str) -> int:
    if module.startswith(HEAVIER):
        return 2
    return 1 if module.split(".")[0] in HEAVY else 0


_COSTS: dict[str, int] = {}


def _cost(name: str) -> int:
    """0, 1 (torch) or 2 (Dynamo, Inductor and the like): what importing ``name`` costs, from its
    top-level imports, followed through ours (a module on a cycle counts 0 while it is weighed)."""
    if name not in _COSTS:
        _COSTS[name] = 0
        _COSTS[name] = max((_cost(t) if t in MODULES else _external_cost(t)
                            for t in _parsed(name)[0] | _parents(name)), default=0)
    return _COSTS[name]


def _statement_cost(node: ast.AST, targets: tuple[str, ...]) -> int:
    best = max((_cost(t) if t in MODULES else _external_cost(t) for t in targets), default=0)
    if isinstance(node, ast.ImportFrom) and node.module in LAZY_NAMES:
        if any(a.name not in _parsed(node.module)[2] for a in node.names):
            best = 2  # resolved by the module's __getattr__: possibly torch's heaviest parts
    return best


@cache
def _reaches(start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module == goal:
            return True
        if module in seen or module not in MODULES:
            continue
        seen.add(module)
        todo.extend(_parsed(module)[0] | _parents(module))
    return False


def unexplained_inner_imports() -> list[str]:
    problems = []
    for name, path in sorted(MODULES.items()):
        lines = path.read_text().splitlines()
        if any(line.startswith(MARKER) for line in lines):
            continue
        own_cost = _cost(name)
        for node, targets in _parsed(name)[1]:
            if "#" in lines[node.lineno - 1] or _statement_cost(node, targets) > own_cost:
                continue
            if any(t in MODULES and _reaches(t, name) for t in targets):
                continue
            problems.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return problems


def test_every_import_inside_a_function_has_its_reason():
    problems = unexplained_inner_imports()
    assert problems == [], ("imports inside functions with no reason (cost, a cycle, or a comment): move each "
                            "to the top of its module, or say why:\n  " + "\n  ".join(problems))


def test_the_rule_sees_cost_and_cycles():
    """The classifier itself: torch costs, Dynamo costs more, and a module that is part of a cycle
    with the importer is found."""
    assert _external_cost("torch") == 1 and _external_cost("torch._inductor.config") == 2
    assert _external_cost("json") == 0
    assert _cost("reproarchive.errors") == 0
    assert _reaches("reproarchive.sources.program.crash_guard", "reproarchive.sources.capture.stack_room")
    assert not _reaches("reproarchive.errors", "reproarchive.sources.program.crash_guard")
