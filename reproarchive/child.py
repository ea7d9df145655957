"""Running a part of reproarchive in a child process, and getting its result or error back.

Two jobs must not run in the caller's process: importing a PyTorch dump (it is code that sets
environment variables and torch config for good) and replaying an archive whose compiler may
crash (a segfault would take the caller with it). Both use this one protocol:

* the parent writes the request as JSON into a private folder and starts
  ``python -X faulthandler -m <module> <folder>``; the child imports this very reproarchive
  (``PYTHONPATH`` points at it) and nothing from the parent's current directory;
* the child may report ``started`` facts before the risky part (so a parent can still say what
  was being replayed when the child dies), and progress ``event`` lines on its original stdout;
  everything else it prints goes to stderr, which the parent keeps in a log file;
* the child writes ``{"result": ...}`` or ``{"error": {"class", "what", "hint", "rule"}}``; the parent
  re-raises our error classes by name (only ``ReproArchiveError`` subclasses) and reports a
  child that died without a result as ``Died`` with its signal and the end of its log.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from reproarchive import errors

EVENT_PREFIX = "@@reproarchive-event "
#: A child's temporary folder, inside its private one (``temp_folder``): what a child that
#: crashes or is killed leaves there (a replay's working folder) goes when the parent removes it.
TEMP_ENV = "REPROARCHIVE_CHILD_TEMP"
_STDERR_TAIL = 64000  # enough for faulthandler's report of every thread and module


def python_path() -> str:
    """``PYTHONPATH`` for a child that must import this reproarchive (installed or a checkout)."""
    entries = [str(Path(__file__).resolve().parent.parent)] + [p for p in sys.path if p and os.path.isdir(p)]
    if os.environ.get("PYTHONPATH"):
        entries.append(os.environ["PYTHONPATH"])
    return os.pathsep.join(dict.fromkeys(entries))


@dataclass
class Died:
    """A child that ended without a result: killed by a signal, or exited early."""

    returncode: int
    signal_name: str | None  # "SIGSEGV", ...; None for an exit status
    log_tail: str
    started: Any  # what it reported before the risky part, or None
    timed_out: float | None = None  # the time limit (s) it ran past and was killed at, if so

    def crash_facts(self) -> dict[str, str]:
        """What a second child needs to record this death as a crash (``first_replay.crashed``):
        plain data, so it travels in a request."""
        return {"signal": self.signal_name or f"exit status {self.returncode}", "reason": self.reason,
                "log": self.log_tail}

    @property
    def reason(self) -> str:
        """What happened, to follow "the process": "was killed by SIGSEGV (11)"."""
        if self.timed_out is not None:
            return f"ran past its time limit of {self.timed_out:g} s and was stopped"
        if self.signal_name:
            return f"was killed by {self.signal_name} ({-self.returncode})"
        return f"exited with status {self.returncode} without a result"


def run_child(module: str, request: Any, *, env: dict[str, str], on_event: Callable[[str], Any] | None = None,
              keep_log: str | os.PathLike | None = None, timeout: float | None = None) -> tuple[Any, Died | None]:
    """Run ``python -m module`` on ``request``: (its result, None) or (None, how it died).

    A ``ReproArchiveError`` the child raised is raised here again. ``keep_log`` copies the
    child's stderr there. With ``timeout`` the child runs in a session of its own and, past
    that many seconds, it and every process it started are killed (``Died.timed_out``).
    Inside ``warm_children`` the child is forked from a warm server instead of started.
    """
    if _warm is not None:
        return _warm.run(module, env, request, on_event=on_event, keep_log=keep_log, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="reproarchive-child-") as tmp:
        folder = Path(tmp)
        workdir = request_folder(folder, request)
        env = dict(env, PYTHONPATH=python_path(), **temp_for_children(folder / "tmp"))
        env.setdefault("PYTHONFAULTHANDLER", "1")
        log_path = folder / "stderr.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", module, str(folder)], cwd=workdir,
                                    env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                    text=True, errors="replace", start_new_session=timeout is not None)
            watchdog = _Watchdog(proc.pid, timeout) if timeout is not None else None
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    if line.startswith(EVENT_PREFIX) and on_event is not None:
                        on_event(line[len(EVENT_PREFIX):].strip())
                code = proc.wait()
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            finally:
                if watchdog is not None:
                    watchdog.cancel()
        result, died = collect(folder, code, keep_log)
    if died is not None and watchdog is not None and watchdog.fired:
        died.timed_out = timeout
    return result, died


def request_folder(folder: Path, request: Any) -> Path:
    """Write ``request`` into a child's private ``folder``; its working directory, made there.
    Returns the working directory."""
    (folder / "request.json").write_text(json.dumps(request))
    workdir = folder / "cwd"
    workdir.mkdir()
    return workdir


def temp_for_children(folder: Path) -> dict[str, str]:
    """The variable that makes ``folder`` (made here) the temporary folder of the processes
    started with it (``temp_folder``): one their starter removes after them, so a process that
    dies mid-replay leaves nothing in the system's."""
    folder.mkdir(exist_ok=True)
    return {TEMP_ENV: str(folder)}


