"""Finding PyTorch repro dumps and reading what their scripts declare, without running them.

PyTorch's repro scripts keep the facts we need in two places: the module-level code (env lines,
config lines, ``class Repro``, ``load_args``) and the arguments of the final ``run_repro(...)``
call, which is guarded by ``if __name__ == '__main__'`` and so never runs when the module body is
executed for import. We read that call with ``ast`` (literal values only), because a regex breaks
on the first repro whose save_dir holds a quote or a comma. Nothing here imports torch, so
discovery stays fast and the CLI can report a bad SOURCE before paying for torch.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reproarchive.errors import SourceError
from reproarchive.format.layout import ZSTD_MAGIC

LAUNCHER_NAME = "minifier_launcher.py"
# after_dynamo / after_aot are importable; aoti dumps hold an ExportedProgram (.pt2, pickled
# inputs) and are refused with a clear message rather than half-imported.
_KINDS = {
    "torch._dynamo.repro.after_dynamo": "after_dynamo",
    "torch._dynamo.repro.after_aot": "after_aot",
    "torch._dynamo.repro.aoti": "aoti",
}
# Folders a discovery walk never enters: they cannot hold a dump the user means, and walking
# a virtualenv or a checkout of PyTorch itself would take seconds.
_SKIP_DIRS = {".git", ".hg", ".svn", "node_modules", "site-packages", "__pycache__", ".venv", "venv",
              ".tox", ".mypy_cache", ".pytest_cache", "checkpoints", "isolate"}
MAX_WALK_DEPTH = 6


@dataclass
class DumpScript:
    """What a repro script says about itself, read from its syntax tree."""

    path: Path
    kind: str  # "after_dynamo" | "after_aot"
    run_args: dict[str, Any] = field(default_factory=dict)  # literal kwargs of run_repro(...)
    non_literal_args: list[str] = field(default_factory=list)  # kwargs we could not evaluate

    @property
    def save_dir(self) -> str | None:
        value = self.run_args.get("save_dir")
        return value if isinstance(value, str) else None

    @property
    def backend(self) -> str | None:
        if self.kind == "after_aot":
            # after_aot replays with compile_fx_inner: the compiler is always Inductor.
            return "inductor"
        value = self.run_args.get("backend", "inductor")
        return value if isinstance(value, str) else None

    @property
    def accuracy_mode(self) -> str:
        """PyTorch's own vocabulary: "" (errors only), "accuracy" or "strict_accuracy"."""
        value = self.run_args.get("accuracy", "")
        if value is True:
            return "accuracy"
        if value in (False, None):
            return ""
        return str(value)


#: How PyTorch's dump writes a submodule it cannot print: a higher-order op's subgraph
#: (``cond``'s branches, ``while_loop``'s body) of a graph after AOTAutograd.
_UNPRINTED_MODULE = re.compile(r"^\s*self\.(\w+)\s*=\s*<[^>]*>\(\)\s*$")


def _refuse_missing_subgraph(path: Path, err: SyntaxError) -> None:
    """The dump PyTorch writes for a graph with higher-order ops after AOTAutograd has no code
    for their subgraphs (``self.true_graph_0 = <lambda>()``): nothing can rebuild the graph from
    it, and it is PyTorch's dump all the same, so it is said so, with the routes that work."""
    match = _UNPRINTED_MODULE.match(err.text or "")
    if match is None:
        return
    raise SourceError(
        f"{path.name} lacks the code of the subgraph {match.group(1)} (line {err.lineno}: "
        f"{(err.text or '').strip()}): PyTorch dumps a graph with higher-order ops (cond, while_loop ...) so, and "
        "it cannot be rebuilt from this file",
        "capture the failure with `reproarchive capture -- python PROGRAM`, or run the program with "
        "TORCH_TRACE=DIR and `reproarchive pack DIR`",
    ) from err


