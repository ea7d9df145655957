"""How many threads the byte layer's pools use (the cores this process actually gets), and the
one way they run a batch of work.

Threads beyond the cores a process may run on do no extra work; they only take turns, and
a pipeline whose stages wait on each other then stalls whenever one stage is descheduled.
So pools are sized from the process's CPU affinity (``taskset``, a CPU set) and, in a
container, from its CPU quota (``docker --cpus=2`` leaves the affinity at every core of the
host but allows two cores' worth of time).
"""

from __future__ import annotations

import collections
import concurrent.futures
import math
import os
import threading
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")

MAX_WORKERS = 4


def available_cores() -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup CPU quota if any."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def worker_threads() -> int:
    """Threads for hashing, encoding and decoding: the available cores, at most ``MAX_WORKERS``."""
    return min(MAX_WORKERS, available_cores())


def cgroup_cpu_quota(cgroup_root: str = "/sys/fs/cgroup", membership: str = "/proc/self/cgroup") -> float | None:
    """Cores' worth of CPU time the cgroups of this process allow (None: no quota, or unknown).

    cgroup v2: ``cpu.max`` (``"quota period"`` or ``"max period"``) of this process's group
    and every ancestor, the smallest wins. cgroup v1: ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``.
    """
    text = _read(membership)
    if text is None:
        return None
    lines = text.splitlines()
    limits: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.strip("/")
        if controllers == "":  # v2 unified hierarchy
            segs = rel.split("/") if rel else []
            for depth in range(len(segs), -1, -1):
                value = _read(os.path.join(cgroup_root, *segs[:depth], "cpu.max"))
                if value:
                    fields = value.split()
                    if len(fields) == 2 and fields[0] != "max":
                        limits.append(_ratio(fields[0], fields[1]))
        elif "cpu" in controllers.split(","):
            # the group's own folder, or the mount's root when a container shows the host's path
            for base in [os.path.join(cgroup_root, m, *sub) for sub in (rel.split("/") if rel else [], [])
                         for m in ("cpu", "cpu,cpuacct", "cpuacct,cpu")]:
                quota = _read(os.path.join(base, "cpu.cfs_quota_us"))
                period = _read(os.path.join(base, "cpu.cfs_period_us"))
                if quota and period:
                    if quota != "-1":
                        limits.append(_ratio(quota, period))
                    break
    limits = [x for x in limits if x > 0]
    return min(limits) if limits else None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _ratio(quota: str, period: str) -> float:
    try:
        return int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return 0.0


class WorkQueue:
    """A thread pool in which the thread that waits for a result works too.

    ``submit`` queues a job and returns a future; a future's ``result()`` called by the owner
    runs queued jobs (oldest first) on the calling thread until its own is done, instead of
    sleeping. So ``WorkQueue(cores - 1)`` keeps exactly ``cores`` threads busy, never more,
    and none of them waits while work is queued. On shared cores that matters: a pipeline
    whose coordinator sleeps until a worker thread (itself waiting for a turn on a busy core)
    finishes lets every other stage idle meanwhile. With no worker threads at all, jobs run on
    the owner's thread as it needs their results, in the order they were submitted.

    Jobs must not wait for other jobs of the same queue.
    """

    def __init__(self, workers: int, name: str = "reproarchive"):
        self._jobs: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for t in self._threads:
            t.start()

    @property
    def workers(self) -> int:
        return len(self._threads)

    def submit(self, fn, *args) -> "_HelpingFuture":
        fut = _HelpingFuture(self)
        with self._cond:
            if self._closed:
                raise RuntimeError("work queue is shut down")
            self._jobs.append((fut, fn, args))
            self._cond.notify()
        return fut

    def _take(self, block: bool):
        with self._cond:
            while not self._jobs and block and not self._closed:
                self._cond.wait()
            return self._jobs.popleft() if self._jobs else None

    @staticmethod
    def _run(job) -> None:
        fut, fn, args = job
        if not fut.set_running_or_notify_cancel():
            return
        try:
            result = fn(*args)
        except BaseException as exc:
            fut.set_exception(exc)
        else:
            fut.set_result(result)

    def _work(self) -> None:
        while (job := self._take(block=True)) is not None:
            self._run(job)

    def help_until(self, fut) -> None:
        """Run queued jobs on this thread until ``fut`` is done or nothing is left to run."""
        while not fut.done():
            job = self._take(block=False)
            if job is None:
                return  # ``fut`` is running on a worker thread: wait for it
            self._run(job)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._cond:
            self._closed = True
            if cancel_futures:
                while self._jobs:
                    self._jobs.popleft()[0].cancel()
            self._cond.notify_all()
        if wait:
            # jobs still queued (not cancelled) are run by the workers, or here when there are none
            while (job := self._take(block=False)) is not None:
                self._run(job)
            for t in self._threads:
                t.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown(wait=True, cancel_futures=exc[0] is not None)


class _HelpingFuture(concurrent.futures.Future):
    def __init__(self, queue: WorkQueue):
        super().__init__()
        self._queue = queue

    def result(self, timeout=None):
        self._queue.help_until(self)
        return super().result(timeout)

    def exception(self, timeout=None):
        self._queue.help_until(self)
        return super().exception(timeout)


def run_all(work: Callable[[T], object], items: Sequence[T], *, jobs: int, name: str) -> None:
    """Run ``work`` on every item on up to ``jobs`` threads; the first failure cancels what has
    not started and is raised (a transfer that fails stops the others instead of finishing them)."""
    with concurrent.futures.ThreadPoolExecutor(max(1, min(jobs, len(items))), thread_name_prefix=name) as pool:
        futures = [pool.submit(work, item) for item in items]
        try:
            for f in concurrent.futures.as_completed(futures):
                f.result()
        except BaseException:
            for f in futures:
                f.cancel()
            raise
