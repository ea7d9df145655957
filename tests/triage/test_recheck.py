"""``triage --against ENVIRONMENT``: the groups that still fail here are replayed in another
environment (an interpreter, or a torch built with pip) and marked fixed, still failing or
failing differently there; those verdicts are cached under that environment, and a replay there
that reaches no verdict is reported as such, never as fixed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from support import fleet_corpus
from support.cli import invoke
from support.shared_fixture import built_once
from support.stand_in_envs import PASSED, REPRODUCED, calls, stand_in
from support.torch_envs import make_env

TRUST = ["--trust-backend", fleet_corpus.NO_LOWERING]


@pytest.fixture
def relu_fleet(tmp_path, tmp_path_factory):
    """Two archives of one bug (PyTorch's relu compile error), triaged once: built once for the
    run (its four replays are the costly part), each test given its own copy (with the verdicts
    that first triage cached beside the archives), which its own triage runs add to."""

    def build(root: Path) -> str:
        fleet_corpus.build(root, 2, bugs=("relu-compile",))
        first = invoke("triage", root / "archives", "--action", "replay", "--json")
        assert first.exit_code == 0, first.output
        return str(root / "archives")

    folder = tmp_path / "archives"
    shutil.copytree(built_once(tmp_path_factory, "recheck_relu_fleet", build), folder)
    return folder


def test_a_group_that_passes_there_is_fixed_there_and_the_verdict_is_kept(relu_fleet, tmp_path):
    newer = stand_in(tmp_path, "python-newer", "2.99.0", [PASSED] * 4)
    result = invoke("triage", relu_fleet, "--action", "replay", "--against", newer, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    (group,) = report["groups"]
    assert group["against"]["status"] == "fixed" and report["against"]["torch"] == "2.99.0"
    # fixed only when every replay there passed: 4, as here
    assert group["against"]["there"]["status"] == "passed" and calls(newer) == 4
    assert group["against"]["there"]["replays"] == ["passed"] * 4
    assert [(s["torch"], s["status"]) for s in group["seen"]][-1] == ("2.99.0", "passed")
    assert report["tasks"]["run"] == 4 and report["tasks"]["cached"] == 1
    # cached under that environment: a rerun replays nothing there, and its digest names it too;
    # by digest, this environment is the newer one: it fails here only
    again = json.loads(invoke("triage", relu_fleet, "--action", "replay", "--against", newer, "--json").stdout)
    assert again["groups"][0]["against"]["status"] == "fixed" and again["rechecked"] and calls(newer) == 4
    by_digest = invoke("triage", relu_fleet, "--group-only", "--against", report["against"]["digest"][7:19], "--json")
    assert json.loads(by_digest.stdout)["groups"][0]["against"]["status"] == "fails here only", by_digest.output
    assert not json.loads(by_digest.stdout)["rechecked"]


def test_a_flaky_bug_that_passes_once_there_is_not_fixed_there(relu_fleet, tmp_path):
    """syzkaller's rule: gone only when no replay shows it. The first replay there passes, the
    second reproduces: it still fails there, and nothing more is replayed."""
    newer = stand_in(tmp_path, "python-newer", "2.99.0", [PASSED, REPRODUCED, PASSED, PASSED])
    result = invoke("triage", relu_fleet, "--action", "replay", "--against", newer, "--json")
    assert result.exit_code == 0, result.output
    (group,) = json.loads(result.stdout)["groups"]
    assert group["against"]["status"] == "still fails", group["against"]
    assert group["against"]["there"]["replays"] == ["passed", "reproduced"] and calls(newer) == 2


def test_a_replay_there_without_a_verdict_is_no_verdict_and_not_cached(relu_fleet, tmp_path):
    broken = stand_in(tmp_path, "python-broken", "2.99.0", [(1, "no document")] * 3)
    result = invoke("triage", relu_fleet, "--action", "replay", "--against", broken, "--json")
    report = json.loads(result.stdout)
    (group,) = report["groups"]
    assert group["against"]["status"] == "no verdict" and group["against"]["there"]["status"] == "error"
    assert "without a verdict" in group["against"]["there"]["message"]
    assert result.exit_code == 1 and report["tasks"]["error"] == 1
    invoke("triage", relu_fleet, "--action", "replay", "--against", broken, "--json")
    assert calls(broken) == 2  # not cached: asked again
    refused = invoke("triage", relu_fleet, "--group-only", "--against", broken, "--json")
    assert refused.exit_code == 2 and "--group-only runs nothing" in json.loads(refused.stdout)["error"]["message"]


#: the "newer torch" of the real environment: sigmoid has a lowering there; the fleet's compiler
#: is importable (its tests folder on the path), as a team's own compiler is installed there
FIXED_SIGMOID = f'''
import os, sys
sys.path.insert(0, {str(fleet_corpus.__file__).rsplit(os.sep, 2)[0]!r})
os.environ[{fleet_corpus.FLEET_FIXED_ENV!r}] = "sigmoid"
'''


@pytest.mark.slow
def test_a_real_environment_fixes_one_bug_and_not_the_other(tmp_path):
    fleet_corpus.build(tmp_path, 2, bugs=("no-sigmoid", "no-tanh"))
    folder = tmp_path / "archives"
    newer = make_env(tmp_path, "newer", sitecustomize=FIXED_SIGMOID)
    # two replays each (here and there): a fixed bug passes both there, one still failing stops at one
    result = invoke("triage", folder, "--action", "replay", *TRUST, "--against", newer, "--max-time", "300",
                    "--repeat", "2", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    status = {g["signature"]["target"]: g["against"]["status"] for g in report["groups"]}
    assert status == {"torch.sigmoid": "fixed", "torch.tanh": "still fails"}
    there = {g["signature"]["target"]: g["against"]["there"].get("replays") for g in report["groups"]}
    assert there == {"torch.sigmoid": ["passed", "passed"], "torch.tanh": None}
    assert report["against"]["interpreter"] == os.path.abspath(newer) and report["rechecked"]
    # the replays there ran in that interpreter: its own verdicts, not this environment's
    assert report["against"]["digest"] != report["environment"]["digest"]
    assert all(g["against"]["there"]["environment"] != g["verdicts"]["replay"]["environment"]
               for g in report["groups"])


def test_against_a_missing_interpreter_is_one_line_exit_4(relu_fleet, tmp_path):
    result = invoke("triage", relu_fleet, "--action", "replay", "--against", tmp_path / "no" / "python", "--json")
    assert result.exit_code == 4 and "no such interpreter" in json.loads(result.stdout)["error"]["message"]
