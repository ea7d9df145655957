"""A repro script from another machine or another torch: run what can run here, record the rest.

PyTorch's ``fx_graph_runnable`` (and its after_aot dumps) set every torch config key the job
had and load the job's own libraries (``torch.ops.load_library('/path/of/that/machine.so')``).
Here, an older or newer torch lacks some keys (``AttributeError``) and the library is not
installed (``OSError``), and then the graph calls operators nobody registered. None of that
is the graph's failure, so the script's module code runs with those two kinds of statement
guarded (``tolerant_source``): a setting this torch does not have is recorded as one that
cannot be applied here, a library that does not load as missing; every other statement runs
as written. The operators its graph calls that are still missing are described from the call
sites in ``Repro.forward`` and the shapes the log annotated on them (``missing_ops``), and get
a stand-in that answers with generated outputs of those shapes, so the graph traces,
compiles and replays, and says it ran on stand-ins.

This runs only in the child process that executes the user's own log or dump.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
from dataclasses import dataclass, field
from typing import Any

SET = "__reproarchive_set_config__"
LOAD = "__reproarchive_load_library__"
_OP_CALL = re.compile(r"torch\.ops\.([A-Za-z_]\w*)\.([A-Za-z_]\w*)\.([A-Za-z_]\w*)\(")
_ANNOTATED = re.compile(  # twice: "f32[3, 4][4, 1]cpu" = torch.ops.mylib.twice.default(
    r"^\s*(\w+): \"(\w+)\[([^\]]*)\]\[([^\]]*)\](\w+)(?::\d+)?\" = torch\.ops\.(\w+)\.(\w+)\.(\w+)\(")
_DTYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16", "i64": "int64",
           "i32": "int32", "i16": "int16", "i8": "int8", "u8": "uint8", "b8": "bool"}


@dataclass
class Guarded:
    """What the guarded statements met: settings not applied, libraries not loaded."""

    unapplied: list[tuple[str, str, str, str]] = field(default_factory=list)  # module, key, value, why
    libraries: list[str] = field(default_factory=list)  # file names of libraries that did not load

    def helpers(self) -> dict[str, Any]:
        def set_config(path: str, make_value):
            parts = path.split(".")
            for cut in range(len(parts) - 1, 0, -1):  # the longest prefix that is a module
                try:
                    owner = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                module, keys = ".".join(parts[:cut]), parts[cut:]
                break
            else:
                self.unapplied.append((parts[0], ".".join(parts[1:]), "?", "its module does not exist here"))
                return
            value = make_value()
            try:
                for key in keys[:-1]:
                    owner = getattr(owner, key)
                setattr(owner, keys[-1], value)
            except (AttributeError, TypeError, ValueError) as exc:
                self.unapplied.append((module, ".".join(keys), repr(value)[:200],
                                       f"this torch has no such setting ({type(exc).__name__})"))

        def load_library(path, *args, **kwargs):
            import torch

            try:
                torch.ops.load_library(path, *args, **kwargs)
            except (OSError, RuntimeError):
                self.libraries.append(os.path.basename(str(path)))

        return {SET: set_config, LOAD: load_library}


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def tolerant_source(source: str) -> ast.Module:
    """The script with its top-level torch config assignments and ``torch.ops.load_library``
    calls guarded (each becomes a call of a ``Guarded`` helper); everything else unchanged."""
    tree = ast.parse(source)
    body = []
    for original in tree.body:
        stmt = original
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and (path := _dotted(stmt.targets[0])) and path.startswith("torch.") and "config" in path):
            value = ast.Lambda(args=ast.arguments([], [], None, [], [], None, []), body=stmt.value)
            stmt = ast.Expr(ast.Call(ast.Name(SET, ast.Load()), [ast.Constant(path), value], []))
        elif (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
              and _dotted(stmt.value.func) == "torch.ops.load_library"):
            stmt = ast.Expr(ast.Call(ast.Name(LOAD, ast.Load()), stmt.value.args, stmt.value.keywords))
        body.append(ast.copy_location(stmt, original))  # tracebacks keep the script's line numbers
    tree.body = body
    return ast.fix_missing_locations(tree)


# --------------------------------------------------------------------------------------------
# operators the graph calls that nobody registered here


def _argument_type(node: ast.AST) -> str:
    if isinstance(node, ast.Constant):
        value = node.value
        return ("Tensor?" if value is None else "bool" if isinstance(value, bool) else "SymInt"
                if isinstance(value, int) else "float" if isinstance(value, float) else "str")
    if isinstance(node, (ast.List, ast.Tuple)):
        inner = {_argument_type(e) for e in node.elts} or {"SymInt"}
        return f"{inner.pop()}[]" if len(inner) == 1 else "Tensor[]"
    if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant):
        return _argument_type(node.operand)
    return "Tensor"


def missing_ops(source: str, annotated: str | None) -> dict[str, dict[str, Any]]:
    """``ns::op.overload`` -> {schema, outputs: [(dtype, shape, stride, device)]} for each op the
    script calls that this process does not have (a stand-in an earlier compile installed
    included: each compile's archive records its own). The schema is inferred from the first call
    site (a tensor per variable, the type of each literal, one tensor result); the outputs from
    the shapes ``annotated`` (the log's graph code with types) gives the same call, if any."""
    from reproarchive.codec.custom_ops import TORCH_NAMESPACES, registered_here
    from reproarchive.codec.stand_ins import is_stand_in

    found: dict[str, dict[str, Any]] = {}
    for m in _OP_CALL.finditer(source):
        ns, op, overload = m.groups()
        name = f"{ns}::{op}.{overload}"
        if ns in TORCH_NAMESPACES or name in found or (registered_here(name) is not None and not is_stand_in(name)):
            continue
        call = _call_at(source, m.start())
        if call is None:
            continue
        args = [f"{_argument_type(a)} a{i}" for i, a in enumerate(call.args)]
        args += (["*"] if call.keywords else []) + [f"{_argument_type(k.value)} {k.arg}" for k in call.keywords]
        overload_part = "" if overload == "default" else f".{overload}"
        found[name] = {"schema": f"{ns}::{op}{overload_part}({', '.join(args)}) -> Tensor", "outputs": []}
    for line in (annotated or "").splitlines():
        a = _ANNOTATED.match(line)
        if a is None:
            continue
        name = f"{a.group(6)}::{a.group(7)}.{a.group(8)}"
        if name in found and not found[name]["outputs"]:
            dims = [int(d) for d in a.group(3).split(",") if d.strip().lstrip("-").isdigit()]
            strides = [int(d) for d in a.group(4).split(",") if d.strip().lstrip("-").isdigit()]
            if a.group(2) in _DTYPES and len(dims) == len([d for d in a.group(3).split(",") if d.strip()]):
                found[name]["outputs"] = [(_DTYPES[a.group(2)], dims, strides or None, a.group(5))]
    return found


def _call_at(source: str, offset: int) -> ast.Call | None:
    """The call expression starting at ``offset`` of ``source`` (one line of FX code)."""
    line_end = source.find("\n", offset)
    text = source[offset: line_end if line_end >= 0 else None].split(";")[0].strip()
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    return node if isinstance(node, ast.Call) else None
