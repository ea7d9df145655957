"""A record of the wrong type anywhere in a valid archive is one archive error, for every command.

The cases are derived from the schema itself: for every field of every record section of a
valid archive (and of a storage, a tensor input, a node and a module-state entry), the field is
replaced by a value of another type and the archive is re-assembled with valid framing. Every
command that reads an archive must then say so in one line with exit 2 (never exit 70, never a
traceback), before it runs anything.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import pytest
from click.testing import CliRunner

import reproarchive
from reproarchive.cli import main
from reproarchive.format import schema
from reproarchive.format.plain import PlainData
from support import hostile_corpus as hc


def _wrong_value(tp) -> object | None:
    """A value of a clearly different type than ``tp`` accepts (None: any value fits)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return "not a record"
    if origin in (typing.Union, __import__("types").UnionType):
        return _wrong_value(next(a for a in args if a is not type(None)))
    if tp is PlainData or tp is typing.Any:
        return None
    if dataclasses.is_dataclass(tp):
        return ["not", "a", "map"]
    if hasattr(tp, "__plain_decode__"):
        return {"k": "no such tag"} if tp is schema.Arg else "not a pair"
    return {int: "7", float: "x", str: 7, bool: 1, bytes: 7}.get(tp) or (
        {"a": 1} if origin is tuple else [1] if origin is dict else None)


