"""The schema is a promise: it changes only with a version bump, a schema file and new vectors."""

from __future__ import annotations

import copy
import enum
import json
from pathlib import Path

import pytest

from reproarchive.format import schema
from reproarchive.format.schema_check import describe, required_bump, schema_file

SPEC = Path(__file__).resolve().parents[2] / "spec"


def _version(path: Path) -> tuple[int, int]:
    major, minor = path.name.removeprefix("schema-").removesuffix(".json").split(".")
    return int(major), int(minor)


def _unbumped_change() -> str | None:
    """What changed in the live schema since the committed file of its version, or None."""
    committed = json.loads(schema_file(SPEC).read_text())
    bump, reasons = required_bump(committed, describe())
    if bump == "none":
        return None
    return (f"the index schema changed ({bump} change) but FORMAT_VERSION is still {schema.FORMAT_VERSION}: "
            f"bump it by spec/FORMAT.md §10 and run `python -m reproarchive.spec_files --write`: "
            + "; ".join(reasons))


def test_live_schema_matches_the_file_of_its_version():
    problem = _unbumped_change()
    assert problem is None, problem


@pytest.mark.parametrize("name, members, expected", [
    ("Stage", [*schema.Stage, "out_of_memory"], "minor: Stage.out_of_memory added"),
    ("Stage", [s for s in schema.Stage if s != "crash"], "major: Stage.crash removed"),
    ("NodeOp", [*schema.NodeOp, "call_anything"], "minor: NodeOp.call_anything added"),
    ("DigestAlgorithm", [*schema.DigestAlgorithm, "sha512"], "minor: DigestAlgorithm.sha512 added"),
])
def test_changing_a_value_set_without_a_bump_fails(monkeypatch, name, members, expected):
    monkeypatch.setattr(schema, name, enum.StrEnum(name, {str(m).upper(): str(m) for m in members},
                                                    module=schema.__name__))
    problem = _unbumped_change()
    bump, reason = expected.split(": ")
    assert problem is not None and f"({bump} change)" in problem and reason in problem


@pytest.mark.parametrize("name, value, expected", [
    ("MAX_RANK", 128, "minor"), ("MAX_RANK", 32, "major"), ("MAX_GRAPH_DEPTH", 9, "minor")])
def test_changing_a_limit_without_a_bump_fails(monkeypatch, name, value, expected):
    from reproarchive.format.schema import sets as schema_sets

    monkeypatch.setattr(schema_sets, name, value)
    problem = _unbumped_change()
    assert problem is not None and f"({expected} change)" in problem and f"limit {name}" in problem


def test_a_field_that_changes_its_value_set_is_a_major_change():
    old = describe()
    new = copy.deepcopy(old)
    new["records"]["FailureRecord"]["fields"]["stage"]["enum"] = "NodeOp"
    assert required_bump(old, new)[0] == "major"


def test_descriptions_before_value_sets_compare_on_records_only():
    old = describe()
    for key in ("enums", "limits"):
        del old[key]
    for rec in old["records"].values():
        for spec in rec["fields"].values():
            spec.pop("enum", None)
    assert required_bump(old, describe()) == ("none", [])


def test_each_released_version_followed_the_bump_rules():
    files = sorted(SPEC.glob("schema-*.json"), key=_version)
    assert files and _version(files[-1]) == (schema.FORMAT_MAJOR, schema.FORMAT_MINOR)
    for old, new in zip(files, files[1:]):
        bump, reasons = required_bump(json.loads(old.read_text()), json.loads(new.read_text()))
        (a, b), (c, d) = _version(old), _version(new)
        if bump == "major":
            assert c > a, f"{new.name} needs a major version after {old.name}: {reasons}"
        elif bump == "minor":
            assert c > a or (c == a and d > b), f"{new.name} needs at least a minor bump: {reasons}"


def test_each_released_version_has_golden_vectors():
    manifest = json.loads((SPEC / "vectors" / "vectors.json").read_text())
    for path in SPEC.glob("schema-*.json"):
        version = "{}.{}".format(*_version(path))
        vectors = [name for name, facts in manifest.items() if facts.get("format") == version]
        assert vectors, f"no golden vectors of format {version} in spec/vectors"
        for name in vectors:
            assert (SPEC / "vectors" / name).exists(), name


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d["records"]["StorageRecord"]["fields"].pop("fill"), "major"),
    (lambda d: d["records"]["StorageRecord"]["fields"]["size"].update(type="str"), "major"),
    (lambda d: d["records"]["StorageRecord"]["fields"].update(
        extra_req={"key": "x", "type": "int", "default": "required"}), "major"),
    (lambda d: d["records"]["StorageRecord"]["fields"].update(note={"key": "note", "type": "str", "default": "null"}),
     "minor"),
    (lambda d: d["dtypes"].update(float2_new=[1, "float"]), "minor"),
    (lambda d: d["dtypes"].pop("float32"), "major"),
    (lambda d: None, "none"),
])
def test_bump_rules(edit, expected):
    old = describe()
    new = copy.deepcopy(old)
    edit(new)
    assert required_bump(old, new)[0] == expected
