"""The half of ``pack_dump`` that runs inside a child process: execute the dump, read it, pack it.

A PyTorch repro script sets environment variables and torch config at import time and may
install Triton kernels or fake process groups; running it in the caller would change the
caller's torch for good. So ``reproarchive.sources.dump_import`` runs this module in a child
process (through ``reproarchive.child``), where it:

1. executes the script's module-level code (never its ``__main__`` block) *before* importing
   torch, so import-time environment variables take effect as they did in the failing process;
2. runs the dump's own ``load_args`` with a reader that records, per storage, whether PyTorch
   saved data for it, and refuses to invent data: inputs without data become AbsentTensor;
3. traces ``Repro`` into a GraphModule whose placeholders match ``load_args`` one to one, and
   lifts module state that PyTorch replaced by ``torch.randn`` into inputs marked absent;
4. takes the config / environment / system snapshots here, where the dump's settings apply;
5. replays the failure once the way the dump's ``run_repro`` would detect it;
6. calls ``reproarchive.pack`` itself, so nothing is pickled across the process boundary, and
   writes a small JSON report for the parent.

Progress events go to the parent as they happen; everything else the dump or torch prints goes
to a log the parent keeps for --debug.
"""

from __future__ import annotations

import argparse
import builtins
import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reproarchive.child import child_main
from reproarchive.errors import NotReplayableError, PackError, ReproArchiveError, SourceError
from reproarchive.format.schema import FailureRecord, from_plain, to_plain
from reproarchive.sources.dump_script import DumpScript, parse_dump_script, symbolic_shapes

# PyTorch inlines buffers with at most this many elements as printed literals
# (torch._dynamo.debug_utils.MAX_CONSTANT_NUMEL_INLINE); larger ones become torch.randn.
_INLINE_NUMEL = 4
# Module state that is not the model's and becomes an input marked absent: what PyTorch wrote
# as torch.randn or constructor defaults, and constants a TORCH_TRACE log does not hold.
LIFTED_ORIGINS = ("random", "defaults", "not_logged")


# --------------------------------------------------------------------------------------------
# The reader
# --------------------------------------------------------------------------------------------


class _Storage:
    """One ``reader.storage(...)`` call: where its data is, or why there is none."""

    def __init__(self, index: int, digest: str | None, nbytes: int, device: Any, dtype_hint: Any):
        self.name = f"buf{index}"
        self.digest = digest
        self.nbytes = nbytes
        self.device = device
        self.dtype_hint = dtype_hint
        self.status = "no_data"  # real | no_data | missing | no_store | unreadable
        self.error: str | None = None
        self.data = None  # torch.UntypedStorage when real
        self.loaded_on: str | None = None

    @property
    def file(self) -> str | None:
        return f"storages/{self.digest}" if self.digest else None


class _GuardedArgs(list):
    """``reader.args`` as the dump's own fix-up code sees it.

    after_aot scripts rewrite ``reader.args[i]`` in place (the repeat_interleave fix-up, meant for
    random data); handing out clones keeps the real data we load bit-exact.
    """

    def __getitem__(self, index):  # type: ignore[override]
        import torch

        value = super().__getitem__(index)
        return value.clone() if isinstance(value, torch.Tensor) else value


