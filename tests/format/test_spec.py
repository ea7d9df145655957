"""The spec and the code say the same: rule ids, error codes, the CDDL grammar, the worked
example, and the invalid vectors a reader must refuse with their code and rule."""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import types
from pathlib import Path

import pytest

from reproarchive import errors
from reproarchive.archive.checking import verify
from reproarchive.format import schema_cddl, schema_check
from reproarchive.format.layout import Limits
from spec.vectors import make_example, make_invalid

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "spec"
INVALID = SPEC / "vectors" / "invalid"
MANIFEST = json.loads((INVALID / "manifest.json").read_text())
FORMAT_MD = (SPEC / "FORMAT.md").read_text()
README = (ROOT / "README.md").read_text()


def test_every_rule_id_is_in_the_spec_and_every_spec_id_is_a_rule():
    in_spec = set(re.findall(r"\bR\d+(?:\.\d+)*-\d+\b", FORMAT_MD))
    assert in_spec == {str(r) for r in errors.Rule}


def test_every_error_class_has_its_own_stable_code_documented_in_readme_and_spec():
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.ReproArchiveError)]
    assert [c.__name__ for c in classes if "code" not in vars(c)] == []
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes))
    for code in errors.ErrorCode:
        assert f"`{code}`" in README, f"README 'Exit codes' does not list {code}"
        assert f"`{code}`" in FORMAT_MD, f"spec §5.2 does not list {code}"


def test_an_error_names_its_rule_in_one_line():
    err = errors.IndexSchemaError("index field x is invalid", "the archive is damaged", rule="R6-1")
    assert (err.code, err.rule, str(err)) == (
        "E_SCHEMA", errors.Rule.FIELD_TYPES, "index field x is invalid (rule R6-1); the archive is damaged")
    with pytest.raises(ValueError):
        errors.IndexSchemaError("x", rule="R99-1")


def test_the_invalid_vectors_cover_every_rule():
    covered = {v["rule"] for v in MANIFEST["vectors"].values()} | set(MANIFEST["not_vectorised"])
    assert covered == {str(r) for r in errors.Rule}
    assert sorted(p.name for p in INVALID.glob("*.tar.zst")) == sorted(MANIFEST["vectors"])


@pytest.mark.parametrize("name", sorted(MANIFEST["vectors"]))
def test_reader_refuses_each_invalid_vector_with_its_code_and_rule(name):
    expected = MANIFEST["vectors"][name]
    limits = dataclasses.replace(Limits(), **expected.get("limits", {}))
    with pytest.raises(errors.ReproArchiveError) as info:
        verify(INVALID / name, limits=limits)
    assert (str(info.value.code), str(info.value.rule)) == (expected["code"], expected["rule"]), str(info.value)
    assert f"(rule {expected['rule']})" in str(info.value)


def test_invalid_vectors_are_what_the_generator_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(make_invalid, "OUT", tmp_path)
    make_invalid.build()
    assert json.loads((tmp_path / "manifest.json").read_text()) == MANIFEST
    for name in MANIFEST["vectors"]:
        assert (tmp_path / name).read_bytes() == (INVALID / name).read_bytes(), name


def test_the_worked_example_is_the_golden_vector_decoded():
    assert (SPEC / "example-index.json").read_text() == make_example.example_text(), \
        "run `python -m reproarchive.spec_files --write`"


def test_the_cddl_grammar_is_the_schema_and_parses():
    assert schema_cddl.grammar_file(SPEC).read_text() == schema_cddl.grammar(), \
        "run `python -m reproarchive.spec_files --write`"
    pycddl = pytest.importorskip("pycddl")
    pycddl.Schema(schema_cddl.grammar())  # raises on a syntax error or an undefined rule


def test_schema_holds_only_records_enums_and_constants():
    import importlib

    for module in map(importlib.import_module, schema_check.SCHEMA_MODULES):
        assert schema_check.data_only_problems(module) == [], module.__name__
    fake = types.ModuleType("fake_schema")
    fake.MAX_X = 3
    fake.helper = lambda: None
    fake.Set = enum.StrEnum("Set", ["A"])
    assert [p.split()[0] for p in schema_check.data_only_problems(fake)] == ["helper"]


def test_json_error_names_code_class_and_rule():
    from click.testing import CliRunner

    from reproarchive.cli import main

    res = CliRunner().invoke(main, ["verify", "--json", str(INVALID / "R6-1-field-type.tar.zst")])
    error = json.loads(res.stdout)["error"]
    assert res.exit_code == 2 == error["exit_code"]
    assert (error["code"], error["class"], error["rule"]) == ("E_SCHEMA", "IndexSchemaError", "R6-1")
    assert error["what"].startswith("index field storages[0].size is invalid")
    usage = CliRunner().invoke(main, ["verify", "--json", "--no-such-option", "x"])
    assert json.loads(usage.stdout)["error"]["code"] == "E_USAGE" and usage.exit_code == 2


def test_an_error_keeps_its_code_and_rule_across_the_child_process_boundary():
    from reproarchive.child import protocol

    sent = errors.UnsafeArchiveError("graph calls 'torch.load'", "refusing", rule=errors.Rule.CALL_TARGET)
    reply = json.loads(json.dumps(protocol._error_reply(sent, errors.ReproArchiveError, "x")))
    got = protocol.error_from(reply["error"])
    assert (type(got), got.code, got.rule, str(got)) == (type(sent), sent.code, sent.rule, str(sent))
