"""Keeping the schema honest: a change to a record needs a version bump (spec §10).

``describe()`` reduces the index declarations in ``schema`` to plain data: every record class,
its fields with their types, map keys, defaults and value sets; the dtype table; every closed
value set (enum) and the limits of the format. The description of each released version is
committed as ``spec/schema-<major>.<minor>.json``; a test compares the live schema with the
file of the current version, and ``required_bump`` says what a difference demands:

* **major**: a record or field removed, a field's type, map key or value set changed, a new
  field without a default, a default changed, a dtype removed or re-sized, a member removed
  from a value set, a limit lowered or removed;
* **minor**: a new record class, a new field with a default, a new dtype, a new value set or a
  new member of one (old readers refuse it, as they refuse a new dtype), a limit raised or added,
  a record field widened into a tagged union whose fallback is that record (an old reader reads
  every variant as the record it knew: open records keep what they do not declare), a tagged
  union that gained a variant (old readers refuse a value of the new kind, as a new dtype);
* **none**: no change. A description written before value sets were described (no ``enums``
  key: schema-1.0.json) is compared on records and dtypes only.

``data_only_problems()`` keeps the modules of the ``schema`` package (``SCHEMA_MODULES``) of
data: anything in one that is not a record, an enum, a constant or a type alias is refused (the
test fails naming it).

    python -m reproarchive.format.schema_check            # compare with the committed file
    python -m reproarchive.format.schema_check --write    # write the current version's file

(``python -m reproarchive.spec_files`` checks or writes this file with every other generated one,
through ``check`` and ``write``.)

(torch.export's ``schema.py`` + ``schema_check.py`` is the model.)
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from reproarchive.format import layout, plain, schema
from reproarchive.format.atomic import write_if_changed
from reproarchive.format.plain import ArgCodec, PlainData, Tagged
from reproarchive.format.schema import sets as schema_sets


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "nil"
    if tp is PlainData or tp is Any:
        return "plain"
    if isinstance(tp, type) and issubclass(tp, enum.StrEnum):
        return "str"  # on disk; the field's ``enum`` names the value set
    if isinstance(tp, ArgCodec):
        return "Arg"
    if isinstance(tp, Tagged):
        variants = [f"{tag}={c.__name__}" for tag, c in sorted(tp.classes.items())]
        if tp.fallback is not None:
            variants.append(f"*={tp.fallback.__name__}")
        return f"tagged[{tp.key}]({', '.join(variants)})"
    if isinstance(tp, type):
        return tp.__name__
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return _type_name(args[1] if isinstance(args[1], (Tagged, ArgCodec)) else args[0])
    if origin is tuple:
        return f"list[{_type_name(args[0])}]"
    if origin is dict:
        return f"map[{_type_name(args[1])}]"
    if args:
        return "|".join(sorted(_type_name(a) for a in args))
    return str(tp)


def _fields(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    """(field, type) of a record as its map holds them: an ``inline`` record's fields are the
    parent's (the description is of bytes, not of how the code groups them)."""
    hints = typing.get_type_hints(cls, vars(schema), include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("inline"):
            out += _fields(hints[f.name])
        else:
            out.append((f, hints[f.name]))
    return out


def _classes() -> list[type]:
    """Every record class reachable from ``Index``."""
    seen: dict[str, type] = {}
    todo: list[Any] = [schema.Index]
    while todo:
        tp = todo.pop()
        if isinstance(tp, Tagged):
            todo.extend(tp.classes.values())
            todo.extend([tp.fallback] if tp.fallback is not None else [])
            continue
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            if tp.__name__ in seen:
                continue
            seen[tp.__name__] = tp
            todo.extend(hint for _, hint in _fields(tp))
            continue
        todo.extend(typing.get_args(tp))
    return [seen[k] for k in sorted(seen)]


def describe() -> dict[str, Any]:
    records: dict[str, Any] = {}
    for cls in _classes():
        fields = {}
        for f, hint in _fields(cls):
            if f.metadata.get("extra"):
                fields["*"] = {"type": "open: unknown keys are kept"}
                continue
            default = f.default
            if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            entry = {"key": f.metadata.get("key", f.name), "type": _type_name(hint)}
            values = _enum_of(hint)
            if values is not None:
                entry["enum"] = values.__name__
            if default is dataclasses.MISSING:
                entry["default"] = "required"
            elif cls is schema.Index and f.name == "version":
                entry["default"] = "the writer's FORMAT_VERSION"
            else:
                entry["default"] = json.dumps(default, default=repr)
            fields[f.name] = entry
        tag = getattr(cls, "TAG", None)
        records[cls.__name__] = {"tag": tag, "fields": fields}
    return {"version": schema.FORMAT_VERSION, "records": records,
            "dtypes": {name: list(info) for name, info in sorted(schema.DTYPES.items())},
            "enums": {cls.__name__: [m.value for m in cls] for cls in _enums()},
            "limits": limits()}


def _enum_of(tp: Any) -> type | None:
    """The value set a field draws from (through ``X | None``), or None."""
    for t in (tp, *typing.get_args(tp)):
        if isinstance(t, type) and issubclass(t, enum.StrEnum):
            return t
    return None


#: The modules the schema is declared in (the ``schema`` package re-exports their names).
SCHEMA_MODULES = tuple(f"reproarchive.format.schema{part}" for part in (
    "", ".version", ".sets", ".values", ".graph", ".sections", ".job", ".custom_ops", ".index"))


def _enums() -> list[type]:
    return sorted((v for v in vars(schema).values()
                   if isinstance(v, type) and issubclass(v, enum.Enum) and v.__module__ in SCHEMA_MODULES),
                  key=lambda cls: cls.__name__)


def limits() -> dict[str, int]:
    """Every limit of the format: the schema's, the byte layer's bounds and the reader's
    default caps that spec §5 states (``max_nodes`` is a reader setting, not a format rule)."""
    out = {name: value for module in (schema_sets, plain) for name, value in vars(module).items()
           if re.fullmatch(r"(MAX|MIN|INT)_[A-Z0-9_]+", name) and type(value) is int}
    out.update({name: getattr(layout, name) for name in ("MIN_FRAME_SIZE", "MAX_FRAME_SIZE", "MAX_WINDOW_SIZE",
                                                         "MAX_NAME_LENGTH", "MAX_LEVEL")})
    out.update({f"Limits.{k}": v for k, v in dataclasses.asdict(layout.DEFAULT_LIMITS).items() if k != "max_nodes"})
    return dict(sorted(out.items()))


_IMPORTED_OK = {"annotations", "dataclass", "field", "StrEnum", "Annotated", "Any", "ClassVar", "Union"}


def data_only_problems(module: types.ModuleType = schema) -> list[str]:
    """Names in ``module`` that are neither a record (a dataclass), an enum, a constant (plain
    data, tuples of enum members) nor a type alias (``Annotated``); empty when it is data only.
    The field helpers and field types it imports from ``plain`` are allowed by name, and so is
    a package's own submodule (``schema.values``: each is checked in its turn)."""
    problems = []
    for name, value in vars(module).items():
        if name.startswith("__") or name in _IMPORTED_OK:
            continue
        if isinstance(value, types.ModuleType) and value.__name__ == f"{module.__name__}.{name}":
            continue
        if getattr(value, "__module__", None) == plain.__name__ and name in vars(plain):
            continue  # ArgCodec, PlainData, Tagged, _Dim, informative, omit_none, open_record
        if isinstance(value, type) and (dataclasses.is_dataclass(value) or issubclass(value, enum.Enum)):
            continue
        if typing.get_origin(value) is typing.Annotated or _is_constant(value):
            continue
        problems.append(f"{name} ({type(value).__name__}) is not a record, an enum or a constant")
    return problems


def _is_constant(value: Any) -> bool:
    if value is None or type(value) in (bool, int, float, str, bytes) or isinstance(value, enum.Enum):
        return True
    if isinstance(value, type) and value in (int, float, bool, str, type(None)):
        return True  # SCALAR_KINDS maps kinds to these
    if isinstance(value, (tuple, frozenset)):
        return all(_is_constant(v) for v in value)
    if isinstance(value, dict):
        return all(type(k) is str and _is_constant(v) for k, v in value.items())
    return False


def required_bump(old: dict[str, Any], new: dict[str, Any]) -> tuple[str, list[str]]:
    """("major" | "minor" | "none", reasons) for the change from ``old`` to ``new``."""
    major: list[str] = []
    minor: list[str] = []
    described = "enums" in old  # older descriptions say nothing of value sets and limits
    if not described:
        new = {**new, "records": {name: {**rec, "fields": {k: {x: y for x, y in f.items() if x != "enum"}
                                                          for k, f in rec["fields"].items()}}
                                  for name, rec in new["records"].items()}}
    old_recs, new_recs = old["records"], new["records"]
    for name, rec in old_recs.items():
        if name not in new_recs:
            major.append(f"record {name} removed")
            continue
        new_rec = new_recs[name]
        if rec.get("tag") != new_rec.get("tag"):
            major.append(f"record {name}: tag changed")
        for field, spec in rec["fields"].items():
            now = new_rec["fields"].get(field)
            if now is None:
                major.append(f"{name}.{field} removed")
            elif now != spec and _widened(spec, now):
                minor.append(f"{name}.{field} widened into {now['type']}")
            elif now != spec and _gained_variants(spec, now):
                minor.append(f"{name}.{field} gained variants: {now['type']}")
            elif now != spec:
                major.append(f"{name}.{field} changed: {spec} -> {now}")
        for field, spec in new_rec["fields"].items():
            if field not in rec["fields"]:
                (major if spec.get("default") == "required" else minor).append(
                    f"{name}.{field} added" + (" without a default" if spec.get("default") == "required" else ""))
    minor += [f"record {name} added" for name in new_recs if name not in old_recs]
    for dt, info in old["dtypes"].items():
        if new["dtypes"].get(dt) != info:
            major.append(f"dtype {dt} removed or changed")
    minor += [f"dtype {dt} added" for dt in new["dtypes"] if dt not in old["dtypes"]]
    if described:
        _compare_sets(old["enums"], new.get("enums", {}), major, minor)
        _compare_limits(old.get("limits", {}), new.get("limits", {}), major, minor)
    if major:
        return "major", major + minor
    return ("minor", minor) if minor else ("none", [])


def _compare_sets(old: dict, new: dict, major: list[str], minor: list[str]) -> None:
    for name, members in old.items():
        now = new.get(name)
        if now is None:
            major.append(f"value set {name} removed")
            continue
        major += [f"{name}.{m} removed" for m in members if m not in now]
        minor += [f"{name}.{m} added" for m in now if m not in members]
    minor += [f"value set {name} added" for name in new if name not in old]


def _compare_limits(old: dict, new: dict, major: list[str], minor: list[str]) -> None:
    for name, value in old.items():
        now = new.get(name)
        if now is None or now != value and (now < value) != (name.startswith("MIN_") or name.endswith("_MIN")):
            major.append(f"limit {name} removed or tightened: {value} -> {now}")
        elif now != value:
            minor.append(f"limit {name} relaxed: {value} -> {now}")
    minor += [f"limit {name} added" for name in new if name not in old]
def _widened(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether a field's type went from a record to a tagged union whose fallback is that record
    (``SourceRecord|nil`` -> ``nil|tagged[kind](..., *=SourceRecord)``), nothing else changed."""
    if {k: v for k, v in old.items() if k != "type"} != {k: v for k, v in new.items() if k != "type"}:
        return False
    before, after = old["type"].split("|"), new["type"].split("|")
    if sorted(a for a in after if not a.startswith("tagged[")) != sorted(b for b in before if b in after):
        return False
    widened = [b for b in before if b not in after]
    unions = [a for a in after if a.startswith("tagged[")]
    return len(widened) == 1 and len(unions) == 1 and unions[0].endswith(f", *={widened[0]})")


_TAGGED = re.compile(r"tagged\[(\w+)\]\(([^()]*)\)")


def _gained_variants(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether every tagged union in a field's type only gained variants (new tags; the old
    tags still name the same records), nothing else changed: an old reader refuses a value of
    a new kind, as it refuses a new dtype or a new member of a value set."""
    if {k: v for k, v in old.items() if k != "type"} != {k: v for k, v in new.items() if k != "type"}:
        return False
    before, after = _TAGGED.findall(old["type"]), _TAGGED.findall(new["type"])
    if not before or len(before) != len(after) or _TAGGED.sub("U", old["type"]) != _TAGGED.sub("U", new["type"]):
        return False
    for (key_a, arms_a), (key_b, arms_b) in zip(before, after):
        a, b = set(arms_a.split(", ")), set(arms_b.split(", "))
        if key_a != key_b or not a < b:
            return False
    return True


def schema_file(spec_dir: Path, version: str = schema.FORMAT_VERSION) -> Path:
    return spec_dir / f"schema-{version}.json"


def schema_text() -> str:
    """The current version's schema file, as ``write`` writes it."""
    return json.dumps(describe(), indent=1, sort_keys=True) + "\n"


def pending_bump(spec_dir: Path) -> str | None:
    """Why the live schema must not be written over its version's file (it changed, and spec
    §10 wants a version bump for the change), or None."""
    target = schema_file(spec_dir)
    if not target.exists():
        return None
    bump, reasons = required_bump(json.loads(target.read_text()), describe())
    if bump == "none":
        return None
    return (f"the schema changed since {target.name} ({bump} change: {'; '.join(reasons)}): "
            f"bump FORMAT_VERSION first (spec/FORMAT.md §10; a version not yet released: remove its file)")


def check(spec_dir: Path) -> list[str]:
    """The current version's schema file if it is not what ``write`` writes now: one line
    naming it and why; empty when it is."""
    target = schema_file(spec_dir)
    if not target.exists():
        return [f"{target}: missing (a new version needs its schema file)"]
    problem = pending_bump(spec_dir)
    if problem is not None:
        return [f"{target}: {problem}"]
    if target.read_text() != schema_text():
        return [f"{target}: differs from the description of the schema"]
    return []


def write(spec_dir: Path) -> list[Path]:
    """Write the current version's schema file; the files changed (none when it was current)."""
    return write_if_changed(schema_file(spec_dir), schema_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", type=Path, default=Path(__file__).resolve().parents[2] / "spec")
    parser.add_argument("--write", action="store_true", help="write the current version's schema file")
    opts = parser.parse_args(argv)
    target = schema_file(opts.spec)
    current = describe()
    if opts.write:
        write(opts.spec)
        print(f"wrote {target}")
        return 0
    if not target.exists():
        print(f"{target} does not exist: a new version needs its schema file (--write)")
        return 1
    bump, reasons = required_bump(json.loads(target.read_text()), current)
    if bump == "none":
        print(f"schema {schema.FORMAT_VERSION} unchanged")
        return 0
    print(f"the schema changed since {target.name} ({bump} change):")
    for r in reasons:
        print(f"  {r}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
