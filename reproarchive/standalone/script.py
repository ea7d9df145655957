"""Exporting an archive as a folder with a standalone ``repro.py``: the form a PyTorch bug report
takes.

The people who read a bug report have torch and nothing else, so the script never imports
reproarchive. Unlike PyTorch's own repro scripts it reads its inputs by a path relative to the
script (the folder can be zipped, mailed and unpacked anywhere), from raw byte files described by
dtype/shape/stride literals in the script (no pickle, no ``torch.load``), and it says which
inputs are real data and which were generated.

The script rebuilds the recorded graph node for node (``torch.fx.Graph.create_node`` with the
same names, targets and constants) and hands that GraphModule to the backend, as ``run`` does;
it never re-traces, which would fold constant-only calls such as ``torch.tensor(2.0)`` into
attributes and rewrite reversed operators. FX's readable form of each graph is included as a
comment. Every target is written as the qualified name the allowlist (spec §7.3) accepted,
and every module the script imports is torch's or the standard library's: none is named by
the archive. What the archive says about config and environment is embedded only when it
passes the filter ``run`` applies (``context.admission``); strings from the archive appear
only as ``repr`` literals or, in the header, with control characters escaped, so the script
always compiles. It is code the user runs by choice; reproarchive itself never execs what an
archive contains.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from pathlib import Path
from typing import Any

from reproarchive.codec.targets import qualified_name
from reproarchive.codec.tensors import storage_view
from reproarchive.context.admission import setting_problem
from reproarchive.context.config import CONFIG_MODULES
from reproarchive.context.environment import plan
from reproarchive.errors import ExportError
from reproarchive.format.atomic import atomic_dir
from reproarchive.format.plain import PlainRecord
from reproarchive.format.schema import (
    ConfigRecord,
    EnvironmentRecord,
    FailureRecord,
    SystemRecord,
    TensorValue,
    TorchInfo,
)
from reproarchive.replay.backends import is_custom
from reproarchive.replay.settings import ReplaySettings


@dataclasses.dataclass(frozen=True)
class ExportReport(PlainRecord):
    """What ``export`` wrote; ``to_plain()`` is ``export --json``."""

    folder: str
    script: str  # folder/repro.py
    files: tuple[str, ...]  # relative to folder
    bytes: int


def export(path: str | os.PathLike, out_dir: str | os.PathLike, settings: ReplaySettings | None = None,
           **options: Any) -> ExportReport:
    """Write ``out_dir`` with ``repro.py`` and its data files; returns what was written.

    ``out_dir`` must not exist or be empty. It is built in a temporary sibling folder and
    renamed into place, so a failure leaves nothing behind. ``settings`` (or ``options``, its
    fields) give the script's backend and accuracy mode (default: the recorded ones) and the
    load's ``max_memory``; the data is always read on the CPU and the script maps devices
    itself when it runs (its ``--device``).
    """
    from reproarchive.archive.loading import load

    settings = ReplaySettings.given(settings, options)
    repro = load(path, device="cpu", remap_graph=False, max_memory=settings.max_memory)
    devices = _recorded_devices(repro)
    records = repro.records
    # not ``settings.for_recorded``: a script may name a recorded custom compiler function for
    # its reader to supply (``run`` never imports one on an archive's say-so)
    return write_export(
        repro.gm, list(repro.args), out_dir,
        backend=settings.backend or records.backend, source_kind=records.graph_kind,
        accuracy=bool(records.accuracy) if settings.accuracy is None else settings.accuracy,
        config=records.config, environment=records.environment,
        system=records.system, failure=records.failure, fidelity=list(repro.fidelity or []),
        recorded_devices=devices, archive_name=Path(path).name, digest=repro.digest,
    )


def _recorded_devices(repro: Any) -> list[str | None]:
    """The device each input was recorded on, from the index (the loaded args are on CPU)."""
    index = repro.index
    return [index.storages[rec.storage].device if isinstance(rec, TensorValue) else None for rec in index.inputs]


def write_export(
    gm: Any,
    args: list[Any],
    out_dir: str | os.PathLike,
    *,
    backend: str | None,
    source_kind: str | None = None,
    accuracy: bool = False,
    config: ConfigRecord | None = None,
    environment: EnvironmentRecord | None = None,
    system: SystemRecord | None = None,
    failure: FailureRecord | None = None,
    fidelity: list[str] | None = None,
    recorded_devices: list[str | None] | None = None,
    archive_name: str = "",
    digest: str | None = None,
) -> ExportReport:
    out = Path(out_dir)
    with atomic_dir(out) as tmp:
        writer = _DataWriter(tmp)
        script = _Script(writer).build(
            gm, args, backend=backend, source_kind=source_kind, accuracy=accuracy, config=config,
            environment=environment, system=system, failure=failure, fidelity=fidelity or [],
            recorded_devices=recorded_devices or [], archive_name=archive_name, digest=digest,
        )
        (tmp / "repro.py").write_text(script, encoding="utf-8")
        files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
        size = sum((tmp / f).stat().st_size for f in files)
    return ExportReport(folder=str(out), script=str(out / "repro.py"), files=tuple(files), bytes=size)


class _DataWriter:
    """Writes each distinct storage once as raw bytes; views of one storage share its file."""

    def __init__(self, root: Path):
        self.root = root
        self.names: dict[int, tuple[str, int]] = {}

    def storage(self, t: Any) -> tuple[str, int]:
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in self.names:
            name = f"data/storage_{len(self.names)}.bin"
            (self.root / "data").mkdir(exist_ok=True)
            data = storage_view(storage.cpu() if storage.device.type != "cpu" else storage)
            (self.root / name).write_bytes(data)
            self.names[key] = (name, len(data))
        return self.names[key]


class _Script:
    def __init__(self, writer: _DataWriter):
        self.writer = writer
        self.imports: set[str] = {"torch", "torch.fx"}  # modules the script imports
        self.graph_defs: list[str] = []  # one function per graph, building it node by node
        self.installs: list[tuple[str, str]] = []  # (module path, graph function), innermost first

    # -- graphs, node for node ----------------------------------------------------------------

    def graph_function(self, gm: Any, path: str) -> str:
        """``def _graph_N()`` that builds ``gm``'s graph with ``create_node``: the same nodes,
        names, targets and constants the archive records (no tracing)."""
        import torch

        for child_name, child in gm.named_children():
            child_path = f"{path}.{child_name}" if path else child_name
            if isinstance(child, torch.fx.GraphModule):
                self.installs.append((child_path, self.graph_function(child, child_path)))
            elif type(child) is not torch.nn.Module:
                raise ExportError(
                    f"the graph calls a {type(child).__module__}.{type(child).__qualname__} submodule "
                    f"({child_path}), which a standalone script cannot recreate",
                    "replay it with `reproarchive run` instead",
                )
        name = f"_graph_{len(self.graph_defs)}"
        readable = gm.graph.python_code(root_module="self", verbose=False).src.strip("\n")
        lines = [f"def {name}():",
                 f'    """{_doc_text(path or "The recorded graph")}, node for node. As FX prints it:',
                 "",
                 *(f"    {_doc_text(ln)}" if ln.strip() else "" for ln in readable.splitlines()),
                 '    """',
                 "    g = torch.fx.Graph()"]
        for node in gm.graph.nodes:
            target = self.target(node)
            args = self.arg(tuple(node.args))
            kwargs = self.arg(dict(node.kwargs))
            lines.append(f"    {_var(node)} = g.create_node({node.op!r}, {target}, {args}, {kwargs}, "
                         f"name={node.name!r})")
        lines.append("    return g")
        self.graph_defs.append("\n".join(lines))
        return name

    def target(self, node: Any) -> str:
        if node.op != "call_function":
            return repr(node.target)
        name = qualified_name(node.target)
        module = _module_of(name)
        if module is None or _resolve(name) is not node.target:
            raise ExportError(f"the graph calls {name}, which a standalone script cannot name",
                              "replay it with `reproarchive run` instead")
        self.imports.add(module)
        return name

    def arg(self, a: Any) -> str:
        """A graph argument as a Python literal (nodes as the variables holding them)."""
        import torch
        import torch.fx as fx

        if isinstance(a, fx.Node):
            return _var(a)
        if a is None or isinstance(a, (bool, int, str)):
            return repr(a)
        if isinstance(a, float):
            return repr(a) if math.isfinite(a) else f"float({str(a)!r})"
        if isinstance(a, complex):
            return f"complex({self.arg(a.real)}, {self.arg(a.imag)})"
        if isinstance(a, torch.dtype):
            return str(a)
        if isinstance(a, torch.device):
            return f"_device({str(a)!r})"
        if isinstance(a, (torch.memory_format, torch.layout)):
            return str(a)
        if isinstance(a, slice):
            return f"slice({self.arg(a.start)}, {self.arg(a.stop)}, {self.arg(a.step)})"
        if a is Ellipsis:
            return "..."
        if isinstance(a, list):
            return "[" + ", ".join(self.arg(x) for x in a) + "]"
        if isinstance(a, tuple):
            return "(" + "".join(self.arg(x) + ", " for x in a) + ")"
        if isinstance(a, dict):
            return "{" + ", ".join(f"{self.arg(k)}: {self.arg(v)}" for k, v in a.items()) + "}"
        raise ExportError(f"the graph has an argument of type {type(a).__name__}, which a script cannot spell",
                          "replay it with `reproarchive run` instead")

    # -- state and inputs -----------------------------------------------------------------------

    def tensor_literal(self, t: Any, device: str | None) -> str:
        import torch

        if (t.layout != torch.strided or t.is_sparse
                or type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter)):
            raise ExportError(f"input of type {type(t).__name__} / layout {t.layout} cannot be exported",
                              "replay it with `reproarchive run` instead")
        name, nbytes = self.writer.storage(t)
        return (
            f"_tensor({name!r}, {nbytes}, {str(t.dtype)}, {tuple(t.shape)!r}, {tuple(t.stride())!r}, "
            f"{t.storage_offset()}, device={device or str(t.device)!r}, requires_grad={bool(t.requires_grad)}, "
            f"leaf={bool(t.is_leaf)})"
        )

    def value_literal(self, value: Any, device: str | None) -> str:
        import torch

        if isinstance(value, torch.Tensor):
            return self.tensor_literal(value, device)
        if isinstance(value, torch.SymInt):
            return repr(int(value.node.hint if value.node.hint is not None else value))
        if isinstance(value, float) and not math.isfinite(value):
            return f"float({str(value)!r})"
        if isinstance(value, (bool, int, float, str)) or value is None:
            return repr(value)
        if isinstance(value, (list, tuple)):
            inner = ", ".join(self.value_literal(v, device) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
        raise ExportError(f"input of type {type(value).__name__} cannot be exported",
                          "replay it with `reproarchive run` instead")

    # -- the script -----------------------------------------------------------------------------

    def build(self, gm, args, *, backend, source_kind, accuracy, config, environment, system, failure,
              fidelity, recorded_devices, archive_name, digest) -> str:
        import torch

        root_graph = self.graph_function(gm, "")
        state_lines = []
        params = dict(gm.named_parameters())
        buffers = dict(gm.named_buffers())
        for name, value in list(params.items()) + list(buffers.items()):
            kind = "parameter" if name in params else "buffer"
            state_lines.append(f"({name!r}, {kind!r}, {bool(value.requires_grad)}, "
                               f"{self.tensor_literal(value.detach(), None)}),")
        for name, value in _plain_tensor_attrs(gm, set(params) | set(buffers)):
            state_lines.append(f"({name!r}, 'attribute', False, {self.tensor_literal(value, None)}),")
        placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        input_lines = []
        table = []
        for i, value in enumerate(args):
            dev = recorded_devices[i] if i < len(recorded_devices) else None
            fid = fidelity[i] if i < len(fidelity) else ("real" if isinstance(value, torch.Tensor) else "value")
            input_lines.append(f"{self.value_literal(value, dev)},")
            what = (f"{str(value.dtype).replace('torch.', '')}{list(value.shape)} on {dev or value.device}"
                    if isinstance(value, torch.Tensor) else repr(value)[:40])
            label = {"real": "real data", "absent": "GENERATED (the archive had no data: seeded random values)",
                     "value": "value"}.get(fid, fid)
            table.append(f"  {i:<3} {placeholders[i] if i < len(placeholders) else '?':<24} {what:<32} {label}")

        needs_backward = source_kind != "after_aot" and (
            (failure is not None and failure.stage == "backward")
            or any(isinstance(a, torch.Tensor) and a.requires_grad for a in args))
        header = _header(archive_name, digest, system, failure, backend, source_kind, table)
        env_to_set, _ = plan(environment, config_applied=False)
        env_lines = "".join(f"os.environ[{k!r}] = {v!r}\n" for k, v in env_to_set.items())
        settings = admitted_settings(config)
        self.imports.update(module for module, _, _ in settings)
        config_lines = "".join(f"_set_config({module}, {key!r}, {value!r})\n" for module, key, value in settings)
        installs = "".join(f"    _install(root, {path!r}, {fn})\n" for path, fn in self.installs)
        imports = "\n".join(f"import {m}" for m in sorted(self.imports - {"torch"}))
        recorded_backend = backend or "inductor"
        custom = is_custom(recorded_backend)
        return _TEMPLATE.format(
            header=header,
            env=env_lines or "# (no recorded environment variables to set)\n",
            imports=imports,
            config=config_lines or "# (no recorded config setting that differed from the defaults may be applied)\n",
            graphs="\n\n\n".join(self.graph_defs),
            installs=installs,
            root_graph=root_graph,
            state="\n".join(f"    {ln}" for ln in state_lines) or "    # (no parameters or buffers)",
            inputs="\n".join(f"        {ln}" for ln in input_lines),
            backend=repr(None if custom else recorded_backend),
            custom=repr(recorded_backend if custom else None),
            source_kind=repr(source_kind),
            accuracy=repr(bool(accuracy)),
            backward=repr(bool(needs_backward)),
        ).lstrip()


def admitted_settings(config: ConfigRecord | None) -> list[tuple[str, str, Any]]:
    """(config module, key, value) of the recorded settings that differed from the defaults and
    pass the replay filter (``context.admission``), in torch's own config modules only."""
    if config is None:
        return []
    import importlib

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


def _var(node: Any) -> str:
    """The script variable holding a node: prefixed, so no node name can shadow a module."""
    return f"v_{node.name}"


def _module_of(name: str) -> str | None:
    """The longest prefix of a qualified target name that is a module to import."""
    import types

    parts = name.split(".")
    if parts[0] in ("operator", "math", "builtins"):
        return parts[0]
    for i in range(len(parts) - 1, 0, -1):
        candidate = ".".join(parts[:i])
        if isinstance(sys.modules.get(candidate), types.ModuleType):
            return candidate
    return None


def _resolve(name: str) -> Any:
    import builtins
    import operator

    import torch

    parts = name.split(".")
    obj: Any = {"operator": operator, "math": math, "builtins": builtins, "torch": torch}[parts[0]]
    for part in parts[1:]:
        obj = getattr(obj, part, None)
    return obj


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


def _machine_specific(config: ConfigRecord | None) -> set[tuple[str, str]]:
    return {(m.module, m.key) for m in config.machine_specific} if config else set()


def _plain_tensor_attrs(gm: Any, known: set[str]):
    """Tensor attributes the graphs read with get_attr that are neither parameters nor buffers
    (constants), at their dotted paths from the root, subgraphs included."""
    import torch

    for prefix, module in gm.named_modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            path = f"{prefix}.{node.target}" if prefix else node.target
            if node.op == "get_attr" and path not in known:
                obj: Any = module
                for part in node.target.split("."):
                    obj = getattr(obj, part)
                if isinstance(obj, torch.Tensor):
                    known.add(path)
                    yield path, obj.detach()


def _header(archive_name, digest, system, failure, backend, source_kind, table) -> str:
    """The script's docstring: every line from the archive through ``_doc_text``."""
    torch_rec = (system.torch if system else None) or TorchInfo()
    lines = [
        f"Standalone reproduction exported by reproarchive from {_doc_text(archive_name or 'an archive')}",
        f"({_doc_text(digest or 'unknown digest')}).",
        "Needs only PyTorch:",
        "    python repro.py [--device DEV] [--backend NAME] [--accuracy/--no-accuracy] [--only-fwd] [--dynamo]",
        "It raises the recorded error (or AssertionError for an accuracy failure), or prints 'no failure'.",
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


_TEMPLATE = '''"""
{header}
"""
import os

# Recorded environment variables, set before torch is imported.
{env}
import argparse
import copy
import importlib
import sys
from pathlib import Path

import torch
{imports}

HERE = Path(__file__).resolve().parent
BACKEND = {backend}
CUSTOM_BACKEND = {custom}  # a compiler function the archive names: imported only if you pass it
SOURCE_KIND = {source_kind}
ACCURACY = {accuracy}
RUN_BACKWARD = {backward}


def _set_config(mod, key, value):
    """Apply one recorded setting; a setting this torch lacks is reported, not fatal."""
    target = mod
    *parents, leaf = key.split(".")
    try:
        for part in parents:
            target = getattr(target, part)
        getattr(target, leaf)
    except AttributeError:
        print(f"warning: this torch has no config setting {{mod.__name__}}.{{key}}", file=sys.stderr)
        return
    old = getattr(target, leaf)
    if isinstance(old, tuple) and isinstance(value, list):
        value = tuple(value)
    elif isinstance(old, set) and isinstance(value, list):
        value = set(value)
    setattr(target, leaf, value)


# Recorded torch config: the settings that differed from the defaults (those a replay applies).
{config}

DEVICE = None  # --device: run everything there instead of on the recorded devices


def _device(name):
    return torch.device(DEVICE or name)


{graphs}


def _install(root, path, graph):
    """Put the subgraph ``graph`` at ``path`` as a GraphModule over the state loaded there."""
    *parents, leaf = path.split(".")
    owner = root
    for part in parents:
        if not hasattr(owner, part):
            owner.add_module(part, torch.nn.Module())
        owner = getattr(owner, part)
    state = getattr(owner, leaf, None)
    owner.add_module(leaf, torch.fx.GraphModule(state if state is not None else torch.nn.Module(), graph()))


def build():
    """The recorded module: its state, each subgraph (innermost first), then the graph."""
    root = torch.nn.Module()
    load_state(root)
{installs}    return torch.fx.GraphModule(root, {root_graph}(), class_name="Repro")


def _tensor(file, nbytes, dtype, shape, stride, offset, *, device, requires_grad, leaf):
    """A tensor viewing the raw bytes in ``file`` (shared by every view of one storage)."""
    device = DEVICE or device
    storage = _STORAGES.get((file, device))
    if storage is None:
        data = bytearray((HERE / file).read_bytes()) if nbytes else bytearray()
        if len(data) != nbytes:
            sys.exit(f"{{file}}: expected {{nbytes}} bytes, found {{len(data)}}")
        raw = torch.frombuffer(data, dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
        storage = raw.to(device).untyped_storage()
        _STORAGES[(file, device)] = storage
    t = torch.empty(0, dtype=dtype, device=device).set_(storage, offset, shape, stride)
    if requires_grad:
        t.requires_grad_(True)
        if not leaf:
            t = t.clone()
    return t


_STORAGES = {{}}


def load_state(module):
    state = [
{state}
    ]
    for name, kind, requires_grad, tensor in state:
        *parents, leaf = name.split(".")
        owner = module
        for part in parents:
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        if kind == "parameter":
            owner.register_parameter(leaf, torch.nn.Parameter(tensor, requires_grad=requires_grad))
        elif kind == "buffer":
            owner.register_buffer(leaf, tensor)
        else:
            setattr(owner, leaf, tensor)


def load_inputs():
    args = [
{inputs}
    ]
    return args


def _backend(name):
    if ":" in name:
        module, _, attr = name.partition(":")
        fn = importlib.import_module(module)
        for part in attr.split("."):
            fn = getattr(fn, part)
        return fn
    return name


def _run(fn, args, backward):
    """One call (and backward). An after_aot graph runs with grad mode off, as AOTAutograd ran
    it: with grad on, inductor's out= kernels refuse inputs that require grad."""
    with torch.set_grad_enabled(SOURCE_KIND != "after_aot"):
        out = fn(*args)
    tensors = [t for t in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(t, torch.Tensor)]
    grads = []
    if backward and any(t.requires_grad for t in tensors):
        loss = sum(t.sum() / max(t.numel(), 1) for t in tensors if t.requires_grad)
        loss.backward()
        grads = [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    return list(out if isinstance(out, (list, tuple)) else [out]) + grads


def _clone(args):
    """Copies for one run. A recorded non-leaf stays a non-leaf that requires grad, as the
    original run handed it to the backend (some backends treat the two differently; torch's
    clone_inputs gives a leaf that does not); its gradient is retained."""
    from torch._dynamo.utils import clone_inputs
    out = clone_inputs(args)
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and not a.is_leaf and a.requires_grad:
            out[i] = out[i].detach().requires_grad_(True).clone()
            out[i].retain_grad()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", help="run every input on DEV instead of the recorded devices")
    parser.add_argument("--backend", default=BACKEND, help="compiler backend (default: %(default)s)")
    parser.add_argument("--accuracy", action=argparse.BooleanOptionalAction, default=ACCURACY,
                        help="compare compiled against eager (PyTorch's rule, fp64 reference)")
    parser.add_argument("--only-fwd", action="store_true", help="never run backward")
    parser.add_argument("--dynamo", action="store_true",
                        help="compile through torch.compile (re-traces with Dynamo) instead of calling the backend")
    opts = parser.parse_args()
    if opts.backend is None:
        sys.exit(f"the archive was compiled with the custom compiler function {{CUSTOM_BACKEND}}; importing its "
                 f"module would run its code. If you trust it, pass --backend {{CUSTOM_BACKEND}}")
    global DEVICE
    DEVICE = opts.device
    args = load_inputs()
    mod = build()  # the recorded graph, node for node: what the backend is handed
    backward = RUN_BACKWARD and not opts.only_fwd
    if opts.dynamo:
        compiled = torch.compile(mod, backend=_backend(opts.backend))
    elif SOURCE_KIND == "after_aot" and opts.backend == "inductor":
        from torch._inductor.compile_fx import compile_fx_inner
        from torch.fx.experimental.proxy_tensor import make_fx
        inner = compile_fx_inner(make_fx(mod)(*_clone(args)), _clone(args))
        compiled = lambda *a: inner(list(a))  # noqa: E731
    else:
        from torch._dynamo.backends.registry import lookup_backend
        fn = _backend(opts.backend)
        compiler = fn if callable(fn) else lookup_backend(fn)
        inner_fn = compiler(copy.deepcopy(mod), _clone(args))
        compiled = lambda *a: inner_fn(*a)  # noqa: E731
    result = _run(compiled, _clone(args), backward)
    if opts.accuracy:
        from torch._dynamo.debug_utils import cast_to_fp64
        from torch._dynamo.utils import same
        ref = _run(copy.deepcopy(mod), _clone(args), backward)
        try:
            m64, a64 = cast_to_fp64(copy.deepcopy(mod), _clone(args))
            a64 = [a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in a64]
            fp64 = _run(m64, a64, backward)
        except Exception as exc:
            print(f"warning: no fp64 reference ({{type(exc).__name__}})", file=sys.stderr)
            fp64 = None
        if not same(ref, result, fp64, tol=1e-3, equal_nan=True):
            for i, (r, c) in enumerate(zip(ref, result)):
                if isinstance(r, torch.Tensor) and isinstance(c, torch.Tensor) and r.shape == c.shape:
                    err = (r.double() - c.double()).abs().max().item() if r.numel() else 0.0
                    print(f"result {{i}}: max abs error {{err:.4g}}", file=sys.stderr)
            raise AssertionError("accuracy failure: the compiled result differs from eager")
    print("no failure: the graph compiled and ran" + (" and matched eager" if opts.accuracy else ""))


if __name__ == "__main__":
    main()
'''