def _refuse_binary(path: Path) -> None:
    """A file named as a dump that is not text: most often an archive that is already packed."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if head[:4] == ZSTD_MAGIC.to_bytes(4, "little"):
        raise SourceError(f"{path.name} is already a compressed archive (zstd), not a PyTorch repro dump: pack "
                          "makes archives from dumps and TORCH_TRACE logs",
                          f"use it as it is: `reproarchive inspect {path}`, `run`, `verify`, or `push` it to a store")
    if b"\0" in head:
        raise SourceError(f"{path.name} is a binary file, not a PyTorch repro dump",
                          "name a repro.py or minifier_launcher.py that PyTorch wrote, or a TORCH_TRACE log")


def parse_dump_script(path: str | os.PathLike) -> DumpScript:
    """Read a PyTorch repro script; SourceError when it is not one we can import."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise SourceError(f"cannot read {path}: {err.strerror}", "check the path and permissions") from err
    if "\ufffd" in text[:4096] or "\0" in text[:4096]:
        _refuse_binary(path)
    if text.startswith("Repro is not generated"):
        raise SourceError(
            f"{path.name} holds no repro: PyTorch refused to write one (a BackwardState input)",
            "capture the failure with reproarchive.capture(...) instead",
        )
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as err:
        _refuse_missing_subgraph(path, err)
        raise SourceError(
            f"{path.name} is not valid Python{'' if err.lineno is None else f' (line {err.lineno})'}: not a PyTorch "
            "repro dump",
            "name a repro.py or minifier_launcher.py that PyTorch wrote",
        ) from err
    info = _inspect_tree(tree)
    if info is None:
        raise SourceError(
            f"{path.name} is not a PyTorch repro dump (no load_args and run_repro call found)",
            "name a repro.py or minifier_launcher.py written with TORCHDYNAMO_REPRO_AFTER set",
        )
    kind, call = info
    if kind == "aoti":
        raise SourceError(
            f"{path.name} is an AOTInductor minifier dump, which reproarchive cannot import yet",
            "capture the failure with reproarchive.capture(...) or an after_aot dump instead",
        )
    run_args: dict[str, Any] = {}
    non_literal: list[str] = []
    for kw in call.keywords:
        if kw.arg is None:
            non_literal.append("**")
            continue
        try:
            run_args[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            non_literal.append(kw.arg)
    return DumpScript(path=path, kind=kind, run_args=run_args, non_literal_args=non_literal)


def is_dump_script(path: str | os.PathLike) -> bool:
    try:
        parse_dump_script(path)
    except SourceError:
        return False
    return True


def _inspect_tree(tree: ast.Module) -> tuple[str, ast.Call] | None:
    """(kind, run_repro call) when the module looks like a repro script, else None."""
    has_load_args = any(isinstance(n, ast.FunctionDef) and n.name == "load_args" for n in tree.body)
    if not has_load_args:
        return None
    kind = None
    call = None
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in _KINDS:
            if any(alias.name == "run_repro" for alias in node.names):
                kind = _KINDS[node.module]
        elif isinstance(node, ast.Call) and _call_name(node.func) == "run_repro" and call is None:
            call = node
    if kind is None or call is None:
        return None
    return kind, call


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def symbolic_shapes(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Per ``reader.tensor``/``reader.symint`` call of load_args, in order: which sizes are symbols.

    after_aot dumps of dynamic-shape graphs write shapes as ``(s0, 4)`` with ``s0 = 5`` bound at
    the top of the script; once load_args runs only the hint 5 is left, so the symbol names are
    taken from the syntax here. Returns dicts ``{"call": "tensor"|"symint", "shape": [...]|None,
    "expr": str|None}`` where a shape entry is an int or a symbol expression string.
    """
    tree = ast.parse(Path(path).read_text(encoding="utf-8", errors="replace"))
    out: list[dict[str, Any]] = []
    for fn in tree.body:
        if not (isinstance(fn, ast.FunctionDef) and fn.name == "load_args"):
            continue
        for node in _sorted_calls(fn):
            if not isinstance(node.func, ast.Attribute):
                continue
            if not (isinstance(node.func.value, ast.Name) and node.func.value.id == "reader"):
                continue
            what = node.func.attr
            if what == "tensor" and len(node.args) >= 2:
                shape = node.args[1]
                dims: list[Any] | None = None
                if isinstance(shape, (ast.Tuple, ast.List)):
                    dims = []
                    for elt in shape.elts:
                        try:
                            dims.append(int(ast.literal_eval(elt)))
                        except (ValueError, TypeError):
                            dims.append(ast.unparse(elt))
                out.append({"call": "tensor", "shape": dims, "expr": None})
            elif what == "symint":
                expr = next((ast.literal_eval(k.value) for k in node.keywords if k.arg == "expr"), None)
                out.append({"call": "symint", "shape": None, "expr": expr})
            elif what in ("const", "unsupported", "generator", "opaque"):
                out.append({"call": what, "shape": None, "expr": None})
        break
    return out


def holds_no_data(path: str | os.PathLike) -> bool:
    """Whether every storage load_args reads was written without data (``reader.storage(None,
    ...)``: PyTorch had only fake tensors, as in an after_aot dump of a compile error). A dump
    PyTorch wrote as invalid Python (a subgraph it cannot print) is read by its lines."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(text)
    except SyntaxError:
        keys = re.findall(r"reader\.storage\(\s*([^,\s)]+)", text)
        return bool(keys) and all(k == "None" for k in keys)
    keys = [node.args[0] for fn in tree.body if isinstance(fn, ast.FunctionDef) and fn.name == "load_args"
            for node in _sorted_calls(fn)
            if isinstance(node.func, ast.Attribute) and node.func.attr == "storage" and node.args]
    return bool(keys) and all(isinstance(k, ast.Constant) and k.value is None for k in keys)


def _sorted_calls(fn: ast.FunctionDef) -> list[ast.Call]:
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)]
    return sorted(calls, key=lambda n: (n.lineno, n.col_offset))


