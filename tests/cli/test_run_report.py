"""What `reproarchive run` prints for people."""

from __future__ import annotations

from reproarchive.format.schema import AccuracyOutput, AccuracyReport, FailureRecord


def test_run_report_prints_mismatches_without_error_figures():
    from reproarchive.cli.replay_cmds import format_outcome
    from reproarchive.replay.outcome import Outcome

    failure = FailureRecord(stage="accuracy")
    report = AccuracyReport(passed=False, tolerance=1e-3, outputs=(
        AccuracyOutput(name="output[0]", passed=False, rule="shape", reason="shape [2] vs [3]"),))
    outcome = Outcome(status="reproduced", exit_code=1, observed=failure, recorded=failure, accuracy=report)
    assert "shape [2] vs [3]" in format_outcome(outcome)
