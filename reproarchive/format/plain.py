"""Typed records <-> plain msgpack data, driven by the dataclass declarations in ``schema``.

The index is declared once, as dataclasses; this module derives from those declarations the one
converter in each direction, so a field cannot be read one way and written another. It plays the
role of torch.export's ``_dict_to_dataclass`` / ``_dataclass_to_dict``, with two additions the
format needs:

* **where**: a type error names the field path (``storages[3].size``), so the one-line error a
  user sees says exactly which record is wrong;
* **open records**: informative sections (system, source, ...) keep keys this version does not
  know in an ``extra`` field and write them back, because readers must ignore unknown keys
  (spec §10) without dropping them when an archive is rewritten (minify keeps its parent's
  records).

Converters are built once per class and cached; decoding a record is a loop over precomputed
(key, converter) pairs, cheap enough for indexes of hundreds of thousands of nodes.

Field options (``dataclasses.field(metadata=...)``):

* ``key``: the map key when it differs from the attribute name (``class`` is a keyword);
* ``omit``: when encoding, leave the key out if the value is ``None`` (``"none"``) or empty
  (``"empty"``); by default every field is written, so a record's encoding has a fixed key set;
* ``extra``: this field collects unknown keys (an open record);
* ``inline``: the field is a record whose keys are written into this record's map, not under
  a key of their own (the index keeps its records at the top level; in memory they are one
  ``Records`` value).

Tagged unions are declared with ``Tagged(key, {tag: class}, fallback)``; a class's tag is its
``TAG`` (or its own ``key`` field, for a class that stands for several tags). A map whose tag is
none of them (or missing) decodes as ``fallback`` when there is one, so a reader keeps a variant
written by a newer minor version as an open record instead of refusing the archive.

Besides the converters, this module holds what ``schema`` needs to declare records without
holding code itself (``schema_check`` refuses anything there that is not a record, an enum or a
constant): the field helpers (``omit_none``, ``open_record``, ``informative``) and the two field
types with codecs of their own, a symbolic dimension (``_Dim``) and a graph argument
(``ArgCodec``, the tagged maps of spec §7.2).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from typing import Any, Callable, Union

from reproarchive.errors import Rule, SchemaViolation

INT_MIN = -(1 << 63)
INT_MAX = (1 << 63) - 1
MAX_PLAIN_DEPTH = 32
MAX_ARG_DEPTH = 32


@dataclasses.dataclass(frozen=True, eq=False)
class Tagged:
    """A union of record classes told apart by the value under ``key``."""

    key: str
    classes: dict[str, type]
    fallback: type | None = None


class PlainData:
    """Marker type: any plain msgpack data (checked for shape and depth, kept as is)."""


# --------------------------------------------------------------------------------------------
# plain data


def check_plain(value: Any, depth: int = 0) -> Any:
    """Nil, bool, int64, float, str, bytes, and lists / string-keyed maps of these."""
    if value is None or type(value) in (bool, float, str, bytes):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            raise SchemaViolation(f"integer {value} does not fit in 64 bits", rule=Rule.INT64)
        return int(value)
    for base in (float, str, bytes):  # a subclass is stored as its builtin base
        if isinstance(value, base):
            return base(value)
    if depth >= MAX_PLAIN_DEPTH:
        raise SchemaViolation(f"data nests deeper than {MAX_PLAIN_DEPTH} levels")
    if isinstance(value, (list, tuple)):
        return _items(value, lambda v: check_plain(v, depth + 1))
    if isinstance(value, dict):
        return _entries(value, lambda v: check_plain(v, depth + 1))
    raise SchemaViolation(f"holds a {type(value).__name__}, which is not plain data")


# --------------------------------------------------------------------------------------------
# scalar converters


# Subclasses (torch's TorchVersion is a str, IntEnum an int) are accepted and stored as the
# base type; bool is never an int here, although Python says it is.


def _int(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise SchemaViolation(f"expected an integer, got {_kind(v)}")
    if not INT_MIN <= v <= INT_MAX:
        raise SchemaViolation(f"integer {v} does not fit in 64 bits", rule=Rule.INT64)
    return int(v)


def _float(v: Any) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    raise SchemaViolation(f"expected a number, got {_kind(v)}")


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise SchemaViolation(f"expected a string, got {_kind(v)}")
    return str(v)


def _bool(v: Any) -> bool:
    if type(v) is not bool:
        raise SchemaViolation(f"expected true or false, got {_kind(v)}")
    return v


def _bytes(v: Any) -> bytes:
    if type(v) is not bytes:
        raise SchemaViolation(f"expected binary data, got {_kind(v)}")
    return v


def _kind(v: Any) -> str:
    names = {type(None): "nil", bool: "a boolean", int: "an integer", float: "a float", str: "a string",
             bytes: "binary data", list: "a list", tuple: "a list", dict: "a map"}
    return names.get(type(v), type(v).__name__)


_SCALARS: dict[Any, Callable[[Any], Any]] = {int: _int, float: _float, str: _str, bool: _bool, bytes: _bytes}


# --------------------------------------------------------------------------------------------
# building converters from type hints


def _hints(cls: type) -> dict[str, Any]:
    module = __import__(cls.__module__, fromlist=["_"])
    return typing.get_type_hints(cls, vars(module), include_extras=True)


@functools.cache
def converters(tp: Any) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """(decode, encode) for a field type: plain data -> typed value, and back."""
    if tp is Any or tp is PlainData:
        return check_plain, check_plain
    if isinstance(tp, Tagged):
        return _tagged_decoder(tp), encode
    if isinstance(tp, ArgCodec):
        return tp.decode, tp.encode
    if tp in _SCALARS:
        return _SCALARS[tp], _SCALARS[tp]
    if isinstance(tp, type) and issubclass(tp, enum.StrEnum):
        # a closed value set is a string on disk and in the record; its members are checked by
        # the index rules, which name the rule of the set's own section
        return _str, _str
    if hasattr(tp, "__plain_decode__"):
        return tp.__plain_decode__, tp.__plain_encode__
    if dataclasses.is_dataclass(tp):
        return (lambda v, tp=tp: decode(tp, v)), encode
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return converters(args[1] if isinstance(args[1], (Tagged, ArgCodec)) else args[0])
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1 or len(args) != 2:
            raise TypeError(f"unsupported union {tp}")
        dec, enc = converters(inner[0])
        return (lambda v, dec=dec: None if v is None else dec(v)), (lambda v, enc=enc: None if v is None else enc(v))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        dec, enc = converters(args[0])
        return (lambda v, dec=dec: _decode_list(v, dec)), (lambda v, enc=enc: _items(v, enc))
    if origin is dict:
        dec, enc = converters(args[1])
        return (lambda v, dec=dec: _decode_map(v, dec)), (lambda v, enc=enc: _entries(v, enc))
    raise TypeError(f"unsupported field type {tp}")


def decoder_for(tp: Any) -> Callable[[Any], Any]:
    return converters(tp)[0]


def _items(seq, conv) -> list:
    """``conv`` over a sequence; an error names the position."""
    out = []
    for i, item in enumerate(seq):
        try:
            out.append(conv(item))
        except SchemaViolation as exc:
            raise exc.at(i) from None
    return out


def _entries(mapping, conv) -> dict:
    """``conv`` over a string-keyed map's values; an error names the key."""
    out = {}
    for k, item in mapping.items():
        if not isinstance(k, str):
            raise SchemaViolation(f"map key {k!r} is not a string")
        try:
            out[k] = conv(item)
        except SchemaViolation as exc:
            raise exc.at(k) from None
    return out


