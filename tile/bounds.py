"""Exact index bounds of a contraction: one implementation for the interpreter and the transforms.

A contraction's valid index tuples are the integer points of a polyhedron: every tensor index
expression in ``[0, dim)`` and every constraint ``0 <= poly < bound``. ``ranges`` lists those
conditions; ``index_box`` projects the polyhedron onto each index by Fourier–Motzkin elimination in
exact rational arithmetic and rounds inward, giving the smallest box that holds every valid tuple
(the interpreter still filters each point exactly). Unbounded and empty index spaces are located
``TileIndexError``s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from tile.affine import Affine
from tile.errors import Span, TileIndexError
from tile.typed import TAccess, TContraction


@dataclass(frozen=True, slots=True)
class Range:
    """``lo <= poly <= hi``; ``origin`` says where it comes from, for messages."""

    poly: Affine
    lo: Fraction
    hi: Fraction
    origin: str
    span: Span


def ranges(c: TContraction) -> list[Range]:
    """Every validity condition of ``c``: tensor accesses (output first), then constraints."""
    out: list[Range] = []
    for acc in (c.output, *c.operands):
        out.extend(access_ranges(acc))
    for k in c.constraints:
        out.append(Range(k.poly, Fraction(0), Fraction(k.bound) - 1, f"the constraint `{k.poly} < {k.bound}`",
                         k.span))
    return out


def access_ranges(acc: TAccess) -> list[Range]:
    shape = acc.type.shape
    assert shape is not None
    spans = acc.poly_spans or (acc.span,) * len(acc.polys)
    return [Range(p, Fraction(0), Fraction(d) - 1,
                  f"dimension {k} of '{acc.tensor}' (size {d})", spans[k])
            for k, (p, d) in enumerate(zip(acc.polys, shape))]


# An inequality sum(a_v * v) + c >= 0, as (coefficients, constant).
_Ineq = tuple[tuple[tuple[str, Fraction], ...], Fraction]


def _ineqs(r: Range) -> list[_Ineq]:
    return [_normal(dict(r.poly.terms), r.poly.const - r.lo),
            _normal({k: -v for k, v in r.poly.terms}, r.hi - r.poly.const)]


def _normal(coeffs: dict[str, Fraction], const: Fraction) -> _Ineq:
    """Scale so the largest |coefficient| is 1: equal directions then compare equal."""
    coeffs = {k: v for k, v in coeffs.items() if v != 0}
    if not coeffs:
        return (), const
    scale = max(abs(v) for v in coeffs.values())
    return tuple(sorted((k, v / scale) for k, v in coeffs.items())), const / scale


class _Infeasible(Exception):
    pass


def _dedupe(ineqs: list[_Ineq]) -> list[_Ineq]:
    best: dict[tuple, Fraction] = {}
    for coeffs, const in ineqs:
        if not coeffs:
            if const < 0:
                raise _Infeasible
            continue
        if coeffs not in best or const < best[coeffs]:
            best[coeffs] = const
    return list(best.items())


def _eliminate(ineqs: list[_Ineq], var: str) -> list[_Ineq]:
    pos, neg, rest = [], [], []
    for coeffs, const in ineqs:
        a = dict(coeffs).get(var, Fraction(0))
        (pos if a > 0 else neg if a < 0 else rest).append((dict(coeffs), const, a))
    out = [(tuple(sorted(c.items())), k) for c, k, _ in rest]
    for pc, pk, pa in pos:
        for nc, nk, na in neg:
            merged = {v: pc.get(v, Fraction(0)) * -na + nc.get(v, Fraction(0)) * pa
                      for v in set(pc) | set(nc) if v != var}
            out.append(_normal(merged, pk * -na + nk * pa))
    return _dedupe(out)


def _project(ineqs: list[_Ineq], keep: str) -> tuple[Fraction | None, Fraction | None]:
    """Rational bounds of ``keep`` over the polyhedron; raises ``_Infeasible`` when it is empty."""
    ineqs = _dedupe(ineqs)
    while True:
        others = {v for coeffs, _ in ineqs for v, _ in coeffs if v != keep}
        if not others:
            break

        def cost(v: str) -> int:
            p = sum(1 for c, _ in ineqs if dict(c).get(v, 0) > 0)
            n = sum(1 for c, _ in ineqs if dict(c).get(v, 0) < 0)
            return p * n - p - n

        ineqs = _eliminate(ineqs, min(sorted(others), key=cost))
    lo: Fraction | None = None
    hi: Fraction | None = None
    for coeffs, const in ineqs:
        (v, a), = coeffs
        bound = -const / a
        if a > 0:
            lo = bound if lo is None else max(lo, bound)
        else:
            hi = bound if hi is None else min(hi, bound)
    if lo is not None and hi is not None and lo > hi:
        raise _Infeasible
    return lo, hi


def _components(conds: list[Range], variables: list[str]) -> list[tuple[list[str], list[_Ineq]]]:
    """Split into groups of variables that share no condition (each projects on its own)."""
    parent = {v: v for v in variables}

    def find(v: str) -> str:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for r in conds:
        vs = r.poly.vars
        for v in vs[1:]:
            parent[find(v)] = find(vs[0])
    groups: dict[str, tuple[list[str], list[_Ineq]]] = {}
    for v in variables:
        groups.setdefault(find(v), ([], []))[0].append(v)
    for r in conds:
        if r.poly.vars:
            groups[find(r.poly.vars[0])][1].extend(_ineqs(r))
        elif not r.lo <= r.poly.const <= r.hi:
            raise _Infeasible
    return list(groups.values())


def feasible(conds: list[Range], variables: list[str]) -> bool:
    """Whether the rational polyhedron is non-empty."""
    try:
        for vs, ineqs in _components(conds, variables):
            _project(ineqs, vs[0])
    except _Infeasible:
        return False
    return True


def rational_bounds(conds: list[Range], variables: list[str]) -> dict[str, tuple[Fraction | None, Fraction | None]]:
    """Exact rational bounds per variable; raises ``_Infeasible`` for an empty polyhedron."""
    out = {}
    for vs, ineqs in _components(conds, variables):
        for v in vs:
            out[v] = _project(ineqs, v)
    return out


def first_emptying(conds: list[Range], variables: list[str]) -> Range:
    """The first condition (in order) after which the rational polyhedron is empty."""
    for k in range(1, len(conds) + 1):
        if not feasible(conds[:k], variables):
            return conds[k - 1]
    raise AssertionError("the polyhedron is feasible")


def empty_error(c: TContraction, culprit: Range) -> TileIndexError:
    return TileIndexError(
        f"no index tuple of '{c.name}' is valid: {culprit.origin} rules out every tuple the "
        "conditions before it allow", culprit.span,
        hint="every tensor index must be in range and every constraint satisfied for at least one tuple; "
        "check the sizes and constraint bounds")


def index_box(c: TContraction) -> dict[str, tuple[int, int]]:
    """The integer box ``{index: (lo, hi)}`` (inclusive) holding every valid index tuple of ``c``.

    Raises ``TileIndexError`` naming an unbounded index, or the condition that empties the
    index space when no rational (hence no integer) tuple is valid.
    """
    conds = ranges(c)
    variables = list(c.index_names)
    try:
        bounds = rational_bounds(conds, variables)
    except _Infeasible:
        raise empty_error(c, first_emptying(conds, variables)) from None
    box: dict[str, tuple[int, int]] = {}
    for v in variables:
        lo, hi = bounds[v]
        if lo is None or hi is None:
            raise TileIndexError(
                f"index '{v}' of '{c.name}' is unbounded", _first_use(c, v),
                hint=f"'{v}' must be limited by a tensor dimension or a constraint on its own; "
                "a difference like `j - k` bounds neither j nor k: add a constraint such as "
                f"`{v} < N`")
        box[v] = (math.ceil(lo), math.floor(hi))
        if box[v][0] > box[v][1]:
            raise TileIndexError(
                f"no index tuple of '{c.name}' is valid: index '{v}' must lie in [{lo}, {hi}], "
                "which holds no integer", _first_use(c, v),
                hint="check the fractional coefficients and constant offsets of the index expressions")
    return box


def _first_use(c: TContraction, v: str) -> Span:
    for acc in (c.output, *c.operands):
        for k, p in enumerate(acc.polys):
            if v in p.vars:
                return acc.poly_spans[k] if acc.poly_spans else acc.span
    return c.span
