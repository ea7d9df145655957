"""The index grammar in CDDL (RFC 8610), derived from ``schema`` so it cannot drift from it.

``spec/index-<major>.<minor>.cddl`` is normative (spec §6): a second reader of the format can
validate an index with any CDDL tool (msgpack maps onto CBOR's data model: ``bin`` is ``bstr``,
``str`` is ``tstr``). The grammar says what the types say: every field's type, which keys are
required, each closed value set; the rules that relate fields (a view fits its storage, a node
reference names an earlier node ...) are the numbered rules of spec §5–§8 that the reader
checks after the grammar. Every map admits further keys (``* tstr => any``) because readers
ignore unknown keys (spec §6, §10).

    python -m reproarchive.format.schema_cddl            # compare with the committed file
    python -m reproarchive.format.schema_cddl --write    # write it

(``python -m reproarchive.spec_files`` checks or writes it with every other generated file,
through ``check`` and ``write``.)
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import sys
import typing
from pathlib import Path
from typing import Any

from reproarchive.format import schema
from reproarchive.format.atomic import write_if_changed
from reproarchive.format.plain import ArgCodec, PlainData, Tagged, _Dim
from reproarchive.format.schema_check import _classes, _enums

# (the header names schema.py, as before the schema became a package, so that the committed
# grammar stays byte for byte what it was)
_HEADER = (f"; The index member of reproarchive format {schema.FORMAT_VERSION} (spec/FORMAT.md §5.1-§8), "
           f"""in CDDL (RFC 8610).
; Generated from reproarchive/format/schema.py by `python -m reproarchive.spec_files --write`.
; msgpack maps onto CBOR's data model: str is tstr, bin is bstr. Every map may hold further keys,
; which readers ignore. Rules between fields (spec §5-§8, ids R5-1 ...) are checked after this grammar.

index = Index