class RecordingReader:
    """A drop-in for ``torch._dynamo.debug_utils.InputReader`` that never makes data up.

    Same call signatures (load_args format version 0). A storage whose data file exists is
    loaded (``torch.load(weights_only=True)``, the dump's own content store); any other storage
    yields inputs described as ``AbsentTensor``. ``inputs`` holds one entry per load_args input
    with what we know about it, for the report.
    """

    def __init__(self, store_dir: Path | None):
        self.store_dir = store_dir
        self.storages: list[_Storage] = []
        self.inputs: list[dict[str, Any]] = []
        self._args: list[Any] = []

    @property
    def args(self) -> list[Any]:
        return _GuardedArgs(self._args)

    # -- the load_args DSL ------------------------------------------------------------------

    def storage(self, storage_hash, nbytes, *, device=None, dtype_hint=None):
        import torch

        device = torch.device(device) if device is not None else torch.device("cpu")
        dtype_hint = dtype_hint if dtype_hint is not None else torch.float32
        rec = _Storage(len(self.storages), storage_hash, int(nbytes), device, dtype_hint)
        self.storages.append(rec)
        if storage_hash is None:
            rec.status = "no_data"
        elif self.store_dir is None:
            rec.status = "no_store"
        else:
            path = self.store_dir / "storages" / storage_hash
            if not path.is_file():
                rec.status = "missing"
            else:
                from reproarchive.codec.devices import is_available

                target = device if is_available(str(device)) else torch.device("cpu")
                try:
                    loaded = torch.load(path, weights_only=True, map_location=target)
                    data = getattr(loaded, "_untyped_storage", loaded)
                    if not isinstance(data, torch.UntypedStorage):
                        raise TypeError(f"holds a {type(loaded).__name__}, not a storage")
                except Exception as err:  # a damaged file is reported, not fatal
                    rec.status = "unreadable"
                    rec.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                else:
                    rec.status = "real"
                    rec.data = data
                    rec.loaded_on = str(data.device)
        return rec

    def tensor(self, storage, shape, stride=None, *, storage_offset=None, dtype=None,
               requires_grad=None, is_leaf=None, **metadata):
        import torch

        from reproarchive.codec.tensors import AbsentTensor

        shape = tuple(int(s) for s in shape)
        stride = tuple(int(s) for s in stride) if stride is not None else AbsentTensor(shape, dtype).contiguous_stride()
        storage_offset = int(storage_offset or 0)
        dtype = dtype if dtype is not None else torch.float32
        requires_grad = bool(requires_grad)
        is_leaf = bool(is_leaf) if is_leaf is not None else False
        info = {"kind": "tensor", "storage": storage.name, "file": storage.file,
                "data": storage.status, "dtype": str(dtype).replace("torch.", ""),
                "shape": list(shape), "device": str(storage.device)}
        if storage.status == "real":
            t = _tensor_on(storage.data, shape, stride, storage_offset, dtype, requires_grad,
                           is_leaf, metadata)
            value: Any = t
        else:
            value = AbsentTensor(shape, dtype, stride=stride, storage_offset=storage_offset,
                                 device=str(storage.device), requires_grad=requires_grad)
        self._args.append(value)
        self.inputs.append(info)
        return value

    def symint(self, val, *, expr=None):
        self._args.append(val)
        self.inputs.append({"kind": "symint", "hint": val, "expr": expr})
        return val

    def const(self, name):
        self._args.append(None)
        self.inputs.append({"kind": "const", "note": "filtered out during compilation"})

    def unsupported(self, name):
        self._args.append(None)
        self.inputs.append({"kind": "unsupported",
                            "note": "PyTorch could not save this input (e.g. a tensor subclass); it is None"})

    def generator(self, device_type, device_index):
        self._args.append(None)
        self.inputs.append({"kind": "generator", "device": f"{device_type}:{device_index}",
                            "note": "a torch.Generator input; stored as None"})

    def opaque(self, script_class_name):
        self._args.append(None)
        self.inputs.append({"kind": "opaque", "note": f"opaque object {script_class_name}; stored as None"})


def _tensor_on(storage, shape, stride, storage_offset, dtype, requires_grad, is_leaf, metadata):
    """Exactly what InputReader.tensor does, including its fake autograd history for non-leaves."""
    import torch

    t = torch.tensor([], dtype=dtype, device=storage.device, requires_grad=requires_grad)
    with torch.no_grad():
        t.set_(storage, storage_offset, shape, stride)
    if not is_leaf:
        with torch.enable_grad():
            t = t.clone(memory_format=torch.preserve_format)
        with torch.no_grad():
            t.set_(storage, storage_offset, shape, stride)
    torch._utils.set_tensor_metadata(t, metadata)
    return t


# --------------------------------------------------------------------------------------------
# The graph
# --------------------------------------------------------------------------------------------


def _module_state_origin(mod) -> dict[str, str]:
    """For every parameter/buffer of the dump's ``Repro``: "random", "defaults" or "printed".

    This mirrors torch._dynamo.debug_utils.NNModuleToString: top-level parameters and buffers
    above 4 elements are written as ``torch.randn``/``torch.randint`` (random); submodules are
    written as constructor calls (their state is the constructor's initialisation, not the
    model's); buffers of at most 4 elements are printed literals (real values, but floats are
    rounded to the printed precision).
    """
    origin: dict[str, str] = {}
    for name, _ in mod.named_parameters():
        origin[name] = "random" if "." not in name else "defaults"
    for name, buf in mod.named_buffers():
        if "." in name:
            origin[name] = "defaults"
        elif buf.numel() <= _INLINE_NUMEL:
            origin[name] = "printed" if buf.is_floating_point() or buf.is_complex() else "real"
        else:
            origin[name] = "random"
    return origin


