"""``triage`` merges the groups whose representatives minified to the same culprit: a bug its
compiler says in several ways (a node in one message, an aten target in another, a Tensor
method where another model called the function) is one group, and two bugs stay two."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from reproarchive.triage.grouping import precision_recall
from support import fleet_corpus
from support.cli import invoke

TRUST = ["--trust-backend", fleet_corpus.NO_LOWERING]
BUGS = ("no-sigmoid", "no-tanh", "relu-runtime")


@pytest.fixture(scope="module")
def varied_fleet(tmp_path_factory):
    """36 archives of three bugs from models of 1-3 inputs and 1-2 outputs, the lowering bugs'
    op called as a function or a Tensor method, on inputs of rank 2, 3 and 4; triaged once."""
    root = tmp_path_factory.mktemp("varied-fleet")
    members = fleet_corpus.build(root, 36, bugs=BUGS, varied=True, seed=3)
    folder = root / "archives"
    # one replay per group: merging is the subject (the default 4 are test_flaky_groups.py's)
    result = invoke("triage", folder, "-j", "2", "--repeat", "1", *TRUST, "--json")
    return folder, {str(m.path): m.bug for m in members}, result


def _scores(report: dict, truth: dict) -> dict:
    return precision_recall([[m["location"] for m in g["members"]] for g in report["groups"]], truth)


@pytest.mark.slow
def test_one_bug_said_several_ways_is_one_group_and_two_bugs_stay_two(varied_fleet):
    folder, truth, result = varied_fleet
    assert result.exit_code == 0, result.output
    merged = json.loads(result.stdout)
    apart = json.loads(invoke("triage", folder, "--group-only", "--no-merge", "--json").stdout)
    # the signatures alone split the lowering bugs (other messages, other targets) but mix none
    before = _scores(apart, truth)
    assert before["precision"] == 1.0 and before["recall"] < 0.9 and before["groups"] >= 6, before
    after = _scores(merged, truth)
    assert after == {"precision": 1.0, "recall": 1.0, "groups": 3, "bugs": 3, "mixed_groups": 0}, after
    culprits = {g["culprit"]["exception_type"].rsplit(".", 1)[-1] + ":" + "+".join(g["culprit"]["ops"])
                for g in merged["groups"]}
    assert culprits == {"LoweringError:sigmoid", "LoweringError:tanh", "AssertionError:relu"}
    lowering = [g for g in merged["groups"] if g["culprit"]["ops"] != ["relu"]]
    for g in lowering:
        # each merged signature is reported with its own count and representative
        assert g["folded"] and g["count"] == sum(f["count"] for f in g["folded"]) + _first_count(apart, g)
        assert all(f["verdicts"]["minify"]["status"] == "minified" for f in g["folded"])
    # the ways the bug was said: a node's target (function or method) and two wordings
    texts = [f["text"] for g in lowering for f in g["folded"]] + [g["text"] for g in lowering]
    assert any("@call_method:" in t for t in texts) and any("@torch." in t for t in texts)
    assert any("missing lowering for aten." in t for t in texts)
    # the table says it too
    table = invoke("triage", folder, "--group-only").stdout
    assert "3 groups" in table and "one culprit, compile|support.fleet_corpus.LoweringError|sigmoid" in table


def _first_count(report: dict, group: dict) -> int:
    """The count of the signature group that gives ``group`` its signature, in the unmerged report."""
    return next(g["count"] for g in report["groups"] if g["text"] == group["text"])


@pytest.mark.slow
def test_groups_without_a_minified_culprit_are_not_merged(varied_fleet):
    """A rerun replays nothing and merges from the cached verdicts' minified archives; with
    those archives gone (a culprit that cannot be read), or with --no-merge, the signature
    groups stand as they are."""
    folder, truth, _ = varied_fleet
    again = json.loads(invoke("triage", folder, "--repeat", "1", *TRUST, "--json").stdout)
    assert again["tasks"]["run"] == 0 and len(again["groups"]) == 3  # culprits from the cached verdicts
    minified = folder / ".reproarchive-triage" / "minified"
    hidden = minified.with_name("minified-hidden")
    minified.rename(hidden)
    try:
        gone = json.loads(invoke("triage", folder, "--group-only", "--json").stdout)
    finally:
        hidden.rename(minified)
    apart = json.loads(invoke("triage", folder, "--group-only", "--no-merge", "--json").stdout)
    assert len(gone["groups"]) == len(apart["groups"]) > 3
    assert all(g["culprit"] is None and g["folded"] == [] for g in gone["groups"])
    assert Counter(g["count"] for g in gone["groups"]) == Counter(g["count"] for g in apart["groups"])


@pytest.mark.slow
def test_a_replay_only_run_on_another_torch_merges_by_the_culprits_found_before(varied_fleet, monkeypatch):
    """On "another torch" (a variable that steers the compiler: another environment) with
    ``--action replay``, nothing is minified there; the groups still merge by what their
    representatives minified to where they were triaged before."""
    folder, _, first = varied_fleet
    monkeypatch.setenv(fleet_corpus.FLEET_BROKEN_ENV, "cos")  # no op of the fleet: every bug as it was
    result = invoke("triage", folder, "--action", "replay", "--repeat", "1", *TRUST, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["environment"]["digest"] != json.loads(first.stdout)["environment"]["digest"]
    assert len(report["groups"]) == 3 and all("minify" not in g["verdicts"] for g in report["groups"])
    assert {g["culprit"]["ops"][0] for g in report["groups"]} == {"sigmoid", "tanh", "relu"}
