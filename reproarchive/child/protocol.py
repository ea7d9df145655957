"""What both sides of every child process agree on, in one place: a child started for one
request, a warm worker and a forked child all speak the same request folder, ``started`` and
result files, error replies and ``Died`` records, so a caller reads any child as it reads a
started one (``reproarchive.child``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import traceback
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
    entries = [str(Path(__file__).resolve().parents[2])] + [p for p in sys.path if p and os.path.isdir(p)]
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
        """What a second child needs to record this death as a crash (``import_replay.crashed``):
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


def _kill_group(pid: int | None) -> None:
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
