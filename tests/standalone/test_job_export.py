"""A job archive's standalone script launches its ranks (or runs under torchrun): every rank
rebuilds its recorded graph, the recorded groups come back under their names, and the rank that
failed raises its error."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.cli import invoke
from support.job_archives import dropout_accuracy, rank_one_fails


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


#: what the exported script does with the ranks' endings the launcher reports, one call of its
#: ``_launched`` per case (rank -> exit code, in the order they ended), the launcher stood in for
_ENDINGS = '''
import json, runpy, sys
import torch.distributed.launcher.api as api
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
script = runpy.run_path("repro.py", run_name="repro")
for case in json.loads(sys.argv[1]):
    def launch(config, entry, case=case):
        def start(*args):
            failures = {}
            for when, (rank, code) in enumerate(case):
                failures[rank] = ProcessFailure(rank, 1, code, "")
                failures[rank].timestamp = when
            if failures:
                raise ChildFailedError("repro.py", failures)
        return start
    api.elastic_launch = launch
    print("exit", script["_launched"]([]), file=sys.stderr, flush=True)
'''


def test_the_script_judges_the_ranks_endings_by_run_s_own_rule(tmp_path):
    """The ranks' exits as the launcher reports them, judged as `run` judges a job (rank 1
    failed when recorded): the job's script reaches the verdict through the same function."""
    import json

    archive = rank_one_fails(tmp_path)
    assert invoke("export", archive, "-o", tmp_path / "bug").exit_code == 0
    assert "def job_verdict(" in (tmp_path / "bug" / "repro.py").read_text()
    cases = [
        ([[1, 1]], 1, "job: reproduced on rank 1 (exit 1)"),
        # rank 0 could not read its inputs (70), then the launcher stopped rank 1 (SIGTERM)
        ([[0, 70], [1, -15]], 3, "job: a different failure on rank 0 than recorded (exit 3)"),
        # rank 0's collective failed when its peer went away, and rank 1 ended without failing: no
        # failure (before, the script said 1, which reads as the recorded failure)
        ([[0, 75]], 0, "job: no rank failed; rank 0 stopped when a peer ended (exit 0)"),
        ([[1, 75]], 3, "job: a different failure on rank 1 than recorded (exit 3)"),
        # both ended by SIGTERM: the first was killed (a crash not recorded), the other stopped
        ([[0, -15], [1, -15]], 3, "job: a different failure on rank 0 than recorded (exit 3)"),
        ([[0, 125]], 125, "job: inconclusive on rank 0 (exit 125)"),
        ([[1, 2]], 3, "job: a different failure on rank 1 than recorded (exit 3)"),
    ]
    done = subprocess.run([sys.executable, "-c", _ENDINGS, json.dumps([c for c, _, _ in cases])],
                          cwd=tmp_path / "bug", capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith(("job: ", "exit "))]
    assert lines == [ln for _, code, said in cases for ln in (said, f"exit {code}")], done.stderr[-3000:]


@pytest.mark.slow
def test_a_rank_s_dropout_is_checked_for_accuracy_fairly_as_run_checks_it(tmp_path):
    """A rank whose graph draws random numbers, recorded in accuracy mode under inductor: its
    compile uses inductor's fallback_random, as `run` checks it, so the compiled dropout draws
    eager's mask and a correct graph matches (without it, inductor's own RNG gave another mask:
    "accuracy failure", exit 3)."""
    archive = dropout_accuracy(tmp_path)
    assert invoke("export", archive, "-o", tmp_path / "out").exit_code == 0
    assert "RANK_RANDOM_OPS = {0: ['dropout'], 1: ['dropout']}" in (tmp_path / "out" / "repro.py").read_text()
    done = subprocess.run([sys.executable, "repro.py", "--timeout", "60"], cwd=tmp_path / "out", capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0 and "job: no failure on any of 2 ranks" in done.stdout, done.stderr[-3000:]
    replayed = invoke("run", archive, "--timeout", "60")  # and `run` says the same
    assert replayed.exit_code == 0, replayed.output
