"""Every private torch name the library and the CLI touch is touched in ``reproarchive/compat/``.

A private torch name is a dotted name under ``torch`` with a component that starts with one
underscore (``torch._dynamo.config``, ``torch._C._set_grad_enabled``,
``torch.utils._pytree.tree_map``), or anything under ``torch.fx.experimental`` (declared
unstable). Operators (``torch.ops.NS.OP``) are public whatever their namespace is called. The
scan reads every module's source (AST, function-level code included) and finds:

* imports: ``import torch._inductor.config as c``, ``from torch._ops import OpOverload``;
* attribute chains from ``torch`` or from a name an import bound to something under torch
  (``dist.distributed_c10d._get_default_group`` after ``import torch.distributed as dist``),
  named in full: ``torch.distributed.distributed_c10d._get_default_group``;
* FX node meta read or written by a string key (``node.meta["val"]``, ``n.meta.get("desc")``,
  ``"val" in node.meta``), named ``node.meta["val"]``: the keys are Dynamo's, AOTAutograd's and
  Inductor's. Modules that read the archive's own ``NodeRecord.meta`` (``ARCHIVE_META``) are left
  out; the test checks they import no torch, so no FX node can reach them.

Not counted: strings. The allowlist tables of ``codec/effects.py`` and ``codec/targets.py`` and the
recorded config's module names hold names like ``"torch._C._set_grad_enabled"`` as data, names
of what a recorded graph calls or of what an archive records, not uses. In the compat modules a
string that is exactly such a name is counted, though: there it names a module to import or to
hook (``"torch._dynamo.repro.after_dynamo"``), and each compat module's ``PRIVATE_NAMES`` must
equal what the scan finds in it.

The one exception by design: the ``*.template`` files of ``reproarchive/standalone`` are not Python
modules of the library but the text of the script ``export`` writes, which runs where only
PyTorch is installed and cannot import ``reproarchive.compat``; they are not scanned.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from reproarchive.package_version import TESTED_TORCH

ROOT = Path(__file__).resolve().parents[1]
COMPAT = ROOT / "reproarchive" / "compat"

#: Modules whose ``.meta`` is the archive's ``NodeRecord.meta`` (``format.schema``), never an FX node's.
ARCHIVE_META = ("reproarchive/archive/graph_code.py", "reproarchive/triage/diff.py", "reproarchive/triage/view.py",
                "reproarchive/triage/graph_drawing.py")


_META_METHODS = ("get", "pop", "setdefault")
_DOTTED = re.compile(r"torch(\.[A-Za-z_]\w*)+")


def is_private(dotted: str) -> bool:
    parts = dotted.split(".")
    if parts[0] != "torch" or dotted.startswith("torch.ops."):
        return False
    if dotted == "torch.fx.experimental" or dotted.startswith("torch.fx.experimental."):
        return True
    return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts[1:])


def _own_nodes(scope: ast.AST):
    """The nodes of ``scope`` that are not inside a nested function or class."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def _key(node: ast.AST) -> str:
    return f'"{node.value}"' if isinstance(node, ast.Constant) and isinstance(node.value, str) else "[?]"


class _Scan(ast.NodeVisitor):
    """(line, private name) sites of one module; names bound by imports resolve per scope."""

    def __init__(self, strings: bool):
        self.strings = strings
        self.scopes: list[dict[str, str]] = []
        self.sites: set[tuple[int, str]] = set()
        self.docstrings: set[int] = set()

    def scope(self, node: ast.AST) -> None:
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            self.docstrings.add(id(body[0].value))
        bound: dict[str, str] = {}
        for child in _own_nodes(node):  # an import anywhere in a scope binds for all of it
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for name, dotted, _ in _imported(child):
                    bound[name] = dotted
        self.scopes.append(bound)
        self.generic_visit(node)
        self.scopes.pop()

    visit_Module = visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = scope

    def resolve(self, name: str) -> str | None:
        for bound in reversed(self.scopes):
            if name in bound:
                return bound[name]
        return None

    def add(self, node: ast.AST, name: str) -> None:
        self.sites.add((node.lineno, name))

    def visit_Import(self, node: ast.AST) -> None:
        for _, _, dotted in _imported(node):
            if is_private(dotted):
                self.add(node, dotted)

    visit_ImportFrom = visit_Import

    def visit_Attribute(self, node: ast.Attribute) -> None:
        parts, cur = [], node
        while isinstance(cur, ast.Attribute):
            parts.append(cur.attr)
            cur = cur.value
        root = self.resolve(cur.id) if isinstance(cur, ast.Name) else None
        if root is not None:
            full = ".".join([root, *reversed(parts)])
            if is_private(full):
                self.add(node, full)
            return
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.value, ast.Attribute) and node.value.attr == "meta":
            self.add(node, f"node.meta[{_key(node.slice)}]")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in _META_METHODS and isinstance(f.value, ast.Attribute) \
                and f.value.attr == "meta" and node.args:
            self.add(node, f"node.meta[{_key(node.args[0])}]")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        for op, right in zip(node.ops, node.comparators):
            if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, ast.Attribute) and right.attr == "meta":
                self.add(node, f"node.meta[{_key(node.left)}]")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if self.strings and isinstance(node.value, str) and id(node) not in self.docstrings \
                and _DOTTED.fullmatch(node.value) and is_private(node.value):
            self.add(node, node.value)