def _decode_list(v: Any, conv) -> tuple:
    if not isinstance(v, list):
        raise SchemaViolation(f"expected a list, got {_kind(v)}")
    return tuple(_items(v, conv))


def _decode_map(v: Any, conv) -> dict:
    if not isinstance(v, dict):
        raise SchemaViolation(f"expected a map, got {_kind(v)}")
    return _entries(v, conv)


def _tagged_decoder(tagged: Tagged):
    decoders = {tag: (lambda v, c=cls: decode(c, v)) for tag, cls in tagged.classes.items()}
    fallback = (lambda v, c=tagged.fallback: decode(c, v)) if tagged.fallback is not None else None

    def conv(v: Any):
        if not isinstance(v, dict):
            raise SchemaViolation(f"expected a map with a {tagged.key!r} tag, got {_kind(v)}")
        tag = v.get(tagged.key)
        dec = decoders.get(tag) if isinstance(tag, str) else None
        if dec is None:
            if tagged.fallback is None:
                raise SchemaViolation(f"unknown {tagged.key} {str(tag)[:40]!r}")
            dec = fallback
        return dec(v)

    return conv


@dataclasses.dataclass(frozen=True)
class _Spec:
    attr: str
    key: str
    decode: Callable[[Any], Any]
    encode: Callable[[Any], Any]
    default: Any  # dataclasses.MISSING when required
    omit: str | None
    inline: type | None = None  # a record whose keys live in this record's map


