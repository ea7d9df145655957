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
only as ``repr`` literals or, in the header, with control characters escaped (both in
``script_literals``), so the script always compiles. It is code the user runs by choice;
reproarchive itself never execs what an archive contains.

The script replays in the recorded thread state (spec §8 ``execution``: grad and inference mode,
autocast, deterministic algorithms, default dtype, matmul precision, inference-tensor inputs)
and sets the recorded generator states (``rng``, written as raw byte files like the inputs)
right before every run, so a graph with dropout draws what the failing run drew; its accuracy
check on such a graph turns on inductor's ``fallback_random`` as ``run`` does.
"""

from __future__ import annotations

import builtins
import dataclasses
import math
import operator
import os
import sys
import types
from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from reproarchive.archive.loading import load
from reproarchive.codec.rng import random_ops
from reproarchive.codec.targets import qualified_name
from reproarchive.codec.tensors import REBUILDABLE_SUBCLASSES, storage_view
from reproarchive.compat.dispatch import INDUCTOR_PRIMS_MODULE, INDUCTOR_PRIMS_PREFIX
from reproarchive.compat.fx_meta import stack_trace_of
from reproarchive.compat.tensor_internals import is_traceable_wrapper_subclass
from reproarchive.context.environment import plan as environment_plan
from reproarchive.errors import ExportError
from reproarchive.format.atomic import atomic_dir
from reproarchive.format.plain import PlainRecord
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import DerivedValue, Records, TensorValue
from reproarchive.replay.accuracy import DEFAULT_TOLERANCE
from reproarchive.replay.backends import is_custom
from reproarchive.replay.faithfulness import before_replay
from reproarchive.replay.settings import ReplaySettings
from reproarchive.standalone.script_literals import (
    _doc_text,
    _execution_literal,
    _header,
    _shape_literals,
    admitted_settings,
)
from reproarchive.standalone.shared_blocks import failure_literal, loading_block, state_block


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
    itself when it runs (its ``--device``). ``exporting.export`` brings the user's
    ``--import``/``--load-library`` before calling it (and sends a multi-rank job archive to
    ``job_script`` instead); the script brings them too.
    """

    settings = ReplaySettings.given(settings, options)
    with ContainerReader(path) as reader:
        if reader.index.triton_kernels:  # (1.4) a script would have to define them: from the archive's text
            raise ExportError(
                f"the graph launches user Triton kernels ({', '.join(k.name for k in reader.index.triton_kernels)}), "
                "which a standalone script cannot define without running the archive's source",
                "replay it with `reproarchive run` (stand-ins, or --import MODULE for the real kernels)")
        repro = load(path, device="cpu", remap_graph=False, max_memory=settings.max_memory, reader=reader)
    # not ``settings.for_recorded``: a script may name a recorded custom compiler function for
    # its reader to supply (``run`` never imports one on an archive's say-so)
    return write_export(repro.gm, list(repro.args), out_dir, repro.records, ScriptPlan(
        backend=settings.backend, accuracy=settings.accuracy, fidelity=tuple(repro.fidelity or ()),
        recorded_devices=tuple(_recorded_devices(repro)), archive_name=Path(path).name, digest=repro.digest,
        custom_ops=repro.custom_ops, brought=(settings.imports, settings.libraries), rng_states=repro.rng_states or {},
        derived={i: (r.kind, r.input, r.dim) for i, r in enumerate(repro.index.inputs) if isinstance(r, DerivedValue)},
    ))


def _recorded_devices(repro: Any) -> list[str | None]:
    """The device each input was recorded on, from the index (the loaded args are on CPU)."""
    index = repro.index
    return [index.storages[rec.storage].device if isinstance(rec, TensorValue) else None for rec in index.inputs]


