"""A job archive's standalone script runs under torchrun: every rank rebuilds its recorded graph,
the recorded groups come back under their names, and the rank that failed raises its error."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support.cli import invoke
from support.job_archives import rank_one_fails


@pytest.mark.slow
def test_the_exported_job_fails_on_rank_one_under_torchrun(tmp_path):
    archive = rank_one_fails(tmp_path)
    result = invoke("export", archive, "-o", tmp_path / "bug")
    assert result.exit_code == 0, result.output
    assert "run it with: torchrun --nproc-per-node 2" in result.output
    text = (tmp_path / "bug" / "repro.py").read_text()
    assert "import reproarchive" not in text and "GROUPS = [\n    ('0', (0, 1))," in text
    assert text.count("def _graph_") == 2  # rank 1 compiled another graph (with a relu)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "repro.py", "--timeout", "30"], cwd=tmp_path / "bug", env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0
    assert "rank 1: no failure" not in proc.stdout
    assert "[rank1]" in proc.stderr and "ReluCompileError" in proc.stderr
