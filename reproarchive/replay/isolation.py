"""Replaying in a child process, so that a crash becomes an outcome instead of killing us.

Compiler bugs often end in a segfault, an abort from a C++ assertion or a fatal device error;
in-process, that takes the replaying program (and a ``git bisect run`` session's verdict) with
it. The child runs the ordinary replay and returns the outcome; if it dies by a signal, the
parent reports a ``crash`` failure named after the signal, with the child's last stderr lines
(Python's faulthandler is on, so they include the Python stack at the crash).

The child also gets the recorded environment variables before it imports torch, so variables
that only take effect at import (``TORCH_LOGS``, ``PYTORCH_CUDA_ALLOC_CONF``, ...) apply there.
"""

from __future__ import annotations

import os
from typing import Any

from reproarchive.child import run_child
from reproarchive.context.environment import child_environment
from reproarchive.context.failure import crash_record
from reproarchive.format.schema import EnvironmentRecord, FailureRecord, from_plain
from reproarchive.replay.outcome import Outcome, judged


def run_in_child(path: str | os.PathLike, *, environment: EnvironmentRecord | None = None, **options: Any):
    """Run ``replay.run(path, isolate=False, **options)`` in a child; return its Outcome."""
    request = {"path": os.fspath(os.path.abspath(path)), "options": options}
    result, died = run_child("reproarchive.replay.isolated_run", request, env=child_environment(environment))
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
        backend=meta.get("backend") or "",
        warnings=list(meta.get("warnings", [])),
        config=meta.get("config", "recorded"),
        isolated=True,
        archive=os.fspath(path),
        digest=meta.get("digest"),
    )