@dataclasses.dataclass(frozen=True)
class ScriptPlan:
    """What a script is written from besides the archive's records: the reader's choices
    (``backend``, ``accuracy``: None keeps the recorded one) and what loading the archive found
    (each input's fidelity and recorded device, its generator states, its derived sizes:
    input -> (``size`` or ``stride``, input, dimension), spec §6.3 ``DerivedValue``)."""

    backend: str | None = None
    accuracy: bool | None = None
    fidelity: tuple[str, ...] = ()
    recorded_devices: tuple[str | None, ...] = ()
    archive_name: str = ""
    digest: str | None = None
    custom_ops: Any = ()
    brought: tuple = ((), ())  # (--import modules, --load-library paths)
    rng_states: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    derived: Mapping[int, tuple[str, int, int]] = dataclasses.field(default_factory=dict)


def write_export(gm: Any, args: list[Any], out_dir: str | os.PathLike, records: Records,
                 plan: ScriptPlan = ScriptPlan()) -> ExportReport:
    """Write ``out_dir`` with the script that replays ``gm`` on ``args`` as ``records`` say."""
    out = Path(out_dir)
    with atomic_dir(out) as tmp:
        writer = _DataWriter(tmp)
        script = _Script(writer).build(gm, args, records, plan)
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

    def graph_function(self, gm: Any, path: str, label: str | None = None) -> str:
        """``def _graph_N()`` that builds ``gm``'s graph with ``create_node``: the same nodes,
        names, targets and constants the archive records (no tracing); each subgraph gets its
        own, installed at its module ``path`` (``installs``). ``label`` names it in its docstring."""

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
                 f'    """{_doc_text(label or path or "The recorded graph")}, node for node. As FX prints it:',
                 "",
                 *(f"    {_doc_text(ln)}" if ln.strip() else "" for ln in readable.splitlines()),
                 '    """',
                 "    g = torch.fx.Graph()"]
        stacks: dict[str, int] = {}  # each distinct stack once, as the archive keeps them (spec §7.1)
        for node in gm.graph.nodes:
            target = self.target(node)
            args = self.arg(tuple(node.args))
            kwargs = self.arg(dict(node.kwargs))
            lines.append(f"    {_var(node)} = g.create_node({node.op!r}, {target}, {args}, {kwargs}, "
                         f"name={node.name!r})")
            if text := stack_trace_of(node):  # the model line it came from, as Dynamo gave it
                lines.append(f"    {_var(node)}.meta['stack_trace'] = stacks[{stacks.setdefault(text, len(stacks))}]")
        if stacks:
            lines.insert(lines.index("    g = torch.fx.Graph()"),
                         "    stacks = (" + "".join(f"{text!r}, " for text in stacks) + ")")
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
        if name.startswith(INDUCTOR_PRIMS_PREFIX):  # registered by the module that defines them
            self.imports.add(INDUCTOR_PRIMS_MODULE)
        return name

    def arg(self, a: Any) -> str:
        """A graph argument as a Python literal (nodes as the variables holding them)."""

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

    def subclass_literal(self, t: Any, device: str | None) -> str:
        """``_subclass(...)``: a tensor subclass the loader rebuilt (a nested jagged tensor),
        as its inner tensors, plain-data context and outer geometry; the script finds the class
        in its own table (``SUBCLASSES``, written from ``REBUILDABLE_SUBCLASSES``)."""

        key = f"{type(t).__module__}.{type(t).__qualname__}"
        if key not in REBUILDABLE_SUBCLASSES:
            raise ExportError(f"input of type {type(t).__name__} cannot be exported",
                              "replay it with `reproarchive run`")
        attrs, context = t.__tensor_flatten__()
        inner = ", ".join(f"{a!r}: {self.value_literal(getattr(t, a), device)}" for a in attrs)
        concrete = not any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride()))  # j1: the class works it out
        size, stride = (tuple(t.shape), tuple(t.stride())) if concrete else (None, None)
        return (f"_subclass({key!r}, {{{inner}}}, {context!r}, {size!r}, {stride!r}, "
                f"requires_grad={bool(t.requires_grad)})")

    def value_literal(self, value: Any, device: str | None) -> str:
        if isinstance(value, torch.Tensor) and is_traceable_wrapper_subclass(value):
            return self.subclass_literal(value, device)
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

    def custom_ops_block(self, ops, *, imports, libraries) -> str:
        """``_custom_ops()``: the user's own implementations (``export --import`` /
        ``--load-library``), then a stand-in for each recorded op still missing."""
        if not ops and not imports and not libraries:
            return "def _custom_ops():\n    pass  # the graph calls no custom op\n"
        bring = [f"    importlib.import_module({m!r})" for m in imports]
        bring += [f"    torch.ops.load_library({p!r})" for p in libraries]
        stand_ins = []
        for op in ops:
            calls = ", ".join(f"({list(c.arguments)!r}, [{', '.join(self.value_literal(v, None) for v in c.outputs)}])"
                              for c in op.calls)
            stand_ins.append(f"    _stand_in({op.name!r}, {op.record.schema!r}, [{calls}])")
        block = Path(__file__).with_name("stand_in_block.py.template").read_text(encoding="utf-8")
        return block.format(names=", ".join(op.name for op in ops) or "none recorded",
                            bring="\n".join(bring) or "    pass", stand_ins="\n".join(stand_ins))

    def _state_lines(self, gm) -> list[str]:
        """The module state as literals: the graph reads it by name, as the recorded module did."""
        state_lines = []
        params = dict(gm.named_parameters())
        buffers = dict(gm.named_buffers())
        for name, value in list(params.items()) + list(buffers.items()):
            kind = "parameter" if name in params else "buffer"
            state_lines.append(f"({name!r}, {kind!r}, {bool(value.requires_grad)}, "
                               f"{self.tensor_literal(value.detach(), None)}),")
        for name, value in _plain_tensor_attrs(gm, set(params) | set(buffers)):
            state_lines.append(f"({name!r}, 'attribute', False, {self.tensor_literal(value, None)}),")
        return state_lines

    def _input_lines(self, gm, args, fidelity, recorded_devices, derived) -> tuple[list[str], list[str]]:
        """(the inputs as literals, the header's table of them): the table says which are real data."""

        placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        input_lines = []
        table = []
        for i, value in enumerate(args):
            dev = recorded_devices[i] if i < len(recorded_devices) else None
            fid = fidelity[i] if i < len(fidelity) else ("real" if isinstance(value, torch.Tensor) else "value")
            if i in derived:  # computed from the rebuilt input by load_inputs, never a literal
                kind, k, d = derived[i]
                input_lines.append(f"None,  # the {kind} of input {k} at dimension {d}, computed below")
                fid = f"the {kind} of input {k} at dimension {d}"
            else:
                input_lines.append(f"{self.value_literal(value, dev)},")
            what = (f"{str(value.dtype).replace('torch.', '')}{list(value.shape)} on {dev or value.device}"
                    if isinstance(value, torch.Tensor) else repr(value)[:40])
            label = {"real": "real data", "absent": "GENERATED (the archive had no data: seeded random values)",
                     "value": "value"}.get(fid, fid)
            table.append(f"  {i:<3} {placeholders[i] if i < len(placeholders) else '?':<24} {what:<32} {label}")
        return input_lines, table

    def build(self, gm: Any, args: list[Any], records: Records, plan: ScriptPlan) -> str:
        backend = plan.backend or records.backend
        accuracy = bool(records.accuracy) if plan.accuracy is None else plan.accuracy
        source_kind, failure, execution, derived = records.graph_kind, records.failure, records.execution, plan.derived
        root_graph = self.graph_function(gm, "")
        state_lines = self._state_lines(gm)
        input_lines, table = self._input_lines(gm, args, list(plan.fidelity), list(plan.recorded_devices), derived)

        needs_backward = source_kind != "after_aot" and (
            (failure is not None and failure.stage == "backward")
            or any(isinstance(a, torch.Tensor) and a.requires_grad for a in args))
        header = _header(plan.archive_name, plan.digest, records.system, failure, backend, source_kind, table)
        env_to_set, _ = environment_plan(records.environment, config_applied=False)
        env_lines = "".join(f"os.environ[{k!r}] = {v!r}\n" for k, v in env_to_set.items())
        settings = admitted_settings(records.config)
        self.imports.update(module for module, _, _ in settings)
        config_lines = "".join(f"_set_config({module}, {key!r}, {value!r})\n" for module, key, value in settings)
        installs = "".join(f"    _install(root, {path!r}, {fn})\n" for path, fn in self.installs)
        imports = "\n".join(f"import {m}" for m in sorted(self.imports - {"torch"}))
        recorded_backend = backend or "inductor"
        custom = is_custom(recorded_backend)
        return _template().format(
            custom_ops=self.custom_ops_block(plan.custom_ops, imports=plan.brought[0], libraries=plan.brought[1]),
            header=header,
            env=env_lines or "# (no recorded environment variables to set)\n",
            imports=imports,
            config=config_lines or "# (no recorded config setting that differed from the defaults may be applied)\n",
            graphs="\n\n\n".join(self.graph_defs),
            installs=installs,
            root_graph=root_graph,
            state="\n".join(f"    {ln}" for ln in state_lines) or "    # (no parameters or buffers)",
            inputs="\n".join(f"        {ln}" for ln in input_lines),
            derived=repr([(i, kind, k, d) for i, (kind, k, d) in sorted(derived.items())]),
            subclasses=repr(dict(sorted(REBUILDABLE_SUBCLASSES.items()))),
            backend=repr(None if custom else recorded_backend),
            custom=repr(recorded_backend if custom else None),
            source_kind=repr(source_kind),
            accuracy=repr(bool(accuracy)),
            recorded_stage=repr(failure.stage if failure is not None else None),
            recorded_failure=repr(failure_literal(failure)),
            not_as_recorded=repr(before_replay(gm, args, list(plan.fidelity), records, plan.rng_states)),
            backward=repr(bool(needs_backward)),
            tolerance=repr(DEFAULT_TOLERANCE),
            **_shape_literals(records.shapes, records.parent is not None),
            execution=repr(_execution_literal(execution)),
            inference_inputs=repr(list(execution.inference_inputs or ()) if execution is not None else []),
            random_ops=repr(list(random_ops(gm))),
            rng_states=repr({name: self.writer.storage(state)[0] for name, state in plan.rng_states.items()}),
            state_block=state_block(),
            loading_block=loading_block(),
        ).lstrip()


