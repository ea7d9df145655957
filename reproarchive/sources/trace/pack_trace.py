"""``pack_trace`` and ``list_trace``: archives from a TORCH_TRACE log, without re-running the job.

PyTorch's bug template asks for the whole TORCH_TRACE log, and many jobs run with it set all the
time; when one fails after hours, the log already holds, per compile, the graph, the inputs'
metadata, the full config, the torch version and the failure. ``list_trace`` shows its compiles
(``reproarchive ls``); ``pack_trace`` writes one archive per chosen compile
(``reproarchive pack LOG``), named by rank and compile id.

This side reads and indexes the log (``log_model``, no torch) and prepares one job per compile:
which graph payload to rebuild, the inputs' metadata, the records taken from the log. The graph
payloads are Python and are only ever executed by ``rebuild_child`` in a child process, started
exactly as the dump import starts its child (``pack_dump.run_child``): the caller's process,
environment, torch config and cwd are never touched.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from reproarchive.child import error_from, run_child
from reproarchive.errors import ReproArchiveError, SourceError
from reproarchive.format.plain import to_plain
from reproarchive.format.schema import TraceSource
from reproarchive.sources.dump.pack_dump import child_env
from reproarchive.sources.pack_report import PackReport
from reproarchive.sources.trace import facts, log_model, log_reader
from reproarchive.sources.trace.job_logs import job_companions, write_job_archive
from reproarchive.sources.trace.log_model import Compile, Trace

GRAPH_CHOICES = ("auto", "dynamo", "aot")
ARCHIVE_SUFFIX = ".tar.zst"
_DEBUG_RUNNABLES = ("run_*/torchinductor/*/fx_graph_runnable.py",
                    "torch_compile_debug/run_*/torchinductor/*/fx_graph_runnable.py")
_STORAGE_CALL = re.compile(r"reader\.storage\((?:'[0-9a-f]*'|\"[0-9a-f]*\"|None)")


@dataclass
class TracePackResult:
    """What ``pack_trace`` did: archives written, compiles it could not pack, log problems."""

    source: Path
    trace_kind: str
    packed: list[PackReport]
    skipped: list[dict[str, Any]]
    warnings: list[str]
    job: PackReport | None = None  # the compiles of several ranks merged into one job archive (job_logs)

    def to_json(self) -> dict[str, Any]:
        return {"source": str(self.source), "trace_kind": self.trace_kind,
                "archives": [p.to_json() for p in self.packed], "skipped": self.skipped, "warnings": self.warnings,
                **({"job": self.job.to_json()} if self.job is not None else {})}


def is_trace(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a TORCH_TRACE log, a folder of them, or a tlparse output folder."""
    return log_reader.find_trace(path) is not None


def list_trace(source: str | os.PathLike) -> dict[str, Any]:
    """The compiles of a trace, for ``reproarchive ls`` (a JSON-ready dict).

    ``{"source", "kind", "files", "compiles": [row...], "warnings"}``; each row holds the compile
    id, rank, frame (name, file, line), op count, status (ok / failed / incomplete, "(no graph)"
    when Dynamo logged none), fail reason, and what the log holds for it.
    """
    trace = log_reader.read_trace(source)
    return {
        "source": str(source),
        "kind": trace.kind,
        "files": [str(f) for f in trace.files],
        "compiles": [c.row(display_log=trace.display_log(c)) for c in trace.compiles],
        "warnings": trace.warnings,
    }


