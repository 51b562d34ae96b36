"""Building readable Tile syntax: simplifying expression constructors, sizes, and fresh names.

Gradient code is generated as ordinary syntax trees so it prints as Tile that re-parses. The
constructors here fold the trivial cases (``x * 1``, ``x + 0``, ``- -x``) as they build, so the
generated program stays close to what a person would write.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import sympy

from tile import ast
from tile.typed import Size


def is_num(e: ast.Expr, value: float) -> bool:
    if isinstance(e, ast.IntLit):
        return e.value == value
    if isinstance(e, ast.FloatLit):
        return float(e.text) == value
    return False


def lit(value: int | float) -> ast.Expr:
    if isinstance(value, int):
        return ast.IntLit(value)
    return ast.FloatLit(repr(float(value)))


def name(n: str) -> ast.Name:
    return ast.Name(n)


def call(fn: str, *args: ast.Expr) -> ast.Call:
    return ast.Call(fn, tuple(args))


def _negated(e: ast.Expr) -> ast.Expr | None:
    """``x`` when ``e`` is written ``-x`` (also ``-x * y`` and ``-x / y``), else None."""
    if isinstance(e, ast.Unary) and e.op == "-":
        return e.operand
    if isinstance(e, ast.Binary) and e.op in "*/":
        inner = _negated(e.lhs)
        if inner is not None:
            return ast.Binary(e.op, inner, e.rhs)
    return None


def add(a: ast.Expr, b: ast.Expr) -> ast.Expr:
    if is_num(a, 0):
        return b
    if is_num(b, 0):
        return a
    positive = _negated(b)
    if positive is not None:
        return ast.Binary("-", a, positive)
    return ast.Binary("+", a, b)


def sub(a: ast.Expr, b: ast.Expr) -> ast.Expr:
    if is_num(b, 0):
        return a
    if is_num(a, 0):
        return neg(b)
    positive = _negated(b)
    if positive is not None:
        return ast.Binary("+", a, positive)
    return ast.Binary("-", a, b)


def mul(a: ast.Expr, b: ast.Expr) -> ast.Expr:
    if is_num(a, 1):
        return b
    if is_num(b, 1):
        return a
    if is_num(a, -1):
        return neg(b)
    if is_num(b, -1):
        return neg(a)
    return ast.Binary("*", a, b)


def div(a: ast.Expr, b: ast.Expr) -> ast.Expr:
    if is_num(b, 1):
        return a
    return ast.Binary("/", a, b)


def neg(a: ast.Expr) -> ast.Expr:
    positive = _negated(a)
    if positive is not None:
        return positive
    if isinstance(a, ast.IntLit):
        return ast.IntLit(-a.value)
    if isinstance(a, ast.FloatLit):
        return ast.FloatLit(a.text[1:] if a.text.startswith("-") else "-" + a.text)
    return ast.Unary("-", a)


def cond(c: ast.Expr, a: ast.Expr, b: ast.Expr) -> ast.Expr:
    return ast.Ternary(c, a, b)


def binary(op: str, a: ast.Expr, b: ast.Expr) -> ast.Expr:
    return ast.Binary(op, a, b)


def sum_all(terms: list[ast.Expr]) -> ast.Expr:
    out = terms[0]
    for t in terms[1:]:
        out = add(out, t)
    return out


def ref(tensor: str, indices: Iterable[ast.Expr]) -> ast.TensorRef:
    return ast.TensorRef(tensor, tuple(indices))


def idx(n: str) -> ast.Name:
    return ast.Name(n)


# --------------------------------------------------------------------------- sizes
def size_expr(size: Size) -> ast.Expr:
    """A size (an int, or a sympy expression of dimension symbols) as Tile syntax."""
    if isinstance(size, int):
        return ast.IntLit(size)
    return _sympy_to_tile(sympy.sympify(size))


def dim_name(symbol_name: str) -> str:
    """Symbols for dims learned from use (``I.0``) become declarable names (``I_d0``)."""
    return symbol_name.replace(".", "_d")


def _sympy_to_tile(e: sympy.Expr) -> ast.Expr:
    if e.is_Integer:
        return ast.IntLit(int(e))
    if e.is_Symbol:
        return ast.Name(dim_name(e.name))
    if isinstance(e, sympy.floor):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        return ast.Binary("/", _sympy_to_tile(num), _sympy_to_tile(den))
    if isinstance(e, (sympy.Max, sympy.Min)):
        fn = "max" if isinstance(e, sympy.Max) else "min"
        args = [_sympy_to_tile(a) for a in e.args]
        out = args[0]
        for a in args[1:]:
            out = ast.Call(fn, (out, a))
        return out
    if e.is_Add:
        terms = sorted(e.args, key=lambda t: (t.is_number, sympy.default_sort_key(t)))
        out = _sympy_to_tile(terms[0])
        for t in terms[1:]:
            coeff, rest = t.as_coeff_Mul()
            if coeff < 0:
                out = ast.Binary("-", out, _sympy_to_tile(-t))
            else:
                out = ast.Binary("+", out, _sympy_to_tile(t))
        return out
    if e.is_Mul:
        coeff, rest = e.as_coeff_Mul()
        if coeff == -1:
            return neg(_sympy_to_tile(rest))
        if coeff != 1:
            if not coeff.is_Integer:
                raise ValueError(f"non-integer size expression {e}")
            return ast.Binary("*", ast.IntLit(int(coeff)), _sympy_to_tile(rest))
        factors = [_sympy_to_tile(f) for f in e.args]
        out = factors[0]
        for f in factors[1:]:
            out = ast.Binary("*", out, f)
        return out
    raise ValueError(f"cannot write size {e} in Tile")


# --------------------------------------------------------------------------- names
class Namer:
    """Fresh, stable, readable names that never collide with the program's own."""

    def __init__(self, taken: Iterable[str]):
        self.taken = set(taken)

    def fresh(self, base: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_]", "_", base)
        if not base[0].isupper():
            base = "T" + base
        if base not in self.taken:
            self.taken.add(base)
            return base
        k = 1
        while f"{base}_{k}" in self.taken:
            k += 1
        out = f"{base}_{k}"
        self.taken.add(out)
        return out

    def index(self, base: str) -> str:
        """A fresh lower-case index name."""
        base = base.lower()
        k = 0
        while f"{base}{k}" in self.taken:
            k += 1
        self.taken.add(f"{base}{k}")
        return f"{base}{k}"