def temp_folder() -> str | None:
    """Where this process makes temporary folders that must not outlive its parent's request:
    the request's own (``TEMP_ENV``) in a child, else the system's (None)."""
    found = os.environ.get(TEMP_ENV)
    return found if found and os.path.isdir(found) else None


def collect(folder: Path, code: int, keep_log: str | os.PathLike | None = None) -> tuple[Any, Died | None]:
    """What a child that ran in ``folder`` and ended with ``code`` left: (its result, None), or
    (None, how it died); an error it reported is raised here."""
    log_path = folder / "stderr.log"
    if keep_log is not None:
        Path(keep_log).write_bytes(log_path.read_bytes())
    reply = _read_json(folder / "result.json")
    if reply is not None:
        if "error" in reply:
            raise error_from(reply["error"])
        return reply.get("result"), None
    tail = log_path.read_text(errors="replace")[-_STDERR_TAIL:] if log_path.exists() else ""
    return None, _died(code, tail, _read_json(folder / "started.json"))


class _Watchdog:
    """Kills a child's whole session (it and what it started) when its time is up, or when the
    caller gives up on every running child (``stop_timed_children``: such a child is in a session
    of its own, so a Ctrl-C at the terminal does not reach it)."""

    live: set[_Watchdog] = set()

    def __init__(self, pid: int, timeout: float):
        self.pid = pid
        self.fired = False
        self.timer = threading.Timer(timeout, self._expire)
        self.timer.daemon = True
        self.timer.start()
        _Watchdog.live.add(self)

    def _expire(self) -> None:
        self.fired = True
        self.kill_group()

    def kill_group(self) -> None:
        _kill_group(self.pid)

    def cancel(self) -> None:
        self.timer.cancel()
        _Watchdog.live.discard(self)


def stop_timed_children() -> None:
    """Kill every child ``run_child`` started with a timeout that is still running (an
    interrupted caller's cleanup)."""
    for watchdog in list(_Watchdog.live):
        watchdog.kill_group()


def _died(code: int, log_tail: str, started: Any) -> Died:
    name = None
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
    return Died(code, name, log_tail[-_STDERR_TAIL:], started)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


_TRACEBACK_CHARS = 8000  # the end of a child's traceback, where it was raised


def error_from(data: dict) -> errors.ReproArchiveError:
    """The error a child reported as ``{"class", "what", "hint"}``, as our error class."""
    cls = getattr(errors, str(data.get("class", "")), None)
    if not (isinstance(cls, type) and issubclass(cls, errors.ReproArchiveError)):
        cls = errors.ReproArchiveError
    rule = data.get("rule")
    err = cls(str(data.get("what") or "the child process failed"), data.get("hint"),
              rule=rule if rule in {str(r) for r in errors.Rule} else None)
    if isinstance(data.get("traceback"), str):  # an unexpected error: where it was raised (``--debug``)
        err.child_traceback = data["traceback"]
    return err


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


def child_main(handler: Callable[..., Any], *, unexpected: type = errors.ReproArchiveError,
               unexpected_what: str = "the child process failed", warm_imports: tuple[str, ...] = ()) -> int:
    """The child's side: ``handler(request, started=..., event=...)`` returns the result; with
    ``--serve`` (a ``Worker``), once per request line until the parent closes the pipe.

    ``warm_imports``: modules every request imports sooner or later (``torch._dynamo`` for one
    that compiles); a fork server imports them before its first fork, so no child pays them.

    An unexpected exception is reported as one line of class ``unexpected``; its traceback
    goes to the log (the parent shows it with --debug).
    """
    if sys.argv[1:2] == ["--serve"]:
        return _serve(handler, sys.argv[2], sys.argv[3], unexpected, unexpected_what)
    if sys.argv[1:2] == ["--fork-server"]:
        for name in warm_imports:
            importlib.import_module(name)
        return _serve_forks(handler, int(sys.argv[2]), int(sys.argv[3]), unexpected, unexpected_what)
    folder = Path(sys.argv[1])
    event_out = os.fdopen(os.dup(1), "w", buffering=1)  # events on the original stdout ...
    os.dup2(2, 1)  # ... everything else the child or torch prints goes to the log
    sys.stdout = sys.stderr

    def event(text: str) -> None:
        event_out.write(EVENT_PREFIX + text + "\n")

    return run_request(handler, folder, event, unexpected, unexpected_what)