@functools.cache
def _specs(cls: type) -> tuple[tuple[_Spec, ...], str | None, frozenset]:
    hints = _hints(cls)
    specs = []
    extra = None
    for f in dataclasses.fields(cls):
        if f.metadata.get("extra"):
            extra = f.name
            continue
        default = f.default
        if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        if f.metadata.get("inline"):
            specs.append(_Spec(f.name, f.name, None, None, default, None, inline=hints[f.name]))
            continue
        dec, enc = converters(hints[f.name])
        specs.append(_Spec(f.name, f.metadata.get("key", f.name), dec, enc, default, f.metadata.get("omit")))
    keys = frozenset(k for s in specs for k in (_specs(s.inline)[2] if s.inline else (s.key,)))
    tag_key = getattr(cls, "TAG_KEY", None)
    if tag_key:
        keys |= {tag_key}
    return tuple(specs), extra, keys


def decode(cls: type, raw: Any):
    """``raw`` (decoded msgpack) as a ``cls`` record; raises SchemaViolation naming the field."""
    if not isinstance(raw, dict):
        raise SchemaViolation(f"expected a map, got {_kind(raw)}")
    specs, extra, keys = _specs(cls)
    values = {}
    for s in specs:
        if s.inline is not None:
            values[s.attr] = decode(s.inline, raw)
            continue
        v = raw.get(s.key, dataclasses.MISSING)
        if v is dataclasses.MISSING:
            if s.default is dataclasses.MISSING:
                raise SchemaViolation("is missing").at(s.key)
            values[s.attr] = s.default
            continue
        try:
            values[s.attr] = s.decode(v)
        except SchemaViolation as exc:
            raise exc.at(s.key) from None
    if extra is not None:
        values[extra] = check_plain({k: v for k, v in raw.items() if k not in keys})
    return cls(**values)


# --------------------------------------------------------------------------------------------
# encoding


def encode(record: Any) -> Any:
    """A record as plain msgpack-ready data (type-checked on the way: SchemaViolation)."""
    cls = type(record)
    if not dataclasses.is_dataclass(cls):
        raise SchemaViolation(f"expected a record, got {_kind(record)}")
    specs, extra, _ = _specs(cls)
    out: dict[str, Any] = {}
    tag_key = getattr(cls, "TAG_KEY", None)
    if tag_key:
        out[tag_key] = cls.TAG
    for s in specs:
        v = getattr(record, s.attr)
        if s.inline is not None:
            out.update(encode(v))
            continue
        if s.omit == "none" and v is None or s.omit == "empty" and not v:
            continue
        try:
            out[s.key] = s.encode(v)
        except SchemaViolation as exc:
            raise exc.at(s.key) from None
    if extra is not None:
        for k, v in getattr(record, extra).items():
            out.setdefault(k, v)
    for key in getattr(cls, "COMPUTED", ()):  # a report's derived keys (PlainRecord)
        out[key] = check_plain(getattr(record, key))
    return out


def to_plain(record: Any) -> Any:
    """A record as plain data (for JSON reports and child processes); the inverse is ``from_plain``."""
    return encode(record)


def from_plain(cls: type, raw: Any):
    """A record from plain data, type-checked (``SchemaViolation`` on a mismatch)."""
    return decode(cls, raw)


# --------------------------------------------------------------------------------------------
# declaring records (used by ``schema``)


def omit_none(**kw):
    """An optional field that is left out of the index when it is None."""
    return dataclasses.field(metadata={"omit": "none", **kw}, default=None)


def open_record(cls):
    """A frozen record that also keeps the keys this version does not declare (in ``extra``),
    for informative sections that newer writers may extend (spec §10: readers ignore unknown
    keys, and rewriting an archive keeps them)."""
    cls.__annotations__["extra"] = "dict[str, Any]"
    cls.extra = dataclasses.field(default_factory=dict, metadata={"extra": True})
    return dataclasses.dataclass(frozen=True)(cls)


def informative(name: str, doc: str, module: str, /, **fields: Any) -> type:
    """An open record whose every field is optional: None when the writer did not know it,
    and then left out of the index. What machines report about themselves is like that."""
    specs = [(k, tp | None, omit_none()) for k, tp in fields.items()]
    specs.append(("extra", dict[str, Any], dataclasses.field(default_factory=dict, metadata={"extra": True})))
    cls = dataclasses.make_dataclass(name, specs, frozen=True)
    cls.__doc__, cls.__module__, cls.__qualname__ = doc, module, name
    return cls


class _Dim:
    """Field type of a symbolic dimension, written as the pair ``[dim, symbol]``."""

    @staticmethod
    def __plain_decode__(v: Any) -> tuple[int, str]:
        if not (isinstance(v, list) and len(v) == 2 and type(v[0]) is int and type(v[1]) is str):
            raise SchemaViolation("expected a [dimension, symbol] pair")
        return (v[0], v[1])

    @staticmethod
    def __plain_encode__(v: tuple[int, str]) -> list:
        return [int(v[0]), str(v[1])]


