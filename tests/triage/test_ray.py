"""``triage --engine ray``: the same tasks on a local Ray give the same verdicts.

One test: ``ray.init()`` costs seconds. Skipped when Ray is not installed (CI installs it with
the test extra)."""

from __future__ import annotations

import shutil

import pytest

from reproarchive.triage.engine import LocalExecutor
from reproarchive.triage.fleet import triage_fleet
from support import fleet_corpus

ray = pytest.importorskip("ray")


@pytest.mark.slow
def test_ray_gives_the_verdicts_the_local_engine_gives(tmp_path, monkeypatch):
    # Ray starts its workers with OMP_NUM_THREADS=<the task's CPUs> when the driver sets none, and
    # the worker's probe rightly records that as a different environment (a thread count can change
    # a kernel's numerics). Pinned here, so that both engines replay under the same one.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    fleet_corpus.build(tmp_path, 2, bugs=("relu-runtime", "no-tanh"))
    local_folder, ray_folder = tmp_path / "archives", tmp_path / "on-ray"
    shutil.copytree(local_folder, ray_folder)  # a cache of its own: every task really runs on Ray
    trusted = (fleet_corpus.NO_LOWERING,)
    local = triage_fleet(local_folder, actions=("replay",), executor=LocalExecutor(2), trusted_backends=trusted)
    from reproarchive.triage.ray_engine import RayExecutor

    with RayExecutor(num_cpus=1, init_options={"num_cpus": 1}) as executor:  # one worker to start
        on_ray = triage_fleet(ray_folder, actions=("replay",), executor=executor, trusted_backends=trusted)
    assert on_ray.engine == "ray" and on_ray.tasks["run"] == 2
    # the cluster's environment is this machine's: the verdicts are cached under the same digest
    assert on_ray.environment.digest == local.environment.digest

    def verdicts(report):
        return {g.text: (g.verdicts["replay"].status, g.verdicts["replay"].signature) for g in report.groups}

    assert verdicts(on_ray) == verdicts(local)
    assert {status for status, _ in verdicts(local).values()} == {"reproduced"}