def _imported(node: ast.AST):
    """(name bound, what it is bound to, what is imported) for each torch name ``node`` imports."""
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name == "torch" or a.name.startswith("torch."):
                yield (a.asname, a.name, a.name) if a.asname else ("torch", "torch", a.name)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
            and (node.module == "torch" or node.module.startswith("torch.")):
        for a in node.names:
            yield a.asname or a.name, f"{node.module}.{a.name}", f"{node.module}.{a.name}"


def scan(source: str, *, strings: bool = False) -> list[tuple[int, str]]:
    """The private torch names ``source`` touches, as (line, name), sorted."""
    visitor = _Scan(strings)
    visitor.visit(ast.parse(source))
    return sorted(visitor.sites)


def _modules() -> list[Path]:
    return sorted([*(ROOT / "reproarchive").rglob("*.py"), *(ROOT / "cli").rglob("*.py")])


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _compat_modules() -> list[Path]:
    return sorted(p for p in COMPAT.glob("*.py") if p.name != "__init__.py")


# -- the scanner can fail ---------------------------------------------------------------------------


def test_the_scan_finds_planted_private_uses():
    planted = '''
import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree
from torch.fx.experimental.symbolic_shapes import ShapeEnv

def f(node, x):
    import torch._inductor.config as ic
    dist.distributed_c10d._get_default_group()
    ic.patch(max_autotune=True)
    torch._C._set_grad_enabled(False)
    node.meta["val"] = x
    return pytree.tree_map(abs, x), node.meta.get("example_value"), "val" in node.meta

def g(ic):
    return ic.patch, torch.ops._c10d_functional.all_reduce, torch.nn.functional.relu, torch.Tensor.__add__
'''
    assert scan(planted) == [
        (4, "torch.utils._pytree"),
        (5, "torch.fx.experimental.symbolic_shapes.ShapeEnv"),
        (8, "torch._inductor.config"),
        (9, "torch.distributed.distributed_c10d._get_default_group"),
        (10, "torch._inductor.config.patch"),
        (11, "torch._C._set_grad_enabled"),
        (12, 'node.meta["val"]'),
        (13, 'node.meta["example_value"]'),
        (13, 'node.meta["val"]'),
        (13, "torch.utils._pytree.tree_map"),
    ]  # g's ``ic`` is a parameter, not the import in f; operators and dunders are public


def test_the_scan_counts_strings_only_when_asked():
    source = '"""torch._dynamo.config is documented here."""\nHOOK = "torch._dynamo.repro.after_dynamo"\n' \
             'TEXT = "see torch._C._foo for details"\n'
    assert scan(source) == []
    assert scan(source, strings=True) == [(2, "torch._dynamo.repro.after_dynamo")]


# -- the library and the CLI ------------------------------------------------------------------------


def test_private_torch_names_are_only_in_compat():
    wrong = []
    for path in _modules():
        rel = _rel(path)
        if path.parent == COMPAT:
            continue
        for line, name in scan(path.read_text()):
            if name.startswith("node.meta[") and rel in ARCHIVE_META:
                continue
            wrong.append(f"{rel}:{line}: {name}")
    assert wrong == [], "use reproarchive.compat.<concern> instead:\n" + "\n".join(wrong)


def test_archive_meta_readers_hold_no_fx_nodes():
    for rel in ARCHIVE_META:
        tree = ast.parse((ROOT / rel).read_text())
        imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [m for m in imported if m == "torch" or m.startswith("torch.")], rel


# -- the compat modules -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", _compat_modules(), ids=lambda p: p.stem)
def test_compat_module_declares_what_it_touches(path):
    module = importlib.import_module(f"reproarchive.compat.{path.stem}")
    found = sorted({name for _, name in scan(path.read_text(), strings=True)})
    assert sorted(module.PRIVATE_NAMES) == found
    assert module.CHECKED_WITH == TESTED_TORCH  # the matrix runs this file on each
    assert (module.__doc__ or "").strip(), "say why the module exists"
    assert len(path.read_text().splitlines()) <= 300


def _resolves(name: str) -> bool:
    """Whether the dotted private ``name`` exists in this torch (its longest importable module,
    then attributes)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for part in parts[cut:]:
                obj = getattr(obj, part)
        except AttributeError:
            return False
        return True
    return False


def test_declared_names_resolve_in_this_torch():
    """Run by CI under every torch of ``CHECKED_WITH`` (the whole suite on the pinned one, and
    .ci/matrix-tests, which holds this file, on the others)."""
    missing = []
    for path in _compat_modules():
        module = importlib.import_module(f"reproarchive.compat.{path.stem}")
        missing += [f"{path.stem}: {n}" for n in module.PRIVATE_NAMES
                    if not n.startswith("node.meta[") and not _resolves(n)]
    assert missing == []


def test_compat_modules_import_no_torch():
    """Importing a compat module costs nothing: ``reproarchive --help`` and the format layer
    never pay for torch's private modules."""
    names = ", ".join(f"reproarchive.compat.{p.stem}" for p in _compat_modules())
    code = f"import sys, {names}; print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]"