# --------------------------------------------------------------------------------------------
# graph arguments (spec §7.2)


@dataclasses.dataclass(frozen=True, eq=False)
class ArgCodec:
    """Field type of one graph argument: nil, bool, int64, float, str, lists of arguments, and
    the tagged maps ``{"k": tag, "v": ...}`` of spec §7.2, decoded into the records ``schema``
    declares (and hands in here, so this module needs nothing from it). ``constants`` maps each
    named-constant tag to the value set its name must be in (None: any string)."""

    node: type
    tuple: type
    dict: type
    slice: type
    constant: type
    ellipsis: type
    complex: type
    constants: dict[str, Any]

    def decode(self, v: Any, depth: int = 0) -> Any:
        if v is None or type(v) in (bool, float, str):
            return v
        if type(v) is int:
            if not INT_MIN <= v <= INT_MAX:
                raise SchemaViolation(f"integer {v} does not fit in 64 bits", rule=Rule.INT64)
            return v
        if depth >= MAX_ARG_DEPTH:
            raise SchemaViolation(f"arguments nest deeper than {MAX_ARG_DEPTH} levels", rule=Rule.ARG_TAG)
        if isinstance(v, list):
            return [self._at(x, i, depth) for i, x in enumerate(v)]
        if not isinstance(v, dict):
            raise SchemaViolation(f"argument of msgpack type {type(v).__name__} is not allowed", rule=Rule.ARG_TAG)
        k, x = v.get("k"), v.get("v")
        if k == "node" and isinstance(x, str):
            return self.node(x)
        if k == "tuple" and isinstance(x, list):
            return self.tuple(tuple(self._at(a, i, depth) for i, a in enumerate(x)))
        if k == "dict" and isinstance(x, list) and all(isinstance(p, list) and len(p) == 2 for p in x):
            return self.dict(tuple((self._at(a, i, depth), self._at(b, i, depth)) for i, (a, b) in enumerate(x)))
        if k == "slice" and isinstance(x, list) and len(x) == 3:
            return self.slice(*(self._at(a, i, depth) for i, a in enumerate(x)))
        if isinstance(k, str) and k in self.constants and isinstance(x, str):
            allowed = self.constants[k]
            if allowed is None or x in frozenset(allowed):
                return self.constant(k, x)
        if k == "ellipsis":
            return self.ellipsis()
        if k == "complex" and isinstance(x, list) and len(x) == 2 and all(type(a) in (int, float) for a in x):
            return self.complex(float(x[0]), float(x[1]))
        raise SchemaViolation(f"unknown or malformed argument tag {str(k)[:40]!r}", rule=Rule.ARG_TAG)

    def _at(self, v: Any, i: int, depth: int) -> Any:
        try:
            return self.decode(v, depth + 1)
        except SchemaViolation as exc:
            raise exc.at(i) from None

    def encode(self, v: Any) -> Any:
        if v is None or type(v) in (bool, float, str):
            return v
        if type(v) is int:
            if not INT_MIN <= v <= INT_MAX:
                raise SchemaViolation(f"graph constant {v} does not fit in 64 bits", rule=Rule.INT64)
            return v
        if isinstance(v, list):
            return [self.encode(x) for x in v]
        if isinstance(v, self.node):
            return {"k": "node", "v": v.name}
        if isinstance(v, self.tuple):
            return {"k": "tuple", "v": [self.encode(x) for x in v.items]}
        if isinstance(v, self.dict):
            return {"k": "dict", "v": [[self.encode(a), self.encode(b)] for a, b in v.items]}
        if isinstance(v, self.slice):
            return {"k": "slice", "v": [self.encode(v.start), self.encode(v.stop), self.encode(v.step)]}
        if isinstance(v, self.constant):
            return {"k": str(v.kind), "v": v.name}
        if isinstance(v, self.ellipsis):
            return {"k": "ellipsis"}
        if isinstance(v, self.complex):
            return {"k": "complex", "v": [v.real, v.imag]}
        raise SchemaViolation(f"graph argument of type {type(v).__name__} cannot be stored")


class PlainRecord:
    """Mixin for a typed report (what a command prints with ``--json``): ``to_plain()`` is its
    JSON-ready form, by the same converter as the index records, so the declared fields (and
    the properties named in ``COMPUTED``) are exactly the printed keys
    (spec/json/reports.schema.json declares them for readers)."""

    COMPUTED = ()  # names of properties to_plain() writes too (not annotated: no field)

    def to_plain(self) -> dict[str, Any]:
        return encode(self)
