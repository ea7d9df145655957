"""The half of ``pack_trace`` that runs in a child process: rebuild one compile's graph, pack it.

A TORCH_TRACE log holds a compile's graph as Python text: the Dynamo graph as
``GraphModule.print_readable`` wrote it (``dynamo_output_graph``) and, for Inductor, the
after_aot repro script (``fx_graph_runnable``). Both are the user's own code and both have to be
executed to get a graph back, the runnable moreover sets torch config and environment variables
when it runs; so, as for PyTorch dumps, this happens in a throwaway process started by
``reproarchive.sources.trace_import``, never in the caller.

* ``fx_graph_runnable`` goes through the dump import's machinery (``dump_child.import_script``):
  same reader, same tracing, same lifting of module state PyTorch did not save. Its load_args
  records no data (``save_dir=None``) unless the run also wrote a TORCH_COMPILE_DEBUG copy with
  TORCH_COMPILE_DEBUG_SAVE_REAL=1, which the parent found and hands over instead.
* ``dynamo_output_graph`` is executed as a class definition and traced; its inputs are built
  from the placeholders' annotations ("f32[s77, 6][6, 1]cpu") and Dynamo's ``describe_tensor``
  records (requires_grad, parameters, offsets), with symbols from ``create_symbol``; all of them
  are absent (a log holds no tensor data).

The records come from the log, not from this process: the config from compilation_metrics, the
system from the torch_version event, the failure from dynamo_error. The graph is replayed once
(unless --no-replay) so that the archive carries the exact signature a later ``run`` observes;
where the log records no failure (runtime and accuracy failures never reach it) the replay's
failure is recorded, and says so.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import dataclasses
import inspect
import json
import re
import sys
import traceback
from pathlib import Path
from typing import Any

from reproarchive.archive.writing import Capture, write_capture
from reproarchive.child import child_main
from reproarchive.errors import PackError, ReproArchiveError, SourceError
from reproarchive.format.plain import from_plain
from reproarchive.format.schema import FailureRecord, Records, SystemRecord, TraceSource
from reproarchive.sources import dump_child, dump_graph, dump_script, first_replay, path_scrub
from reproarchive.sources.report import PackReport, failure_summary

# Logging switches a runnable copies from the job's environment: set here, they would make the
# child write a new trace or debug folder into the user's directories.
_DROPPED_ENV = re.compile(r"^TORCH_TRACE$|^TORCH_COMPILE_DEBUG|^TORCH_LOGS|^TORCHINDUCTOR_TRACE")
_ENV_LINE = re.compile(r"^os\.environ\[(['\"])(?P<name>[A-Za-z_][A-Za-z0-9_]*)\1\]\s*=")
_ANNOTATION = re.compile(r"^(?P<dtype>[a-z][a-z0-9]*)\[(?P<shape>[^\]]*)\](?:\[(?P<stride>[^\]]*)\])?"
                         r"(?P<device>[a-z]+(?::\d+)?)?$")
_SYM = re.compile(r"^Sym\((?P<expr>.+)\)$")
_ATTR_LINE = re.compile(r"^\s+\w+(?:\s*:\s*\"(?P<ann>[^\"]*)\")?\s*=\s*self\.(?P<attr>\w+)\s*(?:;.*)?$")


@dataclasses.dataclass
class Rebuilt:
    """A compile's graph as this process rebuilt it from the log, with what the archive's
    records say about how: the graph PyTorch had (``kind``), each input as the log described it
    (``input_records``) and counted (``inputs_summary``), module state lifted to inputs, and
    where the environment and data came from."""

    gm: Any
    inputs: list[Any]
    kind: str  # after_dynamo (dynamo_output_graph) or after_aot (fx_graph_runnable)
    input_records: list[dict[str, Any]]
    inputs_summary: dict[str, Any]
    warnings: list[str]
    lifted: list[dict[str, Any]]
    environment: Any = None
    storages: dict[str, Any] | None = None
    content_store: str | None = None
    custom_ops: list = dataclasses.field(default_factory=list)  # ops of the job's libraries, stood in for
    unapplied: list = dataclasses.field(default_factory=list)  # settings this torch does not have


# --------------------------------------------------------------------------------------------
# fx_graph_runnable


def runnable_script(code: str, work: Path, name: str = "fx_graph_runnable.py") -> tuple[Path, dict[str, str]]:
    """Write the runnable without its logging switches; return it and the environment variables
    it sets (the job's TORCH*/INDUCTOR*/TRITON* variables, as PyTorch recorded them)."""
    kept, env = [], {}
    for line in code.splitlines():
        m = _ENV_LINE.match(line)
        if m:
            if _DROPPED_ENV.search(m["name"]):
                continue
            try:
                value = ast.literal_eval(line.split("=", 1)[1].strip())
            except (ValueError, SyntaxError):
                value = None
            if isinstance(value, str):
                env[m["name"]] = value
        kept.append(line)
    script = work / name
    script.write_text("\n".join(kept) + "\n", encoding="utf-8")
    return script, env


def _store_of(script: Path) -> Path | None:
    """The content store of a TORCH_COMPILE_DEBUG runnable: the save_dir it names, if present."""
    save_dir = dump_script.parse_dump_script(script).save_dir
    return Path(save_dir) if save_dir and (Path(save_dir) / "storages").is_dir() else None


def from_runnable(job: dict[str, Any], work: Path, events) -> Rebuilt:
    graph = job["graph"]
    script, env = runnable_script(graph["code"], work)
    store = None
    if graph.get("real_data_script"):
        real, _ = runnable_script(Path(graph["real_data_script"]).read_text(encoding="utf-8", errors="replace"),
                                  work, "fx_graph_runnable_real.py")
        store = _store_of(real)
        if store is not None:
            script = real
    imp = dump_child.import_script(script, store, events, annotated=graph.get("annotated"))
    # the log's runnable is written without data by design (save_dir=None)
    inputs, storages, warnings = dump_child.input_report(imp, data_expected=store is not None)
    for info in imp.reader.inputs:
        if info.get("data") == "no_data":
            info["data"] = "absent"
    if store is None:
        warnings.insert(0, "the log holds no tensor data: every input is absent (generated at load time); "
                           "run with TORCH_COMPILE_DEBUG=1 TORCH_COMPILE_DEBUG_SAVE_REAL=1 to keep real inputs")
    from reproarchive.context.environment import environment_snapshot

    return Rebuilt(gm=imp.gm, inputs=imp.example_inputs, input_records=imp.reader.inputs, inputs_summary=inputs,
                   warnings=warnings, kind="after_aot",
                   environment=environment_snapshot(environ=env) if env else None, storages=storages,
                   lifted=imp.lifted,
                   content_store="TORCH_COMPILE_DEBUG_SAVE_REAL data next to the log" if store is not None else None,
                   custom_ops=imp.missing_ops, unapplied=imp.guarded.unapplied)


# --------------------------------------------------------------------------------------------
# dynamo_output_graph


def _eval_dim(expr: Any, hints: dict[str, int]) -> int | None:
    """An int, or a sympy-printed size expression ("s77", "2*s77 + 1") evaluated at the hints."""
    if isinstance(expr, int):
        return expr
    try:
        tree = ast.parse(str(expr).strip(), mode="eval")
    except SyntaxError:
        return None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in hints:
            return hints[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp):
            left, right = ev(node.left), ev(node.right)
            ops = {ast.Add: lambda: left + right, ast.Sub: lambda: left - right, ast.Mult: lambda: left * right,
                   ast.FloorDiv: lambda: left // right, ast.Mod: lambda: left % right}
            if type(node.op) in ops:
                return ops[type(node.op)]()
        raise ValueError(ast.dump(node))

    try:
        value = ev(tree)
    except (ValueError, ZeroDivisionError, TypeError):
        return None
    return value if isinstance(value, int) else None


def _dims(text: str | None) -> list[str]:
    return [d.strip() for d in text.split(",") if d.strip()] if text else []


def _parse_annotation(ann: Any) -> dict[str, Any] | None:
    if not isinstance(ann, str):
        return None
    ann = ann.strip()
    m = _SYM.match(ann)
    if m:
        return {"kind": "sym", "expr": m["expr"].strip()}
    m = _ANNOTATION.match(ann)
    if not m:
        return None
    return {"kind": "tensor", "dtype": m["dtype"], "shape": _dims(m["shape"]),
            "stride": _dims(m["stride"]) if m["stride"] is not None else None, "device": m["device"]}


def _instantiate(cls):
    """An instance of a printed GraphModule class, with its nested subgraph classes as submodules."""
    import torch

    mod = cls()
    for name, value in vars(cls).items():
        if isinstance(value, type) and issubclass(value, torch.nn.Module):
            setattr(mod, name, _instantiate(value))
    return mod


def _hints(params: dict[str, dict | None], described: dict[str, dict], syms: dict[str, dict]) -> dict[str, int]:
    hints = {name: s["hint"] for name, s in syms.items() if isinstance(s.get("hint"), int)}
    for name, ann in params.items():
        desc = described.get(name)
        if not ann or ann["kind"] != "tensor" or not desc or not isinstance(desc.get("shape"), list):
            continue
        for dim, real in zip(ann["shape"], desc["shape"]):
            if re.fullmatch(r"[A-Za-z_]\w*", dim) and isinstance(real, int):
                hints.setdefault(dim, real)
    return hints


def from_dynamo_graph(job: dict[str, Any], events) -> Rebuilt:
    import torch
    from torch.fx.graph import dtype_abbrs

    from reproarchive.codec.tensors import AbsentTensor
    from reproarchive.compat.pytree import graph_code_modules

    code = job["graph"]["code"]
    described: dict[str, dict] = job.get("describe") or {}
    syms: dict[str, dict] = job.get("symbols") or {}
    events("rebuilding the Dynamo graph")
    namespace: dict[str, Any] = {
        "__name__": "__reproarchive_trace_graph__", "__builtins__": builtins, "torch": torch,
        "math": __import__("math"), "operator": __import__("operator"), "inf": float("inf"),
        "nan": float("nan"), "device": torch.device, **graph_code_modules(),
    }
    try:
        exec(compile(code, "<dynamo_output_graph>", "exec", dont_inherit=True), namespace)  # noqa: S102 - the user's own log, in a throwaway process
    except Exception as err:
        raise SourceError(f"the logged Dynamo graph does not run as Python: {type(err).__name__}: "
                          f"{first_replay.first_line(err)}",
                          "the payload may be from an unsupported torch version") from err
    cls = namespace.get("GraphModule")
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise SourceError("the logged Dynamo graph defines no GraphModule class",
                          "the payload may be from an unsupported torch version")
    mod = _instantiate(cls)
    sig = inspect.signature(cls.forward)
    params = {name: _parse_annotation(p.annotation) for name, p in sig.parameters.items() if name != "self"}
    hints = _hints(params, described, syms)
    abbr_to_dtype = {v: k for k, v in dtype_abbrs.items()}

    # constants the graph reads from ``self`` are not in the log: lifted to inputs marked absent
    origin: dict[str, str] = {}
    const_devices: dict[str, str] = {}
    for line in code.split("class ", 2)[1].splitlines() if "class " in code else []:
        m = _ATTR_LINE.match(line)
        if not m or hasattr(mod, m["attr"]):
            continue
        ann = _parse_annotation(m["ann"])
        if not ann or ann["kind"] != "tensor" or ann["dtype"] not in abbr_to_dtype:
            raise PackError(f"the Dynamo graph reads self.{m['attr']}, which the log does not describe",
                            "graphs with such constants cannot be packed from a log")
        shape = [_eval_dim(d, hints) for d in ann["shape"]]
        if any(s is None for s in shape):
            raise PackError(f"the size of self.{m['attr']} ({ann['shape']}) is unknown")
        mod.register_buffer(m["attr"], torch.empty(shape, dtype=abbr_to_dtype[ann["dtype"]], device="meta"))
        origin[m["attr"]] = "not_logged"
        const_devices[m["attr"]] = ann["device"] or "cpu"

    inputs: list[Any] = []
    records: list[dict[str, Any]] = []
    notes: list[str] = []
    shared: dict[Any, list[str]] = {}
    for name, ann in params.items():
        desc = described.get(name) or {}
        if ann is None and not desc:
            raise PackError(f"input {name} of the Dynamo graph has no annotation and no describe_tensor record",
                            "the log is from a torch version whose graphs reproarchive cannot read")
        if ann is not None and ann["kind"] == "sym":
            hint = _eval_dim(ann["expr"], hints)
            if hint is None:
                raise PackError(f"input {name} is the symbol {ann['expr']} and the log holds no value for it",
                                "pack another compile of this frame (e.g. the static one)")
            inputs.append(hint)
            records.append({"placeholder": name, "kind": "symint", "hint": hint, "expr": ann["expr"],
                            "source": (syms.get(ann["expr"]) or {}).get("source")})
            continue
        dtype_name = desc.get("dtype")
        dtype = getattr(torch, dtype_name, None) if dtype_name else None
        if not isinstance(dtype, torch.dtype):
            dtype = abbr_to_dtype.get((ann or {}).get("dtype"))
        if dtype is None:
            raise PackError(f"the dtype of input {name} is not in the log")
        ann_shape = (ann or {}).get("shape")
        shape = desc.get("shape") if isinstance(desc.get("shape"), list) else \
            [_eval_dim(d, hints) for d in (ann_shape or [])]
        if shape is None or any(not isinstance(s, int) for s in shape):
            raise PackError(f"the size of input {name} ({ann_shape}) cannot be worked out from the log")
        stride = desc.get("stride") if isinstance(desc.get("stride"), list) else None
        if stride is None and ann and ann.get("stride") is not None:
            stride = [_eval_dim(d, hints) for d in ann["stride"]]
            stride = stride if all(isinstance(s, int) for s in stride) else None
        device = desc.get("device") or (ann or {}).get("device") or "cpu"
        offset = desc.get("storage_offset") if isinstance(desc.get("storage_offset"), int) else 0
        requires_grad = bool(desc.get("requires_grad")) and (dtype.is_floating_point or dtype.is_complex)
        inputs.append(AbsentTensor(tuple(shape), dtype, stride=tuple(stride) if stride else None,
                                   storage_offset=offset, device=device, requires_grad=requires_grad))
        rec = {"placeholder": name, "kind": "tensor", "data": "absent", "dtype": str(dtype).replace("torch.", ""),
               "shape": list(shape), "stride": stride, "storage_offset": offset, "device": device,
               "requires_grad": requires_grad, "metadata_from": "describe_tensor" if desc else "graph annotation"}
        for key in ("source", "is_parameter", "is_leaf", "is_view", "storage", "view_base_shape"):
            if desc.get(key) not in (None, False):
                rec[key] = desc[key]
        if ann_shape and any(not re.fullmatch(r"-?\d+", d) for d in ann_shape):
            rec["symbolic_shape"] = [int(d) if re.fullmatch(r"-?\d+", d) else d for d in ann_shape]
        if desc.get("storage") is not None:
            shared.setdefault(desc["storage"], []).append(name)
        records.append(rec)
    for names in shared.values():
        if len(names) > 1:
            notes.append(f"inputs {', '.join(names)} were views of one storage in the job; here each has its own "
                         "absent storage, so effects of that aliasing are not reproduced")
    if "_set_grad_enabled" in code:
        notes.append("the graph switches grad mode inside (torch._C._set_grad_enabled); the rebuilt graph "
                     "keeps no such switch")

    events("tracing the graph")
    try:
        with torch.enable_grad():
            gm, trace_notes = dump_graph.trace_repro(mod)
    except Exception as err:
        raise PackError(f"the logged Dynamo graph cannot be rebuilt: {type(err).__name__}: "
                        f"{first_replay.first_line(err)}",
                        "graphs with higher-order ops (cond, while_loop, checkpoint) are not supported from a log "
                        "yet") from err
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise PackError(f"the rebuilt graph takes {len(placeholders)} inputs but its forward declares {len(inputs)}")
    gm, inputs, lifted = dump_graph.lift_state(gm, origin, inputs)
    for i, item in enumerate(lifted):
        inputs[i] = dataclasses.replace(inputs[i], device=const_devices.get(item["attribute"], "cpu"))
        item["origin"] = "a constant of the graph; the log holds no value for it"
    if lifted:
        notes.append(f"{len(lifted)} constant(s) of the graph ({', '.join(x['attribute'] for x in lifted)}) are not in "
                     "the log: lifted to inputs marked absent")
    absent = sum(1 for a in inputs if isinstance(a, AbsentTensor))
    summary = {"total": len(inputs), "real": 0, "absent": absent, "values": len(inputs) - absent, "real_bytes": 0}
    notes.insert(0, "the log holds no tensor data: every input is absent (generated at load time)")
    return Rebuilt(gm=gm, inputs=inputs, input_records=records, inputs_summary=summary,
                   warnings=notes + trace_notes, kind="after_dynamo", lifted=lifted)


# --------------------------------------------------------------------------------------------
# failure


def _short(exc_type: str | None) -> str:
    return str(exc_type or "").rsplit(".", 1)[-1]


def reconcile(logged: FailureRecord | None, observed: FailureRecord, notes: dict[str, Any]
              ) -> tuple[FailureRecord | None, list[str]]:
    """The failure to record, from the log's and the replay's (``observed``), and warnings.

    The log is the truth about what happened in the job; the replay only sharpens it. When both
    name the same stage and exception, the replay's qualified type and exact signature replace
    the log's (which lacks the module), so ``run`` recognises the failure. Where the log records
    none (runtime and accuracy failures are not logged) the replay's is taken, marked as such.
    """
    warnings: list[str] = []
    seen = observed if observed.stage != "unknown" else None
    if logged is None or logged.stage == "unknown":
        if seen is not None:
            learned = "replay on generated data" if notes.get("generated_inputs") else "replay"
            notes["failure_from"] = f"{learned}: the log records no failure for this compile"
            return seen, first_replay.generated_data_warning(notes)
        notes["failure_from"] = "log" if logged else "none"
        return logged, warnings
    notes["failure_from"] = "log"
    if not notes.get("performed"):
        return logged, warnings
    if seen is not None and seen.stage == logged.stage and _short(seen.exception_type) == _short(logged.exception_type):
        notes["agrees_with_log"] = True
        return dataclasses.replace(logged, exception_type=seen.exception_type, signature=seen.signature), warnings
    notes["agrees_with_log"] = False
    what = f"{seen.stage} {seen.exception_type}" if seen else "no failure"
    warnings.append(f"replayed here the graph gives {what}, not the logged {logged.stage} "
                    f"{logged.exception_type}: `run` may report a different failure (data- or "
                    "machine-dependent failure?)")
    return logged, warnings


# --------------------------------------------------------------------------------------------
# main


def run(opts: argparse.Namespace, events, started=None) -> dict[str, Any]:
    """Pack each job in turn. Several Dynamo-graph jobs share one child (nothing of theirs
    outlives the job: the graph is a class, the config is applied only around the replay); a
    runnable sets torch config for good when it runs, so the parent gives it a child of its own.
    One job's error is reported for that job alone."""
    results = []
    for index, path in enumerate(opts.job):
        job = json.loads(Path(path).read_text(encoding="utf-8"))
        label = job["compile"]["label"]
        job_started = None if started is None else (lambda facts, _i=index: started({**facts, "job": _i}))

        def step(stage: str, _label=label) -> None:
            events(f"{_label}: {stage}")

        try:
            results.append(pack_job(job, Path(path).parent, step, job_started))
        except ReproArchiveError as err:
            traceback.print_exc()
            results.append({"error": {"class": type(err).__name__, "what": err.what, "hint": err.hint}})
        except Exception as err:  # noqa: BLE001 - reported as one line for this compile
            traceback.print_exc()
            results.append({"error": {"class": "PackError", "hint": "rerun with --debug to see the child's log",
                                      "what": f"rebuilding {label} failed: {type(err).__name__}: "
                                              f"{first_replay.first_line(err)}"}})
    return {"results": results}


def pack_job(job: dict[str, Any], work: Path, events, started=None) -> dict[str, Any]:
    from reproarchive.codec.stand_ins import bring_implementations

    bring_implementations(job.get("imports") or (), job.get("libraries") or ())
    built = from_runnable(job, work, events) if job["graph"]["from"] == "fx_graph_runnable" \
        else from_dynamo_graph(job, events)
    scrub_opts = argparse.Namespace(cwd_prefix=job.get("cwd_prefixes") or [], dump_prefix=[])
    prefixes = path_scrub.scrub_prefixes(scrub_opts, None)
    prefixes.update(job.get("scrub") or {})
    scrub = path_scrub.Scrubber(prefixes)

    from reproarchive.context import failure as fail
    from reproarchive.context.config import config_from_values

    config = config_from_values(job["config_values"]) if job.get("config_values") else None
    config_origin = "compilation_metrics in the log" if config else None
    warnings = list(job.get("warnings") or []) + built.warnings
    if config is None and built.kind == "after_aot":
        config, _, _, notes = dump_child.take_snapshots()
        config_origin = "the runnable's config lines over this machine's defaults (the log records no config)"
        warnings += notes
    backend = job.get("backend")
    logged = from_plain(FailureRecord, job["failure"]) if job.get("failure") else None
    replay_notes: dict[str, Any] = {"performed": False}
    if job.get("crash"):  # an earlier child died replaying this compile (trace_import)
        failure, replay_notes = first_replay.crashed(job["crash"], backend)
    elif job.get("replay") and backend:
        events("replaying the failure")
        if started is not None:
            started({"stage": "replay"})  # if the replay kills this process, the parent knows
        observed, replay_notes = first_replay.replay_once(
            built.gm, built.inputs, kind=built.kind, backend=backend, accuracy=bool(job.get("accuracy")),
            config=config, environment=built.environment)
        if started is not None:
            started({"stage": "packing"})
        failure, more = reconcile(logged, observed, replay_notes)
        warnings += more
    else:
        failure = logged
        replay_notes["reason"] = "--no-replay" if backend else "no backend known (pass --backend)"
        replay_notes["failure_from"] = "log" if logged else "none"
    if failure is None and job.get("accuracy"):
        failure = fail.unknown_record("an accuracy failure was reported with --accuracy; not replayed", backend=backend)

    config = with_unapplied(config, built.unapplied)
    capture = capture_of(built, job, config=config, config_origin=config_origin, failure=failure,
                         replay_notes=replay_notes)

    events("writing the archive")
    out = write_capture(capture, job["out"], prefixes=scrub.prefixes)
    compile_ = job["compile"]
    return PackReport(
        archive=out, size=out.stat().st_size, kind=built.kind, backend=backend,
        accuracy="accuracy" if job.get("accuracy") else "", graph=dump_graph.graph_summary(built.gm),
        inputs=built.inputs_summary,
        failure=failure_summary(failure, scrub.prefixes),
        replay=replay_notes, warnings=tuple(scrub(warnings)), compile_id=compile_["id"], rank=compile_["rank"],
        graph_from=job["graph"]["from"],
    ).to_plain()


SOURCE_RECORD = TraceSource


def capture_of(built: Rebuilt, job: dict[str, Any], *, config: Any, config_origin: str | None,
               failure: Any, replay_notes: dict[str, Any]) -> Capture:
    """The compile's graph and inputs as ``from_dynamo_graph`` / the runnable rebuilt them,
    and the records around them: what the parent read from the log (``job``: source, system,
    backend) completed with what only this process learnt."""
    source = dataclasses.replace(
        from_plain(TraceSource, job["source"]),
        graph_kind=built.kind,
        inputs=built.input_records,
        config_origin=config_origin,
        environment_origin=("the environment variables fx_graph_runnable sets (the job's TORCH*/INDUCTOR*/"
                            "TRITON* variables)") if built.environment else "not in the log",
        replay=replay_notes,
        lifted_module_state=built.lifted or None,
        storages=built.storages or None,
        content_store=built.content_store or None,
    )
    from reproarchive.codec.shapes import logged_policy  # imports torch: in the child only

    shapes = (logged_policy(built.input_records, job.get("symbols") or {}, first_input=len(built.lifted))
              if built.kind == "after_dynamo" else None)
    return Capture(built.gm, built.inputs, Records(
        backend=job.get("backend"), accuracy=bool(job.get("accuracy")), config=config or None,
        system=from_plain(SystemRecord, job["system"]) if job.get("system") else None,
        environment=built.environment, failure=failure, source=source, shapes=shapes),
        custom_ops=built.custom_ops or None)


def with_unapplied(config: Any, unapplied: list) -> Any:
    """``config`` with the runnable's settings this torch does not have, recorded as settings
    that cannot be applied here (``unrepresentable``, spec §8: a replay says so)."""
    if not unapplied or config is None:
        return config
    from reproarchive.format.schema import UnrepresentableSetting

    known = {(u.module, u.key) for u in config.unrepresentable}
    extra = tuple(UnrepresentableSetting(module=m, key=k, reason=f"not applied when packing: {why}", repr=v,
                                         changed=True) for m, k, v, why in unapplied if (m, k) not in known)
    return dataclasses.replace(config, unrepresentable=config.unrepresentable + extra)


def _pack_jobs(request: dict, *, started, event) -> dict[str, Any]:
    return run(argparse.Namespace(job=request["job"]), event, started)


if __name__ == "__main__":
    sys.exit(child_main(_pack_jobs, unexpected=PackError, unexpected_what="rebuilding the compile from the log"))
