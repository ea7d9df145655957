"""The public minifier benchmark's quick cases, so the benchmark (and its claims) cannot rot.

Runs both minifiers like ``python benchmarks/minify_bench.py --quick``; asserts correctness
only (our result reaches the known minimum and still fails the same way; PyTorch's run
completes), never time.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "minify_bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("minify_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["minify_bench"] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rows(bench):
    return bench.run(quick=True, with_torch=True)


def test_quick_benchmark_covers_every_kind(rows):
    kinds = {case.kind for case, *_ in rows}
    assert {"one culprit", "two connected", "two distant", "three distant", "dtype", "int input",
            "accuracy", "decoy"} <= kinds


def test_reaches_the_known_minimum_with_the_same_failure(rows):
    for case, oracle, ours, _theirs in rows:
        if oracle == "strict":
            assert ours.same_failure, case.name
            assert ours.ops_after == case.minimum, (case.name, ours.ops_after, case.minimum)


def test_no_query_is_repeated_and_pytorch_side_runs(rows):
    for case, _oracle, ours, theirs in rows:
        assert ours.repeats == 0, case.name
        assert theirs is not None and theirs.ops_after is not None, (case.name, theirs and theirs.note)
        assert ours.calls <= theirs.calls, case.name


def test_table_and_exit_status(bench, rows, capsys):
    text = bench.table(rows)
    assert text.count("\n") == len(rows) + 1
    assert bench.main(["--quick", "--no-torch", "--only", "single_20"]) == 0
    assert "1/1 rows" in capsys.readouterr().out
