"""What an exported script may say of its archive, and how: shared by ``script`` (one process)
and ``job_script`` (a job's ranks).

Everything here is the boundary between the archive's data and the script's code. The recorded
config, thread state and shape policy enter a script only as the replay itself would apply them
(``context.admission``, ``context.execution``, ``codec.shapes``) and only as ``repr`` literals;
the archive's strings enter its docstrings only through ``_doc_text``, escaped to one printable
line. Kept apart from the writer of the script so that this boundary reads on its own.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from reproarchive.context.admission import setting_problem
from reproarchive.context.config import CONFIG_MODULES
from reproarchive.context.execution import MATMUL_PRECISIONS
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import DTYPES, ConfigRecord, ExecutionRecord, ShapePolicy, TorchInfo

# -- recorded state, as literals -----------------------------------------------------------------


def _shape_literals(shapes: ShapePolicy | None, cut: bool = False) -> dict[str, str]:
    """The recorded shape policy as the script's literals: the replay's own plan of each
    dimension (``codec.shapes.dimension_plan``), so the script makes the symbols ``run`` makes.
    Sources and guards are strings from the archive, written as ``repr`` literals only; the
    guards are a pair: as the compile ended (None for a graph ``cut`` from the recorded one,
    another program, judged at backend entry as ``run`` judges it), and at backend entry (None:
    not recorded)."""
    from reproarchive.codec.shapes import dimension_plan, is_symbolic, shape_env_settings

    if shapes is None or not is_symbolic(shapes):  # a static compile's ShapeEnv is made with its settings too
        settings = shape_env_settings(shapes) if shapes is not None else {}
        return {"shapes": "{}", "sources": "{}", "shape_settings": repr(settings), "guards": "([], None)"}
    plan = {i: [(str(k), c, e) for k, c, e in dims] for i, dims in dimension_plan(shapes).items()}
    sources = {r.input: r.source for r in shapes.inputs if r.source}
    at_entry = list(shapes.entry.guards) if shapes.entry is not None else None
    after_compile = None if cut and at_entry is not None else list(shapes.guards)
    return {"shapes": repr(plan), "sources": repr(sources), "shape_settings": repr(shape_env_settings(shapes)),
            "guards": repr((after_compile, at_entry))}


def _execution_literal(record: ExecutionRecord | None) -> dict[str, Any]:
    """The recorded thread state as the script's ``EXECUTION``: only names the replay itself
    would enter (``context.execution``: a §6 dtype, one of the matmul precisions)."""
    if record is None:
        return {}
    flags = ("inference_mode", "grad_enabled", "deterministic", "deterministic_warn_only")
    out: dict[str, Any] = {k: getattr(record, k) for k in flags if getattr(record, k) is not None}
    out["autocast"] = [(a.device_type, a.enabled, a.dtype if a.dtype in DTYPES else None)
                       for a in record.autocast or ()]
    if record.default_dtype in DTYPES:
        out["default_dtype"] = record.default_dtype
    if record.float32_matmul_precision in MATMUL_PRECISIONS:
        out["float32_matmul_precision"] = record.float32_matmul_precision
    return out


def recorded_config(path: str | os.PathLike) -> list[tuple[str, str, Any]]:
    """(config module, key, value) of the torch config the failing run of the archive at ``path``
    changed from the defaults, as a replay applies it (``admitted_settings``): what a bug report
    must say for its graph to fail upstream. Reads the index only."""

    with ContainerReader(path) as reader:
        return admitted_settings(reader.index.records.config)


def admitted_settings(config: ConfigRecord | None) -> list[tuple[str, str, Any]]:
    """(config module, key, value) of the recorded settings that differed from the defaults and
    pass the replay filter (``context.admission``), in torch's own config modules only."""
    if config is None:
        return []

    skip = _machine_specific(config) | {(u.module, u.key) for u in config.unrepresentable}
    out = []
    for module, values in sorted(config.changed.items()):
        if module not in CONFIG_MODULES:
            continue  # never a module the archive names
        entries = getattr(importlib.import_module(module), "_config", {})
        for key, value in sorted(values.items()):
            entry = entries.get(key)
            if (module, key) in skip or entry is None or getattr(entry, "alias", None) is not None:
                continue
            if setting_problem(key, value, entry.default) is None:
                kind = config.types.get(module, {}).get(key)
                if kind == "tuple" and isinstance(value, list):
                    value = tuple(value)
                elif kind == "set" and isinstance(value, list):
                    value = set(value)
                out.append((module, key, value))
    return out


def _machine_specific(config: ConfigRecord | None) -> set[tuple[str, str]]:
    return {(m.module, m.key) for m in config.machine_specific} if config else set()


# -- the archive's text, in docstrings -----------------------------------------------------------


_TRIPLE_QUOTE = '"' * 3


def _doc_text(text: str) -> str:
    """Text from an archive as it may stand inside the script's docstrings: every character
    that is not printable (control characters, line and paragraph separators, lone surrogates)
    written as its escape, backslashes doubled, no triple quote. The result is one line."""
    out = []
    for ch in str(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\\\x{code:02x}" if code < 0x100
                       else f"\\\\u{code:04x}" if code < 0x10000 else f"\\\\U{code:08x}")
    return "".join(out).replace(_TRIPLE_QUOTE, "'''")


def _header(archive_name, digest, system, failure, backend, source_kind, table) -> str:
    """The script's docstring: every line from the archive through ``_doc_text``."""
    torch_rec = (system.torch if system else None) or TorchInfo()
    lines = [
        f"Standalone reproduction exported by reproarchive from {_doc_text(archive_name or 'an archive')}",
        f"({_doc_text(digest or 'unknown digest')}).",
        "Needs only PyTorch:",
        "    python repro.py [--device DEV] [--backend NAME] [--accuracy/--no-accuracy] [--only-fwd] [--dynamo]",
        "It raises the recorded error (or AssertionError for an accuracy failure) and judges it as",
        "`reproarchive run` does: 'reproduced' (exit 1) or 'different failure' (exit 3); or it prints",
        "'no failure' (exit 0; 125 when not as recorded: other shape guards, a custom op stood in,",
        "random numbers unknown).",
        "",
        f"Recorded with torch {_doc_text(torch_rec.version or '?')} (git {_doc_text(torch_rec.git_version or '?')}),"
        f" CUDA {_doc_text(torch_rec.cuda)}.",
        f"Backend: {_doc_text(backend)}   graph: {_doc_text(source_kind or 'after_dynamo')}",
    ]
    if failure:
        msg = failure.message.strip().splitlines()
        lines.append(f"Recorded failure ({_doc_text(failure.stage)}): {_doc_text(failure.exception_type)}"
                     + (f": {_doc_text(msg[0][:200])}" if msg else ""))
    else:
        lines.append("Recorded failure: none")
    lines += ["", "Inputs (data files under data/, read relative to this script):"] + [_doc_text(t) for t in table]
    return "\n".join(lines)
