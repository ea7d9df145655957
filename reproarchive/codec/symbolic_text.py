"""Symbolic-shape expressions as text, read back without ``eval``.

An archive stores dimension expressions, guards and runtime asserts the way sympy prints them
(``s77``, ``2*s0 + 1``, ``(s0//2)``, ``Eq(s1, 2*s0)``, ``(u0 >= 0) & Ne(u0, 1)``). PyTorch's own
repro scripts put such text into Python source and run it (and died on ``CeilToInt``,
pytorch#194827); ``sympy.sympify`` is ``eval`` underneath. An archive may come from anyone, so
this module reads the text with ``ast.parse`` and builds the expression itself, node by node,
from a closed grammar: integer and float literals, the names of symbols the caller hands in (the
ShapeEnv's own symbols, so that assumptions match), a fixed table of sympy and
``torch.utils._sympy`` functions called with positional arguments only, arithmetic
(``+ - * / // % **``), comparisons and ``& | ~``. Anything else (attributes, subscripts, other
names, keywords, lambdas, comprehensions, strings) is refused with ``UnsafeArchiveError`` (``E_UNSAFE``); text
length, node count, integer size and exponents are bounded so that reading cannot be made to
take unbounded time or memory.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping
from typing import Any

from reproarchive.compat.fake import sympy_functions
from reproarchive.errors import UnsafeArchiveError

MAX_TEXT = 4096
MAX_NODES = 2000
MAX_INT_BITS = 64
MAX_EXPONENT = 64


def _functions() -> dict[str, Any]:
    """The callables an expression may name: sympy's relations and logic, and the integer
    functions torch's symbolic shapes print (``torch.utils._sympy.functions``)."""
    import sympy


    tf = sympy_functions()
    table = {"Eq": sympy.Eq, "Ne": sympy.Ne, "Lt": sympy.Lt, "Le": sympy.Le, "Gt": sympy.Gt, "Ge": sympy.Ge,
             "And": sympy.And, "Or": sympy.Or, "Not": sympy.Not, "Abs": sympy.Abs,
             "Max": sympy.Max, "Min": sympy.Min}
    for name in ("FloorDiv", "CeilDiv", "ModularIndexing", "CleanDiv", "Mod", "PythonMod", "CeilToInt",
                 "FloorToInt", "TruncToInt", "RoundToInt", "ToFloat", "IntTrueDiv", "FloatTrueDiv", "PowByNatural",
                 "FloatPow", "Where", "Identity", "IsNonOverlappingAndDenseIndicator", "LShift", "RShift",
                 "BitwiseFn_bitwise_and", "BitwiseFn_bitwise_or"):
        fn = getattr(tf, name, None)
        if fn is not None:
            table[name] = fn
    return table


def parse(text: str, symbols: Mapping[str, Any]) -> Any:
    """The sympy expression ``text`` prints, over ``symbols`` (name -> sympy.Symbol), the only
    names besides the function table it may use. Raises UnsafeArchiveError for anything else."""
    if not isinstance(text, str):
        raise UnsafeArchiveError(f"a symbolic expression must be text, not {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise UnsafeArchiveError(f"a symbolic expression of {len(text)} characters is longer than {MAX_TEXT}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as err:
        raise UnsafeArchiveError(f"{_shown(text)} is not an expression ({type(err).__name__})") from None
    count = sum(1 for _ in ast.walk(tree))
    if count > MAX_NODES:
        raise UnsafeArchiveError(f"{_shown(text)} has {count} syntax nodes, more than {MAX_NODES}")
    return _Builder(symbols, _functions(), text).build(tree.body)


def parse_all(texts, symbols: Mapping[str, Any]) -> list[Any]:
    return [parse(t, symbols) for t in texts]


def _shown(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_COMPARE = {ast.Eq: "Eq", ast.NotEq: "Ne", ast.Lt: "Lt", ast.LtE: "Le", ast.Gt: "Gt", ast.GtE: "Ge"}


class _Builder:
    def __init__(self, symbols: Mapping[str, Any], functions: dict[str, Any], text: str):
        self.symbols = symbols
        self.functions = functions
        self.text = text

    def refuse(self, what: str) -> UnsafeArchiveError:
        return UnsafeArchiveError(f"{_shown(self.text)}: {what} is not allowed in a symbolic expression")

    def build(self, node: ast.AST) -> Any:
        import sympy

        if isinstance(node, ast.Constant):
            value = node.value
            if type(value) is int:
                if value.bit_length() > MAX_INT_BITS:
                    raise self.refuse(f"an integer of {value.bit_length()} bits")
                return sympy.Integer(value)
            if type(value) is float:
                return sympy.Float(value)
            if type(value) is bool:
                return sympy.true if value else sympy.false
            raise self.refuse(f"a {type(value).__name__} constant")
        if isinstance(node, ast.Name):
            if node.id in self.symbols:
                return self.symbols[node.id]
            if node.id in ("oo", "int_oo"):
                return sympy.oo
            raise self.refuse(f"the name {node.id!r}")
        if isinstance(node, ast.UnaryOp):
            operand = self.build(node.operand)
            if isinstance(node.op, ast.USub):
                return -operand
            if isinstance(node.op, ast.UAdd):
                return operand
            if isinstance(node.op, (ast.Invert, ast.Not)):
                return sympy.Not(operand)
            raise self.refuse(type(node.op).__name__)
        if isinstance(node, ast.BinOp):
            return self._binary(node)
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, ast.BoolOp):
            parts = [self.build(v) for v in node.values]
            return sympy.And(*parts) if isinstance(node.op, ast.And) else sympy.Or(*parts)
        if isinstance(node, ast.Call):
            return self._call(node)
        raise self.refuse(type(node).__name__)

    def _binary(self, node: ast.BinOp) -> Any:
        import sympy

        left, right = self.build(node.left), self.build(node.right)
        op = type(node.op)
        if op in _BINARY:
            return _BINARY[op](left, right)
        if op is ast.FloorDiv:
            return self.functions["FloorDiv"](left, right)
        if op is ast.Mod:
            return sympy.Mod(left, right)
        if op is ast.Pow:
            if not (right.is_number and abs(right) <= MAX_EXPONENT):
                raise self.refuse(f"the exponent {right}")
            return left ** right
        if op is ast.BitAnd:
            return sympy.And(left, right)
        if op is ast.BitOr:
            return sympy.Or(left, right)
        raise self.refuse(op.__name__)

    def _compare(self, node: ast.Compare) -> Any:
        import sympy

        parts, left = [], self.build(node.left)
        for op, comparator in zip(node.ops, node.comparators):
            name = _COMPARE.get(type(op))
            if name is None:
                raise self.refuse(type(op).__name__)
            right = self.build(comparator)
            parts.append(self.functions[name](left, right))
            left = right
        return parts[0] if len(parts) == 1 else sympy.And(*parts)

    def _call(self, node: ast.Call) -> Any:
        if not isinstance(node.func, ast.Name):
            raise self.refuse(f"calling {type(node.func).__name__}")
        fn = self.functions.get(node.func.id)
        if fn is None:
            raise self.refuse(f"calling {node.func.id!r}")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise self.refuse("a keyword or starred argument")
        return fn(*(self.build(a) for a in node.args))
