"""``run`` of a multi-rank job archive: every rank launched, one rank against a fake process
group, or every rank's reference in one process.

* ``run_job``: the ranks through torch.distributed's launcher (``launch``), gloo on the CPU,
  NCCL on CUDA, every recorded group recreated under its recorded name (``ranks``), one verdict.
* ``rank=r``: rank r alone, in a child process, against PyTorch's fake process group (its
  collectives return at once with made-up values): PyTorch's own way for failures in the
  compiler, which never needs another rank. A verdict about values from it would be made up,
  so it says so.
* ``single_process=True``: ``local_job`` runs every rank's graph in this one process under
  ``LocalTensorMode`` (real collective arithmetic across simulated ranks), then judges each rank
  with its collectives replaced by those per-rank values: an accuracy verdict without N
  processes.
* compile only (``replay.compile_only``: the recorded GPU absent and the failure a compile
  error, or ``--compile-only``): each rank's graph compiled alone in a child, its groups on a
  fake process group, nothing launched; a pass is ``EXIT_COMPILED_ONLY``, never 0.

The rank worker prepares and loads its own rank as ``run`` does one graph
(``rank_worker.loaded``); the parent reads only the index.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from reproarchive.archive.job_archive import rank_inputs
from reproarchive.archive.job_report import first_divergence
from reproarchive.child import python_path
from reproarchive.codec.devices import DevicePlan
from reproarchive.context.system import torch_here, torch_version
from reproarchive.errors import ReproArchiveError
from reproarchive.format.schema import FailureRecord, TensorValue
from reproarchive.replay import launch as _launch
from reproarchive.replay.local_job import run_local
from reproarchive.replay.outcome import EXIT_COMPILED_ONLY
from reproarchive.replay.prepared import prepared
from reproarchive.replay.runner import _moved_warning
from reproarchive.replay.settings import ReplaySettings

#: The collective timeout a replay gives each rank unless told otherwise (seconds).
DEFAULT_TIMEOUT_S = 60.0


def recorded_failures(job: Any) -> dict[int, FailureRecord | None]:
    """Each recorded rank's failure (None: it did not fail, or its part was taken while it ran)."""
    return {r.rank: (r.outcome.failure if r.outcome is not None else None) for r in job.ranks}


def divergence_of(job: Any) -> str | None:
    """Where the recorded ranks' collectives first stop matching (None: they match)."""

    found = first_divergence(job)
    return found.summary if found is not None else None


def node_ranks(world_size: int, passthrough: Sequence[str]) -> list[int]:
    """The global ranks this launcher starts: all of them, or with ``--node-rank K
    --nproc-per-node P`` the K-th block of P (how torchrun numbers ranks on a static layout)."""
    options = _options(passthrough)
    if "--node-rank" not in options:
        return list(range(world_size))
    node, per = int(options["--node-rank"]), int(options.get("--nproc-per-node", world_size))
    return [r for r in range(node * per, (node + 1) * per) if r < world_size]


def _options(passthrough: Sequence[str]) -> dict[str, str]:
    found, items = {}, list(passthrough)
    for i, item in enumerate(items):
        name, sep, value = item.partition("=")
        name = name.replace("_", "-")
        if name.startswith("--"):
            found[name] = value if sep else (items[i + 1] if i + 1 < len(items) else "")
    return found


