"""Fuzzing the reader with hypothesis: mutated archives and raw bytes.

The oracle: ``verify`` / ``load`` / ``inspect`` either raise an ``ArchiveError`` with one line,
or accept a file whose content is exactly one of the valid archives it was made from (a flip
in a bit zstd ignores, or a splice that reproduces the other archive). Anything else - another
exception, a hang, a different archive accepted as valid - fails.

In the suite this runs ~200 examples per test (a few seconds). For a long manual run:

    REPROARCHIVE_FUZZ_EXAMPLES=100000 python -m pytest -q tests/test_fuzz.py

and, where atheris is installed, ``python tests/fuzz_atheris.py`` (see that file).
"""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import hostile_corpus as hc

EXAMPLES = int(os.environ.get("REPROARCHIVE_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="REPROARCHIVE_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """Two valid archives (different data) and what each operation reports for them."""
    import torch

    root = tmp_path_factory.mktemp("fuzz")
    a = hc.make_valid(root / "a.tar.zst").read_bytes()
    gm, _ = hc.make_graph()
    import reproarchive

    b = reproarchive.pack(gm, [torch.arange(8, dtype=torch.float32).reshape(2, 4), 5], root / "b.tar.zst",
                          progress=False).read_bytes()
    refs = {}
    for name in ("a", "b"):
        path = root / f"{name}.tar.zst"
        refs[name] = {op: hc.run_library_op(op, path, root) for op in ("verify", "load", "inspect")}
    return {"a": a, "b": b, "refs": refs, "root": root}


def check(originals, data: bytes, ops=("verify", "load", "inspect")) -> None:
    with tempfile.NamedTemporaryFile(dir=originals["root"], suffix=".tar.zst") as f:
        f.write(data)
        f.flush()
        for op in ops:
            res = hc.run_library_op(op, f.name, originals["root"])
            assert res["outcome"] != "leak", f"{op} leaked {res['type']}: {res['message']}"
            if res["outcome"] == "archive_error":
                assert "\n" not in res["message"] and res["message"].strip()
                continue
            refs = [originals["refs"][k][op] for k in ("a", "b")]
            same = [all(res.get(key) == ref.get(key) for key in ("digest", "args", "code")) for ref in refs]
            assert any(same), f"{op} accepted a mutated archive with content unlike either original"


def _mutate(data: bytes, edits) -> bytes:
    buf = bytearray(data)
    for kind, pos, value in edits:
        if not buf:
            break
        pos %= len(buf)
        if kind == "flip":
            buf[pos] ^= 1 << (value % 8)
        elif kind == "set":
            buf[pos] = value % 256
        elif kind == "insert":
            buf[pos:pos] = bytes([value % 256]) * (1 + value % 16)
        elif kind == "delete":
            del buf[pos : pos + 1 + value % 16]
    return bytes(buf)


edit = st.tuples(st.sampled_from(["flip", "set", "insert", "delete"]), st.integers(0, 1 << 20), st.integers(0, 1 << 16))


@FUZZ
@given(edits=st.lists(edit, min_size=1, max_size=6), from_end=st.booleans())
def test_fuzz_byte_edits(originals, edits, from_end):
    data = originals["a"]
    if from_end:  # bias toward the footer, seek table and index at the end
        edits = [(k, len(data) - 1 - (p % 256), v) for k, p, v in edits]
    check(originals, _mutate(data, edits))


@FUZZ
@given(cut=st.integers(0, 1 << 20), keep_end=st.booleans())
def test_fuzz_truncation(originals, cut, keep_end):
    data = originals["a"]
    cut %= len(data)
    check(originals, data[cut:] if keep_end else data[:cut])


@FUZZ
@given(i=st.integers(0, 1 << 20), j=st.integers(0, 1 << 20), swap=st.booleans())
def test_fuzz_splice(originals, i, j, swap):
    a, b = (originals["b"], originals["a"]) if swap else (originals["a"], originals["b"])
    check(originals, a[: i % (len(a) + 1)] + b[j % (len(b) + 1) :])


@FUZZ
@given(data=st.binary(max_size=4096), tail=st.booleans())
def test_fuzz_random_bytes(originals, data, tail):
    if tail:  # random bytes ending in a real footer and seek table get further into the reader
        data = data + originals["a"][-(len(originals["a"]) // 4) :]
    check(originals, data, ops=("verify", "inspect"))
