"""Pools sized to the cores a process gets, and a queue whose waiting thread works too."""

from __future__ import annotations

import threading

import pytest

from reproarchive.format import parallel


def test_without_workers_jobs_run_on_the_waiting_thread_in_order():
    ran = []
    with parallel.WorkQueue(0) as q:
        futs = [q.submit(lambda i=i: ran.append((i, threading.get_ident())) or i) for i in range(5)]
        assert ran == []  # nothing runs until a result is needed
        assert futs[2].result() == 2
        assert [i for i, _ in ran] == [0, 1, 2]  # older jobs first
        assert {t for _, t in ran} == {threading.get_ident()}
    assert [i for i, _ in ran] == [0, 1, 2, 3, 4]  # leaving the block runs what is left


def test_workers_and_the_waiting_thread_share_the_jobs():
    started, release = threading.Event(), threading.Event()
    threads = set()

    def job(i):
        threads.add(threading.get_ident())
        if i == 0:
            started.set()
            release.wait(5)  # holds the worker until the waiting thread has run the others
        return i * i

    with parallel.WorkQueue(1) as q:
        futs = [q.submit(job, 0)]
        assert started.wait(5)
        futs += [q.submit(job, i) for i in range(1, 6)]
        assert futs[5].result() == 25
        release.set()
        assert [f.result() for f in futs] == [i * i for i in range(6)]
    assert threading.get_ident() in threads and len(threads) == 2


def test_errors_reach_the_caller_and_an_error_cancels_what_is_queued():
    ran = []

    def boom():
        raise ValueError("bad frame")

    with pytest.raises(ValueError, match="bad frame"):
        with parallel.WorkQueue(0) as q:
            q.submit(boom).result()
    with pytest.raises(KeyError):
        with parallel.WorkQueue(0) as q:
            later = q.submit(ran.append, 1)
            raise KeyError("stop")
    assert later.cancelled() and ran == []


@pytest.mark.parametrize(
    "membership, files, quota",
    [
        ("0::/app/job\n", {"app/job/cpu.max": "150000 100000", "app/cpu.max": "max 100000"}, 1.5),
        ("0::/app/job\n", {"app/job/cpu.max": "max 100000", "app/cpu.max": "300000 100000"}, 3.0),
        ("0::/\n", {"cpu.max": "max 100000"}, None),
        ("4:cpu,cpuacct:/docker/abc\n", {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000",
                                          "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000"}, 0.5),
        ("4:cpu,cpuacct:/docker/abc\n", {"cpu,cpuacct/cpu.cfs_quota_us": "200000",
                                          "cpu,cpuacct/cpu.cfs_period_us": "100000"},
                                          2.0),  # host path, container mount
        ("4:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),
    ],
)
def test_cgroup_cpu_quota(tmp_path, membership, files, quota):
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text + "\n")
    (tmp_path / "proc-cgroup").write_text(membership)
    assert parallel.cgroup_cpu_quota(str(tmp_path), str(tmp_path / "proc-cgroup")) == quota


def test_threads_follow_affinity_and_quota(monkeypatch):
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7}, raising=False)
    monkeypatch.setattr(parallel, "cgroup_cpu_quota", lambda: None)
    assert parallel.available_cores() == 8 and parallel.worker_threads() == parallel.MAX_WORKERS
    monkeypatch.setattr(parallel, "cgroup_cpu_quota", lambda: 1.5)
    assert parallel.available_cores() == 2 and parallel.worker_threads() == 2
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda pid: {3}, raising=False)
    assert parallel.worker_threads() == 1
