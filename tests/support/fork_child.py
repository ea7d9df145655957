"""A child module for the fork-server tests: state a request leaves in its process, the
environment it sees, and a native crash on request (inside a replay's private folder too);
progress events, a hang with a grandchild, a pause, an unexpected error, and where it imports
from."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time

import torch  # what the server imports once for all its children

from reproarchive.child import child_main
from reproarchive.replay.containment import private_outputs

SEEN: list[str] = []  # a fresh child sees it empty


def _a_bug_of_ours() -> None:
    raise KeyError("not-there")


def _handle(request: dict, *, started, event) -> dict:
    if request["what"] == "replay-crash":
        with private_outputs() as folder:
            started({"asked": request["what"], "folder": str(folder)})
            ctypes.string_at(0)
    started({"asked": request["what"]})
    if request["what"] == "events":
        for step in ("one", "two", "three"):
            event(step)
    if request["what"] == "hang":
        grandchild = subprocess.Popen(["sleep", "600"])
        started({"asked": "hang", "grandchild": grandchild.pid})
        time.sleep(600)
    if request["what"] == "pause":
        begun = time.time()
        time.sleep(1.5)
        return {"begun": begun, "ended": time.time(), "server": os.getppid()}
    if request["what"] == "crash":
        ctypes.string_at(0)  # SIGSEGV
    if request["what"] == "bug":
        _a_bug_of_ours()
    SEEN.append(request["what"])
    return {"seen": list(SEEN), "env": os.environ.get("FORK_TEST_VALUE"), "cwd": os.getcwd(), "pid": os.getpid(),
            "sum": float(torch.ones(3).sum()), "path0": sys.path[0], "server": os.getppid(),
            "current_test": os.environ.get("PYTEST_CURRENT_TEST")}


if __name__ == "__main__":
    sys.exit(child_main(_handle))