def run_request(handler: Callable[..., Any], folder: Path, event: Callable[[str], None], unexpected: type,
                unexpected_what: str) -> int:
    """The child's work on the request in ``folder``: its result or error written there."""

    def started(facts: Any) -> None:
        _write_json(folder / "started.json", facts)

    try:
        request = json.loads((folder / "request.json").read_text())
        reply: dict[str, Any] = {"result": handler(request, started=started, event=event)}
    except BaseException as err:
        reply = _error_reply(err, unexpected, unexpected_what)
    _write_json(folder / "result.json", reply)
    return 0


def _error_reply(err: BaseException, unexpected: type, unexpected_what: str) -> dict[str, Any]:
    """One line for the parent; the traceback goes to the log (the parent shows it with --debug)."""
    traceback.print_exc()
    if isinstance(err, errors.ReproArchiveError):
        return {"error": {"class": type(err).__name__, "what": err.what, "hint": err.hint,
                          "rule": str(err.rule) if err.rule else None}}
    first = (str(err).strip().splitlines() or [""])[0][:200]
    return {"error": {"class": unexpected.__name__, "what": f"{unexpected_what}: {type(err).__name__}: {first}",
                      "hint": "rerun with --debug to see the child's traceback",
                      "traceback": traceback.format_exc()[-_TRACEBACK_CHARS:]}}


# --------------------------------------------------------------------------------------------
# Warm workers: the same protocol, one child serving many requests


class Worker:
    """A child that stays alive between requests (``python -m module --serve``), for callers
    that send many requests of one kind, such as the minifier replaying candidates: the torch
    import and a compiler's first-use setup are paid once instead of per request.

    Requests go down one pipe as JSON lines and replies come up another, as ``{"started"}``,
    ``{"result"}`` or ``{"error"}`` lines with the meaning they have in ``run_child``; stdout and
    stderr go to a log whose tail is what a ``Died`` reports. ``request`` is not thread-safe:
    one request at a time per worker.
    """

    def __init__(self, module: str, *, env: dict[str, str]):
        self.proc, self._log, self._requests, self._replies, self._temp = _serving(module, "--serve", env)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, request: Any) -> None:
        """A request whose reply nobody waits for (a warm-up)."""
        self._requests.write(json.dumps({"request": request, "reply": False}, default=str) + "\n")
        self._requests.flush()

    def request(self, request: Any) -> tuple[Any, Died | None]:
        """(the handler's result, None) or (None, how the worker died); errors re-raised."""
        start = os.fstat(self._log.fileno()).st_size
        started = None
        try:
            self._requests.write(json.dumps({"request": request, "reply": True}, default=str) + "\n")
            self._requests.flush()
            for line in self._replies:
                reply = json.loads(line)
                if "started" in reply:
                    started = reply["started"]
                elif "error" in reply:
                    raise error_from(reply["error"])
                elif "result" in reply:
                    return reply["result"], None
        except (BrokenPipeError, ValueError):
            pass
        code = self.proc.wait()
        self._log.seek(start)
        return None, _died(code, self._log.read().decode("utf-8", "replace"), started)

    def close(self) -> None:
        _close_quietly(self._requests, self._replies)
        if self.alive:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        shutil.rmtree(self._temp, ignore_errors=True)


def _close_quietly(*streams: Any) -> None:
    for stream in streams:
        try:
            stream.close()
        except OSError:  # the other end is gone already
            pass


