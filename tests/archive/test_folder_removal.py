"""A folder that others read by its name (a job's parts folder, which ``pack FOLDER`` merges)
is removed whole or not at all, and what killed writers left beside a file is cleared by the
next writer that holds their lock.

A rank that merged its job's parts and then removed them file by file could be stopped by the
launcher halfway: the folder stayed under its own name holding one rank's part, and ``pack`` of
it wrote over the whole job's archive with that rank alone (seen under load).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from reproarchive.errors import PackError
from reproarchive.format.atomic import finish_removals, remove_dir, remove_leftovers

ROOT = Path(__file__).resolve().parents[2]
FILES = 20000

CHILD = textwrap.dedent(
    """
    import sys
    from reproarchive.format.atomic import remove_dir
    remove_dir(sys.argv[1])
    """
)


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "job-1.parts"
    folder.mkdir()
    for i in range(FILES):
        (folder / f"rank-{i}.tar.zst").write_bytes(b"x")
    return folder


def test_a_folder_killed_while_it_is_removed_is_whole_or_gone(tmp_path):
    seen_halfway = 0
    for attempt in range(3):
        base = tmp_path / str(attempt)
        base.mkdir()
        folder = _folder(base)
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(folder)], cwd=ROOT,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
        deadline = time.monotonic() + 60
        while folder.exists() and child.poll() is None:  # renamed: the removal itself has begun
            assert time.monotonic() < deadline
            time.sleep(0.001)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        left = sorted(p.name for p in base.iterdir())
        assert left in ([], ["job-1.parts"]) or all(n.startswith(".job-1.parts.") and n.endswith(".removing")
                                                      for n in left), left
        if folder.exists():  # not renamed yet: every file is there
            assert len(list(folder.iterdir())) == FILES
        seen_halfway += any(n.endswith(".removing") for n in left)
    assert seen_halfway, "the kill never landed between the rename and the end of the removal"


def test_removing_a_folder_that_is_gone_is_not_an_error(tmp_path):
    remove_dir(tmp_path / "gone")
    assert list(tmp_path.iterdir()) == []


def test_leftovers_of_killed_writers_of_one_file_are_cleared_and_nothing_else(tmp_path):
    final = tmp_path / "job-1.tar.zst"
    (tmp_path / ".job-1.tar.zst.k3j2.partial").write_bytes(b"half")
    (tmp_path / ".job-1.tar.zst.a9.removing").mkdir()
    (tmp_path / ".job-1.tar.zst.a9.removing" / "rank-0.fault").write_text("")
    keep = [tmp_path / ".job-2.tar.zst.k3j2.partial", tmp_path / ".job-1.tar.zst.note", tmp_path / "job-1.tar.zst"]
    for path in keep:
        path.write_bytes(b"mine")
    gone = remove_leftovers(final)
    assert sorted(p.name for p in gone) == [".job-1.tar.zst.a9.removing", ".job-1.tar.zst.k3j2.partial"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in keep)


def test_removals_a_kill_cut_short_are_finished_by_a_later_merge_and_nothing_else_is_touched(tmp_path):
    """A rank killed while it removed its job's parts folder left it hidden, half emptied; the
    next merge in that output folder (any job's) finishes the removal."""
    from reproarchive.sources.capture.job_parts import merge_folder

    left = tmp_path / ".job-1.parts.a9.removing"
    left.mkdir()
    (left / "rank-1.tar.zst").write_bytes(b"half")
    keep = [tmp_path / ".job-1.tar.zst.note", tmp_path / ".job-1.parts.a9.partial", tmp_path / "job-1.parts.removing"]
    for path in keep:
        path.write_bytes(b"mine")
    assert finish_removals(tmp_path, "*.parts") == [left] and not left.exists()
    left.mkdir()
    (tmp_path / "job-2.parts").mkdir()  # no part in it yet: nothing to merge, the removal is finished
    with pytest.raises(PackError, match="no rank parts"):
        merge_folder(tmp_path / "job-2.parts", tmp_path / "job-2.tar.zst")
    assert not left.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([p.name for p in keep] + ["job-2.parts"])
