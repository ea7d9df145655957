"""The capture-overhead benchmark in its quick mode, so it cannot rot: the table's shape, never
its timings (tiny models on a shared machine say nothing about time)."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import capture_overhead


@pytest.mark.slow
def test_capture_overhead_quick_table(capsys):
    # every route: in process (spooled, or written whole before the first run) and ``capture --``;
    # capture(calls) is an option of these, one process more to no gain
    capture_overhead.main(["--quick", "--json", "--variants", "capture,capture(no spool),capture--"])
    out = capsys.readouterr().out
    assert out.startswith("| weights, backend, graphs | variant |")
    (row,) = json.loads(out[out.index("{"):])["rows"]
    assert row["backend"] == "eager" and row["graphs"] == 2 and row["weights"] > 0
    for variant in ("capture", "capture(no spool)", "capture--"):
        figures = row[variant]
        for name in ("wall_ratio", "first_ratio", "later_ratio", "written_per_distinct"):
            assert math.isfinite(figures[name]) and figures[name] > 0, (variant, name, figures)
        assert math.isfinite(figures["extra_rss_of_weights"])
        assert figures["archives_left"] == []  # a job that does not fail leaves nothing behind
    # without the spool the archive a crash would leave is written whole before each graph's
    # first run: more than a plain run writes; spooled (the default), the weights the two graphs
    # share are written at most once
    assert row["capture(no spool)"]["written"] > row["plain_written_per_distinct"] * row["weights"]
    assert row["capture"]["written"] < row["capture(no spool)"]["written"]
    assert row["capture"]["writer_rss"] > 0  # the guardian's memory, at least, is counted