def run_job(path: str | os.PathLike, settings: ReplaySettings, *, rank: int | None = None,
            single_process: bool = False, timeout_s: float | None = None, launcher: Sequence[str] = (),
            keep: str | os.PathLike | None = None, reader: Any = None) -> _launch.JobOutcome:
    """Replay the job archive at ``path``; see the module docstring for the three ways.

    ``timeout_s``: each collective's timeout (default ``DEFAULT_TIMEOUT_S``; the whole launch is
    bounded by twice that plus the launcher's start). ``launcher``: torchrun's rendezvous options
    for a job over several machines (``--nnodes 2 --node-rank 0 --rdzv-endpoint HOST:PORT
    --nproc-per-node P``); this launch then reports the ranks it started. ``keep``: a folder for
    the ranks' results and logs. Raises ReproArchiveError (2) for an archive without a job,
    BackendUnavailableError (125) when the backend is missing here.
    """

    # a device or backend this machine lacks: 125 before launching anything (launched ranks prepare their
    # own; --single-process replays here)
    ready = prepared(path, settings, here=single_process, reader=reader)  # ``reader``: the caller's, open
    if not ready.is_job:
        raise ReproArchiveError(f"{path} holds one process's graph, not a multi-rank job",
                                "replay it with reproarchive run without --rank / --single-process")
    job = ready.index.job
    if rank is None and not single_process and job.on_fake_group:
        rank = recorded_alone(job)  # as recorded: one process, its rank, PyTorch's fake process group
    _check_ranks(path, job, rank)
    devices = ready.plan
    timeout = float(timeout_s or DEFAULT_TIMEOUT_S)
    if ready.compile_only is not None:
        outcome = _compiled_only(path, settings, ready, rank, timeout, keep, single_process=single_process,
                                 launcher=launcher)
    elif single_process:
        outcome = run_local(ready)
    elif rank is not None:
        outcome = _run_fake_rank(path, settings, job, rank, timeout, keep)
    else:
        request = {"archive": os.fspath(os.path.abspath(path)), "settings": settings.to_plain(), "timeout_s": timeout}
        plan = _launch.LaunchPlan(request, _launch.launcher_options(job.world_size, launcher), timeout,
                                  warm=_launch.on_cpu_only(devices.targets))
        outcome = _launch.run_launched(plan, world_size=job.world_size, ranks=node_ranks(job.world_size, launcher),
                                       recorded=recorded_failures(job), recorded_rank=job.failing_rank,
                                       keep=keep, divergence=divergence_of(job))
    outcome.archive = os.fspath(path)
    outcome.torch, outcome.recorded_torch = torch_here(), torch_version(ready.records.system)
    if devices.moved and ready.compile_only is None:
        outcome.warnings.extend(_moved_warning(devices))
        for r in outcome.ranks:
            if r.outcome is not None:
                r.outcome.recorded_device, r.outcome.same_device_type = devices.recorded, False
    return outcome


def _compile_key(index: Any, rank: Any) -> tuple:
    """What a rank's compile-only replay depends on: its graph, its records, what it is judged
    against, and its inputs as a compile sees them (tensors by their geometry and device, the
    bytes being no part of it; everything else by value). Ranks with equal keys compile alike."""
    storages = index.storages

    def seen(value: Any) -> Any:
        if isinstance(value, TensorValue):
            return dataclasses.replace(value, storage=0), storages[value.storage].device
        return value

    failure = rank.outcome.failure if rank.outcome is not None else None
    return (rank.graph, rank.records, repr(failure), repr([seen(v) for v in rank_inputs(index, rank)]))


def recorded_alone(job: Any) -> int | None:
    """The rank a job recorded on the fake process group played (its failing rank, else its
    lowest recorded), whose replay alone against that group is the recorded condition."""
    recorded = sorted(r.rank for r in job.ranks)
    return job.failing_rank if job.failing_rank in recorded else (recorded[0] if recorded else None)


def _check_ranks(path, job: Any, rank: int | None) -> None:
    """A job replays only with every rank's graph: an archive with fewer ranks than its world
    (a rank's part, written while the job ran, before the parts were merged) replays one of its
    ranks alone (``--rank``), never the job."""
    recorded = sorted(r.rank for r in job.ranks)
    if rank is not None:
        if 0 <= rank < job.world_size and rank not in recorded:
            raise ReproArchiveError(f"{path} records no rank {rank} (it has rank {', '.join(map(str, recorded))} of "
                                    f"{job.world_size})", f"replay one of its ranks: --rank {recorded[0]}")
        return
    if len(recorded) < job.world_size:
        ranks = ", ".join(map(str, recorded))
        raise ReproArchiveError(
            f"{path} holds rank {ranks} of a {job.world_size}-rank job, not the job: a part that rank wrote while the "
            "job ran",
            "pack the folder of the job's parts into the job archive (reproarchive pack FOLDER), or replay this rank "
            f"alone against a fake process group (reproarchive run --rank {recorded[0]} {path})")


def _run_fake_rank(path, settings: ReplaySettings, job: Any, rank: int, timeout: float,
                   keep: str | os.PathLike | None) -> _launch.JobOutcome:
    """Rank ``rank`` alone in a child process, against the fake process group."""

    start = time.monotonic()
    outcomes = _alone_in_a_child(path, settings, job, rank, timeout, keep)
    status, code, _ = _launch.job_verdict(outcomes, rank)
    return _launch.JobOutcome(status=status, exit_code=code, rank=rank, world_size=job.world_size, ranks=outcomes,
                              recorded_rank=job.failing_rank, wall_s=round(time.monotonic() - start, 3),
                              timeout_s=timeout, warnings=[_alone_warning(job, rank)])