def trace_repro(mod) -> tuple[Any, list[str]]:
    """GraphModule for ``Repro``: its forward, one placeholder per load_args input.

    ``Repro.forward`` is the FX code of the graph PyTorch dumped, so re-tracing it symbolically
    gives back that graph with the same targets (torch-level for after_dynamo, ATen for
    after_aot), without running it and without needing input data. Submodules are inlined so
    their state becomes get_attr nodes that can be lifted; when a submodule cannot be traced
    through (data-dependent checks in its forward), it is kept as a call_module.
    """
    import torch.fx as fx

    notes: list[str] = []

    class _Inline(fx.Tracer):
        proxy_buffer_attributes = True

        def is_leaf_module(self, m, qualname):
            return False

    class _Leaf(fx.Tracer):
        proxy_buffer_attributes = True

    try:
        graph = _Inline().trace(mod)
    except Exception as err:
        notes.append(f"submodules kept as calls (inlining failed: {type(err).__name__})")
        graph = _Leaf().trace(mod)
    gm = fx.GraphModule(mod, graph, class_name="Repro")
    for node in gm.graph.nodes:
        node.meta.pop("stack_trace", None)
        if node.op == "placeholder":
            node.type = None  # Repro's annotations (torch.nn.parameter.Parameter) carry nothing
    gm.recompile()
    return gm, notes


def lift_state(gm, origin: dict[str, str], example_inputs: list[Any]) -> tuple[Any, list[Any], list[dict]]:
    """Turn get_attr nodes of state PyTorch did not save into leading inputs marked absent.

    The archive stores module state as real data; storing ``torch.randn`` output there would
    present random numbers as the model's weights. As inputs with fidelity "absent" they are
    generated at load time with a loud warning instead, which is the truth.
    """
    import torch
    import torch.fx as fx

    from reproarchive.codec.tensors import AbsentTensor

    lifted: list[dict] = []
    new_inputs: list[Any] = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    anchor = placeholders[0] if placeholders else next(iter(gm.graph.nodes))
    by_target: dict[str, fx.Node] = {}
    for node in list(gm.graph.nodes):
        if node.op != "get_attr" or origin.get(node.target) not in LIFTED_ORIGINS:
            continue
        value = _resolve_attr(gm, node.target)
        if not isinstance(value, torch.Tensor):
            continue
        if node.target not in by_target:
            name = "state_" + node.target.replace(".", "_")
            with gm.graph.inserting_before(anchor):
                ph = gm.graph.placeholder(name)
            by_target[node.target] = ph
            new_inputs.append(AbsentTensor(tuple(value.shape), value.dtype, stride=tuple(value.stride()),
                                           storage_offset=0, device=str(value.device),
                                           requires_grad=bool(value.requires_grad)))
            lifted.append({"attribute": node.target, "placeholder": ph.name,
                           "origin": origin[node.target]})
        node.replace_all_uses_with(by_target[node.target])
        gm.graph.erase_node(node)
    if not lifted:
        return gm, example_inputs, lifted
    gm.graph.lint()
    new_gm = fx.GraphModule(gm, gm.graph, class_name="Repro")
    return new_gm, new_inputs + list(example_inputs), lifted


def _resolve_attr(root, target: str):
    obj = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def graph_summary(gm) -> dict[str, Any]:
    """Size and op kinds of the graph as the archive will store it (one way of counting ops)."""
    from reproarchive.codec.graphs import encode_graph
    from reproarchive.codec.tensors import StorageTable

    record = encode_graph(gm, StorageTable())
    histogram = record.op_histogram()
    node_ops: dict[str, int] = {}
    for node in record.nodes:
        node_ops[node.op] = node_ops.get(node.op, 0) + 1
    return {"nodes": len(record.nodes), "compute_nodes": record.op_count(), "op_kinds": len(histogram),
            "node_ops": node_ops, "targets": dict(list(histogram.items())[:20])}


# --------------------------------------------------------------------------------------------
# Replay: once, the way the dump's run_repro detects the failure
# --------------------------------------------------------------------------------------------


