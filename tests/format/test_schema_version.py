"""The schema is a promise: it changes only with a version bump, a schema file and new vectors."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from reproarchive.format import schema
from reproarchive.format.schema_check import describe, required_bump, schema_file

SPEC = Path(__file__).resolve().parents[2] / "spec"


def _version(path: Path) -> tuple[int, int]:
    major, minor = path.name.removeprefix("schema-").removesuffix(".json").split(".")
    return int(major), int(minor)


def test_live_schema_matches_the_file_of_its_version():
    committed = json.loads(schema_file(SPEC).read_text())
    bump, reasons = required_bump(committed, describe())
    assert bump == "none", (
        f"the index schema changed ({bump} change) but FORMAT_VERSION is still {schema.FORMAT_VERSION}: "
        f"bump it by spec/FORMAT.md §10, run `python -m reproarchive.format.schema_check --write` and "
        f"`python spec/vectors/make_vectors.py`: " + "; ".join(reasons))


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
    (lambda d: d["records"]["StorageRecord"]["fields"].update(extra_req={"key": "x", "type": "int", "default": "required"}), "major"),
    (lambda d: d["records"]["StorageRecord"]["fields"].update(note={"key": "note", "type": "str", "default": "null"}), "minor"),
    (lambda d: d["dtypes"].update(float2_new=[1, "float"]), "minor"),
    (lambda d: d["dtypes"].pop("float32"), "major"),
    (lambda d: None, "none"),
])
def test_bump_rules(edit, expected):
    old = describe()
    new = copy.deepcopy(old)
    edit(new)
    assert required_bump(old, new)[0] == expected
