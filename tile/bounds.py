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
from tile.linalg import rank
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
        out.append(
            Range(
                k.poly, Fraction(0), Fraction(k.bound) - 1, f"the constraint `{k.poly} < {k.bound}`", k.span
            )
        )
    return out


def access_ranges(acc: TAccess) -> list[Range]:
    shape = acc.type.shape
    assert shape is not None
    spans = acc.poly_spans or (acc.span,) * len(acc.polys)
    return [
        Range(p, Fraction(0), Fraction(d) - 1, f"dimension {k} of '{acc.tensor}' (size {d})", spans[k])
        for k, (p, d) in enumerate(zip(acc.polys, shape))
    ]


# An inequality sum(a_v * v) + c >= 0, as (coefficients, constant).
_Ineq = tuple[tuple[tuple[str, Fraction], ...], Fraction]


def _ineqs(r: Range) -> list[_Ineq]:
    return [
        _normal(dict(r.poly.terms), r.poly.const - r.lo),
        _normal({k: -v for k, v in r.poly.terms}, r.hi - r.poly.const),
    ]


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
            merged = {
                v: pc.get(v, Fraction(0)) * -na + nc.get(v, Fraction(0)) * pa
                for v in set(pc) | set(nc)
                if v != var
            }
            out.append(_normal(merged, pk * -na + nk * pa))
    return _dedupe(out)


def _fm_cost(ineqs: list[_Ineq], v: str) -> int:
    """How many inequalities eliminating ``v`` adds (pairs of opposite signs minus those removed)."""
    p = sum(1 for c, _ in ineqs if dict(c).get(v, 0) > 0)
    n = sum(1 for c, _ in ineqs if dict(c).get(v, 0) < 0)
    return p * n - p - n


class _TooBig(Exception):
    pass


FM_LIMIT = 2000  # inequalities; past it Fourier–Motzkin gives way to interval propagation


def _project(
    ineqs: list[_Ineq], keep: str, limit: int | None = FM_LIMIT
) -> tuple[Fraction | None, Fraction | None]:
    """Rational bounds of ``keep`` over the polyhedron; raises ``_Infeasible`` when it is empty,
    ``_TooBig`` when elimination grows past ``limit`` inequalities."""
    ineqs = _dedupe(ineqs)
    while True:
        if limit is not None and len(ineqs) > limit:
            raise _TooBig
        others = {v for coeffs, _ in ineqs for v, _ in coeffs if v != keep}
        if not others:
            break

        var = min(sorted(others), key=lambda v, cur=ineqs: _fm_cost(cur, v))
        if limit is not None and len(ineqs) + _fm_cost(ineqs, var) > limit:
            raise _TooBig  # decided before the (possibly huge) elimination, not after
        ineqs = _eliminate(ineqs, var)
    lo: Fraction | None = None
    hi: Fraction | None = None
    for coeffs, const in ineqs:
        ((v, a),) = coeffs
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
    """Whether the rational polyhedron is non-empty (True when that is too costly to decide)."""
    try:
        for vs, ineqs in _components(conds, variables):
            _project(ineqs, vs[0])
    except _Infeasible:
        return False
    except _TooBig:
        return True
    return True


def rational_bounds(
    conds: list[Range], variables: list[str]
) -> dict[str, tuple[Fraction | None, Fraction | None]]:
    """Exact rational bounds per variable; raises ``_Infeasible`` for an empty polyhedron."""
    out = {}
    for vs, ineqs in _components(conds, variables):
        try:
            for v in vs:
                out[v] = _project(ineqs, v)
        except _TooBig:
            found = _propagate(ineqs, vs)
            for v in vs:
                out[v] = found[v] if None not in found[v] else _project(ineqs, v, None)
    return out


