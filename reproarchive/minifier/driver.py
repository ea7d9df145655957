"""``run --minify``: shrink an archived failure into a new, smaller archive.

This joins three pieces that know nothing of each other: the archive (load / pack), replay
(which decides "reproduced" by the strict signature recorded at capture time) and the graph
minifier (which only asks a yes/no predicate). The predicate is "replay says *reproduced*",
never "it raised something", so the search cannot drift to a different, smaller failure.

Every accepted step is written to the output archive (atomically), so a crash or Ctrl-C loses
nothing; the final write adds the statistics. With ``isolate`` every candidate is replayed in a
warm worker process (``replay.isolation.WorkerPool``), so a compiler that segfaults on some
candidate cannot take the minifier down, and ``jobs`` workers judge candidates concurrently.

Accuracy modes, as PyTorch's minifier has them: by default only floating outputs (and
gradients) are compared and the search cuts from the inputs, keeping the recorded outputs --
it ends at the op that makes the *outputs* wrong; ``strict_accuracy`` also requires
non-floating outputs (bool masks, indices) to be equal and truncates from the outputs -- it
ends at the *first* op whose value diverges at all.

What the minified archive says about its inputs (``minify.inputs``, one entry per input): the
origin (an input of the original archive, or the recorded eager value of one of its nodes),
the original inputs it was computed from, what an input move did to it (``values``:
``recorded``, ``cropped``, ``cast``, ``zeros``, ``ones``), whether it was computed from data
the original archive did not have (``from_absent``) and, summing up, ``real``: whether the
values are (a block of) the original data. Only this module reads archive records.

Dynamic shapes: each candidate, and the minified archive, carries the parent's shape policy
for the inputs it kept (``codec.shapes.restricted``: matched by placeholder name), so a
recorded symbolic input stays symbolic, and replay judges each candidate with it; a value cut
from inside the graph is a static input, as PyTorch's minifier makes it.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from reproarchive.archive.loading import Repro
from reproarchive.archive.packing import as_records, pack
from reproarchive.child import temp_folder
from reproarchive.codec.graphs import readable_code
from reproarchive.codec.inner_shapes import cut_from, inner_dims
from reproarchive.context.failure import faults_the_device
from reproarchive.errors import DeviceUnavailableError, NotReproducedError, ReproArchiveError
from reproarchive.minifier import EagerRunError, NotFailingError, minify_with_stats
from reproarchive.minifier.job_minify import minify_job
from reproarchive.minifier.minified_records import labelled, minified_records, not_original_positions
from reproarchive.minifier.report import MinifyReport, output_path
from reproarchive.replay.containment import contained
from reproarchive.replay.isolation import WorkerPool
from reproarchive.replay.outcome import REPRODUCED
from reproarchive.replay.prepared import prepared
from reproarchive.replay.runner import replay_repro
from reproarchive.replay.settings import ReplaySettings


def _replay_predicate(repro: Repro, settings: ReplaySettings):
    """Judged by ``replay_repro`` with ``settings`` (backend and accuracy chosen), as ``run``
    judges the archive (the differences report, which takes fresh snapshots, is left out: it
    does not change a verdict)."""

    def fails(gm, inputs) -> bool:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outcome = replay_repro(repro, settings, gm, inputs,
                                   report_differences=False)
        return reproduced_as_recorded(outcome)

    return fails


def reproduced_as_recorded(outcome) -> bool:
    """Whether a candidate reproduces the recorded failure under the recorded specialization: a
    candidate whose shape guards at backend entry are not the recorded ones (a symbolic size
    shrunk to 1 is specialized away) compiled another program than the one that failed, and is
    not taken however it ended."""
    shapes = outcome.shapes or {}
    other = shapes.get("guards_compared_at") == "backend entry" and shapes.get("guards_match") is False
    return outcome.status == REPRODUCED and not other


def _isolated_predicate(repro: Repro, pool, settings: ReplaySettings, *, workdir: Path):
    """Thread-safe: each call writes its own candidate archive and waits for a free worker."""

    counter = itertools.count(1)
    # the candidate holds already-mapped inputs and graph: map nothing again
    candidate_settings = settings.replace(device=None)

    def fails(gm, inputs) -> bool:
        candidate = workdir / f"candidate-{next(counter)}.tar.zst"
        _write(candidate, repro, gm, inputs, stats=None)
        try:
            outcome = pool.run(candidate, candidate_settings)
        finally:
            candidate.unlink(missing_ok=True)
        return reproduced_as_recorded(outcome)

    return fails


def _job_only_options(repeat: int) -> None:
    if repeat > 1:
        raise ReproArchiveError("judging each candidate by several replays is not built for a multi-rank job",
                                "minify the job with one replay per candidate (leave the repeat out)")


def _any_of(fails, repeat: int):
    """``fails`` asked up to ``repeat`` times, the first failure ending it: a flaky failure
    shows in some replays only, and a candidate that passed once by luck would otherwise be
    thrown away with the op that fails (or the original called not reproducing)."""
    if repeat <= 1:
        return fails

    def any_fails(gm, inputs) -> bool:
        return any(fails(gm, inputs) for _ in range(repeat))

    return any_fails


def _write(path: Path, repro: Repro, gm, inputs, *, stats: dict | None) -> None:
    """A candidate (``stats`` None) or the result: ``minified_records``, the parent's custom-op
    calls and its generator states: every candidate is judged from them (``replay_repro``), so
    the result keeps them."""
    minify = as_records({"minify": stats}).minify if stats is not None else None
    only = repro.compile_only  # an absent GPU's tensors are on meta here, and are that GPU's in the archive
    pack(gm, inputs, path, records=minified_records(repro.records, repro.digest, repro.gm, gm, inputs, minify,
                                                   inner_dims(repro.records.shapes, cut_from(gm, repro.gm),
                                                              list(repro.args))),
         custom_ops=repro.custom_ops, rng_states=repro.rng_states,
         device_names={"meta": only.absent[0]} if only is not None and only.absent else None)


def _labelled(stats: dict[str, Any], repro: Repro) -> dict[str, Any]:
    """``stats`` with each input's provenance completed by what the archive knows (``labelled``)."""
    generated = not_original_positions(repro.fidelity, repro.records)
    return {**stats, "inputs": labelled(stats.get("inputs") or [], generated)}