def _concrete(args: list[Any]) -> tuple[list[Any], int]:
    """Inputs to replay with: real ones as loaded, absent ones generated by the one path
    ``reproarchive.load`` takes (``build_storages``, same storage numbering as ``pack``), so the
    failure recorded here is the one a later ``run`` sees."""
    import torch

    from reproarchive.codec.devices import is_available
    from reproarchive.codec.tensors import (
        AbsentTensor,
        StorageTable,
        ValueDecoder,
        build_storages,
        encode_value,
        storage_dtypes,
    )
    from reproarchive.format.schema import iter_tensors

    table = StorageTable()
    records = [encode_value(a, table) for a in args]
    devices = [torch.device(r.device if is_available(r.device) else "cpu") for r in table.records]
    absent = [i for i, r in enumerate(table.records) if not r.is_real]
    dtypes = storage_dtypes(t for r in records for t in iter_tensors(r))
    decoder = ValueDecoder(build_storages(table.records, absent, devices, dtypes, real=None), devices)
    out = [decoder.decode(r) if isinstance(a, AbsentTensor) else a for a, r in zip(args, records)]
    return out, sum(isinstance(a, AbsentTensor) for a in args)


def replay(dump: DumpScript, gm, args: list[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(failure record, replay notes) for a dump: ``replay_once`` the way its ``run_repro`` would
    detect the failure (its autocast flag, Dynamo's repro_forward_only)."""
    from torch._dynamo import config as dynamo_config

    return replay_once(gm, args, kind=dump.kind, backend=dump.backend, accuracy=bool(dump.accuracy_mode),
                       autocast=bool(dump.run_args.get("autocast", False)),
                       only_fwd=None if dump.kind == "after_aot" else bool(dynamo_config.repro_forward_only))


def replay_once(gm, args: list[Any], *, kind: str, backend: str | None, accuracy: bool, autocast: bool = False,
                only_fwd: bool | None = None, config=None, environment=None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(failure record, replay notes). Never raises for a failure of the graph itself.

    Uses ``reproarchive.replay.replay_graph`` (the code behind ``reproarchive run``) on inputs
    generated exactly as ``load`` will generate absent ones, so that the recorded signature is
    classified exactly as a later replay will classify it; ``kind`` "after_aot" graphs are
    retraced with make_fx and compiled by Inductor's inner compiler, as PyTorch's after_aot
    ``run_repro`` does. ``config``/``environment`` are records applied for the duration, as
    ``run`` applies an archive's.
    """
    from reproarchive.context import failure as fail

    inputs, generated = _concrete(args)
    notes: dict[str, Any] = {"performed": True, "generated_inputs": generated}
    if backend is None:
        notes["performed"] = False
        return fail.unknown_record(
            "no backend is known (a custom compiler function was used); not replayed"), notes
    try:
        return _replay_shared(gm, inputs, kind=kind, backend=backend, accuracy=accuracy, autocast=autocast,
                              only_fwd=only_fwd, config=config, environment=environment), notes
    except NotReplayableError as err:
        notes["performed"] = False
        return fail.unknown_record(str(err), backend=backend), notes


def _replay_shared(gm, inputs, *, kind, backend, accuracy, autocast, only_fwd, config, environment):
    import contextlib

    import torch

    from reproarchive.replay.runner import replay_graph

    with contextlib.ExitStack() as stack:
        if kind == "after_aot":
            # replay_graph retraces after_aot graphs for inductor itself, exactly as `run` does
            stack.enter_context(torch.no_grad())
            only_fwd = True
        else:
            device_type = next((a.device.type for a in inputs if isinstance(a, torch.Tensor)
                                and a.device.type != "cpu"), "cpu")
            stack.enter_context(torch.amp.autocast(device_type, enabled=autocast))
        try:
            outcome = replay_graph(gm, inputs, backend=backend, accuracy=accuracy, only_fwd=bool(only_fwd),
                                   source_kind=kind, config=config, environment=environment,
                                   report_differences=False)
        except ReproArchiveError as err:
            raise NotReplayableError(f"cannot replay here: {err}; not replayed")
    observed = outcome.observed
    if observed is None:
        return _passed(backend)
    if observed.backend == "eager":
        raise NotReplayableError(f"the graph fails in eager mode too ({observed.exception_type}: "
                             f"{_first_line(observed.message)}); not replayed")
    return observed


def _passed(backend) -> dict[str, Any]:
    from reproarchive.context import failure as fail

    return fail.unknown_record(
        "it did not fail when replayed here (flaky, device- or data-dependent failure?)",
        backend=backend)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else ""


# --------------------------------------------------------------------------------------------
# Path scrubbing
# --------------------------------------------------------------------------------------------


class Scrubber:
    """Replace the packing machine's paths in every string that goes into the archive.

    A thin layer over ``snapshot.redact_paths`` (component-boundary matching, symlink-resolved
    spellings, home as ``~``) with the prefixes only the dump import knows: the dump's folder and
    content store, the user's cwd, the child's scratch cwd, and the install locations that show
    up in tracebacks and compiler command lines (inductor's cache, site-packages, Python).
    """

    def __init__(self, prefixes: dict[str, str]):
        self.prefixes = {os.path.normpath(p): label for p, label in prefixes.items()
                         if p and os.path.normpath(p) != "/"}

    def without(self, *labels: str) -> "Scrubber":
        return Scrubber({p: l for p, l in self.prefixes.items() if l not in labels})

    def text(self, s: str) -> str:
        from reproarchive.context.redaction import redact_paths

        return redact_paths(s, self.prefixes)

    def __call__(self, obj: Any) -> Any:
        if dataclasses.is_dataclass(obj):  # a record: scrub its plain form
            return from_plain(type(obj), self(to_plain(obj)))
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {self(k) if isinstance(k, str) else k: self(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self(v) for v in obj)
        return obj


def _scrub_prefixes(opts: argparse.Namespace, store: Path | None) -> dict[str, str]:
    prefixes: dict[str, str] = {}
    for path in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        prefixes[path] = "<python>"
    try:
        import torch

        prefixes[str(Path(torch.__file__).resolve().parent.parent)] = "<site-packages>"
    except ImportError:
        pass
    prefixes[str(Path(__file__).resolve().parent.parent)] = "<reproarchive>"
    for label, path in (("<inductor-cache>", _inductor_cache_dir()),
                        ("<triton-cache>", os.environ.get("TRITON_CACHE_DIR"))):
        if path:
            prefixes[path] = label
    prefixes[os.getcwd()] = "<tmp>"
    for path in opts.cwd_prefix:
        prefixes[path] = "<cwd>"
    for path in opts.dump_prefix:
        prefixes[path] = "<dump>"
    if store is not None:
        prefixes[str(store)] = "<dump>/checkpoints"
    return prefixes


def _inductor_cache_dir() -> str | None:
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return cache_dir()
    except Exception:
        return os.environ.get("TORCHINDUCTOR_CACHE_DIR")


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def _exec_module_code(script: Path) -> dict[str, Any]:
    """Run the script body as a module that is not __main__: defines Repro, mod, load_args."""
    source = script.read_text(encoding="utf-8", errors="replace")
    code = compile(source, str(script), "exec")
    namespace: dict[str, Any] = {"__name__": "__reproarchive_dump__", "__file__": str(script),
                                 "__builtins__": builtins}
    exec(code, namespace)  # noqa: S102 - the user's own repro script, in a throwaway process
    return namespace


def _store_dir(dump: DumpScript) -> tuple[Path | None, str]:
    """The content store: the recorded save_dir, else checkpoints/ next to the script."""
    if dump.save_dir and Path(dump.save_dir).is_dir():
        return Path(dump.save_dir), "recorded save_dir"
    beside = dump.path.parent / "checkpoints"
    if (beside / "storages").is_dir():
        return beside, "checkpoints/ beside the script (the recorded save_dir is gone)"
    if dump.save_dir is None:
        return None, "the dump records no save_dir (written without data)"
    return None, "the recorded save_dir does not exist and no checkpoints/ is beside the script"


def _dump_comments(script: Path) -> dict[str, str]:
    """The version comments after_aot writes (``# torch version: ...``)."""
    out = {}
    for line in script.read_text(encoding="utf-8", errors="replace").splitlines()[:400]:
        for key, label in (("# torch version:", "torch_version"),
                           ("# torch cuda version:", "torch_cuda_version"),
                           ("# torch git version:", "torch_git_version")):
            if line.startswith(key):
                out[label] = line[len(key):].strip()
    return out


@dataclass
class ImportedScript:
    """A repro script's graph and inputs, as ``import_script`` read them in this process."""

    dump: DumpScript
    mod: Any
    reader: RecordingReader
    gm: Any
    example_inputs: list[Any]
    lifted: list[dict[str, Any]]
    origin: dict[str, str]
    notes: list[str]
    load_args: Any

    @property
    def load_args_version(self) -> Any:
        return getattr(self.load_args, "_version", None)


def import_script(script: Path, store: Path | None, events) -> ImportedScript:
    """Execute a PyTorch repro script's module code here, read its inputs, trace its graph.

    The script is a repro in PyTorch's after_dynamo/after_aot shape (a dump, or the
    ``fx_graph_runnable`` of a TORCH_TRACE log); its config and environment lines take effect in
    this process, which is why this only ever runs in a child process.
    """
    dump = parse_dump_script(script)
    events("running the script's module code")
    try:
        namespace = _exec_module_code(script)
    except Exception as err:
        raise SourceError(
            f"running the module code of {script.name} failed: {type(err).__name__}: {_first_line(err)}",
            "it may need a package or GPU this machine lacks; see --debug for the log")
    import torch

    mod = namespace.get("mod")
    if not isinstance(mod, torch.nn.Module):
        mod = namespace["Repro"]()
    load_args = namespace["load_args"]

    events("loading inputs")
    reader = RecordingReader(store)
    with torch.no_grad():
        load_args(reader)
    args = list(reader._args)

    events("tracing the graph")
    gm, trace_notes = trace_repro(mod)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(args):
        raise PackError(
            f"{script.name}: Repro.forward takes {len(placeholders)} inputs but load_args gives {len(args)}",
            "the script was edited or is from an incompatible PyTorch version")
    symbolic = symbolic_shapes(script)
    for i, (node, info) in enumerate(zip(placeholders, reader.inputs)):
        info["placeholder"] = str(node.target)
        if i < len(symbolic) and symbolic[i]["call"] == "tensor" and symbolic[i]["shape"] is not None:
            if any(isinstance(d, str) for d in symbolic[i]["shape"]):
                info["symbolic_shape"] = symbolic[i]["shape"]
    origin = _module_state_origin(mod)
    gm, example_inputs, lifted = lift_state(gm, origin, args)
    return ImportedScript(dump=dump, mod=mod, reader=reader, gm=gm, example_inputs=example_inputs,
                          lifted=lifted, origin=origin, notes=trace_notes, load_args=load_args)


def input_report(imp: ImportedScript, *, data_expected: bool = True) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(the inputs summary for the report, the storages record for ``source``, warnings).
    ``data_expected=False`` for scripts written without data by design (no warning for that)."""
    import torch

    from reproarchive.codec.tensors import AbsentTensor

    reader, example_inputs = imp.reader, imp.example_inputs
    missing = [s.file for s in reader.storages if s.status in ("missing", "no_store") and s.file]
    unreadable = [f"{s.file} ({s.error})" for s in reader.storages if s.status == "unreadable"]
    no_data = sum(1 for s in reader.storages if s.status == "no_data")
    warnings: list[str] = []
    if missing:
        warnings.append(f"{len(missing)} storage file(s) named by load_args are missing: "
                        + ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else ""))
    if unreadable:
        warnings.append("unreadable storage file(s): " + ", ".join(unreadable[:10]))
    if no_data and data_expected:
        warnings.append(f"{no_data} storage(s) were recorded by PyTorch without data "
                        "(fake tensors at dump time): those inputs are marked absent")
    if imp.lifted:
        warnings.append(f"{len(imp.lifted)} module parameter(s)/buffer(s) in the script are not the model's "
                        "(PyTorch wrote torch.randn or constructor defaults): lifted to inputs marked absent")
    printed = [n for n, o in imp.origin.items() if o == "printed"]
    if printed:
        warnings.append(f"buffer(s) {', '.join(printed)} come from printed literals (rounded floats)")
    remapped = sorted({str(s.device) for s in reader.storages
                       if s.status == "real" and s.loaded_on and s.loaded_on != str(s.device)})
    if remapped:
        warnings.append(f"data recorded on {', '.join(remapped)} was loaded on cpu (device not present here)")
    real = sum(1 for a in example_inputs if isinstance(a, torch.Tensor))
    absent = sum(1 for a in example_inputs if isinstance(a, AbsentTensor))
    summary = {"total": len(example_inputs), "real": real, "absent": absent,
               "values": len(example_inputs) - real - absent,
               "real_bytes": sum(s.nbytes for s in reader.storages if s.status == "real"),
               "missing_storages": missing}
    storages = {"total": len(reader.storages), "real": sum(s.status == "real" for s in reader.storages),
                "no_data": no_data, "missing": missing, "unreadable": unreadable}
    return summary, storages, warnings + imp.notes


def take_snapshots() -> tuple[Any, Any, Any, list[str]]:
    """(config, environment, system, notes): this process's snapshots, where the script's
    settings apply. A snapshot that fails is reported, never fatal."""
    from reproarchive.context.config import config_snapshot
    from reproarchive.context.environment import environment_snapshot
    from reproarchive.context.system import system_snapshot

    try:
        return config_snapshot(), environment_snapshot(), system_snapshot(), []
    except Exception as err:
        return None, None, None, [f"a snapshot failed: {type(err).__name__}: {_first_line(err)}"]


def run(opts: argparse.Namespace, events) -> dict[str, Any]:
    script = Path(opts.script)
    dump = parse_dump_script(script)
    store, store_note = _store_dir(dump)
    imp = import_script(script, store, events)
    scrub = Scrubber(_scrub_prefixes(opts, store))

    events("taking snapshots")
    config, environment, system, snapshot_notes = take_snapshots()

    from reproarchive.context import failure as fail

    if opts.no_replay:
        failure = fail.unknown_record("not replayed when packing (--no-replay)", backend=dump.backend)
        replay_notes: dict[str, Any] = {"performed": False}
    else:
        events("replaying the failure")
        failure, replay_notes = replay(dump, imp.gm, imp.example_inputs)

    inputs, storages, warnings = input_report(imp)
    warnings += snapshot_notes
    printed = [n for n, o in imp.origin.items() if o == "printed"]
    source = {
        "kind": dump.kind,
        "script": opts.script_label,
        "run_repro": {k: v for k, v in dump.run_args.items() if k != "save_dir"},
        "save_dir_found": store is not None,
        "content_store": store_note,
        "load_args_version": imp.load_args_version,
        "accuracy_mode": dump.accuracy_mode,
        "inputs": imp.reader.inputs,
        "storages": storages,
        "lifted_module_state": imp.lifted,
        "printed_module_state": printed,
        "environment_origin": ("TORCH*/DYNAMO*/INDUCTOR*/TRITON* variables as the dump set them; "
                               "other variables from the packing process"),
        "replay": replay_notes,
        **_dump_comments(script),
    }
    if dump.non_literal_args:
        source["run_repro_non_literal"] = dump.non_literal_args

    events("writing the archive")
    from reproarchive.archive.packing import pack

    failure = scrub(failure)
    out = pack(
        imp.gm, imp.example_inputs, opts.out,
        config=scrub(config), system=scrub(system),
        # The environment keeps install and cache paths (they explain behaviour and a replay may
        # set them); only the user's own folders are replaced.
        environment=scrub.without("<inductor-cache>", "<triton-cache>", "<python>", "<site-packages>")(environment),
        failure=failure, source=scrub(source), backend=dump.backend,
        accuracy=bool(dump.accuracy_mode),
    )
    missing = inputs.pop("missing_storages")
    return {
        "archive": str(out),
        "kind": dump.kind,
        "backend": dump.backend,
        "accuracy": dump.accuracy_mode,
        "graph": graph_summary(imp.gm),
        "inputs": inputs,
        "missing_storages": missing,
        "lifted_module_state": [x["attribute"] for x in imp.lifted],
        "failure": failure_summary(failure),
        "replay": replay_notes,
        "warnings": scrub(warnings),
    }


def failure_summary(failure: FailureRecord) -> dict[str, Any]:
    """The failure as the parent prints it (a summary of the record, not the record)."""
    return {k: getattr(failure, k) for k in ("stage", "exception_type", "message", "signature")}


def _pack(request: dict, *, started, event) -> dict[str, Any]:
    return run(argparse.Namespace(**request), event)


if __name__ == "__main__":
    sys.exit(child_main(_pack, unexpected=PackError, unexpected_what="importing the dump failed"))
