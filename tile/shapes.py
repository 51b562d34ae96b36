"""Size arithmetic and NumPy-style broadcasting, for concrete ints and symbolic (sympy) sizes.

Concrete sizes are Python ints; a symbolic check (``python -m tile check`` without ``--shape``)
uses one positive integer sympy symbol per input dimension. Integer ``/`` truncates toward zero.
"""

from __future__ import annotations

import sympy

from tile.errors import Span, TileShapeError
from tile.typed import Size


def is_concrete(x: Size) -> bool:
    return isinstance(x, int)


def trunc_div(a: int, b: int) -> int:
    """C-style integer division (toward zero); division by zero gives 0, as Tile defines it."""
    if b == 0:
        return 0
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def size_binop(op: str, a: Size, b: Size) -> Size:
    if is_concrete(a) and is_concrete(b):
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "/":
            return trunc_div(a, b)
        if op == "max":
            return max(a, b)
        if op == "min":
            return min(a, b)
        raise AssertionError(op)
    a, b = sympy.sympify(a), sympy.sympify(b)
    if op == "+":
        return sympy.expand(a + b)
    if op == "-":
        return sympy.expand(a - b)
    if op == "*":
        return sympy.expand(a * b)
    if op == "/":
        return sympy.floor(a / b)  # sizes are non-negative, where floor and truncation agree
    if op == "max":
        return sympy.Max(a, b)
    if op == "min":
        return sympy.Min(a, b)
    raise AssertionError(op)


def same_size(a: Size, b: Size) -> bool:
    if a == b or (is_concrete(a) and is_concrete(b)):  # identical: no simplify (seconds on long programs)
        return a == b
    diff = sympy.sympify(a) - sympy.sympify(b)
    if diff.is_polynomial():  # zero exactly when its expansion is: far cheaper than simplify
        return sympy.expand(diff) == 0
    return sympy.simplify(diff) == 0


def may_equal(a: Size, b: Size, notes: list[str] | None, what: str) -> bool:
    """False only when ``a`` and ``b`` certainly differ; symbolic sizes that may differ are
    assumed equal, and the assumption goes into ``notes``."""
    if same_size(a, b):
        return True
    if is_concrete(a) and is_concrete(b):
        return False
    if notes is not None:
        notes.append(f"assumed {a} == {b} ({what})")
    return True


def broadcast(
    shapes: list[tuple[Size, ...] | None], names: list[str], span: Span, notes: list[str] | None = None
) -> tuple[Size, ...] | None:
    """Right-aligned broadcasting; ``None`` (unknown rank) is contagious.

    Two different concrete sizes (neither 1) are an error; two symbolic sizes that may differ are
    assumed equal, and the assumption is appended to ``notes``.
    """
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out: list[Size] = []
    for k in range(rank):
        chosen: Size = 1
        chosen_from = -1
        for j, s in enumerate(shapes):
            pos = k - (rank - len(s))
            if pos < 0:
                continue
            d = s[pos]
            if is_concrete(d) and d == 1:
                continue
            if chosen_from < 0 or (is_concrete(chosen) and chosen == 1):
                chosen, chosen_from = d, j
            elif not same_size(chosen, d):
                if is_concrete(chosen) and is_concrete(d):
                    desc = " and ".join(
                        f"{n}[{', '.join(str(x) for x in sh)}]" for n, sh in zip(names, shapes)
                    )
                    raise TileShapeError(
                        f"shapes do not broadcast: {desc} differ in dimension {k - rank}",
                        span,
                        hint="sizes must be equal or 1 (aligned from the right); reshape or index "
                        "one of them in a contraction",
                    )
                if notes is not None:
                    notes.append(f"assumed {chosen} == {d} (broadcast at line {span.line})")
        out.append(chosen)
    return tuple(out)


def numel(shape: tuple[Size, ...]) -> Size:
    n: Size = 1
    for d in shape:
        n = size_binop("*", n, d)
    return n


def fmt_shape(shape: tuple[Size, ...] | None) -> str:
    """``(2, 3)``, ``(4,)``, ``()``; ``(any rank)`` for an unknown rank."""
    if shape is None:
        return "(any rank)"
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def row_major_strides(shape: tuple[int, ...]) -> list[int]:
    """Element strides of a dense row-major array of ``shape``."""
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return out[::-1]