def auto_jobs() -> int:
    """Workers for an isolated minify: the cores nobody else is using (at least one, at most 4)."""
    cores = os.cpu_count() or 1
    try:
        busy = int(os.getloadavg()[0] + 0.5)
    except OSError:
        busy = 0
    return max(1, min(4, cores - busy))


def minify_archive(
    path: str | os.PathLike,
    output: str | os.PathLike,
    settings: ReplaySettings | None = None,
    *,
    max_time: float | None = None,
    isolate: bool | None = None,
    jobs: int | None = None,
    shrink_inputs: bool = True,
    progress: Callable[[Any], None] | None = None,
    timeout: float | None = None,
    repeat: int = 1,
    **options: Any,
) -> MinifyReport:
    """Shrink the archive at ``path`` while its recorded failure keeps reproducing; write ``output``.

    ``settings`` judge every candidate (or ``options``, its fields: ``backend``, ``accuracy``,
    ``strict_accuracy`` (here False by default; see the module docstring), ``device``, ...).
    ``isolate`` (default: only when the recorded failure is a crash) judges candidates in warm
    worker processes, ``jobs`` of them at once (default ``auto_jobs()``; in-process judging is
    always one at a time). ``shrink_inputs`` also shrinks the smallest graph's inputs (shapes,
    dtypes, zeros/ones), labelled as such. ``repeat``: for a flaky failure, each candidate (and
    the original) fails when one of up to ``repeat`` replays reproduces (``_any_of``).

    A multi-rank job archive is shrunk the same way on every rank, each candidate judged by
    launching the job (``job_minify``; ``timeout``: each collective's, default 60 s; ``isolate``,
    ``jobs`` and ``shrink_inputs`` are one graph's). A job compiled only (its GPU absent here,
    its failure a compile error) needs no peer: its failing rank's graph is shrunk as one graph,
    compiled in this process with the job's groups on a fake process group (``_failing_rank``).
    """
    settings = ReplaySettings.given(settings, options, strict_accuracy=False)
    ready = prepared(path, settings)  # the prologue of every replaying command: 125 as run answers it
    if ready.is_job and ready.compile_only is None:
        _job_only_options(repeat)
        return minify_job(ready, output, timeout_s=timeout or 60.0, max_time=max_time, progress=progress)
    if timeout is not None and not ready.is_job:
        raise ReproArchiveError("a collective timeout applies to a multi-rank job archive only",
                                "leave --timeout out for an archive of one process")
    with _failing_rank(ready, isolate):
        return _minified_graph(ready, path, output, max_time=max_time, isolate=False if ready.is_job else isolate,
                               jobs=jobs, shrink_inputs=shrink_inputs, progress=progress, repeat=repeat)


