"""Replaying a job on torch.distributed: groups under their recorded names and members, one
verdict over the ranks, hangs, crashes.

The launched tests start real jobs with torch.distributed's launcher (gloo, 2 or 4 processes on
this machine) on ``tests/support/live_job.py``: every rank traces a small function with
functional collectives and hands it, with its own inputs and recorded failure, to the rank
worker (an abort inside an operator, and a 4-rank group layout, which an archive cannot carry
without a test-only operator). Job archives are replayed in test_job_run.py. The rest checks
the verdict and the schedule logic without processes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.fx as fx

from reproarchive.context.failure import crash_record
from reproarchive.replay import launch
from reproarchive.replay.ranks import schedule_of

LIVE_JOB = str(Path(__file__).resolve().parents[1] / "support" / "live_job.py")
TIMEOUT_S = 5.0


def _run(scenario: str, world: int, folder: Path, *, recorded_rank: int | None, recorded=None):
    plan = launch.LaunchPlan({"timeout_s": TIMEOUT_S}, launch.launcher_options(world), TIMEOUT_S,
                             program=[LIVE_JOB, scenario])
    return launch.run_launched(plan, world_size=world, ranks=range(world), recorded=recorded or {},
                               recorded_rank=recorded_rank, keep=folder)


@pytest.mark.slow
def test_an_abort_on_one_rank_is_reported_as_that_ranks_crash(tmp_path, monkeypatch):
    system_temp = tmp_path / "system-temp"
    system_temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(system_temp))  # the ranks' system temporary folder
    recorded = {1: crash_record("SIGABRT", "rank 1 was killed by SIGABRT", "")}
    job = _run("aborts_on_rank_one", 2, tmp_path / "job", recorded_rank=1, recorded=recorded)
    by_rank = {r.rank: r for r in job.ranks}
    assert (job.status, job.exit_code, job.rank) == ("reproduced", 1, 1)
    assert by_rank[1].outcome.observed.exception_type == "SIGABRT" and by_rank[1].outcome.isolated
    assert by_rank[0].status in ("passed", "stopped")  # the crash stayed on rank 1
    # the replay folder of the rank that died went with the launch's
    assert sorted(p.name for p in system_temp.glob("reproarchive-*")) == []
    assert not (tmp_path / "job" / "tmp").exists()


@pytest.mark.slow
def test_sub_groups_come_back_with_their_recorded_names_and_members(tmp_path):
    import json

    job = _run("sub_groups", 4, tmp_path, recorded_rank=None)
    assert job.status == "passed", job.to_dict()
    seen = {r: json.loads((tmp_path / f"groups-{r}.json").read_text()) for r in range(4)}
    world = [0, 1, 2, 3]
    assert seen[0] == {"0": world, "1": [0, 1], "3": [0, 2]}
    assert seen[1] == {"0": world, "1": [0, 1], "4": [1, 3]}
    assert seen[2] == {"0": world, "2": [2, 3], "3": [0, 2]}
    assert seen[3] == {"0": world, "2": [2, 3], "4": [1, 3]}


# --------------------------------------------------------------------------------------------
# without processes


def test_schedule_of_reads_collectives_and_their_groups_from_a_dynamo_graph():
    c10d = torch.ops._c10d_functional

    def f(x):
        y = c10d.wait_tensor(c10d.all_reduce(x, "sum", "7"))
        return (c10d.wait_tensor(c10d.all_gather_into_tensor(y, 2, "3")),)

    found = schedule_of(fx.symbolic_trace(f))
    assert [(c.op, c.group) for c in found] == [("all_reduce", "7"), ("all_gather_into_tensor", "3")]


def test_job_verdict_follows_the_recorded_rank():
    def rank(r, status):
        return launch.RankOutcome(r, status)

    assert launch.job_verdict([rank(0, "passed"), rank(1, "reproduced")], 1) == ("reproduced", 1, 1)
    assert launch.job_verdict([rank(0, "passed"), rank(1, "passed")], 1) == ("passed", 0, 1)
    assert launch.job_verdict([rank(0, "different failure"), rank(1, "passed")], 1)[:2] == ("different failure", 3)
    assert launch.job_verdict([rank(0, "stopped"), rank(1, "crashed")], 1) == ("different failure", 3, 1)
    assert launch.job_verdict([rank(0, "hung"), rank(1, "passed")], None) == ("different failure", 3, 0)


def test_launcher_options_pass_rendezvous_through():
    assert launch.launcher_options(2) == ["--standalone", "--nproc-per-node", "2"]
    multi = launch.launcher_options(2, ["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "127.0.0.1:29400",
                                        "--nproc-per-node", "1"])
    assert "--standalone" not in multi and multi[-2:] == ["--nproc-per-node", "1"]
