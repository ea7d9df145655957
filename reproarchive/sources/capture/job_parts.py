"""The parts folder of a job's capture, shared by its ranks through the file system: each rank's
part, its status file and its fault file, the folder's lock, and the merge of the parts into the
job archive. Kept apart from the capture backend's job mode (``job_capture``) because the folder
is also read after the job, by ``pack FOLDER``, where no rank runs."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

from reproarchive.archive.job_merge import merge_parts
from reproarchive.context.failure import crash_record, fault_signal
from reproarchive.format.atomic import finish_removals, remove_dir, remove_leftovers
from reproarchive.format.plain import from_plain, to_plain
from reproarchive.format.schema import RankOutcome

#: How long a rank waits for its peers' parts (seconds): ``$REPROARCHIVE_JOB_WAIT_S``, default 10.
JOB_WAIT_ENV = "REPROARCHIVE_JOB_WAIT_S"
_PART = re.compile(r"^rank-(\d+)\.tar\.zst$")


def set_status(folder: Path, rank: int, outcome: RankOutcome | None) -> None:
    """Record (or, with None, forget) how this rank's current part ended, beside the part."""
    path = folder / f"rank-{rank}.status.json"
    if outcome is None:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(to_plain(outcome)))
    os.replace(tmp, path)


def folder_outcomes(folder: Path) -> dict[int, RankOutcome]:
    """How each rank of a parts folder ended, where the folder says more than the part: a status
    file (passed, or a failure written after the part), or a fatal signal faulthandler wrote."""

    out: dict[int, RankOutcome] = {}
    for part in folder.glob("rank-*.tar.zst"):
        m = _PART.match(part.name)
        if m is None:
            continue
        rank = int(m.group(1))
        status = folder / f"rank-{rank}.status.json"
        fault = folder / f"rank-{rank}.fault"
        if status.exists():
            with contextlib.suppress(ValueError, OSError):
                out[rank] = from_plain(RankOutcome, json.loads(status.read_text()))
                continue
        text = fault.read_text(errors="replace") if fault.exists() else ""
        signal = fault_signal(text)
        if signal is not None:
            failure = crash_record(signal, f"rank {rank} died by {signal}", text)
            out[rank] = RankOutcome(status="crashed", failure=failure, signal=signal,
                                    doing="running its compiled graph for the first time")
    return out


def folder_parts(folder: Path) -> list[Path]:
    return sorted((p for p in folder.glob("rank-*.tar.zst") if _PART.match(p.name)),
                  key=lambda p: int(_PART.match(p.name).group(1)))


@contextlib.contextmanager
def _locked(folder: Path):
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def wait_for_parts(folder: Path, world_size: int, wait_s: float | None = None) -> bool:
    """Wait up to ``wait_s`` (default ``$REPROARCHIVE_JOB_WAIT_S`` or 10 s) until every rank of the
    world has a part in ``folder``; whether they all have (not: the folder went, merged whole)."""
    deadline = time.monotonic() + (float(os.environ.get(JOB_WAIT_ENV, "10")) if wait_s is None else wait_s)
    while len(folder_parts(folder)) < world_size:
        if time.monotonic() >= deadline or not folder.exists():
            return False
        time.sleep(0.1)
    return True


def merge_folder(folder: Path, archive: Path, *, world_size: int | None = None, wait_s: float | None = None,
                 forget: bool = False, own: tuple[int, RankOutcome] | None = None) -> Path:
    """Merge every rank part of ``folder`` into ``archive`` (under the folder's lock), first
    waiting up to ``wait_s`` for the parts of all ``world_size`` ranks. ``forget``: then remove
    the folder where it held a part of every rank (``failed``). ``own``: (rank, outcome) of the
    caller, whose part is in ``folder``: its status, set under the lock; where a peer that failed
    at the same time merged every part and removed the folder first, written into that peer's
    archive instead (its part there may say it was still running)."""
    finish_removals(folder.parent, f"*{folder.suffix}")  # parts folders whose removal a kill cut short
    if world_size is not None:
        wait_for_parts(folder, world_size, wait_s)
    try:
        with _locked(folder):
            parts = folder_parts(folder)
            if parts or own is None:
                if own is not None:
                    set_status(folder, *own)
                remove_leftovers(archive)  # of a rank killed while it merged: its peers' merges hold this lock
                merged = merge_parts(parts, archive, outcomes=folder_outcomes(folder))
                if forget and len(parts) == world_size:
                    # whole or gone: a rank stopped halfway through would leave one part, which ``pack
                    # FOLDER`` would merge alone, over the archive made of all of them
                    remove_dir(folder)
                return merged
    except FileNotFoundError:  # the folder went before its lock could be taken
        if own is None:
            raise
    # a folder goes only once merged whole: ``archive`` holds the caller's part
    return with_rank_outcome(archive, *own)


def with_rank_outcome(archive: Path, rank: int, outcome: RankOutcome) -> Path:
    """``archive`` (a job archive) written again with ``rank``'s ``outcome``, under a lock on its
    folder, so that ranks doing so at once each keep the others' outcomes."""
    lock = os.open(archive.parent, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return merge_parts([archive], archive, outcomes={rank: outcome})
    finally:
        os.close(lock)  # and the lock with it


def forget_when_all_ended(folder: Path, ranks: Sequence[int], archive: Path) -> bool:
    """Remove the parts folder once every rank of ``ranks`` (those that write parts: the world's,
    or one rank on the fake process group) has a part and has ended (its status file says
    passed, failed or timed out, not running): a job that passed leaves nothing, one that failed
    its job archive alone, merged again here if a rank ended since the last merge (so it holds
    every rank's ending). A rank that crashed or was killed wrote no status: the folder stays,
    for ``pack FOLDER``."""
    with _locked(folder):
        parts = folder_parts(folder)
        statuses = {r: folder / f"rank-{r}.status.json" for r in ranks}
        if len(parts) != len(ranks) or not all(p.exists() for p in statuses.values()):
            return False
        outcomes = folder_outcomes(folder)
        if any(o.status == "running" for o in outcomes.values()):
            return False  # a rank that answered a peer's request from inside the call it still runs
        if any(o.status != "passed" for o in outcomes.values()):
            newest = max(p.stat().st_mtime_ns for p in (*parts, *statuses.values()))
            if not archive.exists() or archive.stat().st_mtime_ns < newest:
                remove_leftovers(archive)
                merge_parts(parts, archive, outcomes=outcomes)
        remove_dir(folder)
    return True
