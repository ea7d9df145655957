"""Capture of a multi-rank job under torchrun with gloo: one archive for the job, every
rank in it, and what each was doing. Each test starts one real job (``support/job_program.py``)."""

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

PROGRAM = Path(__file__).resolve().parents[1] / "support" / "job_program.py"
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _torchrun(tmp_path: Path, mode: str, nproc: int = 2, timeout_s: float = 30,
              **env_vars: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "REPROARCHIVE_JOB_WAIT_S": "20", **env_vars}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                           str(PROGRAM), mode, str(tmp_path / "out"), str(timeout_s)],
                          capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path)


def _job_archive(tmp_path: Path) -> Path:
    found = sorted((tmp_path / "out").glob("job-*.tar.zst"))
    assert len(found) == 1, sorted(p.name for p in (tmp_path / "out").iterdir())
    return found[0]


@pytest.fixture(scope="module")
def failed_job(tmp_path_factory):
    """One 2-rank job whose rank 1 fails, run once with TORCH_TRACE on (one log per rank)."""
    tmp_path = tmp_path_factory.mktemp("fail")
    return tmp_path, _torchrun(tmp_path, "fail", TORCH_TRACE=str(tmp_path / "trace"))


def test_a_failure_on_rank_1_gives_one_archive_with_both_ranks(failed_job):
    tmp_path, done = failed_job
    assert done.returncode != 0 and "injected failure on rank 1" in done.stderr
    archive = _job_archive(tmp_path)
    assert f"archive written to {archive}" in done.stderr
    reproarchive.verify(archive)
    job = reproarchive.load_job(archive)
    assert (job.world_size, job.backend, job.failing_rank, job.primary_rank) == (2, "gloo", 1, 1)
    assert [r.rank for r in job.ranks] == [0, 1]
    one = job.rank(1)
    assert one.outcome.status == "failed" and "injected failure on rank 1" in one.outcome.failure.message
    assert job.records.failure.message.startswith("injected failure on rank 1")
    # rank 0 was blocked in the collective rank 1 never reached (then the launcher stopped it)
    assert job.rank(0).outcome.status in ("running", "failed")
    # the job archive holds a part of every rank: the parts are gone, whoever the launcher stopped
    assert sorted((tmp_path / "out").iterdir()) == [archive]
    for r in job.ranks:
        assert r.args[0].tolist() == [float(r.rank)] * 4  # each rank's own real inputs
        assert [c.op for c in r.schedule] == ["all_reduce"] and r.schedule[0].group == job.groups[0].name
    assert job.groups[0].ranks == (0, 1) and job.groups[0].backend == "gloo"
    with pytest.raises(reproarchive.errors.NotReplayableHereError, match="reproarchive run"):
        reproarchive.load(archive)


def test_ranks_that_fail_at_once_each_name_the_one_job_archive(tmp_path):
    """Both ranks raise in the same call: the first to take the parts' lock merges both parts and
    removes the folder; the other, waiting on that lock, finds its part merged. It said "no
    archive written: PackError: no rank parts to merge" where the archive held it."""
    done = _torchrun(tmp_path, "every")
    assert done.returncode != 0 and "could not write the job archive" not in done.stderr, done.stderr[-3000:]
    archive = _job_archive(tmp_path)
    assert sorted((tmp_path / "out").iterdir()) == [archive]
    for rank in (0, 1):
        assert f"reproarchive: rank {rank}: forward failure captured in {archive}" in done.stderr, done.stderr[-3000:]
    job = reproarchive.load_job(archive)
    assert [(r.rank, r.outcome.status) for r in job.ranks] == [(0, "failed"), (1, "failed")]
    assert {job.rank(r).outcome.failure.message for r in (0, 1)} == {"injected failure on rank 0",
                                                                     "injected failure on rank 1"}


