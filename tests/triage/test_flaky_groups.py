"""``triage`` replays each group's representative several times, each in a fresh process, and
marks the group stable or flaky: one lucky replay of a flaky bug no longer calls it passed, and
a flaky group is minified with each candidate judged by several replays (``triage.repeats``).

The flaky bug is ``fleet_corpus.racy_lowering``: a compiler whose lowering of gelu loses a race
one compile in two. With ``RACE_DIR_ENV`` set the race falls in turn per graph (a graph's first
compile wins, its second loses, ...), across processes, so every count below is exact."""

from __future__ import annotations

import json
import re

import pytest

from reproarchive.triage.grouping import precision_recall
from support import fleet_corpus
from support.cli import invoke

TRUST = ["--trust-backend", fleet_corpus.RACY_LOWERING]


@pytest.fixture(scope="module")
def racy_fleet(tmp_path_factory):
    """8 archives: a stable compile error (relu) and a flaky one (gelu)."""
    root = tmp_path_factory.mktemp("racy-fleet")
    fleet_corpus.build(root, 8, bugs=("relu-compile", fleet_corpus.RACY_BUG), seed=5)
    return root / "archives"


def _copy(fleet, folder):
    """The fleet's archives in ``folder``: a verdict cache of its own."""
    folder.mkdir()
    for path in sorted(fleet.glob("*.tar.zst")):
        (folder / path.name).write_bytes(path.read_bytes())
    return folder


def _groups(report: dict) -> dict[str, dict]:
    """The groups by the op their signature names."""
    return {("gelu" if "gelu" in g["text"] else "relu"): g for g in report["groups"]}


def test_a_flaky_group_is_not_called_passed_by_one_lucky_replay(racy_fleet, tmp_path, monkeypatch):
    folder = _copy(racy_fleet, tmp_path / "fleet")
    monkeypatch.setenv(fleet_corpus.RACE_DIR_ENV, str(tmp_path))
    one = json.loads(invoke("triage", folder, "--action", "replay", "--repeat", "1", *TRUST, "--json").stdout)
    # what one replay says, as triage said before it repeated: the flaky bug "passed"
    lucky = _groups(one)["gelu"]
    assert lucky["verdicts"]["replay"]["status"] == "passed"
    assert lucky["repeats"] is None and "replays" not in lucky["verdicts"]["replay"]

    # the default tops the cached replay up to four: the race is lost in two of them
    result = invoke("triage", folder, "--action", "replay", *TRUST, "--json")
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
    text = invoke("triage", folder, "--action", "replay", *TRUST).stdout
    assert "replayed 4 times: flaky: reproduced 2 of 4" in text
    assert "replayed 4 times: stable: reproduced 4 of 4" in text
    assert "0 tasks run, 2 cached" in text