def _propagate(ineqs: list[_Ineq], vs: list[str], rounds: int = 50) -> dict:
    """Interval bounds by repeated tightening (sound, maybe looser than the exact projection)."""
    box: dict[str, list] = {v: [None, None] for v in vs}
    for _ in range(rounds):
        changed = False
        for coeffs, const in ineqs:
            for v, a in coeffs:
                rest = Fraction(0)  # the largest value of sum(other terms) over the box
                for u, b in coeffs:
                    if u == v:
                        continue
                    end = box[u][1] if b > 0 else box[u][0]
                    if end is None:
                        rest = None
                        break
                    rest += b * end
                if rest is None:
                    continue
                bound = (-const - rest) / a  # a*v >= -const - rest
                k = 0 if a > 0 else 1
                cur = box[v][k]
                if cur is None or (bound > cur if k == 0 else bound < cur):
                    box[v][k] = bound
                    changed = True
        if not changed:
            break
    for lo, hi in box.values():
        if lo is not None and hi is not None and lo > hi:
            raise _Infeasible
    return {v: tuple(b) for v, b in box.items()}


def first_emptying(conds: list[Range], variables: list[str]) -> Range:
    """The first condition (in order) after which the rational polyhedron is empty."""
    for k in range(1, len(conds) + 1):
        if not feasible(conds[:k], variables):
            return conds[k - 1]
    return conds[-1]  # only a too-costly prefix test can get here: name the last condition


def empty_error(c: TContraction, culprit: Range) -> TileIndexError:
    return TileIndexError(
        f"no index tuple of '{c.name}' is valid: {culprit.origin} rules out every tuple the "
        "conditions before it allow",
        culprit.span,
        hint="every tensor index must be in range and every constraint satisfied for at least one tuple; "
        "check the sizes and constraint bounds",
    )


def check_bounded(c: TContraction) -> None:
    """Raise if some index is unbounded, whatever the sizes: every condition is two-sided, so an
    index is bounded exactly when its unit vector lies in the span of the conditions' polynomials."""
    names = list(c.index_names)
    polys = [p for acc in (c.output, *c.operands) for p in acc.polys] + [k.poly for k in c.constraints]
    rows = [[p.coeff(v) for v in names] for p in polys] if names else []
    base = rank(rows) if rows else 0
    for k, v in enumerate(names):
        unit = [Fraction(int(j == k)) for j in range(len(names))]
        if rank([*rows, unit]) != base:
            raise _unbounded(c, v)


def _unbounded(c: TContraction, v: str) -> TileIndexError:
    return TileIndexError(
        f"index '{v}' of '{c.name}' is unbounded",
        _first_use(c, v),
        hint=f"'{v}' must be limited by a tensor dimension or a constraint on its own; "
        "a difference like `j - k` bounds neither j nor k: add a constraint such as "
        f"`{v} < N`",
    )


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
            raise _unbounded(c, v)
        box[v] = (math.ceil(lo), math.floor(hi))
        if box[v][0] > box[v][1]:
            raise TileIndexError(
                f"no index tuple of '{c.name}' is valid: index '{v}' must lie in [{lo}, {hi}], "
                "which holds no integer",
                _first_use(c, v),
                hint="check the fractional coefficients and constant offsets of the index expressions",
            )
    return box


def plain_box(c: TContraction) -> dict[str, tuple[int, int]] | None:
    """``index_box(c)`` where every condition is one index plus an integer (``0 <= i + k <= D - 1``,
    a constraint ``i + k < N``): the box is then the intersection of the conditions and implies
    each of them, so no projection is needed; None for any other space, or one this finds empty or
    unbounded (``index_box`` then says why). Most contractions (every matmul, every reduction over
    whole dimensions) are such, and lowering a program at a new shape asks for each of them."""
    box: dict[str, list[int]] = {}
    conds = [(p, int(d)) for acc in (c.output, *c.operands) for p, d in zip(acc.polys, acc.type.shape)]
    conds += [(k.poly, int(k.bound)) for k in c.constraints]
    for poly, size in conds:
        terms = poly.terms
        if len(terms) != 1 or terms[0][1] != 1 or poly.const.denominator != 1:
            return None
        v, k = terms[0][0], int(poly.const)
        got = box.get(v)
        if got is None:
            box[v] = [-k, size - 1 - k]
        else:
            got[0], got[1] = max(got[0], -k), min(got[1], size - 1 - k)
    if any(v not in box or box[v][0] > box[v][1] for v in c.index_names):
        return None
    return {v: (box[v][0], box[v][1]) for v in c.index_names}