def pack_trace(
    source: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    compile_ids: Iterable[str] = (),
    all_compiles: bool = False,
    rank: int | None = None,
    graph: str = "auto",
    backend: str | None = None,
    accuracy: bool = False,
    replay: bool = True,
    cwd: str | os.PathLike | None = None,
    progress: Callable[[str], None] | None = None,
    keep_log: str | os.PathLike | None = None,
    imports: tuple[str, ...] = (),
    libraries: tuple[str, ...] = (),
) -> TracePackResult:
    """Pack compiles of the trace at ``source`` into archives under ``out`` (a folder, default
    ``cwd``; or a ``.tar.zst`` file name when exactly one compile is packed).

    By default the failed (and incomplete) compiles; ``compile_ids`` picks ("0/1", "[0/1]");
    ``all_compiles`` takes every one; ``rank`` keeps one rank. ``graph`` picks the payload:
    "dynamo" (the Dynamo graph, any backend), "aot" (Inductor's fx_graph_runnable) or "auto"
    (the runnable when Inductor logged one, else the Dynamo graph). ``backend``/``accuracy`` say
    what the log cannot (a backend that did not fail is not named in it; accuracy failures are
    never logged). ``replay`` replays each graph once in the child to confirm the failure.
    ``imports``/``libraries``: the real implementations of custom ops the job used (``--import``,
    ``--load-library``), brought into the child before a graph is rebuilt.

    Raises SourceError (exit 4) for a source that is not a trace or a compile id not in it, and
    when no selected compile can be packed; compiles that cannot be packed among others are
    listed in ``skipped``.
    """
    if graph not in GRAPH_CHOICES:
        raise SourceError(f"--graph must be one of {', '.join(GRAPH_CHOICES)}, not {graph!r}")
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    src = Path(source)
    if not src.is_absolute():
        src = cwd / src
    trace = log_reader.read_trace(src)
    chosen = trace.select(compile_ids, all_compiles=all_compiles, rank=rank)
    chosen += job_companions(trace, chosen, rank=rank, explicit=bool(compile_ids) or all_compiles)
    out_dir, single = _output(out, cwd, len(chosen))
    names = _archive_names(chosen, trace)

    warnings = list(trace.warnings)
    jobs, skipped = _jobs(trace, chosen, lambda c: single if single is not None else out_dir / names[id(c)],
                          dict(graph=graph, backend=backend, accuracy=accuracy, replay=replay, cwd=cwd),
                          imports, libraries)
    packed = _packed(chosen, jobs, skipped, progress=progress, keep_log=keep_log)
    if not packed:
        first = skipped[0] if skipped else {"compile_id": "?", "reason": "nothing selected"}
        raise SourceError(
            f"no compile could be packed from {source}: [{first['compile_id']}] {first['reason']}"
            + (f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""),
            "`reproarchive ls` shows what the log holds for each compile")
    job = write_job_archive(packed, trace, out_dir) if single is None else None
    return TracePackResult(source=src, trace_kind=trace.kind, packed=packed, skipped=skipped, warnings=warnings,
                           job=job)


def _jobs(trace: Trace, chosen: list[Compile], target: Callable[[Compile], Path], options: dict[str, Any],
          imports: tuple[str, ...], libraries: tuple[str, ...]) -> tuple[list, list[dict[str, Any]]]:
    """The child's job for each chosen compile, and the compiles the log cannot make one of
    (skipped, with the reason, rather than failing the others)."""
    skipped: list[dict[str, Any]] = []
    jobs: list[tuple[Compile, dict[str, Any]]] = []
    for c in chosen:
        try:
            jobs.append((c, {**_job(trace, c, **options, out=target(c)), "imports": list(imports),
                             "libraries": [str(p) for p in libraries]}))
        except _Unpackable as why:
            skipped.append({"compile_id": c.id, "rank": c.rank, "reason": str(why)})
    return jobs, skipped


def _packed(chosen: list[Compile], jobs: list[tuple[Compile, dict[str, Any]]], skipped: list[dict[str, Any]], *,
            progress, keep_log) -> list[PackReport]:
    """The reports of the jobs the children packed, in the order chosen; a failed one joins
    ``skipped``, unless it was the only compile chosen (then its error is the answer)."""
    done: dict[int, PackReport] = {}
    # Dynamo graphs share one child; each runnable gets its own (it sets torch config for good).
    batches = [[j for j in jobs if j[1]["graph"]["from"] != "fx_graph_runnable"]]
    batches += [[j] for j in jobs if j[1]["graph"]["from"] == "fx_graph_runnable"]
    for batch in filter(None, batches):
        for (c, _), report in zip(batch, _run_batch(batch, progress=progress, keep_log=keep_log)):
            if "error" in report:
                err = error_from(report["error"])
                if len(chosen) == 1:
                    raise err
                skipped.append({"compile_id": c.id, "rank": c.rank, "reason": str(err)})
                continue
            done[id(c)] = dataclasses.replace(PackReport.from_plain(report), frame=c.frame)
    return [done[id(c)] for c in chosen if id(c) in done]


