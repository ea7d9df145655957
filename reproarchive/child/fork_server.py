"""A fork server: fresh children without paying the torch import each time.

A fresh ``python -m`` pays the imports (torch, Dynamo, reproarchive: 4 s of a 6 s replay on
2 cores) before it does anything. Callers that start many children of one kind pay that again
and again: ``bisect compiler`` replays one archive a dozen times, triage runs one process per
task over hundreds of archives, ``pack`` imports every failure of a dump folder in a child of
its own. A ``ForkServer`` is started once, with the environment the children need at import,
imports the child module (and through it torch), and then forks one process per request:
each starts with nothing compiled, no bisector counter and no Dynamo cache, as a fresh process
would, minus the imports. What Python's ``multiprocessing`` forkserver does, with two things
it lacks here: the server's environment is the one the caller asked for (variables torch reads
at import apply), and each child is the same ``run_child`` protocol (request folder,
``started``/result files, stderr log, progress events, a time limit, ``Died`` for a child
killed by a signal), so callers read a forked child as they read a started one.

The server imports but never computes: it starts no thread pool and holds no lock a child
could inherit mid-use (PyTorch's own DataLoader workers rely on the same property). It works
in a folder of its own, so nothing in the caller's working folder is importable by its
children. Each child leads a process group of its own, so a time limit or an interrupted
caller kills it with everything it started; several may run at once (a triage run's ``-j``).
``warm_children`` gives ``run_child`` such servers for a while, one per child module and
environment.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import select
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

from reproarchive.child.protocol import (
    TEMP_ENV,
    Died,
    _kill_group,
    _Watchdog,
    collect,
    python_path,
    request_folder,
    run_request,
    temp_for_children,
)
from reproarchive.child.worker import _close_quietly, _remove_own_folder, _serving


class ForkServer:
    """``python -m module --fork-server``: ``run(request, env)`` forks a child per request;
    ``run`` may be called from several threads at once."""

    def __init__(self, module: str, *, env: dict[str, str]):
        self.proc, self._log, self._requests, self._replies, self._temp = _serving(module, "--fork-server", env)
        self._write_lock = threading.Lock()
        self._waiting: dict[int, queue.SimpleQueue] = {}
        self._running: dict[int, int] = {}  # request id -> the child's pid, while it runs
        self._ids = itertools.count()
        self._gone = False
        self.reserved = 0  # callers about to run a request (``_Servers``): not to be closed
        threading.Thread(target=self._read_replies, name="reproarchive-fork-server", daemon=True).start()

    @property
    def alive(self) -> bool:
        return not self._gone and self.proc.poll() is None

    @property
    def busy(self) -> bool:
        return bool(self._waiting) or self.reserved > 0

    def run(self, request: Any, *, env: dict[str, str] | None = None, on_event: Callable[[str], Any] | None = None,
            keep_log: str | os.PathLike | None = None, timeout: float | None = None) -> tuple[Any, Died | None]:
        """``run_child``'s answer for ``request`` in a child forked with ``env`` set on top of the
        server's (variables read after import only). A server that is gone dies as a child does."""
        watchdog = pid = None
        with tempfile.TemporaryDirectory(prefix="reproarchive-child-") as tmp:
            folder = Path(tmp)
            request_folder(folder, request)
            events = _EventFile(folder / "events", on_event)
            rid = next(self._ids)
            replies: queue.SimpleQueue = queue.SimpleQueue()
            self._waiting[rid] = replies
            code = None
            try:
                env = dict(env or {}, **temp_for_children(folder / "tmp"))
                if not self._gone:
                    with self._write_lock:
                        self._requests.write(json.dumps({"id": rid, "folder": str(folder), "env": env}) + "\n")
                        self._requests.flush()
                while not self._gone or not replies.empty():
                    try:
                        reply = replies.get(timeout=0.2)
                    except queue.Empty:
                        events.pump()
                        continue
                    if "pid" in reply:
                        pid = self._running[rid] = reply["pid"]
                        if timeout is not None:
                            watchdog = _Watchdog(pid, timeout)
                    else:
                        code = reply["code"]
                        break
                events.pump()
            except (BrokenPipeError, ValueError):
                code = None
            except BaseException:
                _kill_group(pid)  # its late reply is read and dropped
                raise
            finally:
                self._waiting.pop(rid, None)
                self._running.pop(rid, None)
                if watchdog is not None:
                    watchdog.cancel()
            if code is None:  # the server itself is gone: its exit status, its log's tail
                _kill_group(pid)  # a child it left
                code = self.proc.wait()
                self._log.seek(0)
                (folder / "stderr.log").write_bytes(self._log.read())
            result, died = collect(folder, code, keep_log)
        if died is not None and watchdog is not None and watchdog.fired:
            died.timed_out = timeout
        return result, died

    def _read_replies(self) -> None:
        try:
            for line in self._replies:
                reply = json.loads(line)
                waiting = self._waiting.get(reply["id"])
                if waiting is not None:
                    waiting.put(reply)
        except (OSError, ValueError):
            pass
        self._gone = True

    def close(self) -> None:
        for pid in list(self._running.values()):  # children lead groups of their own
            _kill_group(pid)
        _kill_group(self.proc.pid)  # the server (a session of its own)
        self.proc.wait()
        _close_quietly(self._requests, self._replies)
        self._log.close()
        shutil.rmtree(self._temp, ignore_errors=True)

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _EventFile:
    """A forked child's progress events: it appends lines to a file in its folder (its stdout
    is its log), which the parent reads as they come."""

    def __init__(self, path: Path, on_event: Callable[[str], Any] | None):
        self.path, self.on_event, self.offset, self.partial = path, on_event, 0, b""

    def pump(self) -> None:
        if self.on_event is None:
            return
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            self.on_event(line.decode("utf-8", "replace").strip())


