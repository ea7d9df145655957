"""Replaying in a child process, so that a crash becomes an outcome instead of killing us.

Compiler bugs often end in a segfault, an abort from a C++ assertion or a fatal device error;
in-process, that takes the replaying program (and a ``git bisect run`` session's verdict) with
it. The child runs the ordinary replay and writes the outcome as JSON; if it dies by a signal,
the parent reports a ``crash`` failure named after the signal, with the child's last stderr
lines (Python's faulthandler is on, so they include the Python stack at the crash).

The child also gets the recorded environment variables before it imports torch, so variables
that only take effect at import (``TORCH_LOGS``, ``PYTORCH_CUDA_ALLOC_CONF``, ...) apply there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from reproarchive import errors
from reproarchive.context.failure import crash_record
from reproarchive.format.schema import EnvironmentRecord, FailureRecord, from_plain

_STDERR_TAIL = 8000


def _python_path() -> str:
    """The child must import what we import: this package and any module:function backend."""
    here = str(Path(__file__).resolve().parent.parent)
    entries = [here] + [p for p in sys.path if p and os.path.isdir(p)]
    extra = os.environ.get("PYTHONPATH")
    if extra:
        entries.append(extra)
    return os.pathsep.join(dict.fromkeys(entries))


def run_in_child(path: str | os.PathLike, *, environment: EnvironmentRecord | None = None, **options: Any):
    """Run ``replay.run(path, isolate=False, **options)`` in a child; return its Outcome."""
    from reproarchive.context.environment import child_environment
    from reproarchive.replay.runner import Outcome, judge

    env = child_environment(environment)
    env["PYTHONPATH"] = _python_path()
    env.setdefault("PYTHONFAULTHANDLER", "1")
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
                err = data["error"]
                cls = getattr(errors, err.get("class", ""), None)
                if not (isinstance(cls, type) and issubclass(cls, errors.ReproArchiveError)):
                    cls = errors.ReproArchiveError
                raise cls(err.get("what", "the isolated replay failed"), err.get("hint"))
            return Outcome.from_dict(data["outcome"])
        meta = json.loads(started.read_text()) if started.exists() else {}

    stderr_tail = (proc.stderr or "")[-_STDERR_TAIL:]
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        message = f"the replay process was killed by {name} ({-proc.returncode})"
    else:
        name = f"exit status {proc.returncode}"
        message = f"the replay process exited with status {proc.returncode} without a result"
    observed = crash_record(name, message, stderr_tail, backend=meta.get("backend"))
    recorded = from_plain(FailureRecord, meta["recorded"]) if meta.get("recorded") else None
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


if __name__ == "__main__":
    sys.exit(_child(*sys.argv[1:4]))