def test_pack_of_the_job_s_torch_trace_folder_gives_one_job_archive(failed_job, tmp_path):
    trace = failed_job[0] / "trace"
    assert len(list(trace.glob("dedicated_log_torch_trace_rank_*.log"))) == 2
    result = invoke("pack", trace, "--all", "--no-replay", "-o", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert len(report["archives"]) == 2 and report["job"]["kind"] == "job"
    job = reproarchive.load_job(report["job"]["archive"])
    assert [r.rank for r in job.ranks] == [0, 1] and job.world_size == 2 and job.index.job.graphs == ()
    assert [[c.op for c in r.schedule] for r in job.ranks] == [["all_reduce"], ["all_reduce"]]
    assert job.groups[0].ranks == (0, 1) and "the log does not list them" in job.groups[0].desc


def test_a_hang_is_a_timeout_and_inspect_names_the_rank_that_skipped_a_collective(tmp_path):
    done = _torchrun(tmp_path, "hang", timeout_s=5)
    assert done.returncode != 0
    archive = _job_archive(tmp_path)
    job = reproarchive.load_job(archive)
    zero = job.rank(0)
    assert zero.outcome.status == "timeout" and zero.outcome.failure.stage == "timeout"
    assert job.failing_rank == 0 and job.rank(1).outcome.status == "passed"
    assert [c.op for c in zero.schedule] == ["all_reduce", "all_reduce"] and len(job.rank(1).schedule) == 1
    result = invoke("inspect", archive)
    assert result.exit_code == 0, result.output
    assert "rank 1 issued no collective #2 on group '0', where rank 0 issued all_reduce on group '0' float32[4]" \
        in result.output
    report = json.loads(invoke("inspect", archive, "--json").stdout)
    assert report["job"]["divergence"]["rank"] == 1 and report["job"]["divergence"]["index"] == 1
    assert report["failure"]["stage"] == "timeout"


def test_a_crash_on_rank_1_leaves_parts_that_pack_merges_naming_the_rank_and_signal(tmp_path):
    done = _torchrun(tmp_path, "crash")
    assert done.returncode != 0
    parts = sorted((tmp_path / "out").glob("job-*.parts"))
    if parts:  # the crashed rank could not merge; rank 0 did not either (the launcher stopped it first)
        result = invoke("pack", parts[0], "--json")
        assert result.exit_code == 0, result.output
        archive = Path(json.loads(result.stdout)["archive"])
        assert not list((tmp_path / "out").glob(".*.partial"))  # a rank stopped while it merged left one
    else:  # rank 0 merged, its peer gone: the archive holds both parts, and they are gone
        archive = _job_archive(tmp_path)
    assert not list((tmp_path / "out").glob("repro-*"))  # a rank's part is its crash record, not a spool
    job = reproarchive.load_job(archive)
    assert job.failing_rank == 1 and job.rank(1).outcome.status == "crashed"
    assert job.rank(1).outcome.signal == "SIGABRT" and job.records.failure.exception_type == "SIGABRT"
    zero = job.rank(0).outcome  # blocked in its collective when the launcher stopped it, or told its peer left
    assert zero.status == "running" or zero.status == "failed" and "lost a peer" in zero.doing


def test_four_ranks_on_a_mesh_record_groups_members_names_and_dtensor_placements(tmp_path):
    done = _torchrun(tmp_path, "mesh", nproc=4)
    assert done.returncode != 0
    job = reproarchive.load_job(_job_archive(tmp_path))
    assert [r.rank for r in job.ranks] == [0, 1, 2, 3] and job.failing_rank == 1
    by_members = {g.ranks: g for g in job.groups}
    assert by_members[(0, 1)].mesh_dim == by_members[(2, 3)].mesh_dim == "tp"
    assert by_members[(0, 2)].mesh_dim == by_members[(1, 3)].mesh_dim == "dp"
    assert job.mesh.shape == (2, 2) and job.mesh.dim_names == ("dp", "tp") and job.mesh.ranks == (0, 1, 2, 3)
    for r in job.ranks:
        # the tp collective names this rank's own sub-group, by its recorded name
        (collective,) = r.schedule
        assert r.rank in next(g for g in job.groups if g.name == collective.group).ranks
        (dt,) = r.dtensors
        assert [p.kind for p in dt.placements] == ["replicate", "shard"] and dt.placements[1].dim == 0
        assert dt.shape == (4, 4) and tuple(r.args[dt.input].shape) == (2, 4)  # the local shard is stored
        assert r.args[dt.input].tolist() == [[float(4 * i + j) for j in range(4)] for i in range(4)][
            2 * (r.rank % 2):2 * (r.rank % 2) + 2]
    # inspect names each DTensor input's placements and its mesh, with the mesh's dimension names
    archive = _job_archive(tmp_path)
    report = json.loads(invoke("inspect", archive, "--json").stdout)
    for row in report["job"]["ranks"]:
        assert row["dtensor_inputs"] == [{"input": 0, "shape": [4, 4], "placements": ["Replicate()", "Shard(0)"],
                                          "mesh_shape": [2, 2], "mesh_dim_names": ["dp", "tp"]}]
    assert report["job"]["meshes"][0]["dim_names"] == ["dp", "tp"]
    text = invoke("inspect", archive).stdout
    assert "input 0: DTensor (4, 4) [Replicate(), Shard(0)] on mesh (2, 2) (dp, tp)" in text


def test_capture_of_torchrun_reaches_every_rank_and_gives_one_job_archive(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "REPROARCHIVE_JOB_WAIT_S": "20"}
    cli = [sys.executable, "-c", "from reproarchive.cli import main; main()"]
    done = subprocess.run([*cli, "capture", "-o", str(tmp_path / "out"), "--json",
                           "--", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(PROGRAM), "plain-fail", str(tmp_path / "unused")],
                          capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path)
    report = json.loads(done.stdout)
    (archive,) = [a for a in report["archives"] if a["kind"] == "job"]
    job = reproarchive.load_job(archive["archive"])
    assert [r.rank for r in job.ranks] == [0, 1] and job.failing_rank == 1
    assert "injected failure on rank 1" in job.rank(1).outcome.failure.message
    assert not (tmp_path / "unused").exists()  # the program itself never named reproarchive
    # (format 1.7) every rank's ops say which line of the program they came from; the program's
    # folder (a checkout, not the job's) is never written out: a label, or its name alone
    for r in job.ranks:
        stacks = [n.meta.get("stack_trace") or "" for n in r.gm.graph.nodes if n.op == "call_function"]
        assert stacks and all(re.match(rf'  File "<[a-z-]+>/(\S+/)?{PROGRAM.name}", line ', s) for s in stacks), \
            (r.rank, stacks)


# -- a failure in a later call: every rank's part of that call ------------------------------------


def _capture_torchrun(folder: Path, mode: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "REPROARCHIVE_JOB_WAIT_S": "20"}
    cli = [sys.executable, "-c", "from reproarchive.cli import main; main()"]
    return subprocess.run([*cli, "capture", "-o", str(folder / "out"), "--json",
                           "--", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(PROGRAM), f"plain-{mode}", str(folder / "unused")],
                          capture_output=True, text=True, env=env, timeout=240, cwd=folder)


@pytest.fixture(scope="module")
def third_call(tmp_path_factory):
    """The job whose rank 1 indexes out of range in its 3rd call, captured by both routes: the
    capture backend in the program, and ``capture -- torchrun`` around the plain program."""
    in_process = tmp_path_factory.mktemp("third")
    around = tmp_path_factory.mktemp("third-capture")
    return {"backend": (in_process, _torchrun(in_process, "third")),
            "capture --": (around, _capture_torchrun(around, "third"))}


@pytest.mark.parametrize("route", ["backend", "capture --"])
def test_a_failure_in_a_later_call_archives_that_call_on_every_rank(third_call, route):
    tmp_path, done = third_call[route]
    assert done.returncode != 0 and "IndexError" in done.stderr
    archive = _job_archive(tmp_path)
    # one file: no parts left behind, no crash archive for the rank the launcher stopped
    assert sorted((tmp_path / "out").iterdir()) == [archive]
    # the rank names the place the user finds the archive, not a private folder gone at the end
    assert f"archive written to {archive}" in done.stderr
    assert "reproarchive-capture-" not in done.stderr
    job = reproarchive.load_job(archive)
    assert job.failing_rank == 1 and [r.rank for r in job.ranks] == [0, 1]
    one, zero = job.rank(1), job.rank(0)
    assert one.outcome.failure.exception_type == "IndexError" and "call 3" in one.outcome.doing
    # the inputs of the 3rd call, on both ranks: rank 0 wrote its part from inside that call
    assert [a.tolist() for a in one.args[:2]] == [[3.0] * 4, [9]]
    assert [a.tolist() for a in zero.args[:2]] == [[2.0] * 4, [2]]
    assert zero.outcome.status == "running" and "call 3" in zero.outcome.doing
    # the generator states each rank's 3rd call started from, not those its dropout left
    unused = tmp_path / ("unused" if route == "capture --" else "out")
    for rank in (0, 1):
        started = torch.load(f"{unused}.rng-{rank}.pt")[2]
        assert torch.equal(job.rank(rank).rng_states["cpu"], started), rank


def test_a_later_call_s_archive_replays_launched_alone_and_in_one_process(third_call):
    tmp_path, _ = third_call["backend"]
    archive = _job_archive(tmp_path)
    launched = json.loads(invoke("run", archive, "--json").stdout)
    assert launched["status"] == "reproduced" and launched["rank"] == 1, launched
    for rank, status in ((0, "passed"), (1, "reproduced")):
        alone = json.loads(invoke("run", archive, "--rank", str(rank), "--json").stdout)
        assert alone["ranks"][0]["status"] == status, alone
    one_process = invoke("run", archive, "--single-process", "--json")
    report = json.loads(one_process.stdout)
    assert report["status"] == "reproduced" and one_process.exit_code == 1, one_process.output
    assert any("raised before its collectives had values" in w for w in report["warnings"])
