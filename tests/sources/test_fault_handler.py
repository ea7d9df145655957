"""Who gets faulthandler's report of a fatal signal (``fault_handler``): the program's own
choice stays; otherwise our latest file, and the program's stderr shows nothing new."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

_PROGRAM = """
import os, sys
from reproarchive.sources.capture import fault_handler
first, second = open(sys.argv[1], "w"), open(sys.argv[2], "w")
print(fault_handler.watch(first), fault_handler.watch(second), fault_handler.watching(first),
      fault_handler.watching(second), flush=True)
os.abort()
"""


@pytest.mark.parametrize("own", [False, True], ids=["ours", "the-programs-own"])
def test_a_fatal_signal_is_reported_to_our_latest_file_unless_the_program_chose(tmp_path, own):
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    flags = ["-X", "faulthandler"] if own else []
    done = subprocess.run([sys.executable, *flags, "-c", _PROGRAM, str(first), str(second)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == -signal.SIGABRT
    if own:  # left where the program said: its stderr, none of our files
        assert done.stdout.split() == ["False"] * 4
        assert "Fatal Python error: Aborted" in done.stderr
        assert first.read_text() == second.read_text() == ""
    else:  # the later of ours took it over; the program's stderr is as it would be without us
        assert done.stdout.split() == ["True", "True", "False", "True"]
        assert "Fatal Python error" not in done.stderr
        assert first.read_text() == ""
        report = second.read_text()
        assert report.startswith("Fatal Python error: Aborted") and "Current thread" in report
