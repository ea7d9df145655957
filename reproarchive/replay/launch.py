"""Replaying a recorded job on torch.distributed itself, and the one verdict over its ranks.

The ranks are started by torch.distributed's own launcher (``launcher_process``: torchrun, with
``--standalone`` on one machine, or the rendezvous options a person passes for several), each
rank runs ``rank_worker`` and writes its judged Outcome into a private folder. Nothing here
manages processes beyond what the launcher does, except the outer wall-clock bound: a job
that neither finishes nor times out in its collectives (a rank stuck outside torch.distributed's
reach) is ended by signalling the launcher's process group, and then, by pid, the ranks it
started (each wrote its pid before running anything).

Per rank the verdict is the single-process one (reproduced / passed / different failure) or one
of three things only a job has: ``crashed`` (killed by a signal; judged against the recorded
failure like an isolated replay's crash), ``stopped`` (the launcher ended it because another
rank failed first, or its collective failed because that rank went away) and ``hung`` (no
result within the bound). The job's verdict follows the rank that failed in the recording: it
is "reproduced on rank r" when that rank reproduced; any other failure is a different failure.
A hang is explained by the recorded ranks' collective schedules (``archive.job_report``): which
rank diverged, at which collective.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from reproarchive.child import python_path, temp_for_children
from reproarchive.context.failure import crash_record, crash_report, failure_kind, says_a_peer_went_away
from reproarchive.errors import LaunchError
from reproarchive.format.schema import FailureRecord
from reproarchive.replay.outcome import (
    PASSED,
    REPRODUCED,
    Outcome,
    across_versions,
    judged,
)
from reproarchive.replay.rank_client import WARM_ENV
from reproarchive.replay.verdict_rule import CRASHED, HUNG, STOPPED, first_failure, job_verdict

#: Seconds a launcher gets, beyond the collective timeout, to start its ranks (torch import,
#: rendezvous) and to end them.
STARTUP_ALLOWANCE_S = 90.0
_KILL_GRACE_S = 5.0


@dataclasses.dataclass
class RankOutcome:
    """How one rank's replay ended. ``status``: passed, reproduced, different failure, crashed,
    stopped or hung; ``outcome``: its judged replay (None when it wrote none); ``timed_out``:
    its failure is a collective that timed out; ``note``: what the launcher said of it."""

    rank: int
    status: str
    outcome: Outcome | None = None
    timed_out: bool = False
    note: str = ""


@dataclasses.dataclass
class JobOutcome:
    """What one replay of a job found; ``to_dict()`` is what ``run --json`` prints for a job.

    ``status``/``exit_code`` as for one graph (README "Exit codes"); ``rank``: the rank the
    verdict is about (the recorded failing rank, or the first rank that failed here);
    ``ranks``: every rank this launch ran; ``divergence``: where the ranks' collective
    schedules part, when they do; ``launcher``: the launcher options used; ``torch`` /
    ``recorded_torch``: the torch version that replayed it and the one that recorded it;
    ``compile_only``: the ranks were compiled, not run (for what)."""

    status: str
    exit_code: int
    rank: int | None
    world_size: int
    ranks: list[RankOutcome]
    recorded_rank: int | None = None
    divergence: str | None = None
    launcher: list[str] = dataclasses.field(default_factory=list)
    timeout_s: float = 0.0
    wall_s: float = 0.0
    warnings: list[str] = dataclasses.field(default_factory=list)
    archive: str | None = None
    torch: str | None = None
    recorded_torch: str | None = None
    compile_only: str | None = None  # every rank's graph compiled, nothing launched: for what (``replay.compile_only``)

    @property
    def across_versions(self) -> bool:
        return across_versions(self.torch, self.recorded_torch)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["ranks"] = [{**dataclasses.asdict(r), "outcome": r.outcome.to_dict() if r.outcome else None}
                         for r in self.ranks]
        data["summary"] = self.summary
        data["across_versions"] = self.across_versions
        return data

    @property
    def observed(self) -> FailureRecord | None:
        """The failure observed on the rank the verdict is about (None: none, or that rank left
        no outcome: it hung or was stopped): what one graph's ``Outcome.observed`` is, so that a
        reader of verdicts (``triage``) takes either."""
        about = next((r for r in self.ranks if r.rank == self.rank and r.outcome is not None), None)
        return about.outcome.observed if about is not None else None

    @property
    def kind(self) -> str:
        """As ``Outcome.kind``, of the rank the verdict is about (a rank that hung: its status)."""
        observed = self.observed
        if observed is not None or self.status == PASSED:
            return failure_kind(observed)
        about = next((r for r in self.ranks if r.rank == self.rank), None)
        return about.status if about is not None else self.status

    @property
    def summary(self) -> str:
        """One line: "reproduced on rank 1", "passed on all 2 ranks", ..."""
        if self.status == PASSED and len(self.ranks) < self.world_size:  # a rank alone, or a node's ranks
            return f"passed on rank {', '.join(str(r.rank) for r in self.ranks)}"
        if self.status == PASSED:
            return f"passed on all {len(self.ranks)} ranks"
        return f"{self.status} on rank {self.rank}"


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """What to launch: the request every rank reads, the launcher's options, the bound."""

    request: dict[str, Any]
    options: list[str]
    timeout_s: float
    program: list[str] = dataclasses.field(default_factory=list)  # [] : the rank worker
    # the rank workers forked from the launcher's imports (``rank_server``): for ranks on the CPU only
    warm: bool = False


