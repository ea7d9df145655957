"""A job archive's standalone script launches its ranks (or runs under torchrun): every rank
rebuilds its recorded graph, the recorded groups come back under their names, and the rank that
failed raises its error."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.cli import invoke
from support.job_archives import rank_one_fails


@pytest.mark.slow
def test_the_exported_job_launches_its_ranks_and_fails_on_rank_one(tmp_path):
    archive = rank_one_fails(tmp_path)
    result = invoke("export", archive, "-o", tmp_path / "bug")
    assert result.exit_code == 0, result.output
    assert "run it with: python " in result.output and "or torchrun --nproc-per-node 2 " in result.output
    text = (tmp_path / "bug" / "repro.py").read_text()
    assert "import reproarchive" not in text and "GROUPS = [\n    ('0', (0, 1))," in text
    assert text.count("def _graph_") == 2  # rank 1 compiled another graph (with a relu)
    # started with python, the script launches its two ranks and exits once for the job, as run does
    proc = subprocess.run([sys.executable, "repro.py", "--timeout", "30"], cwd=tmp_path / "bug", capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "rank 1: no failure" not in proc.stdout
    assert "[rank1]" in proc.stderr and "ReluCompileError" in proc.stderr
    assert "job: reproduced on rank 1 (exit 1)" in proc.stderr
    # another failure on every rank is a different failure, as `run` judges it: 3, from the same rule
    (tmp_path / "bug" / "otherbug.py").write_text("def backend(gm, args):\n    raise ValueError('another bug')\n")
    other = subprocess.run([sys.executable, "repro.py", "--timeout", "30", "--backend", "otherbug:backend"],
                           cwd=tmp_path / "bug", capture_output=True, text=True, timeout=300)
    assert other.returncode == 3 and "job: a different failure on rank" in other.stderr, other.stderr[-3000:]
    assert "different failure: compile|ValueError|another bug (recorded: " in other.stderr
    fixed = subprocess.run([sys.executable, "repro.py", "--timeout", "30", "--backend", "eager"], cwd=tmp_path / "bug",
                           capture_output=True, text=True, timeout=300)
    assert fixed.returncode == 0 and "job: no failure on any of 2 ranks" in fixed.stdout, fixed.stderr[-3000:]
    # a launcher that cannot start the ranks (rendezvous, a port) judges nothing: one line, 125, as run says
    broken = ("import runpy, torch.distributed.launcher.api as api\n"
              "def refused(*a, **k): raise RuntimeError('rendezvous refused\\nmore detail')\n"
              "api.elastic_launch = refused\n"
              "runpy.run_path('repro.py', run_name='__main__')\n")
    unstarted = subprocess.run([sys.executable, "-c", broken], cwd=tmp_path / "bug", capture_output=True, text=True,
                               timeout=300)
    assert unstarted.returncode == 125 and "Traceback" not in unstarted.stderr, unstarted.stderr[-3000:]
    assert unstarted.stderr.strip() == ("job: the launcher started no rank here (RuntimeError: rendezvous refused) "
                                        "(exit 125); start the ranks yourself: torchrun --nproc-per-node 2 repro.py")
