"""The house stays small enough to read: no library or CLI module over 500 lines, no function
over 60 (its decorators not counted). The modules and functions that were over when the rule
came are listed with their size then; each may shrink (and leaves the list once it fits), never
grow, and nothing new joins them. Lower an entry's number when you shrink it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE_LINES, FUNCTION_LINES = 500, 60

#: path -> its lines when the rule came (only shrinking from here); every module fits now
OVER_MODULES: dict[str, int] = {}

#: "path:qualified name" -> its lines when the rule came (only shrinking from here); every function fits now
OVER_FUNCTIONS: dict[str, int] = {}


def _sources() -> list[Path]:
    return sorted([*ROOT.joinpath("reproarchive").rglob("*.py"), *ROOT.joinpath("cli").rglob("*.py")])


def module_sizes() -> dict[str, int]:
    return {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in _sources()}


def _functions(node: ast.AST, prefix: str = ""):
    """(qualified name, lines from its ``def`` to its last line) of every function in ``node``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + child.name, child.end_lineno - child.lineno + 1
            yield from _functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def function_sizes() -> dict[str, int]:
    """"path:Class.function" -> lines from its ``def`` to its last line (decorators excluded)."""
    out: dict[str, int] = {}
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        for name, size in _functions(ast.parse(path.read_text())):
            out[f"{rel}:{name}"] = max(out.get(f"{rel}:{name}", 0), size)
    return out


def _judged(sizes: dict[str, int], limit: int, listed: dict[str, int]) -> list[str]:
    problems = []
    for name, size in sorted(sizes.items()):
        if size > limit and name not in listed:
            problems.append(f"{name}: {size} lines (limit {limit}): split it")
        elif name in listed and size > listed[name]:
            problems.append(f"{name}: grew to {size} lines (was {listed[name]}, limit {limit}): shrink it")
    problems += [f"{name}: fits now or is gone: remove it from the list" for name in listed
                 if sizes.get(name, 0) <= limit]
    return problems


def test_no_module_over_the_limit_and_none_of_the_listed_grows():
    assert not _judged(module_sizes(), MODULE_LINES, OVER_MODULES)


def test_no_function_over_the_limit_and_none_of_the_listed_grows():
    assert not _judged(function_sizes(), FUNCTION_LINES, OVER_FUNCTIONS)


def test_the_rule_can_fail():
    assert _judged({"a.py": 501}, MODULE_LINES, {}) == ["a.py: 501 lines (limit 500): split it"]
    assert _judged({"a.py": 600}, MODULE_LINES, {"a.py": 550})[0].startswith("a.py: grew to 600")
    assert _judged({"a.py": 10}, MODULE_LINES, {"a.py": 550}) == ["a.py: fits now or is gone: remove it from the list"]
