"""The store benchmark at a small size, so it cannot rot: correctness only, never time.

At 8 MiB the per-request cost of moto dominates, so the time ratios mean nothing here; what
must hold at any size is that both pulls are byte-identical and that the second push sends
only the blobs it does not share (6 of 64 tensors of 128 KiB: under 12% of the bytes).
"""

from __future__ import annotations

import json

import pytest

from benchmarks import store_bench


@pytest.mark.slow
def test_store_benchmark_runs_and_dedups(capsys, tmp_path):
    pytest.importorskip("moto.server")
    store_bench.main(["--mib", "8", "--json", "--workdir", str(tmp_path)])
    out = capsys.readouterr().out
    report = json.loads(out[out.index("{"):])
    assert report["byte_identical"] is True
    assert report["second_push_new_blobs"] == f"{store_bench.REPLACED}/{store_bench.TENSORS}"
    assert report["ratios"]["second push bytes / archive bytes"] <= 0.12
    assert report["push_sent_bytes"] >= report["archive_bytes"]
