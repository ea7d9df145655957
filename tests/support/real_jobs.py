"""A real multi-rank job captured once per test run, shared by the test modules that replay it
(``built_once``: the first worker captures, the others read; the archive is read-only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.shared_fixture import built_once

ROOT = Path(__file__).resolve().parents[2]


def inductor_job(tmp_path_factory: Any) -> Path:
    """A real 2-rank gloo job under ``capture -- torchrun``: inductor on both ranks, its C++ relu
    bug injected through its config on rank 1 alone (``job_program.py``'s ``inductor`` mode: a
    custom op, dropout, a relu in a cond's branch, dynamic shapes). The job ran with TORCH_TRACE
    too: its logs are in the ``trace`` folder beside ``out``."""

    def build(folder: Path) -> Path:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "REPROARCHIVE_JOB_WAIT_S": "30",
               "TORCH_TRACE": str(folder / "trace")}
        done = subprocess.run([sys.executable, "-c", "from reproarchive.cli import main; main()", "capture", "-o",
                               str(folder / "out"), "--json", "--", sys.executable, "-m", "torch.distributed.run",
                               "--standalone", "--nproc-per-node=2",
                               str(ROOT / "tests" / "support" / "job_program.py"), "plain-inductor",
                               str(folder / "unused")],
                              capture_output=True, text=True, env=env, timeout=300, cwd=folder)
        [archive] = [a["archive"] for a in json.loads(done.stdout)["archives"] if a["kind"] == "job"]
        return folder / archive

    return built_once(tmp_path_factory, "inductor-job", build, dump=str, load=Path)