def _run_batch(batch: list[tuple[Compile, dict[str, Any]]], *, progress, keep_log) -> list[dict[str, Any]]:
    """Run one child for the jobs of ``batch``; one report per job (``{"error": ...}`` for a job
    that failed, and for all of them when the child died)."""
    crashes: dict[int, dict[str, str]] = {}  # job -> how the replay of it killed the child
    while True:
        work = Path(tempfile.mkdtemp(prefix="reproarchive-trace-"))
        try:
            paths = []
            for i, (_c, job) in enumerate(batch):
                job_dir = work / f"job{i}"
                job_dir.mkdir()
                if i in crashes:  # pack it with the crash as its failure, without replaying again
                    job = {**job, "replay": False, "crash": crashes[i]}
                (job_dir / "job.json").write_text(json.dumps(job), encoding="utf-8")
                paths.append(str(job_dir / "job.json"))
            try:
                report, died = run_child("reproarchive.sources.trace.rebuild_child", {"job": paths}, env=child_env(),
                                         on_event=progress, keep_log=keep_log)
            except ReproArchiveError as err:
                report, died = {"error": {"class": type(err).__name__, "what": err.what, "hint": err.hint}}, None
        finally:
            shutil.rmtree(work, ignore_errors=True)
        crashed = (died.started or {}) if died is not None else {}
        if crashed.get("stage") == "replay" and crashed.get("job") not in crashes:
            # the graph killed the process that replayed it: that is this compile's failure
            crashes[crashed["job"]] = died.crash_facts()
            continue
        break
    if died is not None:
        labels = ", ".join(c.label for c, _ in batch)
        last = next((ln.strip() for ln in reversed(died.log_tail.splitlines()) if ln.strip()), "no output")
        report = {"error": {"class": "PackError",
                            "what": f"the process rebuilding {labels} {died.reason}: {last[:300]}",
                            "hint": "its own code crashed; `reproarchive --debug pack ...` keeps its log"}}
    results = report.get("results")
    if not isinstance(results, list) or len(results) != len(batch):
        return [{"error": report.get("error") or {"what": "the child process reported nothing"}}] * len(batch)
    return results


class _Unpackable(Exception):
    """This compile cannot be packed from the log (said in one line, the others still are)."""


def _output(out, cwd: Path, count: int) -> tuple[Path, Path | None]:
    """(folder, single archive path or None). ``out`` naming a .tar.zst is one archive."""
    if out is None:
        return cwd, None
    path = Path(out)
    if not path.is_absolute():
        path = cwd / path
    if path.name.endswith(ARCHIVE_SUFFIX) and not path.is_dir():
        if count != 1:
            raise SourceError(f"{count} compiles are selected but -o names one archive ({path.name})",
                              "give -o a folder, or pick one compile with --compile-id")
        if not path.parent.is_dir():
            raise SourceError(f"output folder {path.parent} does not exist", "create it or choose another -o")
        return path.parent, path.resolve()
    if not path.is_dir():
        if path.exists():
            raise SourceError(f"{path} is not a folder", "give -o a folder for the archives")
        path.mkdir(parents=True)
    return path.resolve(), None


