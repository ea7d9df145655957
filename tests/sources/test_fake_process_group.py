"""A program on PyTorch's fake process group (one process playing rank 0 of 2, with a DTensor
input and a collective) is captured and replayed as it ran: the capture waits for no other rank
and leaves one archive, and ``run`` replays that rank against the fake group, the recorded
condition, without being asked for ``--rank``; ``run --minify`` shrinks it the same way, that rank
alone against the fake group, to inductor's relu.

Before: the capture waited for a rank that never runs (``REPROARCHIVE_JOB_WAIT_S``) and left a
parts folder beside the archive, and ``run`` refused the archive as "a part written while the job
ran", pointing at a folder of parts that never existed; ``run --minify`` refused it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import reproarchive
from support.cli import invoke

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "tests" / "support" / "fake_group_program.py"

pytestmark = pytest.mark.slow


def _replays_as_recorded(archive: Path) -> None:
    result = invoke("run", archive, "--json")
    report = json.loads(result.stdout)
    assert result.exit_code == 1 and report["status"] == "reproduced" and report["rank"] == 0, result.output
    (rank,) = report["ranks"]
    assert rank["outcome"]["observed"]["exception_type"].endswith("CppCompileError")
    assert any("fake process group, as it did when recorded" in w for w in report["warnings"])
    job = json.loads(invoke("inspect", archive, "--json").stdout)["job"]
    assert job["world_size"] == 2 and job["backend"] == "fake"
    (row,) = job["ranks"]
    assert row["dtensor_inputs"][0]["placements"] == ["Shard(0)"]


def test_a_capture_in_the_program_leaves_one_archive_that_run_replays_as_recorded(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REPROARCHIVE_JOB_WAIT_S": "60"}
    done = subprocess.run([sys.executable, str(PROGRAM), "capture", str(out)], capture_output=True, text=True,
                          env=env, timeout=50, cwd=tmp_path)  # within the wait: it must not wait at all
    assert done.returncode != 0 and "CppCompileError" in done.stderr
    (archive,) = out.iterdir()  # no parts folder left beside it
    assert archive.name.startswith("job-") and archive.name.endswith(".tar.zst")
    _replays_as_recorded(archive)
    # minified as recorded: rank 0 alone on the fake group, its all_reduce replaced by the value
    # the fake group gave it; every cut judged by that replay, down to the relu
    minified = tmp_path / "min.tar.zst"
    result = invoke("run", "--minify", archive, "-o", minified, "--json")
    report = json.loads(result.stdout)
    assert result.exit_code == 0 and report["status"] == "minified", result.output
    code = [ln for ln in report["code"].splitlines() if not ln.strip().startswith("#")]  # not the model lines
    assert "torch.relu" in "\n".join(code) and "all_reduce" not in "\n".join(code)
    assert re.search(r"# File: <[a-z-]+>/(\S+/)?fake_group_program\.py:", report["code"])  # the folder redacted
    assert report["stats"]["final_ops"] == 1 and report["stats"]["rank"] == 0
    job = json.loads(invoke("inspect", minified, "--json").stdout)["job"]
    assert job["backend"] == "fake" and [r["rank"] for r in job["ranks"]] == [0]
    # a torchrun script needs every rank's graph: the other rank never ran, so export is refused
    # in one line, pointing at run, and writes nothing
    refused = invoke("export", archive, "-o", tmp_path / "x")
    assert refused.exit_code == 2 and refused.output.count("\n") == 1, refused.output
    assert "fake process group" in refused.output and "reproarchive run" in refused.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["min.tar.zst", "out"]


def test_capture_dash_dash_of_the_program_replays_as_recorded(tmp_path):
    result = invoke("capture", "-o", tmp_path / "out", "--json", "--", sys.executable, PROGRAM, "plain",
                    tmp_path / "unused", env={"PYTHONPATH": str(ROOT)})
    assert result.exit_code == 1, result.output
    (archive,) = (tmp_path / "out").iterdir()
    _replays_as_recorded(archive)


def test_accuracy_is_not_checked_on_a_rank_and_the_capture_says_so(tmp_path):
    """A wrong value on one rank reaches every rank through the collectives, so each rank's
    comparison with eager would report it: the capture says once that it does not check (it
    checked nothing, silently)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from reproarchive.sources.capture.capture_backend import CaptureWarning, _no_accuracy_on_ranks

    _no_accuracy_on_ranks.cache_clear()
    torch._dynamo.reset()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        compiled = torch.compile(lambda x: torch.relu(x) * 2,
                                 backend=reproarchive.capture("eager", path=tmp_path / "out", accuracy=True))
        with pytest.warns(CaptureWarning, match="accuracy=True is not checked on the ranks of a multi-rank job"):
            assert torch.equal(compiled(torch.ones(4)), torch.full((4,), 2.0))
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()