def _fields(cls) -> list[tuple[str, object]]:
    hints = typing.get_type_hints(cls, vars(schema), include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("extra"):
            continue
        wrong = _wrong_value(hints[f.name])
        if wrong is not None:
            out.append((f.metadata.get("key", f.name), wrong))
    return out


def _setter(path: tuple, value):
    def edit(index: dict) -> None:
        target = index
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return edit


def _cases(p: hc.Parsed) -> list[tuple[str, object]]:
    index = p.index
    # (where in the plain index, the record class that lives there)
    places: list[tuple[tuple, type]] = [
        (("storages", 0), schema.StorageRecord),
        (("inputs", 0), schema.TensorValue),
        (("graph", "nodes", 1), schema.NodeRecord),
        (("graph", "module_state", 0), schema.ModuleEntry),
        (("created_by",), schema.CreatedBy),
        (("config",), schema.ConfigRecord),
        (("environment",), schema.EnvironmentRecord),
        (("system",), schema.SystemRecord),
        (("failure",), schema.FailureRecord),
        (("failure", "accuracy"), schema.AccuracyReport),
        (("source",), schema.CaptureSource),  # the kind the valid archive records
        (("minify",), schema.MinifyRecord),
    ]
    for key in ("torch", "python", "os", "cpu", "cuda", "cxx"):
        places.append((("system", key), typing.get_type_hints(schema.SystemRecord)[key].__args__[0]))
    cases = []
    for where, cls in places:
        target = index
        for step in where:
            target = target[step]
        assert isinstance(target, dict), where
        for key, wrong in _fields(cls):
            path = (*where, key)
            cases.append((".".join(map(str, path)), _setter(path, wrong)))
    for key in ("backend", "accuracy", "parent", "metadata", "digest_algorithm", "graph", "inputs", "storages"):
        cases.append((key, _setter((key,), 12345 if key != "backend" else ["x"])))
    return cases


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("record_types")
    from reproarchive.context.config import config_snapshot
    from reproarchive.context.environment import environment_snapshot
    from reproarchive.context.system import system_snapshot
    from reproarchive.format.schema import AccuracyReport, FailureRecord

    failure = FailureRecord(stage="accuracy", exception_type="AccuracyError", message="m", signature="accuracy||",
                            backend="eager", accuracy=AccuracyReport(passed=False, tolerance=1e-3, summary="s"))
    valid = hc.make_valid(root / "valid.tar.zst", config=config_snapshot(), environment=environment_snapshot(),
                          system=system_snapshot(), failure=failure, source={"kind": "capture"},
                          minify={"calls": 1, "stop_reason": "fixpoint"}, note="metadata")
    reproarchive.verify(valid)
    parsed = hc.parse(valid.read_bytes())
    out = []
    for i, (name, edit) in enumerate(_cases(parsed)):
        path = root / f"case{i}.tar.zst"
        path.write_bytes(hc.rebuild(parsed, edit))
        out.append((name, path))
    return out


def test_the_cases_cover_every_section(corpus):
    names = {name.split(".")[0] for name, _ in corpus}
    assert {"storages", "inputs", "graph", "config", "environment", "system", "failure", "source", "minify",
            "created_by"} <= names
    assert len(corpus) > 80


LIBRARY = {
    "verify": lambda path, tmp: reproarchive.verify(path),
    "inspect": lambda path, tmp: reproarchive.inspect(path).to_plain(),
    "unpack": lambda path, tmp: reproarchive.unpack(path, tmp / "out"),
    "load": lambda path, tmp: reproarchive.load(path),
    "read_input": lambda path, tmp: reproarchive._internal.read_input(path, 0),
    "run": lambda path, tmp: reproarchive.run(path, isolate=False),
    "export": lambda path, tmp: reproarchive.export(path, tmp / "export"),
    "minify": lambda path, tmp: reproarchive.minify_archive(path, tmp / "min.tar.zst"),
}


def test_every_library_reader_refuses_with_an_archive_error(corpus, tmp_path):
    problems = []
    for name, path in corpus:
        for op, fn in LIBRARY.items():
            work = tmp_path / f"{op}-{path.stem}"
            work.mkdir()
            try:
                fn(path, work)
            except reproarchive.errors.ArchiveError:
                pass
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{name} [{op}]: {type(exc).__name__}: {str(exc)[:120]}")
            else:
                problems.append(f"{name} [{op}]: accepted")
            if list(work.iterdir()):
                problems.append(f"{name} [{op}]: wrote {sorted(p.name for p in work.iterdir())}")
    assert problems == []


COMMANDS = [["verify"], ["inspect"], ["inspect", "--json"], ["unpack", "-C", "{tmp}/out"], ["run", "--no-isolate"],
            ["run", "--minify", "-o", "{tmp}/min.tar.zst"], ["export", "-o", "{tmp}/export"]]


def test_every_command_prints_one_line_and_exits_2(corpus, tmp_path):
    runner = CliRunner()
    problems = []
    for name, path in corpus:
        for command in COMMANDS:
            work = tmp_path / f"{command[0]}-{path.stem}"
            work.mkdir(exist_ok=True)
            args = [a.replace("{tmp}", str(work)) for a in command]
            result = runner.invoke(main, [args[0], str(path), *args[1:]])
            lines = result.stderr.strip().splitlines()
            if result.exit_code != 2 or len(lines) != 1 or not lines[0].startswith("error: "):
                problems.append(f"{name} {command}: exit {result.exit_code}: {result.output[-200:]!r}")
            if "--json" in command:  # the failure as a JSON document on stdout too
                if json.loads(result.stdout).get("exit_code") != 2:
                    problems.append(f"{name} {command}: no JSON error document: {result.stdout[-200:]!r}")
            elif result.stdout.strip():
                problems.append(f"{name} {command}: printed {result.stdout[-200:]!r}")
            if list(work.iterdir()):
                problems.append(f"{name} {command}: wrote {sorted(p.name for p in work.iterdir())}")
    assert problems == []


def test_isolated_replay_refuses_in_the_parent(corpus):
    """One case per section through `run --isolate`: refused before a child is started."""
    runner = CliRunner()
    seen = set()
    for name, path in corpus:
        section = name.split(".")[0]
        if section in seen:
            continue
        seen.add(section)
        result = runner.invoke(main, ["run", str(path), "--isolate"])
        assert result.exit_code == 2 and result.output.startswith("error: "), (name, result.output)
