"""A replay's working folder (``replay.containment``): private to the replay's files, but alive
for as long as the process, because the compiler starts helpers in it that outlive the replay.

Inductor starts its compile-worker pool at the first compile that needs one, in the working
folder of the moment, and keeps it for the whole process. On torch 2.15 the pool's process
died at start-up when that folder had been removed meanwhile, and every later compile in the
process failed with "Attempting to use a closed pool": the demo's minifier judged all its
candidates as different failures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from reproarchive.replay.containment import contained

# a helper the compiler might start: it reads its working folder only after the replay ended
_HELPER = "import os, sys; sys.stdin.read(); print(os.path.realpath(os.getcwd()))"


def test_a_process_started_in_a_replay_keeps_a_working_folder_after_it():
    with contained() as folder:
        helper = subprocess.Popen([sys.executable, "-c", _HELPER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = helper.communicate("", timeout=60)
    finally:
        helper.kill()
    assert helper.returncode == 0, err
    assert Path(out.strip()) == folder.resolve()


def test_what_a_replay_writes_is_gone_before_the_next_one(tmp_path):
    start = os.getcwd()
    with contained() as first:
        assert Path(os.getcwd()).resolve() == first.resolve()
        Path("kernel.cpp").write_text("int main() {}")
        (first / "torch_compile_debug").mkdir()
    assert os.getcwd() == start
    assert first.is_dir() and list(first.iterdir()) == []
    with contained() as second:
        assert list(second.iterdir()) == []
