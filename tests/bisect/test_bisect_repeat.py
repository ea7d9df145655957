"""``bisect torch --repeat N``: a failure that shows in one replay of N makes its environment bad
and is reported as flaky; replays that disagree without a failure give no verdict; an answer
that more replays cannot change stops the replays.

The environments here are stand-in interpreters (an executable script that answers the probe and
replays from a script of verdicts), so the rule is checked exactly and in seconds; the real
replays in real environments are ``test_bisect_torch.py``'s."""

from __future__ import annotations

import json

import pytest

import reproarchive
from support.cli import invoke
from support.stand_in_envs import OTHER, PASSED, REPRODUCED
from support.stand_in_envs import calls as _calls
from support.stand_in_envs import stand_in as _env


@pytest.fixture
def archive(tmp_path):
    path = tmp_path / "a.tar.zst"
    path.write_bytes(b"only its path is read: the stand-ins replay nothing")
    return path


def test_one_failure_in_n_replays_is_bad_and_flaky(tmp_path, archive):
    good = _env(tmp_path, "good", "2.12", [PASSED] * 3)
    bad = _env(tmp_path, "bad", "2.13", [PASSED, REPRODUCED, PASSED])
    result = reproarchive.bisect_torch(archive, [str(good), str(bad)], repeat=3)
    by = {v.python: v for v in result.verdicts}
    assert by[str(good)].verdict == "good" and by[str(good)].replays == ("good",) * 3
    assert not by[str(good)].flaky
    flaky = by[str(bad)]
    assert flaky.verdict == "bad" and flaky.flaky and flaky.replays == ("good", "bad")
    assert _calls(bad) == 2  # seen good and bad: a third replay could not change the answer
    assert flaky.reason == "flaky: 1 of 2 replays failed"
    assert result.status == "found" and result.first_bad == str(bad)
    assert "flaky there: 1 of 2 replays failed" in result.summary
    assert result.to_plain()["verdicts"][1]["flaky"] is True


def test_a_single_replay_misses_the_flaky_failure_that_repeating_finds(tmp_path, archive):
    good = _env(tmp_path, "good", "2.12", [PASSED] * 3)
    bad = _env(tmp_path, "bad", "2.13", [PASSED, PASSED, REPRODUCED])
    once = reproarchive.bisect_torch(archive, [str(good), str(bad)])
    # the newest passed its one replay: nothing to look for (the search tried nothing else)
    assert once.status == "no bad environment" and _calls(bad) == 1 and _calls(good) == 0
    for env in (good, bad):  # each stand-in's script from its start again
        env.with_name(env.name + ".calls").unlink(missing_ok=True)
    thrice = reproarchive.bisect_torch(archive, [str(good), str(bad)], repeat=3)
    assert thrice.status == "found" and thrice.verdicts[1].replays == ("good", "good", "bad")


def test_replays_that_disagree_without_a_failure_give_no_verdict(tmp_path, archive):
    env = _env(tmp_path, "odd", "2.13", [PASSED, OTHER, PASSED])
    (verdict,) = reproarchive.bisect_torch(archive, [str(env)], repeat=3).verdicts
    assert verdict.verdict == "skipped" and verdict.flaky
    assert verdict.reason == "the replays disagreed (good, different failure): no verdict"
    assert _calls(env) == 3


