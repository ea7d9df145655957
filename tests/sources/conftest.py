"""Real TORCH_TRACE logs, made once per test session by running small failing jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import trace_programs
from support.shared_fixture import built_once


@pytest.fixture(scope="session")
def trace_jobs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """name -> (job folder, trace folder) for every job in ``trace_programs.PROGRAMS``.

    The jobs run concurrently (each is mostly torch's import time); the Inductor one takes a
    real C++ compile. Built once for the whole run (``built_once``): the logs are read-only."""

    def build(root: Path) -> dict[str, tuple[Path, Path]]:
        procs = {name: trace_programs.start(root / name, name) for name in trace_programs.PROGRAMS}
        return {name: (root / name, trace_programs.finish(proc, root / name, name)) for name, proc in procs.items()}

    return built_once(tmp_path_factory, "trace_jobs", build,
                      dump=lambda jobs: {k: [str(a), str(b)] for k, (a, b) in jobs.items()},
                      load=lambda data: {k: (Path(a), Path(b)) for k, (a, b) in data.items()})