def _failing_rank(ready: Any, isolate: bool | None) -> Any:
    """Where a compile-only job's failing rank (the archive's own graph: ``load`` gives it) is
    shrunk: in this process, joined as that rank (``Prepared.as_its_rank``), so never in
    isolated workers."""
    if ready.is_job and isolate:
        raise ReproArchiveError("a job compiled only is minified in this process (its groups are joined here)",
                                "leave --isolate out")
    return ready.as_its_rank()


def _minified_graph(ready: Any, path, output, *, max_time: float | None, isolate: bool | None, jobs: int | None,
                    shrink_inputs: bool, progress: Callable[[Any], None] | None, repeat: int) -> MinifyReport:
    """``minify_archive`` of one graph (the archive's own) under the ``ready`` archive's settings."""
    output = output_path(path, output)
    repro = ready.load()
    stage = _recorded_stage(repro)
    # a crash, or a fault on the device, ends what the process can do: each such candidate in a worker of its own
    ends_the_process = stage == "crash" or faults_the_device(repro.records.failure)
    isolate, jobs = _workers(isolate, jobs, ends_the_process)
    chosen = ready.settings
    started = time.monotonic()
    pool = None
    with tempfile.TemporaryDirectory(prefix="reproarchive-minify-", dir=temp_folder()) as tmp:
        try:
            pool, fails = _judge(repro, chosen, isolate=isolate, jobs=jobs, crash=ends_the_process,
                                 workdir=Path(tmp))
            fails = _any_of(fails, repeat)
            result = _searched(path, output, repro, chosen, fails, stage, jobs=jobs, max_time=max_time,
                               progress=progress, shrink_inputs=shrink_inputs)
        finally:
            if pool is not None:
                pool.close()
    stats = _result_stats(result, repro, chosen, wall_s=round(time.monotonic() - started, 3), isolate=isolate,
                          workers_started=pool.started if pool is not None else 0)
    _write(output, repro, result.gm, result.inputs, stats=stats)
    return MinifyReport(archive=str(path), output=str(output), parent=repro.digest,
                        status="minified" if result.stats.accepted > 0 else "unchanged", stats=stats,
                        code=readable_code(result.gm), input_origins=result.input_origins)


def _recorded_stage(repro: Repro) -> str:
    """The stage of the recorded failure: the signature every candidate must reproduce. An
    archive without one has nothing to minify against; one whose failure is unknown says why it
    is (the pack's replay could not learn it: not replayed, a custom op it could not run, a
    graph that fails in eager mode too), and that reason is the user's next step."""
    failure = repro.records.failure
    if failure is None:
        raise ReproArchiveError("the archive records no failure to minify against",
                                "minify an archive of a failure (`reproarchive inspect` shows what it records)")
    if failure.stage == "unknown":
        why = (failure.message.strip().splitlines() or [""])[0][:300]
        raise ReproArchiveError(
            "the archive's failure is unknown, so there is no signature to minify against"
            + (f" ({why})" if why else ""),
            "pack it again where its replay can learn the failure (without --no-replay; --import MODULE for a custom "
            "op it calls); a graph that fails in eager mode too is not the compiler's to minify")
    return failure.stage