def launcher_options(world_size: int, passthrough: Sequence[str] = ()) -> list[str]:
    """torchrun's options for this job: ``passthrough`` (a person's ``--nnodes``,
    ``--node-rank``, ``--rdzv-endpoint`` ..., which must then say ``--nproc-per-node`` too) or,
    on one machine, ``--standalone`` with one process per rank."""
    options = list(passthrough)
    if not any(o.startswith(("--nproc-per-node", "--nproc_per_node")) for o in options):
        options += ["--nproc-per-node", str(world_size)]
    if not any(o.startswith(("--nnodes", "--rdzv", "--master", "--standalone")) for o in options):
        options.insert(0, "--standalone")
    return options


def on_cpu_only(targets) -> bool:
    """Whether every device a job's archive names goes to the CPU here (``DevicePlan.targets``):
    its ranks may then be forked warm."""
    return all(str(device).split(":")[0] == "cpu" for device in targets.values())


#: The ranks' temporary folder, inside the launch's: a rank that dies mid-replay (an abort on
#: one rank) leaves its replay's folder there, and the launch removes it.
_RANKS_TEMP = "tmp"


def _start(plan: LaunchPlan, folder: Path, log: Any) -> subprocess.Popen:
    """The launcher, started on ``plan`` in ``folder`` in a process group of its own."""

    (folder / "request.json").write_text(json.dumps(plan.request))
    env = dict(os.environ, PYTHONPATH=python_path(), PYTHONFAULTHANDLER="1",
               **temp_for_children(folder / _RANKS_TEMP))
    env.setdefault("OMP_NUM_THREADS", "1")
    if plan.warm and not plan.program:
        env[WARM_ENV] = "1"
    program = ["--", *plan.program] if plan.program else []
    command = [sys.executable, "-m", "reproarchive.replay.launcher_process", str(folder), *plan.options, *program]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                            start_new_session=True)


def _failures(folder: Path) -> dict[int, dict]:
    failures: dict[int, dict] = {}
    for path in folder.glob("launch-*.json"):
        for rank, failure in json.loads(path.read_text()).get("failures", {}).items():
            failures[int(rank)] = failure
    return failures


def launch(plan: LaunchPlan, folder: Path) -> tuple[dict[int, dict], bool, float]:
    """Run the launcher on ``plan`` in ``folder``: (the launcher's failures by rank, whether the
    wall-clock bound ended it, wall seconds)."""
    bound = plan.timeout_s * 2 + STARTUP_ALLOWANCE_S
    start = time.monotonic()
    with open(folder / "launcher.log", "wb") as log:
        proc = _start(plan, folder, log)
        bounded = False
        try:
            proc.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            bounded = True
            _end(proc, folder)
        except BaseException:
            _end(proc, folder)
            raise
        finally:
            shutil.rmtree(folder / _RANKS_TEMP, ignore_errors=True)
    return _failures(folder), bounded, time.monotonic() - start


