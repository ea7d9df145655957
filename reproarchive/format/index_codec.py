"""The index member's msgpack encoding (spec §5.1): canonical on write, bomb-checked on read.

msgpack's C decoder preallocates what headers declare, so the shape of the bytes is walked
once, without decoding, before msgpack ever sees them.
"""

from __future__ import annotations

from typing import Any

import msgpack

from reproarchive.errors import IndexSchemaError, LimitExceededError, Rule


def canonical(obj: Any) -> Any:
    """Sort map keys recursively so equal records encode to equal bytes."""
    if isinstance(obj, dict):
        return {k: canonical(obj[k]) for k in sorted(obj, key=lambda k: (str(type(k)), k))}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    return obj


def encode_index(index: dict) -> bytes:
    try:
        return msgpack.packb(canonical(index), use_bin_type=True, strict_types=False)
    except (TypeError, ValueError, OverflowError) as exc:
        raise IndexSchemaError(f"index cannot be encoded: {exc}") from exc


MAX_INDEX_DEPTH = 64

# msgpack type byte -> (kind, fixed payload length); kinds: s scalar, b/S bin/str with a length prefix
_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4,
          0xD3: 8}
_SIZED = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}
_CONTAINERS = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}


# Rough CPython sizes, for bounding what decoding an index costs: every element is a pointer
# in its container, containers and strings are objects of their own.
_COST_POINTER = 8
_COST_CONTAINER = 64
_COST_STRING = 40


def check_msgpack_shape(data: bytes, *, max_depth: int = MAX_INDEX_DEPTH, max_memory: int | None = None) -> None:
    """Reject msgpack that would make the decoder allocate more than the data can fill.

    msgpack's C decoder preallocates a list for every array header it meets, so a few bytes
    declaring nested arrays of millions of elements cost gigabytes before it notices the data
    is missing. Every element takes at least one byte, so the elements still owed by all open
    containers can never exceed the bytes left; this walk checks that, the nesting depth, and
    that no extension types appear, in one pass without decoding anything.
    """
    n, pos = len(data), 0
    stack: list[int] = []
    owed = 1  # the top-level object
    # Bytes-to-objects amplification is bounded too: one byte (0x90) decodes to an empty list of
    # ~64 bytes, so an index of empty containers within the size cap could take gigabytes.
    memory = 0
    budget = max_memory if max_memory is not None else 1 << 62
    while pos < n:
        if owed == 0:
            raise IndexSchemaError(f"{n - pos} bytes of trailing data after the index", rule=Rule.MSGPACK_TRAILING)
        b = data[pos]
        pos += 1
        owed -= 1
        if stack:
            stack[-1] -= 1
        count = 0
        if b <= 0x7F or b >= 0xE0:
            pass
        elif 0x80 <= b <= 0x8F:
            count = 2 * (b & 0x0F)
            memory += _COST_CONTAINER
        elif 0x90 <= b <= 0x9F:
            count = b & 0x0F
            memory += _COST_CONTAINER
        elif 0xA0 <= b <= 0xBF:
            pos += b & 0x1F
            memory += _COST_STRING + (b & 0x1F)
        elif b in _FIXED:
            pos += _FIXED[b]
        elif b in _SIZED:
            width = _SIZED[b]
            length = int.from_bytes(data[pos : pos + width], "big")
            pos += width + length
            memory += _COST_STRING + length
        elif b in _CONTAINERS:
            width, mult = _CONTAINERS[b]
            count = mult * int.from_bytes(data[pos : pos + width], "big")
            pos += width
            memory += _COST_CONTAINER
        else:
            raise _bad_byte(b)
        if count:
            owed = _opened(stack, count, owed, n - pos, max_depth)
            memory += _COST_POINTER * count
        if memory > budget:
            raise _over_budget(budget)
        while stack and stack[-1] == 0:
            stack.pop()
    if owed or pos != n:
        raise IndexSchemaError("index ends in the middle of a msgpack value", rule=Rule.MSGPACK_INVALID)


# The rare branches of the walk, out of its loop, which runs once per msgpack object.


def _bad_byte(b: int) -> IndexSchemaError:
    if 0xC7 <= b <= 0xC9 or 0xD4 <= b <= 0xD8:
        return IndexSchemaError("index uses a msgpack extension type",
                                "format 1 has no extension types; the archive is hostile or damaged",
                                rule=Rule.MSGPACK_EXTENSION)
    return IndexSchemaError(f"index holds an invalid msgpack byte {b:#x}", rule=Rule.MSGPACK_INVALID)


def _opened(stack: list[int], count: int, owed: int, left: int, max_depth: int) -> int:
    """The elements owed once a container of ``count`` opens; refused when the bytes ``left``
    cannot hold them all (each takes at least one)."""
    if len(stack) >= max_depth:
        raise IndexSchemaError(f"index nests deeper than {max_depth} levels", rule=Rule.MSGPACK_DEPTH)
    if owed + count > left:
        raise IndexSchemaError(
            "index declares more elements than it has bytes (a msgpack bomb)",
            "the archive is hostile or damaged",
            rule=Rule.MSGPACK_BOMB,
        )
    stack.append(count)
    return owed + count


def _over_budget(budget: int) -> LimitExceededError:
    return LimitExceededError(
        f"index would take more than {budget >> 20} MiB of memory to decode",
        "the archive is hostile or damaged",
        rule=Rule.MSGPACK_MEMORY,
    )


def decode_index(data: bytes, *, max_memory: int) -> Any:
    """Plain data from index bytes, after the shape check; ``schema.rules.decode_index`` types it."""
    check_msgpack_shape(data, max_memory=max_memory)
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise IndexSchemaError(f"index is not valid msgpack: {type(exc).__name__}: {str(exc)[:200]}",
                               rule=Rule.MSGPACK_INVALID) from exc