def _serving(module: str, mode: str, env: dict[str, str]):
    """``python -m module MODE REQUESTS REPLIES`` in a session of its own (Ctrl-C reaches the
    caller only, which ends it): the process, its log, the two ends of its pipes, and its
    temporary folder (``TEMP_ENV``), for the caller to remove once the process is gone (the
    process removes it itself when its caller dies first: ``_remove_own_folder``): a
    request that kills the process (a crashing candidate) leaves its replay's folder there,
    not in the system's. It works in an empty folder inside that one: ``-m`` puts the working
    folder first on ``sys.path``, and nothing in the caller's must be importable there."""
    temp = tempfile.mkdtemp(prefix="reproarchive-worker-")
    env = dict(env, PYTHONPATH=python_path(), **temp_for_children(Path(temp)))
    (Path(temp) / "cwd").mkdir()
    env.setdefault("PYTHONFAULTHANDLER", "1")
    req_r, req_w = os.pipe()
    res_r, res_w = os.pipe()
    log = tempfile.TemporaryFile(prefix="reproarchive-worker-")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", "-m", module, mode, str(req_r), str(res_w)],
            cwd=Path(temp) / "cwd", env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(req_r, res_w),
            start_new_session=True,
        )
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    finally:
        os.close(req_r)
        os.close(res_w)
    return proc, log, os.fdopen(req_w, "w", encoding="utf-8"), os.fdopen(res_r, "r", encoding="utf-8"), temp


def _serve(handler: Callable[..., Any], request_fd: str, reply_fd: str, unexpected: type, unexpected_what: str) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    requests = os.fdopen(int(request_fd), "r", encoding="utf-8")
    replies = os.fdopen(int(reply_fd), "w", encoding="utf-8")

    def send(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message, default=str) + "\n")
        replies.flush()

    for line in requests:
        message = json.loads(line)
        try:
            reply: dict[str, Any] = {"result": handler(message["request"],
                                                       started=lambda facts: send({"started": facts}),
                                                       event=lambda text: None)}
        except BaseException as err:
            reply = _error_reply(err, unexpected, unexpected_what)
        if message.get("reply", True):
            send(reply)
    _remove_own_folder()
    return 0


# --------------------------------------------------------------------------------------------
# A fork server: fresh children without paying the torch import each time
#
# A fresh ``python -m`` pays the imports (torch, Dynamo, reproarchive: 4 s of a 6 s replay on
# 2 cores) before it does anything. Callers that start many children of one kind pay that again
# and again: ``bisect compiler`` replays one archive a dozen times, triage runs one process per
# task over hundreds of archives, ``pack`` imports every failure of a dump folder in a child of
# its own. A ``ForkServer`` is started once, with the environment the children need at import,
# imports the child module (and through it torch), and then forks one process per request:
# each starts with nothing compiled, no bisector counter and no Dynamo cache, as a fresh process
# would, minus the imports. What Python's ``multiprocessing`` forkserver does, with two things
# it lacks here: the server's environment is the one the caller asked for (variables torch reads
# at import apply), and each child is the same ``run_child`` protocol (request folder,
# ``started``/result files, stderr log, progress events, a time limit, ``Died`` for a child
# killed by a signal), so callers read a forked child as they read a started one.
#
# The server imports but never computes: it starts no thread pool and holds no lock a child
# could inherit mid-use (PyTorch's own DataLoader workers rely on the same property). It works
# in a folder of its own, so nothing in the caller's working folder is importable by its
# children. Each child leads a process group of its own, so a time limit or an interrupted
# caller kills it with everything it started; several may run at once (a triage run's ``-j``).
# ``warm_children`` gives ``run_child`` such servers for a while, one per child module and
# environment.


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


def _kill_group(pid: int | None) -> None:
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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


def _remove_own_folder() -> None:
    """A server whose caller closed the pipe without ending it (a caller killed outright: a Ray
    worker at ``ray.shutdown()``) removes the temporary folder ``_serving`` made for it, as the
    caller's ``close`` would have; only that folder: the parent of its working folder."""
    own = os.environ.get(TEMP_ENV)
    if own and Path(os.getcwd()) == Path(own) / "cwd":
        shutil.rmtree(own, ignore_errors=True)


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


_warm: _Servers | None = None


@contextlib.contextmanager
def warm_children(limit: int = 2) -> Iterator[None]:
    """Inside: ``run_child`` forks its children from a warm ``ForkServer`` per child module and
    environment, so a second child of a kind skips the imports; on leaving, the servers end.
    Nested uses share the outermost one's servers."""
    global _warm
    if _warm is not None:
        yield
        return
    _warm = _Servers(limit)
    try:
        yield
    finally:
        servers, _warm = _warm, None
        servers.close()
