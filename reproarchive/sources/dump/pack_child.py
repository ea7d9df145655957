"""The half of ``pack_dump`` that runs inside a child process: execute the dump, read it, pack it.

A PyTorch repro script sets environment variables and torch config at import time and may
install Triton kernels or fake process groups; running it in the caller would change the
caller's torch for good. So ``reproarchive.sources.dump.pack_dump`` runs this module in a child
process (through ``reproarchive.child``), where it:

1. executes the script's module-level code (never its ``__main__`` block) *before* importing
   torch, so import-time environment variables take effect as they did in the failing process;
2. runs the dump's own ``load_args`` with a reader that records, per storage, whether PyTorch
   saved data for it, and refuses to invent data: inputs without data become AbsentTensor;
3. traces ``Repro`` into a GraphModule whose placeholders match ``load_args`` one to one, and
   lifts module state that PyTorch replaced by ``torch.randn`` into inputs marked absent;
4. takes the config / environment / system snapshots here, where the dump's settings apply;
5. replays the failure once the way the dump's ``run_repro`` would detect it (saying so first:
   when the replay kills this process, the parent starts a second child that packs the dump
   with the crash as its failure, from the first one's signal and faulthandler report);
6. calls ``reproarchive.pack`` itself, so nothing is pickled across the process boundary, and
   writes a small JSON report for the parent.

Progress events go to the parent as they happen; everything else the dump or torch prints goes
to a log the parent keeps for --debug.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import dataclasses
import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reproarchive.archive.loading import load
from reproarchive.archive.writing import Capture, write_capture
from reproarchive.child import child_main
from reproarchive.codec.custom_ops import LiveCall, LiveCustomOp
from reproarchive.codec.logged_shapes import logged_policy
from reproarchive.codec.recorded_calls import record_calls
from reproarchive.codec.shapes import restricted
from reproarchive.codec.stand_ins import bring_implementations, install, set_calls
from reproarchive.codec.tensors import AbsentTensor
from reproarchive.context import failure as fail
from reproarchive.context.config import config_snapshot
from reproarchive.context.environment import environment_snapshot
from reproarchive.context.system import system_snapshot
from reproarchive.errors import PackError, SourceError
from reproarchive.format.plain import from_plain
from reproarchive.format.schema import CustomOpRecord, DumpSource, ExecutionRecord, OpProvenance, Records, ShapePolicy
from reproarchive.sources.dump.foreign_runnable import Guarded, missing_ops, tolerant_source
from reproarchive.sources.dump.scripts import DumpScript, parse_dump_script, symbolic_shapes
from reproarchive.sources.dump.tensor_reader import RecordingReader
from reproarchive.sources.import_replay import crashed, first_line, generated_data_warning, replay
from reproarchive.sources.pack_report import PackReport, failure_summary
from reproarchive.sources.path_scrub import Scrubber, scrub_prefixes
from reproarchive.sources.printed_stacks import give_noted
from reproarchive.sources.repro_module import graph_summary, lift_state, module_state_origin, trace_repro

# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def _exec_module_code(script: Path, guarded: Guarded) -> dict[str, Any]:
    """Run the script body as a module that is not __main__: defines Repro, mod, load_args.
    Its torch config settings and library loads are guarded (``foreign_runnable``): what this
    torch or machine lacks is recorded in ``guarded`` instead of stopping the script."""
    source = script.read_text(encoding="utf-8", errors="replace")
    code = compile(tolerant_source(source), str(script), "exec")
    namespace: dict[str, Any] = {"__name__": "__reproarchive_dump__", "__file__": str(script),
                                 "__builtins__": builtins, **guarded.helpers()}
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
    guarded: Guarded = dataclasses.field(default_factory=Guarded)  # settings not applied, libraries missing
    missing_ops: list = dataclasses.field(default_factory=list)  # ops described from the script (stand-ins)

    @property
    def load_args_version(self) -> Any:
        return getattr(self.load_args, "_version", None)


def import_script(script: Path, store: Path | None, events, annotated: str | None = None) -> ImportedScript:
    """Execute a PyTorch repro script's module code here, read its inputs, trace its graph.

    The script is a repro in PyTorch's after_dynamo/after_aot shape (a dump, or the
    ``fx_graph_runnable`` of a TORCH_TRACE log); its config and environment lines take effect in
    this process, which is why this only ever runs in a child process. A setting this torch
    lacks and a library this machine lacks are recorded, not fatal; an operator still missing
    then gets a stand-in described from its call sites (``annotated``: the log's graph code
    with the shapes of its values, for the stand-in's outputs).
    """
    dump = parse_dump_script(script)
    events("running the script's module code")
    guarded = Guarded()
    try:
        namespace = _exec_module_code(script, guarded)
    except Exception as err:
        raise SourceError(
            f"running the module code of {script.name} failed: {type(err).__name__}: {first_line(err)}",
            "it may need a package or GPU this machine lacks; see --debug for the log") from err

    mod = namespace.get("mod")
    if not isinstance(mod, torch.nn.Module):
        mod = namespace["Repro"]()
    load_args = namespace["load_args"]

    events("loading inputs")
    reader = RecordingReader(store)
    with torch.no_grad():
        load_args(reader)
    args = list(reader._args)

    missing = stand_ins_for_missing_ops(script.read_text(encoding="utf-8", errors="replace"), annotated, guarded)
    if missing:
        events(f"standing in for {len(missing)} operator(s) not registered here")
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
    origin = module_state_origin(mod)
    gm, example_inputs, lifted = lift_state(gm, origin, args)
    notes = trace_notes + [f"setting {m}.{k} = {v} was not applied: {why}" for m, k, v, why in guarded.unapplied]
    notes += [f"library {lib} could not be loaded here" for lib in guarded.libraries]
    notes += [f"operator {op.name} is not registered here: a stand-in with the inferred schema {op.record.schema} "
              "returns generated outputs" for op in missing]
    return ImportedScript(dump=dump, mod=mod, reader=reader, gm=gm, example_inputs=example_inputs,
                          lifted=lifted, origin=origin, notes=notes, load_args=load_args, guarded=guarded,
                          missing_ops=missing)


def stand_ins_for_missing_ops(source: str, annotated: str | None, guarded: Guarded) -> list:
    """Stand-ins for the operators the script calls that nobody registered here (a library of
    the recording machine): the archive's ``custom_ops`` records, outputs absent."""

    archived, here = [], []
    library = guarded.libraries[0] if len(guarded.libraries) == 1 else None
    for name, found in missing_ops(source, annotated).items():
        record = CustomOpRecord(name=name, schema=found["schema"], provenance=OpProvenance(
            kind="library" if library else "unknown", library=library))
        absent, generated = [], []
        for dtype, shape, stride, device in found["outputs"]:
            dt = getattr(torch, dtype)
            absent.append(AbsentTensor(tuple(shape), dt, stride=tuple(stride) if stride else None, device=device))
            generated.append(torch.zeros(shape, dtype=dt))
        calls = [LiveCall((), tuple(absent))] if found["outputs"] else []
        archived.append(LiveCustomOp(record, calls))
        here.append(LiveCustomOp(record, [LiveCall((), tuple(generated))] if calls else []))
    install([op.record for op in here])
    set_calls(here)
    return archived


def input_report(imp: ImportedScript, *,
                 data_expected: bool = True) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(the inputs summary for the report, the storages record for ``source``, warnings).
    ``data_expected=False`` for scripts written without data by design (no warning for that)."""

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

    try:
        return config_snapshot(), environment_snapshot(), system_snapshot(), []
    except Exception as err:
        return None, None, None, [f"a snapshot failed: {type(err).__name__}: {first_line(err)}"]


SOURCE_RECORD = DumpSource


def capture_of(imp: ImportedScript, *, label: str, store_found: bool, store_note: str, storages: dict[str, Any],
               snapshots: tuple[Any, Any, Any], failure: Any, replay_notes: dict[str, Any],
               execution: Any = None, shapes: Any = None) -> Capture:
    """The dump's graph and inputs as ``import_script`` read them, and the records around them:
    this process's ``snapshots`` (config, environment, system) where the script's settings
    apply, the failure its one replay recorded, the thread state and shape policy of the failing
    compile (``execution``, ``shapes``), and where everything came from."""
    dump = imp.dump
    config, environment, system = snapshots
    source = DumpSource(
        kind=dump.kind,
        script=label,
        run_repro={k: v for k, v in dump.run_args.items() if k != "save_dir"},
        run_repro_non_literal=tuple(dump.non_literal_args) or None,
        save_dir_found=store_found,
        content_store=store_note,
        load_args_version=imp.load_args_version,
        accuracy_mode=dump.accuracy_mode,
        inputs=tuple(imp.reader.inputs),
        storages=storages,
        lifted_module_state=tuple(imp.lifted),
        printed_module_state=tuple(n for n, o in imp.origin.items() if o == "printed"),
        environment_origin=("TORCH*/DYNAMO*/INDUCTOR*/TRITON* variables as the dump set them; "
                            "other variables from the packing process"),
        replay=replay_notes,
        **_dump_comments(dump.path),
    )

    return Capture(imp.gm, imp.example_inputs, Records(
        backend=dump.backend, accuracy=bool(dump.accuracy_mode), config=config, system=system,
        environment=environment, failure=failure, source=source, shapes=shapes, execution=execution))


def noted_at_the_dump(notes: str | None, script: Path) -> tuple[Any, Any, Any]:
    """(thread state, (shape policy, its graph's number of inputs), its calls with their stacks)
    of the compile the dump ``script`` was written for, as its process noted them
    (``crash_guard._note_compile``, one JSON line per compile): the last entry that began before
    the dump was written. Nones without notes (a dump packed on its own); the policy None where
    the compile had none."""

    if not notes:
        return None, None, None
    written = script.stat().st_mtime
    chosen = None
    with contextlib.suppress(OSError, ValueError):
        for line in Path(notes).read_text().splitlines():
            entry = json.loads(line)
            if float(entry["time"]) <= written:
                chosen = entry
    if chosen is None:
        return None, None, None
    execution = from_plain(ExecutionRecord, chosen["execution"])
    shapes = from_plain(ShapePolicy, chosen["shapes"]) if chosen.get("shapes") is not None else None
    return execution, (shapes, chosen.get("inputs")), chosen.get("calls")


def _policy_of_the_dump(imp: ImportedScript, noted: Any) -> Any:
    """The failing compile's own policy where its process noted it for this graph (its inputs
    after the module state the import lifted into inputs), else what the dump's symbolic sizes
    say."""
    shapes, count = noted if noted is not None else (None, None)
    lifted = len(imp.lifted)
    if shapes is not None and count == len(imp.reader.inputs) - lifted:
        names = [f"input {i}" for i in range(count)]
        return restricted(shapes, names, [f"lifted {i}" for i in range(lifted)] + names)
    return logged_policy(imp.reader.inputs, {}, first_input=lifted, recorded_from="dump")


def custom_ops_before_import(imports, libraries, recorded_in, events) -> list:
    """Before the dump's code runs: the user's implementations of its custom ops (``--import``,
    ``--load-library``), then stand-ins for the ops still missing from the calls the failing
    program recorded (``recorded_in``: archives ``capture --`` wrote). Returns those calls."""

    bring_implementations(imports, libraries)
    recorded = {}
    for path in recorded_in:
        events("installing the program's custom ops")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            for op in load(path).custom_ops:
                recorded.setdefault(op.name, op)
    return list(recorded.values())


def _refuse_sizes_without_value(inputs: list[dict[str, Any]]) -> None:
    """PyTorch's dump writes a size passed as an unbacked symbol (``mark_unbacked``) as
    ``reader.symint(None, expr='u0')``: no value, and no word of which tensor's size it is. A
    replay would pass None; no archive is better than one that replays another failure."""
    for i, rec in enumerate(inputs):
        if rec.get("kind") == "symint" and rec.get("hint") is None:
            raise PackError(f"input {i} of this dump, the size {rec.get('expr') or '?'}, has no value: PyTorch's dump "
                            "writes none for an unbacked size (mark_unbacked)",
                            "capture the program with `reproarchive capture -- python PROGRAM`, which records its "
                            "value from the tensor that has it")


def run(opts: argparse.Namespace, events, started=None) -> dict[str, Any]:
    script = Path(opts.script)
    dump = parse_dump_script(script)
    store, store_note = _store_dir(dump)
    recorded_ops = custom_ops_before_import(getattr(opts, "imports", ()), getattr(opts, "libraries", ()),
                                            getattr(opts, "custom_ops_from", ()), events)
    imp = import_script(script, store, events)
    _refuse_sizes_without_value(imp.reader.inputs)
    scrub = Scrubber(scrub_prefixes(opts, store))
    execution, noted_shapes, noted = noted_at_the_dump(getattr(opts, "execution_from", None), script)
    shapes = _policy_of_the_dump(imp, noted_shapes)  # the archive's, and its replay's below
    give_noted(imp.gm, noted, script.read_text(encoding="utf-8", errors="replace"))  # the model lines

    events("taking snapshots")
    config, environment, system, snapshot_notes = take_snapshots()


    crash = getattr(opts, "crash", None)
    if crash:
        # An earlier child died replaying this dump; this one packs what it died of.
        failure, replay_notes = crashed(crash, dump.backend)
    elif opts.no_replay:
        failure = fail.unknown_record("not replayed when packing (--no-replay)", backend=dump.backend)
        replay_notes = {"performed": False}
    else:
        events("replaying the failure")
        if started is not None:
            started({"stage": "replay"})  # if the replay takes this process down, the parent knows
        failure, replay_notes = replay(dump, imp.gm, imp.example_inputs, execution=execution, shapes=shapes)

    inputs, storages, warnings = input_report(imp)
    warnings += snapshot_notes + generated_data_warning(replay_notes)
    capture = capture_of(imp, label=opts.script_label, store_found=store is not None, store_note=store_note,
                         storages=storages, snapshots=(config, environment, system), failure=failure,
                         replay_notes=replay_notes, execution=execution, shapes=shapes)
    capture = dataclasses.replace(capture, custom_ops=recorded_ops or imp.missing_ops
                                  or record_calls(imp.gm, imp.example_inputs))

    events("writing the archive")
    out = write_capture(capture, opts.out, prefixes=scrub.prefixes)
    missing = inputs.pop("missing_storages")
    return PackReport(
        archive=out, size=out.stat().st_size, kind=dump.kind, backend=dump.backend, accuracy=dump.accuracy_mode,
        graph=graph_summary(imp.gm), inputs=inputs, missing_storages=tuple(missing),
        lifted_module_state=tuple(x["attribute"] for x in imp.lifted),
        failure=failure_summary(failure, scrub.prefixes), replay=replay_notes,
        warnings=tuple(scrub(warnings)),
    ).to_plain()


def _pack(request: dict, *, started, event) -> dict[str, Any]:
    return run(argparse.Namespace(**request), event, started)


if __name__ == "__main__":
    sys.exit(child_main(_pack, unexpected=PackError, unexpected_what="importing the dump failed"))