def _serve_forks(handler: Callable[..., Any], request_fd: int, reply_fd: int, unexpected: type,
                 unexpected_what: str) -> int:
    """The server's loop: a forked child per request line, answered with ``{"id", "pid"}`` when
    it starts and ``{"id", "code"}`` (its exit status) when it ends. One thread: a SIGCHLD wakes
    the wait for the next request, and every wake reaps what has ended."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller decides when to stop
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    replies = os.fdopen(reply_fd, "w", encoding="utf-8")
    running: dict[int, int] = {}  # pid -> request id
    pending = b""
    open_requests = True

    def reply(message: dict[str, Any]) -> None:
        try:
            replies.write(json.dumps(message) + "\n")
            replies.flush()
        except OSError:  # the caller is gone
            pass

    while open_requests or running:
        ready, _, _ = select.select([request_fd, wake_r] if open_requests else [wake_r], [], [], 1.0)
        if wake_r in ready:
            os.read(wake_r, 4096)
        if request_fd in ready:
            chunk = os.read(request_fd, 1 << 16)
            if not chunk:  # the caller closed the pipe (or died): end what runs, then stop
                open_requests = False
                for pid in running:
                    _kill_group(pid)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                message = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    _child(handler, message, (request_fd, reply_fd, wake_r, wake_w), unexpected, unexpected_what)
                try:
                    os.setpgid(pid, pid)  # as the child does: whichever runs first
                except OSError:
                    pass
                running[pid] = message["id"]
                reply({"id": message["id"], "pid": pid})
        for pid in list(running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                reply({"id": running.pop(pid), "code": os.waitstatus_to_exitcode(status)})
    _remove_own_folder()
    return 0


def _child(handler: Callable[..., Any], message: dict, server_fds: tuple[int, ...], unexpected: type,
           unexpected_what: str) -> None:
    """A forked child: its own process group, the request's folder, environment and log, then
    ``run_request``; never returns into the server's loop."""
    code = 70  # EX_SOFTWARE: the child's own set-up failed
    try:
        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        for fd in server_fds:
            os.close(fd)
        folder = Path(message["folder"])
        os.environ.update(message["env"])
        os.chdir(folder / "cwd")
        log = os.open(folder / "stderr.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        events = open(folder / "events", "a", buffering=1, encoding="utf-8")
        code = run_request(handler, folder, lambda text: events.write(text + "\n"), unexpected,
                           unexpected_what)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


# --------------------------------------------------------------------------------------------
# Warm children for a while: run_child forks from servers


#: Variables that change between the children of one caller and that nothing reads at import:
#: they do not choose the server (each child still gets their current values). pytest names the
#: running test in one, which would give every test of a suite a server of its own.
_PER_CHILD_VARIABLES = frozenset({"PYTEST_CURRENT_TEST", TEMP_ENV})


class _Servers:
    """The fork servers ``run_child`` uses inside ``warm_children``: one per child module and
    environment, the least recently used idle one closed past ``limit`` (each holds an imported
    torch, some hundreds of MiB)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.lock = threading.Lock()
        self.servers: dict[tuple[str, tuple[tuple[str, str], ...]], ForkServer] = {}

    def run(self, module: str, env: dict[str, str], request: Any, **how: Any) -> tuple[Any, Died | None]:
        """``run_child``'s answer, from the server for ``module`` and ``env``: the ``PYTHONPATH``
        a started child would get is part of the environment (a caller that added a folder to
        ``sys.path`` since gets a server that sees it)."""
        env = dict(env, PYTHONPATH=python_path())
        server = self.server(module, env)
        try:
            return server.run(request, env=env, **how)
        finally:
            with self.lock:
                server.reserved -= 1

    def server(self, module: str, env: dict[str, str]) -> ForkServer:
        """The server for ``module`` and ``env``, reserved for one request."""
        key = (module, tuple(sorted((k, v) for k, v in env.items() if k not in _PER_CHILD_VARIABLES)))
        with self.lock:
            server = self.servers.pop(key, None)
            if server is not None and not server.alive:
                server.close()
                server = None
            if server is None:
                server = ForkServer(module, env=env)
            server.reserved += 1
            self.servers[key] = server  # the most recently used last
            idle = [k for k, s in self.servers.items() if k != key and not s.busy]
            for old in idle[: max(0, len(self.servers) - self.limit)]:
                self.servers.pop(old).close()
            return server

    def close(self) -> None:
        with self.lock:
            servers, self.servers = list(self.servers.values()), {}
        for server in servers:
            server.close()
