"""Failure records and the signature that decides "is this the same failure?"."""

from __future__ import annotations

from reproarchive.context.failure import signature


def test_signature_tells_dtypes_apart():
    a = signature("compile", "RuntimeError", "expected scalar type float16 but found float32")
    b = signature("compile", "RuntimeError", "expected scalar type float64 but found float32")
    assert a != b
    assert signature("compile", "E", "add_3 failed on buf12") == signature("compile", "E", "add_7 failed on buf3")