int64 = int  ; -2^63 .. 2^63-1 (rule R5.1-7)
plain = nil / bool / int64 / float / tstr / bstr / [* plain] / {{* tstr => plain}}  ; nesting at most 32
dim = [int64, tstr]
""")


def _name(tp: Any, tags: dict[type, list[str]]) -> str:
    if tp is type(None):
        return "nil"
    if tp is PlainData or tp is Any:
        return "plain"
    if tp is _Dim:
        return "dim"
    if isinstance(tp, ArgCodec):
        return "Arg"
    if isinstance(tp, Tagged):
        return " / ".join(dict.fromkeys(c.__name__ for c in tp.classes.values()))
    if isinstance(tp, type):
        if issubclass(tp, enum.StrEnum):
            return tp.__name__
        return {int: "int64", float: "number", str: "tstr", bool: "bool", bytes: "bstr"}.get(tp, tp.__name__)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        meta = args[1]
        if isinstance(meta, Tagged):
            return _union_name(meta)
        return _name(meta if isinstance(meta, ArgCodec) else args[0], tags)
    if origin is tuple:
        return f"[* {_name(args[0], tags)}]"
    if origin is dict:
        return f"{{* tstr => {_name(args[1], tags)}}}"
    inner = [_name(a, tags) for a in args]
    return " / ".join(("(" + i + ")") if " / " in i else i for i in inner)


def _union_name(tagged: Tagged) -> str:
    classes = list(dict.fromkeys(tagged.classes.values()))
    if any(c is schema.TensorValue for c in classes):
        return "Value"
    if set(classes) <= set(typing.get_args(schema.StateEntry)[1].classes.values()):
        return "StateEntry"
    return " / ".join(c.__name__ for c in [*classes, *([tagged.fallback] if tagged.fallback else [])])


def _tags() -> dict[type, list[str]]:
    """Class -> the tag values it is stored under, from every tagged union of the schema."""
    out: dict[type, list[str]] = {}
    for alias in (schema.Value, schema.StateEntry):
        tagged = typing.get_args(alias)[1]
        for tag, cls in tagged.classes.items():
            out.setdefault(cls, []).append(tag)
    return out




def _literal(values) -> str:
    return " / ".join(f'"{v}"' for v in values)


def _fields(cls: type, hints: dict):
    """(field, the type hints it resolves in) for each key of ``cls``'s map: an inline record's
    fields (``Index.records``) are keys of the map that holds it."""
    for f in dataclasses.fields(cls):
        if f.metadata.get("extra"):
            continue
        if f.metadata.get("inline"):
            inner = hints[f.name]
            yield from _fields(inner, typing.get_type_hints(inner, vars(schema), include_extras=True))
        else:
            yield f, hints


def grammar() -> str:
    tags = _tags()
    rules = [_HEADER]
    value_classes = typing.get_args(schema.Value)[1].classes.values()
    rules.append(f"Value = {' / '.join(dict.fromkeys(c.__name__ for c in value_classes))}")
    entry_classes = typing.get_args(schema.StateEntry)[1].classes.values()
    rules.append(f"StateEntry = {' / '.join(dict.fromkeys(c.__name__ for c in entry_classes))}")
    memory, layout = _literal(schema.MemoryFormat), _literal(schema.Layout)
    rules.append(
        "Arg = nil / bool / int64 / float / tstr / [* Arg] / ArgMap  ; nesting at most 32 (R7.2-1)\n"
        'ArgMap = {k: "node", v: tstr} / {k: "tuple", v: [* Arg]} / {k: "dict", v: [* [Arg, Arg]]}\n'
        '       / {k: "slice", v: [Arg, Arg, Arg]} / {k: "dtype" / "device", v: tstr}\n'
        f'       / {{k: "memory_format", v: {memory}}}\n'
        f'       / {{k: "layout", v: {layout}}} / {{k: "ellipsis"}} / {{k: "complex", v: [number, number]}}')
    for cls in _classes():
        hints = typing.get_type_hints(cls, vars(schema), include_extras=True)
        lines = []
        tag_key = getattr(cls, "TAG_KEY", None)
        if tag_key:
            lines.append(f'{tag_key}: "{cls.TAG}"')
        for f, field_hints in _fields(cls, hints):
            key = f.metadata.get("key", f.name)
            tp = _name(field_hints[f.name], tags)
            if cls in tags and key == "kind":
                tp = _literal(tags[cls])
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if cls is schema.Index and key in ("format", "version"):
                required, tp = True, '"reproarchive"' if key == "format" else "tstr"
            lines.append(f"{'' if required else '? '}{key}: {tp}")
        lines.append("* tstr => any")
        rules.append(f"{cls.__name__} = {{\n" + "".join(f"  {line},\n" for line in lines[:-1]) + f"  {lines[-1]}\n}}")
    for cls in _enums():
        rules.append(f"{cls.__name__} = {_literal(cls)}")
    return "\n\n".join(rules) + "\n"


def grammar_file(spec_dir: Path, version: str = schema.FORMAT_VERSION) -> Path:
    return spec_dir / f"index-{version}.cddl"


def check(spec_dir: Path) -> list[str]:
    """The current version's grammar if it is not what ``grammar()`` makes now: one line naming
    it and why; empty when it is."""
    target = grammar_file(spec_dir)
    if not target.exists():
        return [f"{target}: missing"]
    if target.read_text() != grammar():
        return [f"{target}: differs from the schema"]
    return []


def write(spec_dir: Path) -> list[Path]:
    """Write the current version's grammar; the files changed (none when it was current)."""
    return write_if_changed(grammar_file(spec_dir), grammar())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", type=Path, default=Path(__file__).resolve().parents[2] / "spec")
    parser.add_argument("--write", action="store_true", help="write the current version's grammar")
    opts = parser.parse_args(argv)
    target = grammar_file(opts.spec)
    if opts.write:
        write(opts.spec)
        print(f"wrote {target}")
        return 0
    if check(opts.spec):
        print(f"{target} is missing or differs from the schema: run with --write")
        return 1
    print(f"{target.name} matches the schema")
    return 0


if __name__ == "__main__":
    sys.exit(main())
