"""An archive captured on one torch release replays on another, and the verdict names both
(``support.cross_version``): the committed captures of every release of the matrix replay on
the torch running the tests, and with ``REPROARCHIVE_OTHER_TORCH_PYTHON`` (an interpreter with
another torch and this reproarchive: CI's matrix sets it) a capture made here replays there
and one made there replays here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from reproarchive.package_version import torch_release
from support.cli import invoke
from support.cross_version import capture_into, committed

HERE = torch_release(torch.__version__)
OTHER_PYTHON = os.environ.get("REPROARCHIVE_OTHER_TORCH_PYTHON")
ELSEWHERE = {release: folder for release, folder in committed().items() if release != HERE}


def _run(archive, *, python: str | None = None) -> tuple[int, dict, str]:
    """``reproarchive run ARCHIVE --json`` and its text, here (in-process) or under ``python``."""
    if python is None:
        done = invoke("run", archive, "--json")
        text = invoke("run", archive)
        return done.exit_code, json.loads(done.stdout), text.stdout
    runs = [subprocess.run([python, "-c", "from reproarchive.cli import main; main()", "run", str(archive), *extra],
                           capture_output=True, text=True, timeout=600) for extra in (["--json"], [])]
    return runs[0].returncode, json.loads(runs[0].stdout), runs[1].stdout


def test_the_matrix_has_captures_of_other_releases():
    assert len(ELSEWHERE) >= 2, f"committed captures: {sorted(committed())}"


@pytest.mark.parametrize("release", sorted(ELSEWHERE))
def test_a_compile_error_recorded_on_another_release_reproduces_here_and_says_so(release):
    code, outcome, text = _run(ELSEWHERE[release] / "compile-error.tar.zst")
    assert code == 1, text
    assert outcome["status"] == "reproduced" and outcome["across_versions"] is True
    assert torch_release(outcome["recorded_torch"]) == release and outcome["torch"] == torch.__version__
    recorded = outcome["recorded_torch"]
    assert text.splitlines()[0] == f"REPRODUCED on torch {torch.__version__} (recorded on {recorded}) (exit 1)"


@pytest.mark.parametrize("release", sorted(ELSEWHERE))
def test_a_failure_of_the_recording_torch_alone_passes_here_and_says_where(release):
    code, outcome, text = _run(ELSEWHERE[release] / "gone-elsewhere.tar.zst")
    assert code == 0, text
    assert outcome["status"] == "passed" and outcome["across_versions"] is True
    assert text.startswith(f"PASSED on torch {torch.__version__} (recorded on {outcome['recorded_torch']}) (exit 0)")
    assert any(d["name"] == "torch version" and d["important"] for d in outcome["differences"])


def test_a_replay_on_the_recording_release_names_no_versions(tmp_path):
    [archive, _] = capture_into(sys.executable, tmp_path)
    code, outcome, text = _run(archive)
    assert code == 1 and outcome["across_versions"] is False
    assert text.splitlines()[0] == "REPRODUCED (exit 1)"


@pytest.mark.skipif(not OTHER_PYTHON, reason="needs REPROARCHIVE_OTHER_TORCH_PYTHON (CI's torch matrix sets it)")
def test_captured_here_replayed_there_and_back(tmp_path):
    there = subprocess.run([OTHER_PYTHON, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                           text=True, timeout=300, check=True).stdout.strip()
    assert torch_release(there) != HERE, "the other interpreter must have another torch release"
    here_made = capture_into(sys.executable, tmp_path / "here")
    there_made = capture_into(OTHER_PYTHON, tmp_path / "there")
    for archive, python, replayed_on in ((here_made[0], OTHER_PYTHON, there), (there_made[0], None, torch.__version__)):
        code, outcome, text = _run(archive, python=python)
        assert code == 1 and outcome["across_versions"] is True, text
        assert outcome["torch"] == replayed_on
    for archive, python in ((here_made[1], OTHER_PYTHON), (there_made[1], None)):
        code, outcome, text = _run(archive, python=python)
        assert code == 0 and outcome["status"] == "passed" and "PASSED on torch" in text, text