def _alone_in_a_child(path, settings: ReplaySettings, job: Any, rank: int, timeout: float,
                      keep: str | os.PathLike | None, *, plan: DevicePlan | None = None) -> list[_launch.RankOutcome]:
    """The outcome of rank ``rank`` replayed alone in a child process against the fake process
    group (``plan``: compiled only, under that device plan)."""

    if not 0 <= rank < job.world_size:
        raise ReproArchiveError(f"--rank {rank} is not a rank of this job (ranks 0 to {job.world_size - 1})",
                                f"pass a rank below {job.world_size}")
    with tempfile.TemporaryDirectory(prefix="reproarchive-rank-") as tmp:
        folder = Path(keep) / f"rank-{rank}" if keep is not None and plan is not None else Path(keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "request.json").write_text(json.dumps({
            "archive": os.fspath(os.path.abspath(path)), "settings": settings.to_plain(), "timeout_s": timeout,
            "fake_rank": rank, "world_size": job.world_size, "fake_when_recorded": job.on_fake_group,
            **({"mode": "compile", "plan": plan.to_plain()} if plan is not None else {})}))
        env = dict(os.environ, PYTHONPATH=python_path(), PYTHONFAULTHANDLER="1")
        proc = subprocess.run([sys.executable, "-m", "reproarchive.replay.rank_worker", str(folder)], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=timeout * 2 + _launch.STARTUP_ALLOWANCE_S, check=False)
        failures = {}
        if proc.returncode < 0:
            failures[rank] = {"exitcode": proc.returncode, "signal": signal.Signals(-proc.returncode).name}
        return _launch.rank_outcomes(folder, [rank], recorded_failures(job), failures, False)


def _compiled_only(path, settings: ReplaySettings, ready: Any, rank: int | None, timeout: float,
                   keep: str | os.PathLike | None, *, single_process: bool,
                   launcher: Sequence[str]) -> _launch.JobOutcome:
    """Every recorded rank's graph (or rank ``rank``'s) compiled for its recorded devices and
    launched nowhere (``replay.compile_only``): each rank in a child of its own, its collectives'
    groups registered on a fake process group, judged against its own recorded failure; the job's
    verdict by the rule of a launched job, and a pass is ``EXIT_COMPILED_ONLY``, never 0."""

    if single_process or launcher:
        raise ReproArchiveError(f"{'--single-process' if single_process else 'a launcher'} runs the job's graphs, and "
                                "this replay compiles them only (for devices this machine does not have, or as "
                                "--compile-only asks)", "drop one of the two")
    job, start = ready.index.job, time.monotonic()
    alike: dict[Any, list[int]] = {}  # ranks whose compiles are one: each distinct one compiled once
    for r in sorted(job.ranks, key=lambda r: r.rank):
        if rank is None or r.rank == rank:
            alike.setdefault(_compile_key(ready.index, r), []).append(r.rank)
    outcomes = []
    for first, *rest in alike.values():
        (done,) = _alone_in_a_child(path, settings, job, first, timeout, keep, plan=ready.plan)
        outcomes += [done, *(dataclasses.replace(done, rank=r, note=f"compiled once with rank {first}, whose graph, "
                                                 "inputs' shapes and records are this rank's") for r in rest)]
    outcomes.sort(key=lambda o: o.rank)
    status, code, about = _launch.job_verdict(outcomes, job.failing_rank if rank is None else rank)
    return _launch.JobOutcome(
        status=status, exit_code=EXIT_COMPILED_ONLY if status == "passed" else code, rank=about,
        world_size=job.world_size, ranks=outcomes, recorded_rank=job.failing_rank,
        wall_s=round(time.monotonic() - start, 3), compile_only=ready.compile_only.said(),
        warnings=["each rank's graph was compiled alone, its collectives' groups on a fake process group: nothing "
                  "was launched, so only a failure of the compile is evidence"])


def _alone_warning(job: Any, rank: int) -> str:
    if job.on_fake_group:
        return (f"rank {rank} ran alone against PyTorch's fake process group, as it did when recorded (its "
                "collectives return made-up values there too)")
    return (f"rank {rank} ran alone against a fake process group: its collectives returned made-up values, so only "
            "a failure in the compiler (or before the first collective) is evidence")
