"""``triage`` replays each group's representative several times, each in a fresh process, and
marks the group stable or flaky: one lucky replay of a flaky bug no longer calls it passed
(``triage.repeats``)."""

from __future__ import annotations

import json

import pytest

from support import fleet_corpus
from support.cli import invoke

TRUST = ["--trust-backend", fleet_corpus.RACY_LOWERING]


@pytest.fixture(scope="module")
def racy_fleet(tmp_path_factory):
    """8 archives: a stable compile error (relu) and a flaky one (gelu, lost one race in two)."""
    root = tmp_path_factory.mktemp("racy-fleet")
    fleet_corpus.build(root, 8, bugs=("relu-compile", fleet_corpus.RACY_BUG), seed=5)
    return root / "archives"


def _groups(report: dict) -> dict[str, dict]:
    """The groups by the op their signature names."""
    return {("gelu" if "gelu" in g["text"] else "relu"): g for g in report["groups"]}


def test_a_flaky_group_is_not_called_passed_by_one_lucky_replay(racy_fleet, tmp_path, monkeypatch):
    race = tmp_path / "race"
    race.write_text("1")  # the next compile wins its race: the first replay passes
    monkeypatch.setenv(fleet_corpus.RACE_FILE_ENV, str(race))
    one = json.loads(invoke("triage", racy_fleet, "--action", "replay", "--repeat", "1", *TRUST,
                            "--json").stdout)
    # what one replay says, as triage said before it repeated: the flaky bug "passed"
    lucky = _groups(one)["gelu"]
    assert lucky["verdicts"]["replay"]["status"] == "passed"
    assert lucky["repeats"] is None and "replays" not in lucky["verdicts"]["replay"]

    # the default tops the cached replay up to four: the race is lost in two of them
    result = invoke("triage", racy_fleet, "--action", "replay", *TRUST, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["tasks"]["run"] == 3 + 3  # each group's cached replay topped up, none redone
    gelu, relu = _groups(report)["gelu"], _groups(report)["relu"]
    assert gelu["verdicts"]["replay"]["status"] == "reproduced"
    # the cached lucky replay first, then the three new ones as they ended
    assert gelu["verdicts"]["replay"]["replays"][0] == "passed"
    assert sorted(gelu["verdicts"]["replay"]["replays"]) == ["passed", "passed", "reproduced", "reproduced"]
    assert gelu["repeats"] == {"kind": "flaky", "failed": 2, "replays": 4, "status": "reproduced",
                               "text": "flaky: reproduced 2 of 4"}
    assert relu["repeats"]["text"] == "stable: reproduced 4 of 4"
    assert relu["verdicts"]["replay"]["replays"] == ["reproduced"] * 4

    # the table says it under the group; a rerun is all cached
    text = invoke("triage", racy_fleet, "--action", "replay", *TRUST).stdout
    assert "replayed 4 times: flaky: reproduced 2 of 4" in text
    assert "replayed 4 times: stable: reproduced 4 of 4" in text
    assert "0 tasks run, 2 cached" in text


def test_a_group_reproduced_once_in_three_is_flaky_and_still_minified(racy_fleet, tmp_path, monkeypatch):
    folder = tmp_path / "fleet"
    folder.mkdir()
    for path in sorted(racy_fleet.glob("*.tar.zst")):  # a fresh cache: the folder's own
        (folder / path.name).write_bytes(path.read_bytes())
    race = tmp_path / "race"
    race.write_text("1")  # replays win, lose, win
    monkeypatch.setenv(fleet_corpus.RACE_FILE_ENV, str(race))
    result = invoke("triage", folder, "--repeat", "3", "-j", "1", *TRUST, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    gelu, relu = _groups(report)["gelu"], _groups(report)["relu"]
    assert gelu["repeats"]["text"] == "flaky: reproduced 1 of 3"
    assert gelu["verdicts"]["replay"]["replays"] == ["passed", "reproduced", "passed"]
    # one failure is the bug: the group fails, and is minified like any other
    assert gelu["verdicts"]["replay"]["status"] == "reproduced"
    assert gelu["verdicts"]["minify"]["status"] in ("minified", "unchanged", "not failing")
    assert relu["repeats"]["text"] == "stable: reproduced 3 of 3"
    assert relu["verdicts"]["minify"]["status"] == "minified"
