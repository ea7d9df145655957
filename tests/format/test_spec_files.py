"""One command checks and regenerates every file spec/ derives from the code
(``python -m reproarchive.spec_files``): the tree is current, a stale file is named with the
command that fixes it, a check writes nothing, and a schema change that needs a version bump is
not written over its version's file."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from reproarchive import documents, spec_files
from reproarchive.format import schema_check

SPEC = Path(__file__).resolve().parents[2] / "spec"


@pytest.fixture
def spec_copy(tmp_path) -> Path:
    """The generated files (and the golden vectors they are made from), in a folder of their own."""
    copy = tmp_path / "spec"
    shutil.copytree(SPEC, copy, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return copy


def _contents(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_every_generated_file_is_current(capsys):
    assert spec_files.main(["--check"]) == 0, capsys.readouterr().out


def test_a_stale_file_is_named_with_the_command_that_fixes_it(spec_copy, capsys):
    stale = documents.schema_file(spec_copy)
    stale.write_text(stale.read_text() + " ")
    before = _contents(spec_copy)
    assert spec_files.main(["--check", "--spec", str(spec_copy)]) == 1
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("stale:")] == [
        f"stale: {stale}: differs from what the reports declare"]
    assert "run `python -m reproarchive.spec_files --write`" in out
    assert _contents(spec_copy) == before  # the check built its vectors elsewhere

    assert spec_files.main(["--write", "--spec", str(spec_copy)]) == 0
    assert f"wrote {stale}" in capsys.readouterr().out
    written = hashlib.sha256(documents.schema_text().encode()).hexdigest()
    assert _contents(spec_copy) == {**before, "json/reports.schema.json": written}  # that file alone


def test_a_schema_change_that_needs_a_bump_writes_nothing(spec_copy, monkeypatch, capsys):
    from reproarchive.format.schema import sets as schema_sets

    monkeypatch.setattr(schema_sets, "MAX_RANK", schema_sets.MAX_RANK + 1)
    documents.schema_file(spec_copy).write_text("stale")
    before = _contents(spec_copy)
    assert spec_files.main(["--write", "--spec", str(spec_copy)]) == 1
    assert "bump FORMAT_VERSION" in capsys.readouterr().err
    assert _contents(spec_copy) == before
    assert "bump FORMAT_VERSION" in schema_check.check(spec_copy)[0]


def test_without_a_checkout_it_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(spec_files, "SPEC", tmp_path / "spec")
    assert spec_files.main(["--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "source checkout" in err
