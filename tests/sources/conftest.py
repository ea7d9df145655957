"""Real TORCH_TRACE logs, made once per test session by running small failing jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import trace_programs


@pytest.fixture(scope="session")
def trace_jobs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """name -> (job folder, trace folder) for every job in ``trace_programs.PROGRAMS``.

    The jobs run concurrently (each is mostly torch's import time); the Inductor one takes a
    real C++ compile."""
    root = tmp_path_factory.mktemp("trace_jobs")
    procs = {name: trace_programs.start(root / name, name) for name in trace_programs.PROGRAMS}
    return {name: (root / name, trace_programs.finish(proc, root / name, name)) for name, proc in procs.items()}
