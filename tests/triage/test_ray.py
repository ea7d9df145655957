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
def test_ray_gives_the_verdicts_the_local_engine_gives_and_shares_what_threads_cannot_change(tmp_path, monkeypatch):
    # The laptop replays with 2 OpenMP threads; Ray starts its workers with OMP_NUM_THREADS set
    # to the task's CPUs when the driver sets none. The environments differ in it, and only
    # the runtime failure's verdict depends on it.
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    fleet_corpus.build(tmp_path, 2, bugs=("relu-runtime", "no-tanh"))
    local_folder, ray_folder = tmp_path / "archives", tmp_path / "on-ray"
    shutil.copytree(local_folder, ray_folder)  # a cache of its own: every task really runs on Ray
    trusted = (fleet_corpus.NO_LOWERING,)
    # one replay each: the engines are compared, not the failures' flakiness (test_flaky_groups.py)
    local = triage_fleet(local_folder, actions=("replay",), executor=LocalExecutor(2), trusted_backends=trusted,
                         repeat=1)
    monkeypatch.delenv("OMP_NUM_THREADS")
    from reproarchive.triage.ray_engine import RayExecutor

    with RayExecutor(num_cpus=1, init_options={"num_cpus": 1}) as executor:  # one worker to start
        on_ray = triage_fleet(ray_folder, actions=("replay",), executor=executor, trusted_backends=trusted, repeat=1)
        shared = triage_fleet(local_folder, actions=("replay",), executor=executor, trusted_backends=trusted,
                              repeat=1)
    assert on_ray.engine == "ray" and on_ray.tasks["run"] == 2
    assert on_ray.environment.variables.get("OMP_NUM_THREADS") != "2"
    assert on_ray.environment.digest != local.environment.digest

    def verdicts(report):
        return {g.text: (g.verdicts["replay"].status, g.verdicts["replay"].signature) for g in report.groups}

    assert verdicts(on_ray) == verdicts(local) == verdicts(shared)
    assert {status for status, _ in verdicts(local).values()} == {"reproduced"}
    # on the laptop's cache, Ray replays the runtime failure again and takes the compile error's verdict
    assert {g.signature.stage: g.cached for g in shared.groups} == {"forward": (), "compile": ("replay",)}
    assert (shared.tasks["run"], shared.tasks["cached"]) == (1, 1)
