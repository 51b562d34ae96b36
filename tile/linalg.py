"""Exact rational linear algebra on small matrices (lists of Fraction rows)."""

from __future__ import annotations

from fractions import Fraction

Matrix = list[list[Fraction]]


def independent(basis: Matrix, vec: list[Fraction]) -> bool:
    """Whether ``vec`` is outside the span of the rows of ``basis``."""
    rows = [list(r) for r in basis] + [list(vec)]
    return rank(rows) == len(rows)


def rank(rows: Matrix) -> int:
    m = [list(r) for r in rows]
    r = 0
    ncols = len(m[0]) if m else 0
    for c in range(ncols):
        piv = next((i for i in range(r, len(m)) if m[i][c] != 0), None)
        if piv is None:
            continue
        m[r], m[piv] = m[piv], m[r]
        for i in range(len(m)):
            if i != r and m[i][c] != 0:
                f = m[i][c] / m[r][c]
                m[i] = [a - f * b for a, b in zip(m[i], m[r])]
        r += 1
    return r


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
