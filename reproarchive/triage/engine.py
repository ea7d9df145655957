"""Where triage's work runs: one executor interface, tasks in, typed verdicts out.

A task is one action (``replay``, ``minify``, ``doctor``) on one archive, named by its index
digest; its verdict is a ``verdicts.Verdict``. Every task runs in a fresh process
(``task_child``), so a compiler that segfaults, leaks or hangs takes one task with it, never the
run: the process's death is the verdict ("crashed", with its signal), and a task past
``max_time`` is killed with everything it started ("timed out").

``Executor`` is the seam. ``LocalExecutor`` (the default, ``-j N``) runs N such processes at a
time on this machine. ``ray_engine.RayExecutor`` (``--engine ray``) hands the same function,
``run_task``, to a Ray cluster, one Ray task per triage task with the resources asked for; on a
worker it starts the same fresh process. Adding an engine (Dask, a batch queue) is: subclass
``Executor``, make ``submit`` call ``run_task(task.to_plain())`` where the engine runs work and
return a future of its plain result (``typed`` turns that into a ``Verdict``), and make
``environment`` report the workers' ``verdicts.current_environment`` (the cache keys on it).
"""

from __future__ import annotations

import abc
import concurrent.futures
import contextlib
import dataclasses
import os
import re
import time
from datetime import datetime, timezone
from typing import Any

from reproarchive.child import run_child, stop_timed_children, warm_children
from reproarchive.errors import ReproArchiveError
from reproarchive.format.plain import PlainData, PlainRecord, from_plain, omit_none
from reproarchive.replay.settings import ReplaySettings
from reproarchive.triage.verdicts import (
    CRASHED,
    ERROR,
    TIMED_OUT,
    VERDICT_FORMAT,
    Environment,
    Verdict,
    current_environment,
)

ACTIONS = ("replay", "minify", "bisect", "doctor")
_CHILD = "reproarchive.triage.task_child"


@dataclasses.dataclass(frozen=True)
class Task(PlainRecord):
    """One action on one archive. ``archive``: where the worker reads it (a path, or a store
    reference ``STORE/NAME`` a remote worker can pull); ``digest``: its index digest;
    ``output``: where a minify task puts the minified archive (a folder, or a store URL)."""

    action: str
    archive: str
    digest: str
    settings: dict[str, PlainData]
    output: str | None = None
    max_time: float | None = None
    #: minify, bisect: judge each candidate or step by up to this many replays (a flaky group's,
    #: ``repeats``)
    repeat: int | None = omit_none()

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ReproArchiveError(f"unknown action {self.action!r}", f"choose among {', '.join(ACTIONS)}")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    """Run one task (plain data, as ``Task.to_plain()``) in a fresh process; its verdict as plain
    data. Never raises for what happens to the task: a death, a timeout or an error is the
    verdict. This is what every engine calls where it runs work."""
    spec = from_plain(Task, task)
    start = time.monotonic()

    def failed(status: str, message: str, signal: str | None = None) -> dict[str, Any]:
        environment = current_environment(ReplaySettings.from_plain(spec.settings)).digest
        return Verdict(format=VERDICT_FORMAT, action=spec.action, archive=spec.digest, environment=environment,
                       status=status, message=message, signal=signal, elapsed_s=round(time.monotonic() - start, 3),
                       finished=now()).to_plain()

    try:
        result, died = run_child(_CHILD, task, env=dict(os.environ), timeout=spec.max_time)
    except ReproArchiveError as err:  # one line: the error, and where the task's child raised it
        where = _raised_at(getattr(err, "child_traceback", None) or "")
        return failed(ERROR, f"{err.what} (raised at {where})" if where else str(err))
    if died is None:
        return result
    if died.timed_out is not None:
        return failed(TIMED_OUT, f"the task {died.reason}")
    return failed(CRASHED, f"the task's process {died.reason}: {_last_line(died.log_tail)}".rstrip(": "),
                  died.signal_name or f"exit status {died.returncode}")


def _raised_at(traceback_text: str) -> str:
    """The innermost frame of a traceback, as ``file:line in function``."""

    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', traceback_text)
    if not frames:
        return ""
    file, line, function = frames[-1]
    return f"{file}:{line} in {function}"


def _last_line(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip() and not ln.startswith(("  File", "Current thread"))]
    return lines[-1][:200] if lines else ""


def typed(future: concurrent.futures.Future) -> concurrent.futures.Future:
    """A future of a verdict, from a future of its plain data."""
    out: concurrent.futures.Future = concurrent.futures.Future()

    def done(f: concurrent.futures.Future) -> None:
        try:
            out.set_result(from_plain(Verdict, f.result()))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
            out.set_exception(exc)

    future.add_done_callback(done)
    return out


class Executor(abc.ABC):
    """Runs tasks somewhere; ``submit`` returns a ``concurrent.futures.Future`` of a ``Verdict``."""

    name: str = ""
    workers: int = 1

    @abc.abstractmethod
    def submit(self, task: Task) -> concurrent.futures.Future:
        """Start ``task``; a future of its ``Verdict``."""

    @abc.abstractmethod
    def environment(self, settings: Any) -> Environment:
        """The environment the tasks run in (the verdict cache's key), under ``settings``."""

    def close(self) -> None:  # noqa: B027 - a default: an engine with nothing to release
        """Stop taking tasks; tasks already running finish."""

    def cancel_pending(self) -> None:  # noqa: B027 - a default: an engine that queues nothing here
        """Drop the tasks not started yet (an interrupted run)."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is not None:
            self.cancel_pending()
        self.close()


class LocalExecutor(Executor):
    """``jobs`` fresh processes at a time on this machine (threads wait on them), forked from a
    warm server (``child.warm_children``): a run over hundreds of archives pays the torch import
    once, not once per task."""

    name = "local"

    def __init__(self, jobs: int = 1):
        if jobs < 1:
            raise ReproArchiveError(f"-j {jobs}: at least one task must run at a time", "pass -j 1 or more")
        self.workers = jobs
        self._pool = concurrent.futures.ThreadPoolExecutor(jobs, thread_name_prefix="reproarchive-task")
        self._warm = contextlib.ExitStack()
        self._warm.enter_context(warm_children())

    def submit(self, task: Task) -> concurrent.futures.Future:
        return typed(self._pool.submit(run_task, task.to_plain()))

    def environment(self, settings: Any) -> Environment:
        return current_environment(settings)

    def cancel_pending(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        stop_timed_children()  # in sessions of their own, out of a Ctrl-C's reach

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._warm.close()