def _var(node: Any) -> str:
    """The script variable holding a node: prefixed, so no node name can shadow a module."""
    return f"v_{node.name}"


def _module_of(name: str) -> str | None:
    """The longest prefix of a qualified target name that is a module to import."""

    parts = name.split(".")
    if parts[0] in ("operator", "math", "builtins"):
        return parts[0]
    for i in range(len(parts) - 1, 0, -1):
        candidate = ".".join(parts[:i])
        if isinstance(sys.modules.get(candidate), types.ModuleType):
            return candidate
    return None


def _resolve(name: str) -> Any:
    parts = name.split(".")
    obj: Any = {"operator": operator, "math": math, "builtins": builtins, "torch": torch}[parts[0]]
    for part in parts[1:]:
        obj = getattr(obj, part, None)
    return obj


def _plain_tensor_attrs(gm: Any, known: set[str]):
    """Tensor attributes the graphs read with get_attr that are neither parameters nor buffers
    (constants), at their dotted paths from the root, subgraphs included."""

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


def _template() -> str:
    """The program ``repro.py`` is, with ``{name}`` slots (``str.format``: its own braces are
    doubled). Shipped as package data, not a string in this module, so it reads as the program
    it is."""

    return files("reproarchive.standalone").joinpath("repro.py.template").read_text(encoding="utf-8")