def _archive_names(chosen: list[Compile], trace: Trace) -> dict[int, str]:
    """``repro-0_1.tar.zst``, ``repro-rank3-0_1.tar.zst``, ``repro-ca2-0_1.tar.zst``; when two logs
    hold the same rank and id (two processes), the log's own name tells them apart."""
    def stem(c: Compile) -> str:
        parts = ["repro"]
        if c.rank is not None:
            parts.append(f"rank{c.rank}")
        if c.compiled_autograd_id is not None:
            parts.append(f"ca{c.compiled_autograd_id}")
        frame = "-" if c.frame_id is None else c.frame_id
        parts.append(f"{frame}_{'-' if c.frame_compile_id is None else c.frame_compile_id}")
        return "-".join(parts)

    counts: dict[str, int] = {}
    for c in chosen:
        counts[stem(c)] = counts.get(stem(c), 0) + 1
    out = {}
    for c in chosen:
        s = stem(c)
        if counts[s] > 1:
            s += "-" + re.sub(r"[^A-Za-z0-9]+", "_", c.log.stem.replace(log_reader.TRACE_FILE_PREFIX, "")).strip("_")
        out[id(c)] = s + ARCHIVE_SUFFIX
    return out


def _choose_graph(c: Compile, graph: str, problems=(), notes: list[str] | None = None
                  ) -> tuple[str, log_model.TraceEvent]:
    # an empty runnable is no graph: torch 2.15 logs one (payload "") for a compile whose kernel
    # later killed the process
    runnables = [r for r in c.runnables() if r.payload and r.payload.strip() and r.payload_state == "ok"]
    dynamo = c.graph_event if c.graph_event is not None and c.graph_event.payload_state == "ok" else None
    damaged = [e for e in [c.graph_event, *c.runnables()] if e is not None and e.payload_state != "ok"]
    # a failed compile failed on the last graph Inductor took; otherwise the forward (first)
    runnable = (runnables[-1] if c.failed else runnables[0]) if runnables else None
    broken = _not_python(runnable.payload) if runnable is not None else None
    blind = facts.blind_stand_ins(runnable.payload) if graph == "auto" and runnable is not None and dynamo else []
    if blind and broken is None and notes is not None:
        notes.append(f"{c.label}'s graph issues collectives and calls {', '.join(blind)}: packed alone it is not "
                     "replayed, so from PyTorch's fx_graph_runnable a stand-in for the op would have no call to "
                     "answer from; the Dynamo graph is packed instead, whose log gives the op's output shapes")
    if graph in ("auto", "aot") and runnable is not None and broken is None and not blind:
        return "fx_graph_runnable", runnable
    if broken is not None and (graph == "aot" or dynamo is None):
        raise _Unpackable(f"PyTorch's fx_graph_runnable for it is not valid Python ({broken}); "
                          + ("pack the Dynamo graph with --graph dynamo" if dynamo is not None
                             else "and the log holds no Dynamo graph"))
    if broken is not None and notes is not None:
        notes.append(f"PyTorch's fx_graph_runnable for {c.label} is not valid Python ({broken}: a graph with "
                     "higher-order ops prints its subgraphs so); the Dynamo graph is packed instead, replayed "
                     "with the backend the log names")
    if graph == "aot":
        raise _Unpackable("the log holds no usable fx_graph_runnable for it (Inductor did not compile it)"
                          + (" or its payload is damaged" if damaged else ""))
    if dynamo is not None:
        return "dynamo_output_graph", dynamo
    if damaged:
        raise _Unpackable(f"its graph payload is damaged (MD5 mismatch at line {damaged[0].lineno})")
    unreadable = [p for p in problems if "JSON" in p.what or "envelope" in p.what]
    if unreadable:  # its graph's envelope may be among the lines that could not be read
        raise _Unpackable(f"no readable graph for it: {unreadable[0]}")
    reason = c.fail_reason.splitlines()[0][:200] if c.fail_reason else ""
    raise _Unpackable("Dynamo logged no graph for it" + (f" (it failed before making one: {reason})" if reason else ""))


def _not_python(text: str) -> str | None:
    """Why ``text`` does not parse as Python (``line 63: invalid syntax``), or None when it does:
    PyTorch writes ``self.true_graph_0 = <lambda>()`` into the runnable of a graph whose
    higher-order ops take subgraphs."""
    try:
        ast.parse(text)
    except SyntaxError as err:
        return f"line {err.lineno}: {err.msg}"
    except ValueError as err:  # a NUL byte
        return str(err)
    return None