# --------------------------------------------------------------------------------------------
# Discovery
# --------------------------------------------------------------------------------------------


@dataclass
class Discovery:
    chosen: Path
    candidates: list[Path]  # every valid dump found, newest first
    reason: str  # one line: why this one


def find_dumps(root: str | os.PathLike, *, extra_roots: list[Path] | None = None) -> list[Path]:
    """Every PyTorch repro script below ``root`` (and below ``extra_roots``), newest first.

    Looks for ``torch_compile_debug/run_*/minifier/minifier_launcher.py`` at any depth up to
    MAX_WALK_DEPTH and for ``repro*.py`` directly in ``root`` (level 1 writes it into the cwd).
    Files that merely share the name are checked with ``is_dump_script``.
    """
    root = Path(root)
    found: set[Path] = set()
    for base in [root, *(extra_roots or [])]:
        if not base.is_dir():
            continue
        for p in base.glob("repro*.py"):
            if p.is_file():
                found.add(p.resolve())
        base_depth = len(base.parts)
        for dirpath, dirnames, filenames in os.walk(base):
            depth = len(Path(dirpath).parts) - base_depth
            dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not (d.startswith(".") and d != ".")]
            if depth >= MAX_WALK_DEPTH:
                dirnames[:] = []
            if LAUNCHER_NAME in filenames and Path(dirpath).name == "minifier":
                found.add((Path(dirpath) / LAUNCHER_NAME).resolve())
    valid = [p for p in found if is_dump_script(p)]
    return sorted(valid, key=lambda p: (p.stat().st_mtime, str(p)), reverse=True)


def discover(source: str | os.PathLike | None, cwd: str | os.PathLike) -> Discovery:
    """Resolve SOURCE (a script, a folder, or nothing) to one dump script."""
    cwd = Path(cwd)
    if source is not None:
        src = Path(source)
        if not src.is_absolute():
            src = cwd / src
        if not src.exists():
            raise SourceError(f"{source} does not exist", "name a repro script or a folder holding one")
        if src.is_file():
            parse_dump_script(src)  # raises with the precise reason
            return Discovery(src.resolve(), [src.resolve()], "named on the command line")
        candidates = find_dumps(src)
        where = str(source)
    else:
        extra = []
        debug_root = os.environ.get("TORCH_COMPILE_DEBUG_DIR")
        if debug_root:
            extra.append(Path(debug_root))
        candidates = find_dumps(cwd, extra_roots=extra)
        where = "the current directory"
    if not candidates:
        raise SourceError(
            f"no PyTorch repro dump found below {where}",
            "run the failing program with TORCHDYNAMO_REPRO_AFTER=dynamo (or aot) and "
            "TORCHDYNAMO_REPRO_LEVEL=2, or name the repro script",
        )
    chosen = candidates[0]
    if len(candidates) == 1:
        reason = "the only dump found"
    else:
        reason = f"the newest of {len(candidates)} dumps found (by modification time)"
    return Discovery(chosen, candidates, reason)
