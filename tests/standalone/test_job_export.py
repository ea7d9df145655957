"""A job's standalone script runs under torchrun: every rank rebuilds its recorded graph, the
recorded groups come back under their names, and only the rank whose inputs fail raises."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.fx as fx

from reproarchive.standalone.job_script import write_job_export

c10d = torch.ops._c10d_functional


def _gather_then_index(x, idx):
    y = c10d.wait_tensor(c10d.all_reduce(x * 2, "sum", "0"))
    return (torch.ops.aten.index_select.default(y, 0, idx) + 1,)


@pytest.mark.slow
def test_the_exported_job_fails_on_rank_one_under_torchrun(tmp_path):
    gm = fx.symbolic_trace(_gather_then_index)
    shared = torch.arange(4.0)
    ranks = [(r, gm, [shared, torch.tensor([r * 10])], ["cpu", "cpu"], None) for r in range(2)]
    report = write_job_export(ranks, [("0", (0, 1))], tmp_path / "bug", world_size=2, backend="eager")
    text = (tmp_path / "bug" / "repro.py").read_text()
    assert "import reproarchive" not in text and "def _graph_1" not in text  # one graph for both ranks
    assert sum(f.startswith("data/") for f in report.files) == 3  # the shared storage once
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "repro.py"], cwd=tmp_path / "bug", env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "rank 0: no failure" in proc.stdout
    assert "rank 1: no failure" not in proc.stdout
    assert "index out of range" in proc.stderr.lower() and "[rank1]" in proc.stderr
