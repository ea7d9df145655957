"""The half of ``pack_trace`` that runs in a child process: rebuild one compile's graph, pack it.

A TORCH_TRACE log holds a compile's graph as Python text: the Dynamo graph as
``GraphModule.print_readable`` wrote it (``dynamo_output_graph``) and, for Inductor, the
after_aot repro script (``fx_graph_runnable``). Both are the user's own code and both have to be
executed to get a graph back, the runnable moreover sets torch config and environment variables
when it runs; so, as for PyTorch dumps, this happens in a throwaway process started by
``reproarchive.sources.trace.pack_trace``, never in the caller.

* ``fx_graph_runnable`` goes through the dump import's machinery (``pack_child.import_script``):
  same reader, same tracing, same lifting of module state PyTorch did not save. Its load_args
  records no data (``save_dir=None``) unless the run also wrote a TORCH_COMPILE_DEBUG copy with
  TORCH_COMPILE_DEBUG_SAVE_REAL=1, which the parent found and hands over instead.
* ``dynamo_output_graph`` is executed as a class definition and traced (``dynamo_graph``); its inputs are built
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
import dataclasses
import json
import re
import sys
import traceback
from pathlib import Path
from typing import Any

from reproarchive.archive.writing import Capture, write_capture
from reproarchive.child import child_main
from reproarchive.codec.stand_ins import bring_implementations
from reproarchive.context import failure as fail
from reproarchive.context.config import config_from_values
from reproarchive.context.environment import environment_snapshot
from reproarchive.context.redaction import redact_paths
from reproarchive.errors import PackError, ReproArchiveError
from reproarchive.format.plain import from_plain
from reproarchive.format.schema import FailureRecord, Records, SystemRecord, TraceSource, UnrepresentableSetting
from reproarchive.sources import import_replay, path_scrub, repro_module
from reproarchive.sources.dump import pack_child, scripts
from reproarchive.sources.pack_report import PackReport, failure_summary
from reproarchive.sources.printed_stacks import NOT_MATCHED, give_stacks
from reproarchive.sources.trace.dynamo_graph import Rebuilt, from_dynamo_graph

# Logging switches a runnable copies from the job's environment: set here, they would make the
# child write a new trace or debug folder into the user's directories.
_DROPPED_ENV = re.compile(r"^TORCH_TRACE$|^TORCH_COMPILE_DEBUG|^TORCH_LOGS|^TORCHINDUCTOR_TRACE")
_ENV_LINE = re.compile(r"^os\.environ\[(['\"])(?P<name>[A-Za-z_][A-Za-z0-9_]*)\1\]\s*=")


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
    save_dir = scripts.parse_dump_script(script).save_dir
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
    imp = pack_child.import_script(script, store, events, annotated=graph.get("annotated"))
    # the log's runnable is written without data by design (save_dir=None)
    inputs, storages, warnings = pack_child.input_report(imp, data_expected=store is not None)
    for info in imp.reader.inputs:
        if info.get("data") == "no_data":
            info["data"] = "absent"
    if store is None:
        warnings.insert(0, "the log holds no tensor data: every input is absent (generated at load time); "
                           "run with TORCH_COMPILE_DEBUG=1 TORCH_COMPILE_DEBUG_SAVE_REAL=1 to keep real inputs")

    printed = graph.get("printed") or []
    if not give_stacks(imp.gm, printed, rebuilt_from=graph["code"],
                       paths=lambda text: redact_paths(text, job.get("scrub") or {})) and any(
            "# File: " in code for code in printed):
        warnings.append(NOT_MATCHED)
    return Rebuilt(gm=imp.gm, inputs=imp.example_inputs, input_records=imp.reader.inputs, inputs_summary=inputs,
                   warnings=warnings, kind="after_aot",
                   environment=environment_snapshot(environ=env) if env else None, storages=storages,
                   lifted=imp.lifted,
                   content_store="TORCH_COMPILE_DEBUG_SAVE_REAL data next to the log" if store is not None else None,
                   custom_ops=imp.missing_ops, unapplied=imp.guarded.unapplied)


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
            return seen, import_replay.generated_data_warning(notes)
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
                                              f"{import_replay.first_line(err)}"}})
    return {"results": results}


def pack_job(job: dict[str, Any], work: Path, events, started=None) -> dict[str, Any]:
    bring_implementations(job.get("imports") or (), job.get("libraries") or ())
    built = from_runnable(job, work, events) if job["graph"]["from"] == "fx_graph_runnable" \
        else from_dynamo_graph(job, events)
    scrub_opts = argparse.Namespace(cwd_prefix=job.get("cwd_prefixes") or [], dump_prefix=[])
    prefixes = path_scrub.scrub_prefixes(scrub_opts, None)
    prefixes.update(job.get("scrub") or {})
    scrub = path_scrub.Scrubber(prefixes)


    config = config_from_values(job["config_values"]) if job.get("config_values") else None
    config_origin = "compilation_metrics in the log" if config else None
    warnings = list(job.get("warnings") or []) + built.warnings
    if config is None and built.kind == "after_aot":
        config, _, _, notes = pack_child.take_snapshots()
        config_origin = "the runnable's config lines over this machine's defaults (the log records no config)"
        warnings += notes
    backend = job.get("backend")
    shapes = _logged_shapes(built, job)  # the archive's, and its replay's below
    logged = from_plain(FailureRecord, job["failure"]) if job.get("failure") else None
    replay_notes: dict[str, Any] = {"performed": False}
    if job.get("crash"):  # an earlier child died replaying this compile (pack_trace)
        failure, replay_notes = import_replay.crashed(job["crash"], backend)
    elif job.get("replay") and backend:
        events("replaying the failure")
        if started is not None:
            started({"stage": "replay"})  # if the replay kills this process, the parent knows
        observed, replay_notes = import_replay.replay_once(
            built.gm, built.inputs, kind=built.kind, backend=backend, accuracy=bool(job.get("accuracy")),
            config=config, environment=built.environment, shapes=shapes)
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
                         replay_notes=replay_notes, shapes=shapes)

    events("writing the archive")
    out = write_capture(capture, job["out"], prefixes=scrub.prefixes)
    compile_ = job["compile"]
    return PackReport(
        archive=out, size=out.stat().st_size, kind=built.kind, backend=backend,
        accuracy="accuracy" if job.get("accuracy") else "", graph=repro_module.graph_summary(built.gm),
        inputs=built.inputs_summary,
        failure=failure_summary(failure, scrub.prefixes),
        replay=replay_notes, warnings=tuple(scrub(warnings)), compile_id=compile_["id"], rank=compile_["rank"],
        graph_from=job["graph"]["from"],
    ).to_plain()


SOURCE_RECORD = TraceSource


def _logged_shapes(built: Rebuilt, job: dict[str, Any]) -> Any:
    """The shape policy the log records for an after_dynamo graph (None after AOT)."""
    from reproarchive.codec.logged_shapes import logged_policy  # imports torch: in the child only

    if built.kind != "after_dynamo":
        return None
    return logged_policy(built.input_records, job.get("symbols") or {}, first_input=len(built.lifted))


def capture_of(built: Rebuilt, job: dict[str, Any], *, config: Any, config_origin: str | None,
               failure: Any, replay_notes: dict[str, Any], shapes: Any) -> Capture:
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

    known = {(u.module, u.key) for u in config.unrepresentable}
    extra = tuple(UnrepresentableSetting(module=m, key=k, reason=f"not applied when packing: {why}", repr=v,
                                         changed=True) for m, k, v, why in unapplied if (m, k) not in known)
    return dataclasses.replace(config, unrepresentable=config.unrepresentable + extra)


def _pack_jobs(request: dict, *, started, event) -> dict[str, Any]:
    return run(argparse.Namespace(job=request["job"]), event, started)


if __name__ == "__main__":
    sys.exit(child_main(_pack_jobs, unexpected=PackError, unexpected_what="rebuilding the compile from the log"))
