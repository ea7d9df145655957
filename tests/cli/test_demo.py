"""The README's main-job command: the demo must keep working end to end (real inductor)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import reproarchive
from reproarchive.cli import main


@pytest.mark.slow
def test_demo_runs_the_whole_story(tmp_path):
    result = CliRunner().invoke(main, ["demo", "-C", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for text in ("REPRODUCED (exit 1)", "ops -> 1 ops", "torch.relu"):
        assert text in result.output
    assert reproarchive.inspect(tmp_path / "repro.min.tar.zst").graph.ops == 1
