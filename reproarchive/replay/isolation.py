"""Replaying in a child process, so that a crash becomes an outcome instead of killing us.

Compiler bugs often end in a segfault, an abort from a C++ assertion or a fatal device error;
in-process, that takes the replaying program (and a ``git bisect run`` session's verdict) with
it. The child runs the ordinary replay and writes the outcome as JSON; if it dies by a signal,
the parent reports a ``crash`` failure named after the signal, with the child's last stderr
lines (Python's faulthandler is on, so they include the Python stack at the crash).

The child also gets the recorded environment variables before it imports torch, so variables
that only take effect at import (``TORCH_LOGS``, ``PYTORCH_CUDA_ALLOC_CONF``, ...) apply there.

``WorkerPool`` keeps such children alive between replays, for the minifier, which replays
dozens of candidates of one archive: a fresh child pays the torch import and the compiler's
first-use setup (a few seconds) before every candidate, a warm worker pays them once. A worker
that crashes is reported exactly as ``run_in_child`` reports a crashed child, and replaced.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, IO

from reproarchive import errors
from reproarchive.context.failure import crash_record

_STDERR_TAIL = 8000


def _python_path() -> str:
    """The child must import what we import: this package and any module:function backend."""
    here = str(Path(__file__).resolve().parent.parent)
    entries = [here] + [p for p in sys.path if p and os.path.isdir(p)]
    extra = os.environ.get("PYTHONPATH")
    if extra:
        entries.append(extra)
    return os.pathsep.join(dict.fromkeys(entries))


def _child_env(environment: dict[str, Any] | None) -> dict[str, str]:
    from reproarchive.context.environment import child_environment

    env = child_environment(environment)
    env["PYTHONPATH"] = _python_path()
    env.setdefault("PYTHONFAULTHANDLER", "1")
    return env


def _raise_child_error(err: dict[str, Any]) -> None:
    cls = getattr(errors, err.get("class", ""), None)
    if not (isinstance(cls, type) and issubclass(cls, errors.ReproArchiveError)):
        cls = errors.ReproArchiveError
    raise cls(err.get("what", "the isolated replay failed"), err.get("hint"))


def _died(path, returncode: int, stderr_tail: str, meta: dict[str, Any]):
    """The Outcome of a child that ended without a result: a ``crash`` failure named after
    the signal (or exit status), judged against the recorded failure it reported at start."""
    from reproarchive.replay.runner import Outcome, judge

    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        message = f"the replay process was killed by {name} ({-returncode})"
    else:
        name = f"exit status {returncode}"
        message = f"the replay process exited with status {returncode} without a result"
    observed = crash_record(name, message, stderr_tail[-_STDERR_TAIL:], backend=meta.get("backend"))
    recorded = meta.get("recorded")
    status, exit_code = judge(recorded, observed)
    return Outcome(
        status=status,
        exit_code=exit_code,
        observed=observed,
        recorded=recorded,
        device=meta.get("device", "cpu"),
        backend=meta.get("backend") or "",
        warnings=list(meta.get("warnings", [])),
        config=meta.get("config", "recorded"),
        isolated=True,
        archive=os.fspath(path),
        digest=meta.get("digest"),
    )


def run_in_child(path: str | os.PathLike, *, environment: dict[str, Any] | None = None, **options: Any):
    """Run ``replay.run(path, isolate=False, **options)`` in a child; return its Outcome."""
    from reproarchive.replay.runner import Outcome

    env = _child_env(environment)
    with tempfile.TemporaryDirectory(prefix="reproarchive-isolate-") as tmp:
        request = Path(tmp, "request.json")
        started = Path(tmp, "started.json")
        result = Path(tmp, "result.json")
        request.write_text(json.dumps({"path": os.fspath(Path(path).resolve()), "options": options}))
        proc = subprocess.run(
            [sys.executable, "-X", "faulthandler", "-m", "reproarchive.replay.isolation",
             str(request), str(started), str(result)],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, errors="replace",
        )
        if result.exists():
            data = json.loads(result.read_text())
            if "error" in data:
                _raise_child_error(data["error"])
            return Outcome.from_dict(data["outcome"])
        meta = json.loads(started.read_text()) if started.exists() else {}
    return _died(path, proc.returncode, proc.stderr or "", meta)


class _Worker:
    """One warm child: requests go down one pipe as JSON lines, answers come up another
    (stdout and stderr stay free for whatever the compiler prints; they go to a log file whose
    tail becomes the crash report)."""

    def __init__(self, env: dict[str, str], warmup: dict[str, Any] | None):
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        self.log: IO[bytes] = tempfile.TemporaryFile(prefix="reproarchive-worker-")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-X", "faulthandler", "-m", "reproarchive.replay.isolation", "--worker",
                 str(req_r), str(res_w)],
                env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, pass_fds=(req_r, res_w),
                start_new_session=True,  # Ctrl-C reaches the parent only; it ends the workers
            )
        finally:
            os.close(req_r)
            os.close(res_w)
        self.requests = os.fdopen(req_w, "w", encoding="utf-8")
        self.results = os.fdopen(res_r, "r", encoding="utf-8")
        if warmup:
            self._send({"warmup": warmup})

    def _send(self, message: dict[str, Any]) -> None:
        self.requests.write(json.dumps(message, default=str) + "\n")
        self.requests.flush()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, path: str | os.PathLike, options: dict[str, Any]):
        from reproarchive.replay.runner import Outcome

        start = os.fstat(self.log.fileno()).st_size
        meta: dict[str, Any] = {}
        try:
            self._send({"path": os.fspath(Path(path).resolve()), "options": options})
            for line in self.results:
                message = json.loads(line)
                if "started" in message:
                    meta = message["started"]
                elif "error" in message:
                    _raise_child_error(message["error"])
                elif "outcome" in message:
                    return Outcome.from_dict(message["outcome"])
        except (BrokenPipeError, ValueError):
            pass
        returncode = self.proc.wait()
        self.log.seek(start)
        tail = self.log.read().decode("utf-8", "replace")
        return _died(path, returncode, tail, meta)

    def close(self) -> None:
        for stream in (self.requests, self.results):
            try:
                stream.close()
            except OSError:
                pass
        if self.alive:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class WorkerPool:
    """``size`` warm replay processes for one archive's environment; ``run`` is thread-safe.

    Workers start at once (their torch import overlaps with whatever the caller does next) and
    ``warmup`` -- ``{"backend": name}`` -- has each one compile a one-op graph with that backend
    first, so the compiler's own first-use cost is paid before the first candidate, too. A
    worker that dies is replaced at once, and the replacement joins the back of the queue:
    with ``spares`` extra workers (for failures that are crashes, where every failing
    candidate kills its worker) the next candidate goes to a worker that is already warm while
    the replacement warms up. Use as a context manager or call ``close``.
    """

    def __init__(self, environment: dict[str, Any] | None = None, *, size: int = 1, spares: int = 0,
                 warmup: dict[str, Any] | None = None):
        self._env = _child_env(environment)
        self._warmup = warmup
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self.size = max(1, int(size))
        self.started = 0
        for _ in range(self.size + max(0, int(spares))):
            self._idle.put(self._start())

    def _start(self) -> _Worker:
        worker = _Worker(self._env, self._warmup)
        with self._lock:
            self._workers.append(worker)
            self.started += 1
        return worker

    def run(self, path: str | os.PathLike, **options: Any):
        """``replay.run(path, isolate=False, **options)`` in a warm worker; its Outcome."""
        worker = self._idle.get()
        try:
            if not worker.alive:
                worker = self._replace(worker)
            outcome = worker.run(path, options)
        finally:
            if not worker.alive:
                worker = self._replace(worker)
            self._idle.put(worker)
        return outcome

    def _replace(self, worker: _Worker) -> _Worker:
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

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


def _child(request_path: str, started_path: str, result_path: str) -> int:
    from reproarchive.replay.runner import run_here

    request = json.loads(Path(request_path).read_text())
    options = request["options"]

    def started(meta: dict[str, Any]) -> None:
        _write_json(Path(started_path), meta)

    try:
        outcome = run_here(request["path"], on_start=started, **options)
    except errors.ReproArchiveError as err:
        _write_json(Path(result_path), {"error": {"class": type(err).__name__, "what": err.what, "hint": err.hint}})
        return 0
    except Exception as exc:  # noqa: BLE001 - report, never a traceback in the parent
        _write_json(Path(result_path), {"error": {"class": "ReproArchiveError",
                                                  "what": f"the isolated replay failed: {type(exc).__name__}: {exc}"}})
        return 0
    _write_json(Path(result_path), {"outcome": outcome.to_dict()})
    return 0


def _warm(spec: dict[str, Any]) -> None:
    """Pay the backend's first-use cost (imports, toolchain probes) on a one-op graph."""
    import torch
    import torch.fx as fx

    from reproarchive.replay.runner import replay_graph

    g = fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(torch.ops.aten.sin.default, (x,)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    try:
        replay_graph(gm, [torch.ones(4)], backend=spec.get("backend") or "eager", source_kind=spec.get("source_kind"),
                     only_fwd=True, report_differences=False)
    except Exception:  # noqa: BLE001 - a failed warm-up only costs the first request its setup
        pass


def _serve(request_fd: str, result_fd: str) -> int:
    """A warm worker: one replay per request line, until the parent closes the pipe."""
    from reproarchive.replay.runner import run_here

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    requests = os.fdopen(int(request_fd), "r", encoding="utf-8")
    results = os.fdopen(int(result_fd), "w", encoding="utf-8")

    def send(message: dict[str, Any]) -> None:
        results.write(json.dumps(message, default=str) + "\n")
        results.flush()

    for line in requests:
        request = json.loads(line)
        if "warmup" in request:
            _warm(request["warmup"])
            continue
        try:
            outcome = run_here(request["path"], on_start=lambda meta: send({"started": meta}), **request["options"])
        except errors.ReproArchiveError as err:
            send({"error": {"class": type(err).__name__, "what": err.what, "hint": err.hint}})
            continue
        except Exception as exc:  # noqa: BLE001 - report, never a traceback in the parent
            send({"error": {"class": "ReproArchiveError",
                            "what": f"the isolated replay failed: {type(exc).__name__}: {exc}"}})
            continue
        send({"outcome": outcome.to_dict()})
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(_serve(*sys.argv[2:4]))
    sys.exit(_child(*sys.argv[1:4]))
