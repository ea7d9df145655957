"""The ``--json`` documents, declared: which typed record each command prints, and the JSON
Schema derived from those declarations (``spec/json/reports.schema.json``).

A document's keys are its record's fields: ``to_plain()`` writes them with the converter the
index uses (``format.plain``), and ``json_schema()`` reads the same declarations, so the file
a tool validates against cannot drift from what the commands print. tests/test_documents.py
checks the committed file against ``json_schema()`` and validates every command's output
with it, failures included: a failing command with ``--json`` prints the error document.

``ls`` still builds its two listings as plain data where they are made (``store.listing`` for
a store, ``sources.trace.pack_trace.list_trace`` for a TORCH_TRACE log); their shapes are written
here by hand (``_LISTINGS``) until they have records of their own.

Regenerate the file after changing a document: ``python -m reproarchive.spec_files --write``
(with every other generated file; ``python -m reproarchive.documents --write`` writes this one).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, Union

from reproarchive.archive.checking import VerifyReport
from reproarchive.archive.inspection import InspectReport
from reproarchive.bisect.results import CompilerBisection, TorchBisection
from reproarchive.errors import ErrorCode
from reproarchive.format.atomic import write_if_changed
from reproarchive.format.plain import PlainData, Tagged
from reproarchive.minifier.report import MinifyReport
from reproarchive.replay.differences import DoctorReport
from reproarchive.replay.launch import JobOutcome
from reproarchive.replay.outcome import Outcome
from reproarchive.standalone.script import ExportReport
from reproarchive.store.check import StoreCheck
from reproarchive.triage.diff import DiffReport
from reproarchive.triage.fleet import TriageReport


def schema_file(spec_dir: Path) -> Path:
    return spec_dir / "json" / "reports.schema.json"


SCHEMA_FILE = schema_file(Path(__file__).resolve().parents[1] / "spec")

_STRING, _INTEGER, _BOOLEAN = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
_STRINGS = {"type": "array", "items": _STRING}


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


def _object(properties: dict[str, dict], *, optional: tuple[str, ...] = (), open_: bool = False) -> dict:
    return {"type": "object", "properties": properties,
            "required": [k for k in properties if k not in optional], "additionalProperties": open_}


#: Documents that are not records (yet), written out by hand.
_LISTINGS = {
    "GraphCode": _object({"path": _STRING, "code": _STRING}),  # inspect --graph --json
    "StoreListing": _object({
        "store": _STRING,
        "archives": _INTEGER,
        "groups": {"type": "array", "items": _object({
            "signature": _STRING,
            "failure": {"anyOf": [{"type": "object"}, {"type": "null"}]},
            "archives": {"type": "array", "items": _object({
                "name": _STRING, "digest": _STRING, "file_digest": _STRING, "index_digest": _nullable(_STRING),
                "pushed": {}, "failure": {"anyOf": [{"type": "object"}, {"type": "null"}]},
                "backend": {}, "ops": {}, "inputs": {"type": "object"}, "bytes_logical": {}, "bytes_stored": _INTEGER,
                "torch": {},
            })},
        })},
        "warnings": _STRINGS,
    }),
    "TraceListing": _object({
        "source": _STRING,
        "kind": _STRING,
        "files": _STRINGS,
        "compiles": {"type": "array", "items": _object({
            "compile_id": _STRING, "rank": _nullable(_INTEGER), "attempt": {}, "frame": {}, "ops": _nullable(_INTEGER),
            "status": _STRING, "fail_reason": _nullable(_STRING), "graph": _nullable(_STRING),
            "runnables": _INTEGER, "cache": {}, "log": _STRING, "tlparse_directory": _nullable(_STRING),
        })},
        "warnings": _STRINGS,
    }),
    # what every command with --json prints when it fails (cli/app.py, error_document): ``code``
    # one of the stable codes, ``class`` the error's class, ``rule`` the spec rule or null;
    # ``what``/``hint`` only for errors of ours
    "Error": _object({
        "error": _object({"message": _STRING, "exit_code": _INTEGER,
                          "code": {"enum": sorted(str(c) for c in ErrorCode)},
                          "class": _nullable(_STRING), "rule": _nullable(_STRING),
                          "what": _nullable(_STRING), "hint": _nullable(_STRING)}, optional=("what", "hint")),
        "exit_code": _INTEGER,
    }),
}

#: Keys a record's ``to_plain``/``to_dict`` adds beyond its fields.
_COMPUTED: dict[type, dict[str, Any]] = {Outcome: {"kind": str, "across_versions": bool},
                                         JobOutcome: {"summary": str, "across_versions": bool}}

#: command -> what its --json prints on success (the Error document on failure).
DOCUMENTS: dict[str, tuple[type | str, ...]] = {
    "inspect": (InspectReport, "GraphCode"),
    "verify": (VerifyReport,),
    "doctor": (DoctorReport,),
    "diff": (DiffReport,),
    "triage": (TriageReport,),
    "run": (Outcome, JobOutcome, MinifyReport),  # a job archive: a JobOutcome; run --minify: a MinifyReport
    "minify": (MinifyReport,),
    "export": (ExportReport,),
    "ls": ("StoreListing", "TraceListing"),
    "fsck": (StoreCheck,),
    "bisect.compiler": (CompilerBisection,),  # also the sidecar ARCHIVE.bisect.json
    "bisect.torch": (TorchBisection,),
}

_SCALARS = {str: _STRING, int: _INTEGER, bool: _BOOLEAN, float: {"type": "number"}}


class _Builder:
    def __init__(self) -> None:
        self.defs: dict[str, dict] = {}
        self.owners: dict[str, type] = {}

    def of(self, tp: Any) -> dict:
        if tp is Any or tp is PlainData:
            return {}
        if isinstance(tp, Tagged):
            return {"anyOf": [self.record(c) for c in dict.fromkeys(tp.classes.values())]}
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return {"enum": [m.value for m in tp]}  # a closed value set of the schema
        if tp in _SCALARS:
            return dict(_SCALARS[tp])
        if hasattr(tp, "__plain_decode__"):
            return {}  # a record with its own codec (a dimension pair): not described further
        if dataclasses.is_dataclass(tp):
            return self.record(tp)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is typing.Annotated:
            return self.of(args[1] if isinstance(args[1], Tagged) else args[0])
        if origin in (Union, types.UnionType):
            inner = [self.of(a) for a in args if a is not type(None)]
            schema = inner[0] if len(inner) == 1 else {"anyOf": inner}
            return _nullable(schema) if type(None) in args else schema
        if origin in (tuple, list):
            return {"type": "array", "items": self.of(args[0])} if args else {"type": "array"}
        if origin is dict:
            return {"type": "object", "additionalProperties": self.of(args[1])}
        raise TypeError(f"no JSON Schema for {tp!r}")

    def record(self, cls: type) -> dict:
        name = cls.__name__
        if self.owners.setdefault(name, cls) is not cls:
            raise TypeError(f"two documented records are named {name}")
        if name not in self.defs:
            self.defs[name] = {}  # a placeholder while the fields refer back to it
            hints = typing.get_type_hints(cls, include_extras=True)
            properties: dict[str, dict] = {}
            optional, open_ = [], False
            tag_key = getattr(cls, "TAG_KEY", None)
            if tag_key:
                properties[tag_key] = {"const": cls.TAG}
            for f in dataclasses.fields(cls):
                if f.metadata.get("extra"):
                    open_ = True  # an open record keeps keys this version does not know
                    continue
                key = f.metadata.get("key", f.name)
                properties[key] = f.metadata.get("json") or self.of(hints[f.name])
                if f.metadata.get("omit"):
                    optional.append(key)
            computed = {key: typing.get_type_hints(getattr(cls, key).fget)["return"]
                        for key in getattr(cls, "COMPUTED", ())}
            for key, tp in {**computed, **_COMPUTED.get(cls, {})}.items():
                properties[key] = self.of(tp)
            schema = _object(properties, optional=tuple(optional), open_=open_)
            doc = (cls.__doc__ or "").strip()
            if doc and not doc.startswith(f"{name}("):
                schema = {"description": " ".join(doc.split("\n\n")[0].split()), **schema}
            self.defs[name] = schema
        return {"$ref": f"#/$defs/{name}"}


def json_schema() -> dict[str, Any]:
    """The JSON Schema of every command's ``--json`` document: ``$defs/command.NAME`` is what
    ``reproarchive NAME --json`` prints, success or failure."""
    builder = _Builder()
    commands = {}
    for command, documents in DOCUMENTS.items():
        alternatives = [builder.record(d) if isinstance(d, type) else {"$ref": f"#/$defs/{d}"} for d in documents]
        commands[f"command.{command}"] = {"anyOf": [*alternatives, {"$ref": "#/$defs/Error"}]}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "reproarchive --json documents",
        "description": "What each command prints with --json: $defs/command.NAME for `reproarchive NAME`. "
                       "Generated by `python -m reproarchive.spec_files --write`; do not edit.",
        "$defs": {**commands, **dict(sorted({**builder.defs, **_LISTINGS}.items()))},
    }


def schema_text() -> str:
    return json.dumps(json_schema(), indent=1, sort_keys=False) + "\n"


def check(spec_dir: Path) -> list[str]:
    """The schema file if it is not what the records declare now: one line naming it and why;
    empty when it is."""
    target = schema_file(spec_dir)
    if not target.exists():
        return [f"{target}: missing"]
    if target.read_text(encoding="utf-8") != schema_text():
        return [f"{target}: differs from what the reports declare"]
    return []


def write(spec_dir: Path) -> list[Path]:
    """Write the schema file; the files changed (none when it was current)."""
    return write_if_changed(schema_file(spec_dir), schema_text())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--write"]:
        write(SCHEMA_FILE.parents[1])
        return 0
    if args == ["--check"]:
        if check(SCHEMA_FILE.parents[1]):
            print(f"{SCHEMA_FILE} is out of date: run python -m reproarchive.spec_files --write", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(schema_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