def _first_use(c: TContraction, v: str) -> Span:
    for acc in (c.output, *c.operands):
        for k, p in enumerate(acc.polys):
            if v in p.vars:
                return acc.poly_spans[k] if acc.poly_spans else acc.span
    return c.span


# ----------------------------------------------------------------- constraint clean-up
def _direction(poly: Affine) -> tuple[tuple[tuple[str, Fraction], ...], Fraction]:
    """``(primitive integer direction, scale)`` with ``poly - const == scale * direction``."""
    den = 1
    for _, v in poly.terms:
        den = den * v.denominator // math.gcd(den, v.denominator)
    ints = [int(v * den) for _, v in poly.terms]
    g = 0
    for x in ints:
        g = math.gcd(g, x)
    sign = -1 if ints and ints[0] < 0 else 1
    scale = Fraction(g * sign, den) if ints else Fraction(1)
    return tuple((k, v / scale) for k, v in poly.terms), scale


def merge_parallel(conds: list[Range]) -> list[Range]:
    """Intersect conditions whose polynomials are multiples of one another (plus constants).

    ``0 <= 2*i + 1 <= 9`` and ``0 <= i <= 6`` become one range on ``2*i + 1``: ``0 <= 2*i + 1 <= 9``
    (``i <= 6`` allows 13, so it adds nothing); bounds are rounded inward, since every condition's
    polynomial must be an integer at a valid tuple. The
    merged range keeps the first condition's polynomial form, origin and span; constant
    conditions are kept as they are.
    """
    groups: dict[tuple, list[tuple[Range, Fraction]]] = {}
    order: list[tuple] = []
    out_const: list[Range] = []
    for r in conds:
        if r.poly.is_constant:
            out_const.append(r)
            continue
        direction, scale = _direction(r.poly)
        if direction not in groups:
            groups[direction] = []
            order.append(direction)
        groups[direction].append((r, scale))
    merged: list[Range] = []
    for direction in order:
        members = groups[direction]
        first, s0 = members[0]
        # In terms of t = direction·x: lo <= s*t + c <= hi  =>  t in [(lo-c)/s, (hi-c)/s] (swapped if s < 0)
        lo_t, hi_t = None, None
        for r, s in members:
            a, b = (r.lo - r.poly.const) / s, (r.hi - r.poly.const) / s
            a, b = min(a, b), max(a, b)
            lo_t = a if lo_t is None else max(lo_t, a)
            hi_t = b if hi_t is None else min(hi_t, b)
        lo, hi = sorted((lo_t * s0 + first.poly.const, hi_t * s0 + first.poly.const))
        # Every condition's polynomial must be an integer at a valid tuple: round inward.
        lo, hi = Fraction(math.ceil(lo)), Fraction(math.floor(hi))
        origin = (
            first.origin if len(members) == 1 else f"{first.origin} (merged with {len(members) - 1} more)"
        )
        merged.append(Range(first.poly, lo, hi, origin, first.span))
    return out_const + merged


def poly_interval(poly: Affine, box: dict[str, tuple[int, int]]) -> tuple[Fraction, Fraction]:
    """The exact range of ``poly`` over the box."""
    lo = hi = poly.const
    for v, c in poly.terms:
        a, b = box[v]
        lo += min(c * a, c * b)
        hi += max(c * a, c * b)
    return lo, hi


def remove_implied(conds: list[Range], box: dict[str, tuple[int, int]]) -> list[Range]:
    """Drop the conditions the box already guarantees (worst case over the box), keeping
    any whose polynomial has fractional coefficients (they also demand integrality)."""
    out = []
    for r in conds:
        lo, hi = poly_interval(r.poly, box)
        if r.poly.is_integral and r.lo <= lo and hi <= r.hi:
            continue
        out.append(r)
    return out
