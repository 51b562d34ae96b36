"""Exact rational linear algebra on small matrices (lists of Fraction rows)."""

from __future__ import annotations

import math
from fractions import Fraction

Matrix = list[list[Fraction]]


def independent(basis: Matrix, vec: list[Fraction]) -> bool:
    """Whether ``vec`` is outside the span of the rows of ``basis``."""
    rows = [list(r) for r in basis] + [list(vec)]
    return rank(rows) == len(rows)


def rank(rows: Matrix) -> int:
    """The rank of ``rows`` (rationals or ints), by fraction-free elimination on integers: each row
    scaled to integers, then ``row_i := p * row_i - f * row_r`` under a pivot ``p`` (row operations
    that keep the rank), each new row divided by the gcd of its entries. Exact as ``Fraction``
    elimination is, without a ``Fraction`` per step (binding and lowering ask for thousands of
    ranks in a long program)."""
    m = [_integral(r) for r in rows]
    r = 0
    ncols = len(m[0]) if m else 0
    for c in range(ncols):
        piv = next((i for i in range(r, len(m)) if m[i][c] != 0), None)
        if piv is None:
            continue
        m[r], m[piv] = m[piv], m[r]
        p, top = m[r][c], m[r]
        for i in range(r + 1, len(m)):
            f = m[i][c]
            if f:
                row = [a * p - f * b for a, b in zip(m[i], top)]
                g = math.gcd(*row)
                m[i] = [a // g for a in row] if g > 1 else row
        r += 1
    return r


def _integral(row) -> list[int]:
    """``row`` times the least common multiple of its denominators: integers, the same span."""
    d = math.lcm(*(x.denominator for x in row)) if row else 1
    return [x.numerator * (d // x.denominator) for x in row]


def inverse(a: Matrix) -> Matrix:
    """The inverse of a square non-singular matrix (Gauss–Jordan in exact arithmetic)."""
    n = len(a)
    m = [list(map(Fraction, row)) + [Fraction(int(i == j)) for j in range(n)] for i, row in enumerate(a)]
    for c in range(n):
        piv = next(i for i in range(c, n) if m[i][c] != 0)
        m[c], m[piv] = m[piv], m[c]
        p = m[c][c]
        m[c] = [x / p for x in m[c]]
        for i in range(n):
            if i != c and m[i][c] != 0:
                f = m[i][c]
                m[i] = [x - f * y for x, y in zip(m[i], m[c])]
    return [row[n:] for row in m]