def _end(proc: subprocess.Popen, folder: Path) -> None:
    """End a launcher that overran its bound: SIGTERM to its process group (torchrun then stops
    its ranks), SIGKILL after a grace period, then SIGKILL to every rank that wrote its pid."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=_KILL_GRACE_S)
            break
        except subprocess.TimeoutExpired:
            continue
    for started in folder.glob("started-*.json"):
        try:
            os.kill(int(json.loads(started.read_text())["pid"]), signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            pass


class LaunchedJob:
    """A launched job whose ranks judge candidate archives one after another (``rank_worker``'s
    ``candidates`` mode): torch import, rendezvous and group creation are paid once, not per
    candidate. ``judge`` returns every rank's ending for one candidate; when a candidate takes a
    rank down (a crash), the launcher ends the job, ``judge`` reports that candidate from what
    the launcher said, and the job is gone (``alive`` False): start a new one."""

    def __init__(self, plan: LaunchPlan, folder: Path):
        self.folder, self.plan = folder, plan
        folder.mkdir(parents=True, exist_ok=True)
        self._log = open(folder / "launcher.log", "wb")  # noqa: SIM115 - closed in close()
        self._proc = _start(plan, folder, self._log)
        self._k = 0

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def judge(self, archive: Path, settings: dict, ranks: Sequence[int],
              recorded: Mapping[int, FailureRecord | None]) -> list[RankOutcome]:
        self._k += 1
        k = self._k
        _ask(self.folder / f"next-{k}.json", {"archive": str(archive), "settings": settings})
        deadline = time.monotonic() + self.plan.timeout_s * 2 + STARTUP_ALLOWANCE_S
        while not all((self.folder / f"rank-{r}-{k}.json").exists() for r in ranks):
            if not self.alive or time.monotonic() > deadline:
                bounded = self.alive
                if bounded:
                    _end(self._proc, self.folder)
                self._proc.wait()
                return rank_outcomes(self.folder, ranks, recorded, _failures(self.folder), bounded,
                                     suffix=f"-{k}")
            time.sleep(0.02)
        return rank_outcomes(self.folder, ranks, recorded, {}, False, suffix=f"-{k}")

    def close(self) -> None:
        if self.alive:
            _ask(self.folder / f"next-{self._k + 1}.json", {"stop": True})
            try:
                self._proc.wait(timeout=_KILL_GRACE_S * 4)
            except subprocess.TimeoutExpired:
                _end(self._proc, self.folder)
        self._log.close()


def _ask(path: Path, request: dict) -> None:
    """Write a request the ranks poll for whole (renamed into place: never read half-written)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(request))
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------
# the verdict


def rank_outcomes(folder: Path, ranks: Sequence[int], recorded: Mapping[int, FailureRecord | None],
                  failures: Mapping[int, dict], bounded: bool, *, suffix: str = "") -> list[RankOutcome]:
    """Each rank's ending, from what it wrote in ``folder`` (``rank-r{suffix}.json``) and what the
    launcher said."""
    first = _first_failure(failures)
    out = []
    for rank in ranks:
        result = _read(folder / f"rank-{rank}{suffix}.json")
        failure = failures.get(rank)
        if result is not None:
            outcome = Outcome.from_dict(result["outcome"])
            observed = outcome.observed
            message = observed.message if observed is not None else ""
            if outcome.status != REPRODUCED and observed is not None and says_a_peer_went_away(message):
                who = f"rank {first}" if first is not None and first != rank else "a peer"
                out.append(RankOutcome(rank, STOPPED, outcome, note=f"its collective failed when {who} went away"))
                continue
            out.append(RankOutcome(rank, outcome.status, outcome,
                                   timed_out=observed is not None and observed.stage == "timeout"))
        elif failure is not None and failure.get("signal") and not _stopped_by_launcher(rank, failure, first):
            log = _log_tail(folder, rank)
            observed = crash_record(failure["signal"], f"rank {rank} was killed by {failure['signal']}", log)
            outcome = judged(recorded.get(rank), observed, isolated=True)
            out.append(RankOutcome(rank, CRASHED if outcome.status != REPRODUCED else REPRODUCED, outcome,
                                   note=f"killed by {failure['signal']}"))
        elif bounded:
            out.append(RankOutcome(rank, HUNG, note="no result within the wall-clock bound: ended by reproarchive"))
        elif failure is not None:
            why = f"after rank {first} failed" if first is not None and first != rank else ""
            how = failure.get("signal") or f"exit status {failure.get('exitcode')}"
            out.append(RankOutcome(rank, STOPPED, note=f"the launcher ended it {why} ({how})".replace("  ", " ")))
        else:
            out.append(RankOutcome(rank, STOPPED, note="ended without a result"))
    return out


