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

This package is where callers and child modules enter: ``run_child`` (a started child, or a
forked one inside ``warm_children``) and ``child_main`` (the child's side, in every mode). What
both sides share is in ``protocol``; children that serve many requests in ``worker`` (a warm
worker) and ``fork_server`` (a server that forks fresh children).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

from reproarchive import errors
from reproarchive.child.fork_server import ForkServer, _serve_forks, _Servers
from reproarchive.child.protocol import (
    EVENT_PREFIX,
    TEMP_ENV,
    Died,
    _Watchdog,
    collect,
    error_from,
    python_path,
    request_folder,
    run_request,
    stop_timed_children,
    temp_folder,
    temp_for_children,
)
from reproarchive.child.worker import Worker, _serve

__all__ = ["EVENT_PREFIX", "TEMP_ENV", "Died", "ForkServer", "Worker", "child_main", "collect", "error_from",
           "python_path", "request_folder", "run_child", "run_request", "stop_timed_children", "temp_folder",
           "temp_for_children", "warm_children"]


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


#: The fork servers ``run_child`` uses inside ``warm_children`` (None: it starts each child).
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
