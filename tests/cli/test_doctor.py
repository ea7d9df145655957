"""`reproarchive doctor`: the differences from the recording machine, without running anything."""

from __future__ import annotations

import json

import pytest
import torch._inductor.config

from reproarchive.cli.text import difference_line
from reproarchive.context.config import config_snapshot
from reproarchive.context.environment import environment_snapshot
from reproarchive.context.system import system_snapshot
from reproarchive.format.plain import from_plain, to_plain
from reproarchive.format.schema import ConfigRecord
from support.cli import invoke
from support.graphs import pack_chain

KEY = "torch._inductor.config.max_autotune"


def _pack(path, edit=None):
    config = config_snapshot()
    if edit is not None:
        plain = to_plain(config)
        edit(plain)
        config = from_plain(ConfigRecord, plain)
    return pack_chain(path, 8, config=config, environment=environment_snapshot(), system=system_snapshot())


def _changed(plain):
    value = not torch._inductor.config.max_autotune
    plain["modules"]["torch._inductor.config"]["max_autotune"] = value
    plain["changed"].setdefault("torch._inductor.config", {})["max_autotune"] = value
    plain["modules"]["evil.mod"] = plain["changed"]["evil.mod"] = {"x": 1}


def test_doctor_json_has_the_changed_key(tmp_path):
    path = _pack(tmp_path / "a.tar.zst", _changed)
    res = invoke("doctor", path, "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    rows = {r["name"]: r for r in report["differences"] if r["what"] == "config"}
    assert set(rows) == {KEY, "evil.mod.x"}
    assert rows[KEY]["status"] == "differs" and rows[KEY]["recorded"] is (not torch._inductor.config.max_autotune)
    assert rows["evil.mod.x"]["status"] == "not_compared"
    assert report["count"] == len(report["differences"]) and report["path"] == str(path)


def test_doctor_text_one_line_each_and_a_count(tmp_path):
    path = _pack(tmp_path / "a.tar.zst", _changed)
    res = invoke("doctor", path)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert any(KEY in line and "recorded" in line for line in lines)
    assert lines[-1].startswith(f"{len(lines) - 1} differences from the recording machine")
    assert "Traceback" not in res.output and "here None" not in res.stdout


def test_doctor_same_machine_says_so(tmp_path):
    res = invoke("doctor", _pack(tmp_path / "same.tar.zst"))
    assert (res.exit_code, res.stdout) == (0, "no differences that could change the outcome\n")


def test_doctor_exit_codes(tmp_path):
    res = invoke("doctor", tmp_path / "missing.tar.zst", "--json")
    assert res.exit_code == 4 and json.loads(res.stdout)["exit_code"] == 4
    bad = tmp_path / "bad.tar.zst"
    bad.write_bytes(b"not an archive" * 100)
    res = invoke("doctor", bad, "--json")
    assert res.exit_code == 2 and json.loads(res.stdout)["exit_code"] == 2
    assert "Exit codes" in invoke("doctor", "--help").stdout


@pytest.mark.parametrize("status", ["missing_here", "new_here", "not_compared"])
def test_a_side_without_the_setting_is_said_in_words(status):
    line = difference_line({"what": "config", "name": "torch._inductor.config.k", "recorded": None,
                            "current": None, "important": True, "status": status})
    assert "here None" not in line


def test_an_unset_variable_is_said_in_words():
    line = difference_line({"what": "environment", "name": "TORCH_X", "recorded": None, "current": "1",
                            "important": False})
    assert line.endswith("TORCH_X: unset there, here '1'")


def test_doctor_says_which_torch_releases_were_tested_and_warns_on_another(tmp_path, monkeypatch):
    from reproarchive.package_version import TESTED_TORCH, torch_release

    path = _pack(tmp_path / "a.tar.zst")
    report = json.loads(invoke("doctor", path, "--json").stdout)
    assert report["tested_torch"] == list(TESTED_TORCH) and report["torch"] == torch.__version__
    assert report["torch_tested"] is (torch_release(torch.__version__) in TESTED_TORCH)
    assert report["torch_tested"], "the suite runs on a tested torch"
    assert not invoke("doctor", path).output.startswith("warning:")
    monkeypatch.setattr(torch, "__version__", "2.99.0+cpu")
    res = invoke("doctor", path)
    assert res.exit_code == 0
    assert res.output.splitlines()[0] == (f"warning: torch 2.99.0+cpu here: this reproarchive was tested with torch "
                                          f"{', '.join(TESTED_TORCH)}; it reads torch's private modules, which change "
                                          "in every release")
    assert json.loads(invoke("doctor", path, "--json").stdout)["torch_tested"] is False
