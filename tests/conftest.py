"""Fixtures shared by every test folder (helpers live in tests/support/)."""

from __future__ import annotations

import compileall
import os
from pathlib import Path

# The suite runs three test processes (and their children) on two cores. Set before torch is
# imported, so every child process the tests start inherits them:
# - Inductor compiles in a pool of worker processes by default (two here), and most compiles
#   are one or two tiny kernels: every process that compiled paid ~3 s of CPU to start it;
# - OpenMP's threads spin between parallel regions by default, on cores another test process
#   needs: passive, they sleep (the thread count, which some crashes depend on, is unchanged);
# - every process that compiles a C++ kernel first proves each SIMD instruction set the CPU
#   reports by building and loading a probe library, one Python process per set (about 450 in
#   a suite run): told the sets work, it uses the CPU's report alone.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from reproarchive.child import warm_children  # noqa: E402


def pytest_configure(config):
    """The project's own modules compiled to bytecode once, before any test or child process
    starts. An editable install writes none, and where ``PYTHONDONTWRITEBYTECODE`` is set (this
    machine's image sets it) no process does: each of the suite's several hundred child
    processes compiled every module of ours it imported, about 0.4 s of CPU for a replay's.
    Python still checks each file's time stamp, so an edited module is never run stale."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # once, in the process that starts the workers
        root = Path(__file__).resolve().parents[1]
        for folder in ("reproarchive", "cli", "tests", "benchmarks"):
            compileall.compile_dir(root / folder, quiet=2, workers=0)


@pytest.fixture(scope="session", autouse=True)
def warm_child_processes():
    """Children the library starts in this test process are forked from warm servers, as the
    CLI's are (``child.warm_children``): the torch import is paid once per kind of child, not
    once per test. ``tests/test_child.py`` holds both ways to the same answers."""
    with warm_children():
        yield


@pytest.fixture
def fresh_dynamo():
    """A test that compiles starts and ends with an empty Dynamo cache."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
