"""Well-formed archives with hostile *content*, written with reproarchive's own writer
or by editing a valid index: every one passes the byte-level checks, so what stops them is the
effect allowlist, the one filter for recorded config and environment, and the neutralising of
strings on their way to a terminal or into generated code.

Each builder returns a path; ``MARKER`` files are what the payload would create if it ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from support import hostile_corpus as hc

NODE_X = {"k": "node", "v": "x"}

#: Call targets that are not tensor computations whose effects stay on their tensors, though
#: several look like one by name: (label, op, target, args).
TARGET_ATTACKS: list[tuple[str, str, str, list]] = [
    ("from_file", "call_function", "torch.from_file", ["{victim}", True, 4]),
    ("aten_from_file", "call_function", "torch.ops.aten.from_file.default", ["{victim}", True, 4]),
    ("torch_save", "call_function", "torch.save", [NODE_X, "{victim}"]),
    ("torch_load", "call_function", "torch.load", ["{victim}"]),
    ("sorted_with_key", "call_function", "builtins.sorted", [[NODE_X]]),
    ("map_callable", "call_function", "builtins.map", [None, [1]]),
    ("getattr_graph_method", "call_function", "builtins.getattr", [NODE_X, "to_folder"]),
    ("methodcaller", "call_function", "operator.methodcaller", ["to_folder", "{victim}"]),
    ("method_tofile", "call_method", "tofile", [NODE_X, "{victim}"]),
    ("method_numpy", "call_method", "numpy", [NODE_X]),
    ("method_register_hook", "call_method", "register_hook", [NODE_X, None]),
    ("manual_seed", "call_function", "torch.manual_seed", [1]),
    ("set_default_dtype", "call_function", "torch.set_default_dtype", [{"k": "dtype", "v": "float64"}]),
    ("set_num_threads", "call_function", "torch.set_num_threads", [1]),
    ("profiler_op", "call_function", "torch.ops.profiler._record_function_enter.default", ["x", None]),
    ("torch_compile", "call_function", "torch.compile", [None]),
]


def pack_functional(path: Path, **kwargs: Any) -> Path:
    """A valid archive of a graph of functions only (no submodule), which ``export`` can write
    as a standalone script: relu, mm and sum on a float input and a weight."""
    import torch
    import torch.fx as fx

    import reproarchive

    g = fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    y = g.call_function(torch.relu, (g.call_function(torch.mm, (x, w)),))
    g.output((g.call_function(torch.sum, (y,)),))
    kwargs.setdefault("backend", "eager")
    return reproarchive.pack(fx.GraphModule(torch.nn.Module(), g), [torch.randn(3, 4), torch.randn(4, 2)], path,
                             **kwargs)


def valid_parsed(workdir: Path, **pack_kwargs: Any) -> hc.Parsed:
    return hc.parse(hc.make_valid(workdir / "valid.tar.zst", **pack_kwargs).read_bytes())


def with_call(parsed: hc.Parsed, op: str, target: str, args: list) -> bytes:
    def edit(index: dict) -> None:
        node = next(n for n in index["graph"]["nodes"] if n["op"] == "call_function")
        node["op"], node["target"], node["args"] = op, target, args
    return hc.rebuild(parsed, edit)


def target_archives(workdir: Path, victim: Path) -> dict[str, Path]:
    parsed = valid_parsed(workdir)
    out = {}
    for label, op, target, args in TARGET_ATTACKS:
        args = [a.format(victim=victim) if isinstance(a, str) else a for a in args]
        path = workdir / f"target_{label}.tar.zst"
        path.write_bytes(with_call(parsed, op, target, args))
        out[label] = path
    return out


def context_archive(path: Path, marker: Path, module: str, *, backend: str = "inductor") -> Path:
    """A valid archive whose recorded config and environment would, if applied, run a program
    (the C++ compiler setting), import a module the archive names, and make torch write logs,
    traces and debug folders into the working directory."""
    modules = {
        "torch._inductor.config": {"cpp.cxx": ["sh", "-c", f"touch {marker}; exec g++ \"$@\"", "sh"],
                                   "trace.enabled": True, "debug": True},
        "torch._dynamo.config": {"debug_dir_root": "./debug-here"},
        module: {"payload": 1},  # a config section naming a module the replay would import
    }
    record = {"modules": modules, "changed": modules}
    environment = {"variables": {"TORCH_LOGS": "+dynamo", "TORCH_LOGS_OUT": "torch-log.txt",
                                 "TORCH_COMPILE_DEBUG": "1", "TORCH_TRACE": "trace-here",
                                 "TORCHINDUCTOR_CACHE_DIR": "cache-here", "LD_PRELOAD": str(marker)}}
    return pack_functional(path, config=record, environment=environment, backend=backend,
                         failure={"stage": "compile", "exception_type": "RuntimeError", "message": "recorded",
                                  "traceback": "", "signature": "compile|RuntimeError|recorded", "backend": backend})


#: Strings an archive can carry into terminal output or generated code.
HOSTILE_TEXT = [
    "\x1b]0;pwned\x07\x1b[2J\x1b[31mred",  # title, clear screen, colour
    "line\rOVERWRITE",
    "a\u202eevil\u202c",  # right-to-left override
    "\"\"\"; import os; os.system('touch {marker}'); \"\"\"",
    "'''\\\n__import__('os').system('touch {marker}')#",
    "\\N{xyz}\\x\\u12",
    "\x00nul\x85next\u2028sep",
]


def text_archive(path: Path, marker: Path, text: str) -> Path:
    """A valid archive whose failure record, backend name and source fields carry ``text``."""
    text = text.replace("{marker}", str(marker))
    return pack_functional(path, backend="eager", failure={
        "stage": "compile", "exception_type": "RuntimeError", "message": text, "traceback": text,
        "signature": f"compile|RuntimeError|{text}", "backend": "eager"}, source={"kind": text, "note": text})


def edited(path: Path, parsed: hc.Parsed, edit: Callable[[dict], Any]) -> Path:
    path.write_bytes(hc.rebuild(parsed, edit))
    return path


#: A module an archive names and a test puts on ``sys.path``: importing it writes a marker.
EVIL_MODULE = "reproarchive_hostile_module"


def evil_module(folder: Path, marker: Path) -> Path:
    """``EVIL_MODULE`` in ``folder``: a class and a function an archive can name, and a marker
    written the moment anything imports it."""
    path = folder / f"{EVIL_MODULE}.py"
    path.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n\n\n"
                    "class Evil:\n    pass\n\n\ndef op(*args):\n    return args\n")
    return path


def subclass_archive(path: Path, cls: str) -> Path:
    """A valid functional archive whose first input is a (1.3) tensor subclass of class ``cls``."""
    parsed = hc.parse(pack_functional(path.with_name(f"plain-{path.name}")).read_bytes())
    return edited(path, parsed, lambda index: hc.as_subclass(index, cls))


def operator_archive(path: Path, hop: str, operator: str) -> Path:
    """A valid functional archive whose first call is higher-order operator ``hop`` handed
    ``operator`` by name (the 1.3 ``operator`` argument), as with_effects and
    auto_functionalized are."""
    parsed = hc.parse(pack_functional(path.with_name(f"plain-{path.name}")).read_bytes())

    def edit(index: dict) -> None:
        node = next(n for n in index["graph"]["nodes"] if n["op"] == "call_function")
        node["target"] = f"torch.ops.higher_order.{hop}"
        node["args"] = [NODE_X, {"k": "operator", "v": operator}, NODE_X]

    return edited(path, parsed, edit)