def _first_failure(failures: Mapping[int, dict]) -> int | None:
    """The rank the launcher saw fail first (the others were stopped because of it)."""
    return first_failure({r: (f.get("signal") in ("SIGTERM", "SIGKILL"), f.get("time") or 0)
                          for r, f in failures.items()})


def _stopped_by_launcher(rank: int, failure: Mapping[str, Any], first: int | None) -> bool:
    return failure.get("signal") in ("SIGTERM", "SIGKILL") and first is not None and first != rank


def _log_tail(folder: Path, rank: int) -> str:
    try:
        return (folder / f"rank-{rank}.log").read_text(errors="replace")[-64000:]
    except OSError:
        return ""


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_launched(plan: LaunchPlan, *, world_size: int, ranks: Sequence[int],
                 recorded: Mapping[int, FailureRecord | None], recorded_rank: int | None,
                 keep: str | os.PathLike | None = None, divergence: str | None = None) -> JobOutcome:
    """Launch ``plan``, read every rank's ending and judge the job. ``ranks``: the global ranks
    this launch runs (all of them on one machine; this node's with ``--node-rank``).
    ``keep``: a folder to keep the ranks' results and logs in (default: a temporary one).
    ``divergence``: where the recorded ranks' collectives part (``archive.job_report``), said
    with the verdict."""
    with tempfile.TemporaryDirectory(prefix="reproarchive-job-") as tmp:
        folder = Path(keep) if keep is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        failures, bounded, wall = launch(plan, folder)
        ranks = _ranks_here(folder, failures) or list(ranks)
        if not any((folder / f"started-{r}.json").exists() for r in ranks):
            raise LaunchError(f"no rank of the job started: {_launcher_said(folder)}",
                              "check that torch.distributed's launcher runs here (python -m torch.distributed.run "
                              "--help) and, over several machines, its rendezvous options")
        outcomes = rank_outcomes(folder, ranks, recorded, failures, bounded)
        warnings = []
        if recorded_rank is not None and recorded_rank not in ranks:
            warnings.append(f"the recorded failing rank {recorded_rank} ran in another launch (another machine): "
                            "its verdict is that launch's")
    status, code, rank = job_verdict(outcomes, recorded_rank)
    return JobOutcome(status=status, exit_code=code, rank=rank, world_size=world_size, ranks=outcomes,
                      recorded_rank=recorded_rank, divergence=divergence, launcher=list(plan.options),
                      timeout_s=plan.timeout_s, wall_s=round(wall, 3), warnings=warnings)


def _ranks_here(folder: Path, failures: Mapping[int, dict]) -> list[int]:
    """The global ranks this launch started, as they reported themselves (a rendezvous over
    several machines numbers them as the nodes arrive), and those the launcher reported."""
    seen = {int(p.stem.rsplit("-", 1)[1]) for p in folder.glob("started-*.json")}
    return sorted(seen | set(failures))


def _launcher_said(folder: Path) -> str:
    text = (folder / "launcher.log").read_text(errors="replace") if (folder / "launcher.log").exists() else ""
    native, _ = crash_report(text)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return (native or lines or ["the launcher printed nothing"])[-1][:300]

