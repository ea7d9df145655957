"""``run --minify`` of a job archive: one cut on every rank, judged by launching the job."""

from __future__ import annotations

import json

import pytest

import reproarchive
from support.cli import invoke
from support.job_archives import rank_one_fails


@pytest.mark.slow
def test_minify_keeps_the_culprit_on_every_rank_and_the_values_its_collectives_gave(tmp_path):
    """Rank 0's ``x`` was recorded without its data: the all_reduce value rank 1's cut reads is
    computed from it, so it is labelled generated on rank 1 (each rank its own labels)."""
    archive = rank_one_fails(tmp_path, absent_on_rank_0=True)
    result = invoke("run", "--minify", archive, "-o", tmp_path / "min.tar.zst", "--timeout", "30", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    stats = report["stats"]
    assert report["status"] == "minified" and (stats["initial_ops"], stats["final_ops"]) == (4, 1)
    assert stats["launches"] == 2  # one to record the collectives' values, one reused for every candidate
    assert "torch.relu" in report["code"]
    job = reproarchive.load_job(tmp_path / "min.tar.zst")
    assert job.world_size == 2 and job.failing_rank == 1 and job.records.parent == report["parent"]
    one, zero = job.rank(1), job.rank(0)
    assert "torch.relu" in one.gm.code and "relu" not in zero.gm.code  # the same cut on both ranks
    # the culprit reads what the all_reduce gave rank 1 (x * 2, summed over both ranks)
    originals = reproarchive.load_job(archive)
    expected = sum(r.args[0] * 2 for r in originals.ranks)
    assert one.args[0].tolist() == expected.tolist()
    assert stats["inputs"][0]["from_absent"] is True and stats["inputs"][0]["real"] is False
    labels = {r.rank: [(p.origin, p.from_absent, p.real) for p in r.records.minify.inputs] for r in job.ranks}
    assert labels[1][0][1:] == (True, False)  # computed by the all_reduce from rank 0's generated x
    assert len(labels[0]) == len(zero.args)  # rank 0's own inputs (its cut keeps none), not rank 1's
    assert any("generated" in note or "not the original" in note for note in one.notes), one.notes


def test_judging_each_candidate_by_several_replays_is_refused_for_a_job_in_one_line(tmp_path):
    archive = rank_one_fails(tmp_path)
    result = invoke("run", "--minify", archive, "-o", tmp_path / "min.tar.zst", "--repeat", "2", "--json")
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert "not built for a multi-rank job" in error["message"] and "\n" not in error["message"]
    assert not (tmp_path / "min.tar.zst").exists()
