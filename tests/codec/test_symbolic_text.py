"""Symbolic expressions in an archive are read by a closed grammar, never evaluated."""

from __future__ import annotations

import pytest
import sympy

from reproarchive.codec.symbolic_text import MAX_TEXT, parse
from reproarchive.errors import UnsafeArchiveError

S0 = sympy.Symbol("s0", positive=True, integer=True)
S1 = sympy.Symbol("s1", positive=True, integer=True)
U0 = sympy.Symbol("u0", integer=True)
SYMBOLS = {"s0": S0, "s1": S1, "u0": U0}


def _printed_forms():
    from torch.utils._sympy.functions import CeilToInt, FloorDiv, PythonMod

    return [S0, 2 * S0 + 1, FloorDiv(S0, 2), sympy.Eq(S1, 2 * S0), sympy.And(sympy.Ge(U0, 0), sympy.Ne(U0, 1)),
            PythonMod(S0, 3), CeilToInt(S0 / 2), sympy.Max(S0, U0), S0 ** 2, sympy.Le(2, S0), -S1 + 3 * U0]


@pytest.mark.parametrize("index", range(11))
def test_what_sympy_prints_reads_back_to_the_same_expression(index):
    expr = _printed_forms()[index]
    back = parse(str(expr), SYMBOLS)
    assert back == expr, (str(expr), str(back))
    assert back.free_symbols <= set(SYMBOLS.values())  # the caller's symbols, with their assumptions


HOSTILE = [
    "__import__('os').system('touch {marker}')",
    "open('{marker}', 'w').write('x')",
    "s0.__class__.__mro__[1].__subclasses__()",
    "(lambda: open('{marker}', 'w'))()",
    "[open('{marker}', 'w') for _ in (1,)]",
    "exec(\"open('{marker}', 'w')\")",
    "eval(\"open('{marker}', 'w')\")",
    "Symbol('x')",
    "sympify(\"open('{marker}', 'w')\")",
    "Eq(s0, 1, evaluate=False)",
    "Max(*s0)",
    "s0 if s0 else s1",
    "'a' * 1000",
    "x9",
    "9**9**9",
    "s0**100000",
    "1" + "0" * 30,
    "(" * 3000 + "s0" + ")" * 3000,
    "s0 + " * 2000 + "s0",
    "s0; import os",
    "s0 := 1",
    "b'bytes'",
    "{{s0: 1}}",
]


@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_text_is_refused_and_never_run(template, tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(UnsafeArchiveError):
        parse(template.format(marker=marker), SYMBOLS)
    assert not marker.exists()


def test_text_longer_than_the_limit_is_refused_before_parsing():
    with pytest.raises(UnsafeArchiveError, match="longer than"):
        parse("s0+" * MAX_TEXT + "s0", SYMBOLS)
