"""`run`'s differences and `doctor`: only real differences between the recording machine and
this one, and an archive's module names are never imported."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch._inductor.config  # noqa: F401 - the inductor key below is read from it
import torch._inductor.config_comms  # noqa: F401 - imported by a compile; a fresh process lacks it

import reproarchive
from reproarchive.context.config import config_snapshot
from reproarchive.context.environment import environment_snapshot
from reproarchive.context.system import system_snapshot
from reproarchive.format.plain import from_plain, to_plain
from reproarchive.format.schema import ConfigRecord
from reproarchive.replay.differences import differences
from support.graphs import pack_chain

ROOT = Path(reproarchive.__file__).resolve().parents[1]
KEY = "max_autotune"


def _records(edit=None):
    """This process's records, as a capture after a compile takes them (inductor has exported
    its cache folder), with ``edit`` applied to the config's plain form."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    config = config_snapshot()
    if edit is not None:
        plain = to_plain(config)
        edit(plain)
        config = from_plain(ConfigRecord, plain)
    environ = {"TORCHINDUCTOR_CACHE_DIR": os.path.abspath(default_cache_dir()), **os.environ}
    return {"config": config, "environment": environment_snapshot(environ), "system": system_snapshot()}


def _fresh_doctor(path: Path) -> dict:
    """``reproarchive.doctor`` in a new process, where no compile has imported anything."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    code = "import json, sys, reproarchive; print(json.dumps(reproarchive.doctor(sys.argv[1]).to_plain(), default=str))"
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _assert_real(rows: list[dict]) -> None:
    assert [r for r in rows if r["recorded"] == r["current"]] == []


@pytest.mark.parametrize("redacted", [False, True], ids=["raw", "redacted-as-captured"])
def test_same_machine_archive_has_no_config_differences_here_or_in_a_fresh_process(tmp_path, redacted):
    """Records as every capture path stores them (``redacted_records``: the cache folder is
    ``<inductor-cache>``) and as archives from before that redaction stored them."""
    from reproarchive.context.redaction import redacted_records

    records = redacted_records(_records()) if redacted else _records()
    path = pack_chain(tmp_path / "same.tar.zst", 8, **records)
    recorded = reproarchive.doctor(path).to_plain()
    assert "torch._inductor.config_comms" in reproarchive.load(path).records.config.modules
    for report in (recorded, _fresh_doctor(path)):
        rows = report["differences"]
        assert [r for r in rows if r["what"] == "config"] == []
        assert [r for r in rows if r["what"] == "environment"] == []  # torch's own cache folder is not one
        _assert_real(rows)
        assert report["count"] == len(rows)


def test_one_changed_key_is_the_one_difference(tmp_path):
    value = torch._inductor.config.max_autotune

    def edit(plain):
        plain["modules"]["torch._inductor.config"][KEY] = not value
        plain["changed"].setdefault("torch._inductor.config", {})[KEY] = not value

    path = pack_chain(tmp_path / "changed.tar.zst", 8, **_records(edit))
    for report in (reproarchive.doctor(path).to_plain(), _fresh_doctor(path)):
        config_rows = [r for r in report["differences"] if r["what"] == "config"]
        assert config_rows == [{"what": "config", "name": f"torch._inductor.config.{KEY}", "recorded": not value,
                                "current": value, "important": False, "status": "differs"}]
    # run applies the recorded value, so its report leaves it out; with --current-config it is the cause
    records = _records(edit)
    assert [r for r in differences(**records) if r["what"] == "config"] == []
    rows = differences(**records, config_applied=False)
    assert ([(r["name"], r["important"]) for r in rows if r["what"] == "config"]
            == [(f"torch._inductor.config.{KEY}", True)])


def test_a_module_named_by_the_archive_is_never_imported(tmp_path, monkeypatch):
    def edit(plain):
        for module, key in (("evil.mod", "x"), ("os", "sep"), ("torch._not_a_config_module", "y")):
            plain["modules"][module] = {key: 1}
            plain["changed"][module] = {key: 1}

    path = pack_chain(tmp_path / "names.tar.zst", 8, **_records(edit))
    imported = []
    real_import = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: imported.append(name) or real_import(name, *a))
    report = reproarchive.doctor(path).to_plain()
    assert not {"evil.mod", "evil", "os", "torch._not_a_config_module"} & set(imported)
    assert "evil.mod" not in sys.modules and "evil" not in sys.modules
    assert "torch._not_a_config_module" not in sys.modules
    rows = {r["name"]: r for r in report["differences"] if r["what"] == "config"}
    assert set(rows) == {"evil.mod.x", "os.sep", "torch._not_a_config_module.y"}
    assert {r["status"] for r in rows.values()} == {"not_compared"}
    assert all(r["recorded"] == 1 and r["current"] is None for r in rows.values())