def _debug_runnables(c: Compile) -> list[Path]:
    """TORCH_COMPILE_DEBUG copies of runnables written by the same process as the log (a
    ``run_*-pid_<pid>`` folder next to the log or next to its folder)."""
    log_dir = c.log.parent  # for tlparse output: the folder holding raw.jsonl
    bases = {log_dir, log_dir.parent}
    found = []
    for base in bases:
        for pattern in _DEBUG_RUNNABLES:
            found.extend(base.glob(pattern))
    return sorted(set(found))


def _runnable_key(text: str) -> str:
    body = text.split("class Repro", 1)[-1].split("load_args._version", 1)[0]
    return _STORAGE_CALL.sub("reader.storage(?", body)


def _real_data_script(c: Compile, runnable: log_model.TraceEvent, warnings: list[str]) -> str | None:
    """The TORCH_COMPILE_DEBUG_SAVE_REAL copy of this runnable, when exactly one matches: same
    graph and input layout, written by the same process. None (with a note) when ambiguous."""
    candidates = _debug_runnables(c)
    if not candidates or runnable.payload is None:
        return None
    pid = runnable.pid
    key = _runnable_key(runnable.payload)
    matches = []
    for path in candidates:
        run_dir = path.parent.parent.parent.name
        if pid is not None and not run_dir.endswith(f"-pid_{pid}"):
            continue
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if "save_dir=None" not in text and _runnable_key(text) == key:
            matches.append((path, tuple(_STORAGE_CALL.findall(text))))
    if len({data for _, data in matches}) > 1:
        warnings.append(f"{len(matches)} TORCH_COMPILE_DEBUG runnables next to the log match {c.label} with different "
                        "data; none is used (inputs stay absent)")
        return None
    return str(matches[0][0]) if matches else None


def _backend_of(trace: Trace, c: Compile, graph_from: str, backend: str | None) -> tuple[str | None, str]:
    """(the backend the archive records, where that came from): ``--backend``, else the log's
    (a runnable is Inductor's input)."""
    logged_backend, origin = facts.backend_from_log(c, trace)
    if graph_from == "fx_graph_runnable":
        logged_backend, origin = "inductor", "fx_graph_runnable is Inductor's input"
    if backend and logged_backend and backend != logged_backend:
        origin = f"--backend (the log says {logged_backend})"
    elif backend:
        origin = "--backend"
    return backend or logged_backend, origin


def _real_data(c: Compile, graph_from: str, event: log_model.TraceEvent, warnings: list[str]) -> str | None:
    """The TORCH_COMPILE_DEBUG_SAVE_REAL runnable whose data the archive takes, if any; where the
    runnable is set aside, a warning that the data beside the log is not used."""
    if graph_from == "fx_graph_runnable":
        return _real_data_script(c, event, warnings)
    if c.runnables() and _debug_runnables(c):
        warnings.append("TORCH_COMPILE_DEBUG's runnables (with the data TORCH_COMPILE_DEBUG_SAVE_REAL kept) lie "
                        "next to the log, but PyTorch's runnable is not used for this compile: the Dynamo graph's "
                        "inputs stay absent")
    return None