def _workers(isolate: bool | None, jobs: int | None, ends_the_process: bool) -> tuple[bool, int]:
    """(whether candidates are judged in worker processes, how many at once): isolated by
    default only for a failure that ends what a process can do (a crash would end this one;
    after a fault on the device, every later use of it in the process fails, so every later
    candidate would look as if it reproduced); in-process judging is always one at a time."""
    if isolate is None:
        isolate = ends_the_process
    return isolate, (auto_jobs() if jobs is None else max(1, int(jobs))) if isolate else 1


def _judge(repro: Repro, chosen: ReplaySettings, *, isolate: bool, jobs: int, crash: bool, workdir: Path):
    """(the worker pool or None, the predicate that judges a candidate): in warm worker
    processes when ``isolate`` (the caller closes the pool), else in this process."""
    if not isolate:
        return None, _replay_predicate(repro, chosen)

    # a crash kills the worker of every failing candidate: keep one warm in reserve
    pool = WorkerPool(repro.records.environment, size=jobs, spares=1 if crash else 0,
                      warmup={"backend": chosen.backend, "source_kind": repro.records.graph_kind})
    return pool, _isolated_predicate(repro, pool, chosen, workdir=workdir)


def _searched(path, output: Path, repro: Repro, chosen: ReplaySettings, fails, stage: str, *, jobs: int,
              max_time: float | None, progress, shrink_inputs: bool):
    """The search (``minify_with_stats``), each accepted step checkpointed to ``output``; a
    search that cannot start (the original does not reproduce, or does not run in eager mode)
    is reported as NotReproducedError with a hint at what to do instead."""

    def checkpoint(gm, inputs, stats) -> None:
        _write(output, repro, gm, inputs,
               stats=_labelled({**stats.as_dict(), "stop_reason": "checkpoint"}, repro))

    judge_accuracy, strict_accuracy = chosen.accuracy, chosen.strict_accuracy
    localize = "truncate" if judge_accuracy and strict_accuracy else "auto"
    try:
        # the eager recording runs the graph here too: its thread state and RNG are put back
        with contained(outputs=False):
            return minify_with_stats(repro.gm, repro.args, fails, max_time=max_time, progress=progress,
                                     on_accept=checkpoint, localize=localize, shrink_inputs=shrink_inputs,
                                     jobs=jobs)
    except NotFailingError:
        hint = "run `reproarchive run` on it to see what happens instead"
        if judge_accuracy and not strict_accuracy and stage == "accuracy" and \
                _replay_predicate(repro, chosen.replace(strict_accuracy=True))(repro.gm, list(repro.args)):
            hint = ("only non-floating outputs (bool masks, indices) differ here; "
                    "minify with --strict-accuracy to count them")
        raise NotReproducedError(
            f"{path} does not reproduce its recorded failure here, so it cannot be minified", hint,
        ) from None
    except EagerRunError as exc:
        if repro.compile_only is not None and repro.compile_only.absent:  # its inputs hold shapes, not data
            cause = exc.__cause__ or exc
            said = f"{type(cause).__name__}: {(str(cause).splitlines() or [''])[0][:160]}"
            raise DeviceUnavailableError(
                f"the graph is compiled only here (for {', '.join(repro.compile_only.absent)}, which this machine "
                "does not have), and the minifier cuts it after one run on fake tensors that hold shapes and no "
                f"data, where it cannot run ({said})", "minify it on a machine with the device") from None
        raise NotReproducedError(
            f"the archived graph does not run in eager mode on its inputs ({str(exc)[:160]})",
            "the failure is not the compiler's; `reproarchive run --backend eager` shows it",
        ) from None


def _result_stats(result, repro: Repro, chosen: ReplaySettings, *, wall_s: float, isolate: bool,
                  workers_started: int) -> dict[str, Any]:
    """The statistics the minified archive records (``minify``): the search's, with how it was
    run and each input's provenance (``_labelled``)."""
    stats = result.stats.as_dict()
    stats["wall_s"] = wall_s
    stats["isolate"] = isolate
    judge_accuracy = chosen.accuracy
    stats["accuracy_mode"] = ("strict" if chosen.strict_accuracy else "default") if judge_accuracy else None
    stats["workers_started"] = workers_started
    stats["input_origins"] = result.input_origins
    return _labelled(stats, repro)
