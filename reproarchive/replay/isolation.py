"""Replaying in a child process, so that a crash becomes an outcome instead of killing us.

Compiler bugs often end in a segfault, an abort from a C++ assertion or a fatal device error;
in-process, that takes the replaying program (and a ``git bisect run`` session's verdict) with
it. The child runs the ordinary replay and returns the outcome; if it dies by a signal, the
parent reports a ``crash`` failure named after the signal, with the child's last stderr lines
(Python's faulthandler is on, so they include the Python stack at the crash).

The child also gets the recorded environment variables before it imports torch, so variables
that only take effect at import (``TORCH_LOGS``, ``PYTORCH_CUDA_ALLOC_CONF``, ...) apply there.

``WorkerPool`` keeps such children alive between replays (``child.Worker``), for the
minifier, which replays dozens of candidates of one archive: a fresh child pays the torch
import and the compiler's first-use setup (a few seconds) before every candidate, a warm worker
pays them once. A worker that crashes is reported exactly as ``run_in_child`` reports a crashed
child, and replaced.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any

from reproarchive.child import Died, Worker, run_child
from reproarchive.codec.devices import DevicePlan
from reproarchive.context.environment import child_environment
from reproarchive.context.failure import crash_record, faults_the_device
from reproarchive.format.plain import from_plain
from reproarchive.format.schema import EnvironmentRecord, FailureRecord
from reproarchive.replay.outcome import Outcome, judged
from reproarchive.replay.settings import ReplaySettings

_MODULE = "reproarchive.replay.isolated_run"


def run_in_child(path: str | os.PathLike, settings: ReplaySettings | None = None, *, plan: DevicePlan | None = None,
                 environment: EnvironmentRecord | None = None) -> Outcome:
    """Run ``replay.run(path, settings, isolate=False)`` in a child, on the devices ``plan``
    resolved (None: the child resolves ``settings.device``); return its Outcome."""
    result, died = run_child(_MODULE, _request(path, settings, plan), env=child_environment(environment))
    return _outcome(path, result, died)


def _request(path: str | os.PathLike, settings: ReplaySettings | None,
             plan: DevicePlan | None = None) -> dict[str, Any]:
    """What the child reads: the archive, the settings and the device plan, as plain data."""
    return {"path": os.fspath(os.path.abspath(path)), "settings": (settings or ReplaySettings()).to_plain(),
            "plan": plan.to_plain() if plan is not None else None}


def _outcome(path: str | os.PathLike, result: Any, died: Died | None) -> Outcome:
    """The child's outcome, or for a child that died: a ``crash`` failure named after the
    signal (or exit status), judged against the recorded failure it reported at start."""
    if died is None:
        return Outcome.from_dict({**result, "isolated": True})
    meta = died.started or {}
    message = f"the replay process {died.reason}"
    observed = crash_record(died.signal_name or f"exit status {died.returncode}", message, died.log_tail,
                            backend=meta.get("backend"))
    recorded = from_plain(FailureRecord, meta["recorded"]) if meta.get("recorded") else None
    return judged(
        recorded, observed,
        device=meta.get("device", "cpu"),
        recorded_device=meta.get("recorded_device"),
        same_device_type=meta.get("same_device_type", True),
        backend=meta.get("backend") or "",
        warnings=list(meta.get("warnings", [])),
        config=meta.get("config", "recorded"),
        isolated=True,
        archive=os.fspath(path),
        digest=meta.get("digest"),
        torch=meta.get("torch"),
        recorded_torch=meta.get("recorded_torch"),
    )


child_outcome = _outcome  # for other drivers of isolated replays (bisect compiler)


class WorkerPool:
    """``size`` warm replay processes for one archive's environment; ``run`` is thread-safe.

    Workers start at once (their torch import overlaps with whatever the caller does next) and
    ``warmup`` -- ``{"backend": name, "source_kind": kind}`` -- has each one compile a one-op
    graph with that backend first, so the compiler's own first-use cost is paid before the
    first candidate, too. A worker that dies is replaced at once, and the replacement joins the
    back of the queue: with ``spares`` extra workers (for failures that are crashes, where every
    failing candidate kills its worker) the next candidate goes to a worker that is already warm
    while the replacement warms up. Use as a context manager or call ``close``.
    """

    def __init__(self, environment: EnvironmentRecord | None = None, *, size: int = 1, spares: int = 0,
                 warmup: dict[str, Any] | None = None):
        self._env = child_environment(environment)
        self._warmup = warmup
        self._idle: queue.Queue[Worker] = queue.Queue()
        self._workers: list[Worker] = []
        self._lock = threading.Lock()
        self.size = max(1, int(size))
        self.started = 0
        for _ in range(self.size + max(0, int(spares))):
            self._idle.put(self._start())

    def _start(self) -> Worker:
        worker = Worker(_MODULE, env=self._env)
        if self._warmup:
            worker.send({"warmup": self._warmup})
        with self._lock:
            self._workers.append(worker)
            self.started += 1
        return worker

    def run(self, path: str | os.PathLike, settings: ReplaySettings) -> Outcome:
        """``replay.run(path, settings, isolate=False)`` in a warm worker; its Outcome. A worker
        whose replay met a fault on the device is replaced as a dead one is: every later use of
        the device in that process would fail, and the next candidate would seem to reproduce."""
        worker = self._idle.get()
        faulted = False
        try:
            if not worker.alive:
                worker = self._replace(worker)
            result, died = worker.request(_request(path, settings))
            outcome = _outcome(path, result, died)
            faulted = faults_the_device(outcome.observed)
        finally:
            if faulted or not worker.alive:
                worker = self._replace(worker)
            self._idle.put(worker)
        return outcome

    def _replace(self, worker: Worker) -> Worker:
        worker.close()
        with self._lock:
            if worker in self._workers:
                self._workers.remove(worker)
        return self._start()

    def close(self) -> None:
        with self._lock:
            workers, self._workers = self._workers, []
        for worker in workers:
            worker.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