def _job(trace: Trace, c: Compile, *, graph: str, backend: str | None, accuracy: bool, replay: bool, out: Path,
         cwd: Path) -> dict[str, Any]:
    """Everything the child needs for one compile, as plain JSON (the child never reads the log)."""
    warnings: list[str] = []
    graph_from, event = _choose_graph(c, graph, trace.problems, warnings)
    chosen_backend, backend_origin = _backend_of(trace, c, graph_from, backend)
    failure, diagnostics = facts.failure_record(c, backend=chosen_backend)
    real_script = _real_data(c, graph_from, event, warnings)
    config_values, config_notes = facts.config_values(c)
    warnings += config_notes
    if chosen_backend is None:
        warnings.append("the log does not name the backend (it names it only when it fails): pass --backend "
                        "to record it; `run --backend NAME` works too")
    source = _trace_source(trace, c, graph_from, event, backend_origin if chosen_backend else "unknown",
                           diagnostics, accuracy, real_script)
    runnable_event = event if graph_from == "fx_graph_runnable" else None
    scrub = {str(cwd.resolve()): "<cwd>",
             str(trace.root.resolve() if trace.root.is_dir() else trace.root.resolve().parent): "<trace>"}
    scrub.update(facts.job_paths(trace, c))
    return {
        "compile": {"id": c.id, "rank": c.rank, "label": c.label},
        "graph": {"from": graph_from, "code": event.payload, "real_data_script": real_script,
                  "annotated": _annotated_graph(c), "printed": _printed_graphs(c)},
        "describe": facts.describe_inputs(c),
        "symbols": facts.symbols(c),
        "config_values": config_values,
        "system": facts.system_record(trace, c, runnable_event.payload if runnable_event else None),
        "failure": to_plain(failure) if failure is not None else None,
        "backend": chosen_backend,
        "accuracy": accuracy,
        "replay": replay,
        "source": to_plain(source),
        "scrub": scrub,
        "cwd_prefixes": [str(cwd.resolve())],
        "out": str(out),
        "warnings": warnings,
    }


def _trace_source(trace: Trace, c: Compile, graph_from: str, event: log_model.TraceEvent, backend_origin: str,
                  diagnostics: Any, accuracy: bool, real_script: str | None) -> TraceSource:
    """Where in the log the compile's archive came from, so a reader can go back to it."""
    pages = _tlparse_pages(c)
    if pages is not None and event.page:
        pages[graph_from] = event.page  # the page of the payload packed, not merely the last one
    used = ["dynamo_output_graph", "fx_graph_runnable", "dynamo_error", "compilation_metrics"]
    return TraceSource(
        compile_id=c.id,
        attempt=c.attempt,
        rank=c.rank,
        frame=c.frame,
        user_stack=facts.user_stack(trace, c),
        log=trace.display_log(c),
        trace_format=trace.kind,
        log_lines={**facts.events_lines(c, used), graph_from: event.lineno},
        tlparse={"directory": c.tlparse_directory, "pages": pages},
        graph_from=graph_from,
        backend_origin=backend_origin,
        status=c.status,
        diagnostics=diagnostics,
        metrics={k: c.metrics.get(k) for k in ("graph_op_count", "graph_node_count", "graph_input_count",
                                                "guard_count", "entire_frame_compile_time_s",
                                                "backend_compile_time_s", "fail_type")
                 if c.metrics.get(k) is not None},
        cache=c.cache,
        symbols=facts.symbols(c),
        accuracy_from="--accuracy" if accuracy else None,
        real_data_from=("a TORCH_COMPILE_DEBUG_SAVE_REAL copy of fx_graph_runnable next to the log"
                        if real_script else None),
        **{k: tuple(v) for k, v in facts.graph_breaks_and_recompiles(c).items()},
    )


def _annotated_graph(c: Compile) -> str | None:
    """The compile's ATen graph code with the shape of every value (AOT's inference or forward
    graph): where the outputs of an operator the job's library defined are read from."""
    for kind in ("aot_inference_graph", "aot_forward_graph"):
        event = c.last(kind)
        if event is not None and event.payload:
            return event.payload
    return None


def _printed_graphs(c: Compile) -> list[str]:
    """The compile's graphs as the log prints them with their source comments, that Inductor's
    ``fx_graph_runnable`` may be another print of (``printed_stacks``): the graph before its
    post-grad passes, then the AOT graph."""
    return [event.payload for kind in ("before_post_grad_graph", "aot_inference_graph", "aot_forward_graph")
            if (event := c.last(kind)) is not None and event.payload]


def _tlparse_pages(c: Compile) -> dict[str, str] | None:
    """tlparse's page for each artifact of the compile, when read from tlparse's output (a raw
    log does not say: tlparse numbers its pages as it writes them)."""
    if c.tlparse_root is None:
        return None
    pages: dict[str, str] = {}
    for ev in c.events:
        if ev.page:
            pages[ev.kind] = ev.page  # the last one of each kind, like the graph we take
    return pages
