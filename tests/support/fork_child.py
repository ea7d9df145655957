"""A child module for the fork-server tests: state a request leaves in its process, the
environment it sees, and a native crash on request (inside a replay's private folder too)."""

from __future__ import annotations

import ctypes
import os
import sys

import torch  # what the server imports once for all its children

from reproarchive.child import child_main
from reproarchive.replay.containment import private_outputs

SEEN: list[str] = []  # a fresh child sees it empty


def _handle(request: dict, *, started, event) -> dict:
    if request["what"] == "replay-crash":
        with private_outputs() as folder:
            started({"asked": request["what"], "folder": str(folder)})
            ctypes.string_at(0)
    started({"asked": request["what"]})
    if request["what"] == "crash":
        ctypes.string_at(0)  # SIGSEGV
    SEEN.append(request["what"])
    return {"seen": list(SEEN), "env": os.environ.get("FORK_TEST_VALUE"), "cwd": os.getcwd(), "pid": os.getpid(),
            "sum": float(torch.ones(3).sum())}


if __name__ == "__main__":
    sys.exit(child_main(_handle))
