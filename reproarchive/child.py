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
* the child writes ``{"result": ...}`` or ``{"error": {"class", "what", "hint"}}``; the parent
  re-raises our error classes by name (only ``ReproArchiveError`` subclasses) and reports a
  child that died without a result as ``Died`` with its signal and the end of its log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from reproarchive import errors

EVENT_PREFIX = "@@reproarchive-event "
_STDERR_TAIL = 8000


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

    @property
    def reason(self) -> str:
        """What happened, to follow "the process": "was killed by SIGSEGV (11)"."""
        if self.signal_name:
            return f"was killed by {self.signal_name} ({-self.returncode})"
        return f"exited with status {self.returncode} without a result"


def run_child(module: str, request: Any, *, env: dict[str, str], on_event: Callable[[str], Any] | None = None,
              keep_log: str | os.PathLike | None = None) -> tuple[Any, Died | None]:
    """Run ``python -m module`` on ``request``: (its result, None) or (None, how it died).

    A ``ReproArchiveError`` the child raised is raised here again. ``keep_log`` copies the
    child's stderr there.
    """
    env = dict(env, PYTHONPATH=python_path())
    env.setdefault("PYTHONFAULTHANDLER", "1")
    with tempfile.TemporaryDirectory(prefix="reproarchive-child-") as tmp:
        folder = Path(tmp)
        (folder / "request.json").write_text(json.dumps(request))
        workdir = folder / "cwd"
        workdir.mkdir()
        log_path = folder / "stderr.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", module, str(folder)], cwd=workdir,
                                    env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                    text=True, errors="replace")
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
        if keep_log is not None:
            Path(keep_log).write_bytes(log_path.read_bytes())
        reply = _read_json(folder / "result.json")
        if reply is not None:
            if "error" in reply:
                raise error_from(reply["error"])
            return reply.get("result"), None
        started = _read_json(folder / "started.json")
        tail = log_path.read_text(errors="replace")[-_STDERR_TAIL:]
    name = None
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
    return None, Died(code, name, tail, started)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def error_from(data: dict) -> errors.ReproArchiveError:
    """The error a child reported as ``{"class", "what", "hint"}``, as our error class."""
    cls = getattr(errors, str(data.get("class", "")), None)
    if not (isinstance(cls, type) and issubclass(cls, errors.ReproArchiveError)):
        cls = errors.ReproArchiveError
    return cls(str(data.get("what") or "the child process failed"), data.get("hint"))


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


def child_main(handler: Callable[..., Any], *, unexpected: type = errors.ReproArchiveError,
               unexpected_what: str = "the child process failed") -> int:
    """The child's side: ``handler(request, started=..., event=...)`` returns the result.

    An unexpected exception is reported as one line of class ``unexpected``; its traceback
    goes to the log (the parent shows it with --debug).
    """
    folder = Path(sys.argv[1])
    event_out = os.fdopen(os.dup(1), "w", buffering=1)  # events on the original stdout ...
    os.dup2(2, 1)  # ... everything else the child or torch prints goes to the log
    sys.stdout = sys.stderr

    def event(text: str) -> None:
        event_out.write(EVENT_PREFIX + text + "\n")

    def started(facts: Any) -> None:
        _write_json(folder / "started.json", facts)

    try:
        request = json.loads((folder / "request.json").read_text())
        reply: dict[str, Any] = {"result": handler(request, started=started, event=event)}
    except errors.ReproArchiveError as err:
        traceback.print_exc()
        reply = {"error": {"class": type(err).__name__, "what": err.what, "hint": err.hint}}
    except BaseException as err:  # one line for the parent; the log has the traceback
        traceback.print_exc()
        first = (str(err).strip().splitlines() or [""])[0][:200]
        reply = {"error": {"class": unexpected.__name__, "what": f"{unexpected_what}: {type(err).__name__}: {first}",
                           "hint": "rerun with --debug to see the child's log"}}
    _write_json(folder / "result.json", reply)
    return 0
