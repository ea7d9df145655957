"""The pack/load benchmark at a small size, so it cannot rot: correctness only, never time.

Also checks what the benchmark's speed rests on: compressing frames on several threads, and
writing past the page cache, must not change a single byte of the archive.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import pack_load
from reproarchive.archive import loading, packing
from reproarchive.format import digests as digest
from reproarchive.format import frames, layout, reader, writer
from support.records import minimal_index

ROOT = Path(__file__).resolve().parents[2]

SMALL = 16 << 20
ALL_VARIANTS = pack_load.OURS_PACK + pack_load.OURS_READ + pack_load.BASELINES


def _expected(total: int) -> dict:
    """What dedup must give, worked out from the inputs themselves (not from the archive)."""
    _, _, inputs = pack_load.build_inputs(total)
    storages = {}
    for t in inputs:
        st = t.untyped_storage()
        storages[st.data_ptr()] = bytes(pack_load.storage_bytes(st))
    nonzero = {p: b for p, b in storages.items() if any(b)}
    contents = {hashlib.sha256(b).hexdigest(): len(b) for b in nonzero.values()}
    return {
        "storages": len(storages),
        "zero_filled": len(storages) - len(nonzero),
        "blobs": len(contents),
        "stored_bytes": sum(contents.values()),
        "hashed_bytes": sum(len(b) for b in nonzero.values()),
        "inputs": len(inputs),
    }


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """Every variant once, in this process (children would pay torch's import each time)."""
    work = str(tmp_path_factory.mktemp("bench"))
    results = {}
    for variant in ALL_VARIANTS:
        results[variant] = [pack_load.child(variant, SMALL, work)]
    # a second pack of the same inputs, for the determinism check the benchmark reports
    results["pack"].append(pack_load.child("pack", SMALL, work))
    return work, results


def test_benchmark_variants_are_correct(small_run):
    work, results = small_run
    want = _expected(SMALL)
    report = pack_load.summarise(results, SMALL)
    v = report["variants"]
    assert v["pack"]["input_bytes"] == SMALL
    for key in ("storages", "zero_filled", "blobs", "stored_bytes"):
        assert v["pack"][key] == want[key], key
    assert v["pack"]["inputs_sharing_a_storage"] == want["inputs"] - want["storages"] == 2
    assert v["pack"]["identical_bytes_every_run"] is True
    assert v["verify"]["blobs"] == want["blobs"]
    for name in ("load", "read-one", "contentstore-load", "contentstore-read-one", "torchsave-load"):
        assert v[name]["bit_exact"] is True, name
    assert v["load"]["checked_tensors"] == want["inputs"]
    assert v["load"]["aliasing_kept"] is True
    # every writer's archive size is reported; compressing every frame is no larger than what
    # users have today, and storing the frames zstd barely shrinks never costs more than the
    # data itself (raw blocks add 3 bytes per 128 KiB)
    for name in ("pack", "pack-blake3", "pack-compress-all", "contentstore-pack", "torchsave-pack"):
        assert v[name]["file_bytes"] > 0
    assert v["pack-compress-all"]["file_bytes"] <= v["contentstore-pack"]["file_bytes"]
    assert v["pack-compress-all"]["file_bytes"] < v["pack"]["file_bytes"] <= want["stored_bytes"] * 1.001 + (64 << 10)
    assert 0 < report["ratios"]["size_vs_compress_all"] < 1 / (1 - frames.MIN_SAVING)
    for key in ("pack_speedup_vs_contentstore_tar", "load_speedup_vs_contentstore", "read_one_speedup_vs_contentstore",
                "pack_cpu_saving_vs_contentstore_tar", "load_cpu_saving_vs_contentstore"):
        assert report["ratios"][key] is not None and report["ratios"][key] > 0
    for name in ALL_VARIANTS:
        assert v[name]["cpu_seconds_per_gib"] == pytest.approx(v[name]["cpu_seconds"] / (SMALL / (1 << 30)))
    assert v["first-touch"]["peak_extra_bytes"] is None or v["first-touch"]["peak_extra_bytes"] < (4 << 20)
    if os.path.exists("/proc/self/clear_refs"):
        assert v["pack"]["peak_extra_bytes"] >= 0
    text = _printed(report, results)
    assert "pack_speedup_vs_contentstore_tar" in text and "dedup:" in text


def _printed(summary, results) -> str:
    import contextlib

    report = {"input_bytes": SMALL, "requested_bytes": SMALL, "repeat": 1, "one_tensor": pack_load.ONE_TENSOR,
              "versions": pack_load._versions(), "loadavg_before": [0, 0, 0], "loadavg_after": [0, 0, 0],
              **summary, "runs": results}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        pack_load.print_report(report)
    return out.getvalue()


def test_shared_storage_is_hashed_once_and_repeated_bytes_stored_once(tmp_path, monkeypatch):
    want = _expected(SMALL)
    gm, _, inputs = pack_load.build_inputs(SMALL)
    hashed = []
    real_new = digest.new_hasher

    class Counting:
        def __init__(self, algorithm):
            self._h = real_new(algorithm)

        def update(self, data):
            hashed.append(len(memoryview(data).cast("B")))
            self._h.update(data)

        def hexdigest(self):
            return self._h.hexdigest()

    monkeypatch.setattr(packing.digests, "new_hasher", Counting)
    path = packing.pack(gm, inputs, tmp_path / "a.tar.zst", progress=False)
    assert sum(hashed) == want["hashed_bytes"]
    with reader.ContainerReader(path) as r:
        blobs = [m for m in r.members if layout.is_blob_name(m)]
        assert len(blobs) == want["blobs"]
        assert sum(r.members[m].size for m in blobs) == want["stored_bytes"]


@pytest.mark.parametrize("total, frame_size", [(3 << 20, 64 << 10), (24 << 20, frames.PROBE_MIN_BYTES)])
def test_thread_count_and_direct_io_do_not_change_bytes(tmp_path, monkeypatch, total, frame_size):
    """Frames encoded on 1, 2 or 3 threads, written through the page cache or past it."""
    gm, _, inputs = pack_load.build_inputs(total, seed=3)
    outputs = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(packing, "worker_threads", lambda threads=threads: threads)
        # small frames: every blob spans several frames and most end in a partial one; at 256
        # KiB, full frames are probed, and weights are stored while indices are compressed
        outputs.append(packing.pack(gm, inputs, tmp_path / f"t{threads}.tar.zst", progress=False,
                                    frame_size=frame_size).read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]
    if frame_size >= frames.PROBE_MIN_BYTES:
        with reader.ContainerReader(tmp_path / "t1.tar.zst") as r:
            stored = {c == frames.stored_frame_size(d) for c, d in r.frames if d == frame_size}
        assert stored == {True, False}

    def write(fileobj, **kw):
        w = writer.ContainerWriter(fileobj, frame_size=64 << 10, **kw)
        data = bytes(range(256)) * 3000
        w.add_member("a", data)
        w.add_member("b", size=len(data), chunks=[data[:1000], data[1000:]])
        w.finish(minimal_index())

    plain = io.BytesIO()
    write(plain)
    with open(tmp_path / "direct.bin", "wb") as f:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            write(f, direct_io=True, executor=pool)
    assert (tmp_path / "direct.bin").read_bytes() == plain.getvalue()


def test_parallel_load_is_bit_exact(tmp_path, monkeypatch):
    gm, names, inputs = pack_load.build_inputs(8 << 20, seed=2)
    path = packing.pack(gm, inputs, tmp_path / "p.tar.zst", progress=False)
    monkeypatch.setattr(loading, "_PARALLEL_LOAD_BYTES", 0)
    monkeypatch.setattr(loading, "worker_threads", lambda: 3)
    repro = loading.load(path, progress=False)
    assert all(pack_load.same_bits(a, b) for a, b in zip(repro.args, inputs))
    assert pack_load.same_bits(loading.read_input(path, "same_bytes_copy"), inputs[names.index("same_bytes_copy")])


def test_benchmark_command_line_json(tmp_path):
    """The parent process: children, JSON report (one cheap variant, tiny size)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "pack_load.py"), "--mib", "2", "--only", "pack", "--json",
         "--work", str(tmp_path), "--cores", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["variants"]["pack"]["file_bytes"] > 0
    assert [t["cpus"] for t in report["tables"]] == [pack_load.pinned_cpus(1)]
    assert report["versions"]["libzstd"] and report["versions"]["torch"] == torch.__version__
    assert len(report["loadavg_before"]) == 3


def test_busy_load_is_pinned_and_stops():
    cpu = pack_load.pinned_cpus(1)[0]
    procs = pack_load.start_busy_load([cpu], seconds=30)
    try:
        assert all(p.poll() is None for p in procs)
    finally:
        pack_load.stop_busy_load(procs)
    assert all(p.returncode is not None for p in procs)
    # a loop left behind ends by itself
    (p,) = pack_load.start_busy_load([cpu], seconds=0.2)
    assert p.wait(timeout=30) == 0