def test_the_command_takes_repeat_and_refuses_zero(tmp_path, archive):
    good = _env(tmp_path, "good", "2.12", [PASSED] * 2)
    bad = _env(tmp_path, "bad", "2.13", [REPRODUCED] * 2)
    result = invoke("bisect", "torch", archive, "--env", good, "--env", bad, "--repeat", "2", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [v["replays"] for v in document["verdicts"]] == [["good", "good"], ["bad", "bad"]]
    assert [v["flaky"] for v in document["verdicts"]] == [False, False]
    refused = invoke("bisect", "torch", archive, "--env", good, "--repeat", "0")
    assert refused.exit_code == 2 and "--repeat" in refused.output


def test_a_failure_then_a_replay_that_could_not_run_is_bad_but_not_called_flaky(tmp_path, archive):
    good = _env(tmp_path, "good", "2.12", [PASSED] * 2)
    bad = _env(tmp_path, "bad", "2.13", [REPRODUCED, (1, "no document")])
    result = reproarchive.bisect_torch(archive, [str(good), str(bad)], repeat=2)
    verdict = result.verdicts[1]
    assert verdict.verdict == "bad" and verdict.replays == ("bad", "skipped")
    assert result.status == "found" and result.last_good == str(good)
    assert verdict.reason is None and not verdict.flaky and "flaky" not in result.summary


# -- the default: replays chosen from the flakiness measured at the first bad environment --------


def test_by_default_a_flaky_failure_is_measured_and_the_good_environments_before_it_replayed(tmp_path, archive):
    """2.12 passed its first replay but fails one time in two; 2.13 fails 2 of 4: the default
    replays 2.12 until it fails (7 replays would miss a rate-1/2 failure under 1% of the time),
    and the culprit moves to 2.12."""
    old = _env(tmp_path, "old", "2.11", [PASSED] * 20)
    mid = _env(tmp_path, "mid", "2.12", [PASSED, PASSED, REPRODUCED] + [PASSED] * 17)
    new = _env(tmp_path, "new", "2.13", [REPRODUCED, PASSED, REPRODUCED, PASSED])
    result = reproarchive.bisect_torch(archive, [str(old), str(mid), str(new)])
    assert (result.flakiness.environment, result.flakiness.failed, result.flakiness.replays,
            result.flakiness.repeat) == (str(new), 2, 4, 7)
    by = {v.python: v for v in result.verdicts}
    assert by[str(new)].replays == ("bad", "good", "bad", "good") and _calls(new) == 4
    assert by[str(mid)].verdict == "bad" and by[str(mid)].replays == ("good", "good", "bad") and _calls(mid) == 3
    assert by[str(mid)].reason == "flaky: 1 of 3 replays failed"
    assert by[str(old)].verdict == "good" and _calls(old) == 7
    assert result.status == "found" and result.first_bad == str(mid) and result.last_good == str(old)
    assert "replayed 7 times" in result.summary


def test_by_default_a_stable_failure_costs_its_measure_only(tmp_path, archive):
    good = _env(tmp_path, "good", "2.12", [PASSED] * 5)
    bad = _env(tmp_path, "bad", "2.13", [REPRODUCED] * 5)
    result = invoke("bisect", "torch", archive, "--env", good, "--env", bad, "--json")
    document = json.loads(result.stdout)
    assert result.exit_code == 0 and document["flakiness"] == {"environment": str(bad), "failed": 4, "replays": 4,
                                                               "repeat": 1}
    assert _calls(bad) == 4 and _calls(good) == 1
    # nothing to compare before the first bad one: nothing is measured; --repeat N: N, not measured
    for env in (good, bad):
        env.with_name(env.name + ".calls").unlink()
    alone = reproarchive.bisect_torch(archive, [str(bad)])
    assert alone.flakiness is None and _calls(bad) == 1
    given = reproarchive.bisect_torch(archive, [str(good), str(bad)], repeat=1)
    assert given.flakiness is None and _calls(bad) == 2 and _calls(good) == 1


def test_the_replays_for_a_rate():
    from reproarchive.bisect.flakiness import CAP, repeat_for

    assert repeat_for(4, 4) == 1 and repeat_for(0, 0) == 1
    assert repeat_for(2, 4) == 7  # 0.5 ** 7 < 0.01 <= 0.5 ** 6
    assert repeat_for(1, 4) == 17 and repeat_for(1, 10) == CAP == 20
    assert repeat_for(3, 4) == 4  # 0.25 ** 4 < 0.01 <= 0.25 ** 3


# -- which environments are replayed: a binary search by default ----------------------------------


def test_a_binary_search_replays_log_n_environments_and_names_the_same_culprit(tmp_path, archive):
    """Eight releases, the bug from the sixth on: the search replays the newest, the oldest and
    then the middles (7, 0, 3, 5, 4), never the others; a linear walk replays all eight."""
    envs = [_env(tmp_path, f"env{i}", f"2.{i}", [REPRODUCED if i >= 5 else PASSED] * 2) for i in range(8)]
    found = reproarchive.bisect_torch(archive, [str(e) for e in envs], repeat=1)
    assert [_calls(e) for e in envs] == [1, 0, 0, 1, 1, 1, 0, 1]
    assert found.status == "found" and found.first_bad == str(envs[5]) and found.last_good == str(envs[4])
    assert [v.python for v in found.verdicts] == [str(envs[i]) for i in (0, 3, 4, 5, 7)]  # in the given order
    for env in envs:
        env.with_name(env.name + ".calls").unlink(missing_ok=True)
    walked = invoke("bisect", "torch", archive, *[a for e in envs for a in ("--env", e)], "--repeat", "1",
                    "--search", "linear", "--json")
    assert json.loads(walked.stdout)["first_bad"] == str(envs[5]) and [_calls(e) for e in envs] == [1] * 8


def test_a_binary_search_sets_aside_what_cannot_say_and_stops_at_the_ends(tmp_path, archive):
    # the middle cannot load the archive: set aside, and its neighbour nearest the middle is tried
    envs = [_env(tmp_path, "a", "2.0", [PASSED]), _env(tmp_path, "b", "2.1", [PASSED]),
            _env(tmp_path, "c", "2.2", [(2, "no document")]), _env(tmp_path, "d", "2.3", [REPRODUCED]),
            _env(tmp_path, "e", "2.4", [REPRODUCED])]
    result = reproarchive.bisect_torch(archive, [str(e) for e in envs], repeat=1)
    assert result.first_bad == str(envs[3]) and result.last_good == str(envs[1])
    assert [v.verdict for v in result.verdicts] == ["good", "good", "skipped", "bad", "bad"]
    # the newest passes: nothing to look for, nothing else replayed
    calm = [_env(tmp_path, f"calm{i}", f"3.{i}", [PASSED]) for i in range(4)]
    none = reproarchive.bisect_torch(archive, [str(e) for e in calm], repeat=1)
    assert none.status == "no bad environment" and [_calls(e) for e in calm] == [0, 0, 0, 1]