def test_a_flaky_group_is_minified_with_each_candidate_judged_by_several_replays(racy_fleet, tmp_path,
                                                                                   monkeypatch):
    folder = _copy(racy_fleet, tmp_path / "fleet")
    monkeypatch.setenv(fleet_corpus.RACE_DIR_ENV, str(tmp_path))
    result = invoke("triage", folder, "--repeat", "3", "-j", "1", *TRUST, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    gelu, relu = _groups(report)["gelu"], _groups(report)["relu"]
    assert gelu["verdicts"]["replay"]["replays"] == ["passed", "reproduced", "passed"]
    assert gelu["repeats"]["text"] == "flaky: reproduced 1 of 3"
    # one failure is the bug: the group fails and is minified. Every candidate's first compile
    # wins its race, so one replay per candidate would keep none; 12 replays miss a failure of
    # rate 1/3 under 1% of the time
    minify = gelu["verdicts"]["minify"]
    assert minify["status"] == "minified" and minify["minified"]["ops"] == 1, minify
    assert "each candidate judged by up to 12 replays (flaky)" in minify["message"]
    assert "gelu" in minify["minified"]["code"]
    assert relu["repeats"]["text"] == "stable: reproduced 3 of 3"
    assert relu["verdicts"]["minify"]["status"] == "minified" and "judged" not in relu["verdicts"]["minify"]["message"]


def test_run_minify_repeat_judges_each_candidate_by_several_replays(racy_fleet, tmp_path, monkeypatch):
    monkeypatch.setenv(fleet_corpus.RACE_DIR_ENV, str(tmp_path))
    archive = next(p for p in sorted(racy_fleet.glob("*.tar.zst"))
                   if json.loads(invoke("inspect", p, "--json").stdout)["backend"] == fleet_corpus.RACY_LOWERING)
    args = ("run", "--minify", archive, "--backend", fleet_corpus.RACY_LOWERING, "--json")
    # one replay each: the original's first compile wins its race, and it is called not reproducing
    once = invoke(*args, "-o", tmp_path / "once.tar.zst")
    assert once.exit_code == 3 and "does not reproduce its recorded failure" in json.loads(once.stdout)["error"]["what"]
    twice = invoke(*args, "-o", tmp_path / "twice.tar.zst", "--repeat", "2")
    assert twice.exit_code == 0, twice.output
    assert json.loads(twice.stdout)["stats"]["final_ops"] == 1
    refused = invoke("run", archive, "--repeat", "2", "--json")
    message = json.loads(refused.stdout)["error"]["message"]
    assert refused.exit_code == 2 and "--repeat only apply with --minify" in message


@pytest.mark.slow
def test_a_fleet_of_real_captures_groups_one_bug_per_group_flaky_one_included(tmp_path, monkeypatch):
    """Every archive a real capture: each model run under torch.compile with reproarchive.capture
    around the bug's compiler, six bugs reached from five models and said several ways."""
    bugs = (*fleet_corpus.BUGS, fleet_corpus.RACY_BUG)
    members = fleet_corpus.build(tmp_path, 14, bugs=bugs, varied=True, dynamo=True, seed=11)
    folder = tmp_path / "archives"
    race = tmp_path / "race"
    race.mkdir()
    monkeypatch.setenv(fleet_corpus.RACE_DIR_ENV, str(race))
    result = invoke("triage", folder, "-j", "2", *TRUST, "--trust-backend", fleet_corpus.NO_LOWERING, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    truth = {str(m.path): m.bug for m in members}
    assert report["archives"] == 14
    groups = [[m["location"] for m in g["members"]] for g in report["groups"]]
    scores = precision_recall(groups, truth)
    assert (scores["precision"], scores["recall"], len(groups)) == (1.0, 1.0, 6), [g["text"] for g in report["groups"]]
    for g in report["groups"]:
        bug = truth[g["representative"]["location"]]
        assert g["verdicts"]["replay"]["status"] == "reproduced" and g["verdicts"]["minify"]["minified"]["ops"] == 1
        assert g["repeats"]["kind"] == ("flaky" if bug == fleet_corpus.RACY_BUG else "stable"), (bug, g["repeats"])
        # (format 1.7) the culprit names the model line its op came from, kept through the minify
        (where,) = g["culprit"]["where"]
        assert re.fullmatch(rf"<tmp>/\S+/src/fleet_\S+\.py:\d+ in \w+: .*{g['culprit']['ops'][0]}.*", where), where
    text = invoke("triage", folder, "-j", "2", *TRUST, "--trust-backend", fleet_corpus.NO_LOWERING)  # cached
    assert text.exit_code == 0 and text.output.count("\n          at <tmp>/") == 6, text.output


def test_replays_combine_into_one_verdict_and_a_mark():
    from reproarchive.triage.repeats import combined, judging_repeat, measured
    from reproarchive.triage.verdicts import VERDICT_FORMAT, Verdict

    def v(status, signal=None):
        return Verdict(format=VERDICT_FORMAT, action="replay", archive="sha256:" + "0" * 64,
                       environment="sha256:" + "1" * 64, status=status, signal=signal, elapsed_s=1.0,
                       finished=f"2026-11-30T00:00:0{len(status) % 10}+00:00")

    one = combined([v("passed")])
    assert one.replays is None and measured(one) is None  # one replay: nothing measured
    flaky = combined([v("passed"), v("crashed", "SIGSEGV"), v("reproduced"), v("passed")])
    assert flaky.status == "reproduced" and flaky.replays == ("passed", "crashed", "reproduced", "passed")
    assert flaky.elapsed_s == 4.0 and measured(flaky).text == "flaky: reproduced 1 of 3"  # the crash did not run
    assert judging_repeat(flaky) == 12
    # a cached combination topped up keeps its replays first
    again = combined([flaky, v("reproduced")])
    assert again.replays == ("passed", "crashed", "reproduced", "passed", "reproduced")
    # none could run: that is the verdict, and nothing is measured
    dead = combined([v("timed out"), v("crashed", "SIGABRT")])
    assert dead.status == "timed out" and measured(dead) is None and judging_repeat(dead) is None
    stable = combined([v("passed")] * 3)
    assert measured(stable).text == "stable: passed 3 of 3" and judging_repeat(stable) is None
    odd = combined([v("passed"), v("different failure")])
    assert odd.status == "different failure" and measured(odd).kind == "flaky" and judging_repeat(odd) is None


@pytest.mark.slow
def test_a_flaky_group_is_bisected_with_each_step_judged_by_several_replays(tmp_path, monkeypatch):
    """The bisector's replay at its last stage (the archive's own compiler) would pass by luck and
    end with "not reproduced"; judged by 7 replays a step (a rate of 2 in 4), it names the compiler."""
    fleet_corpus.build(tmp_path, 2, bugs=(fleet_corpus.RACY_BUG,), seed=5)
    folder = tmp_path / "archives"
    monkeypatch.setenv(fleet_corpus.RACE_DIR_ENV, str(tmp_path))
    result = invoke("triage", folder, "--action", "replay", "--action", "bisect", *TRUST, "--json")
    assert result.exit_code == 0, result.output
    gelu = _groups(json.loads(result.stdout))["gelu"]
    assert gelu["repeats"]["text"] == "flaky: reproduced 2 of 4"
    bisect = gelu["verdicts"]["bisect"]
    assert (bisect["status"], bisect["kind"]) == ("found", fleet_corpus.RACY_LOWERING), bisect
    assert bisect["message"].endswith("each step judged by up to 7 replays (flaky)")
