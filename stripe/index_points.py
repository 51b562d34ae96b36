"""The valid index points of a Stripe block, and the values an affine takes over them.

A block's points are its box (each index's range of values, from the enclosing box through the
index's affine) cut by its constraints ``c >= 0``. ``IndexPoints`` tightens the box to the points
and bounds an affine over them: exactly, point by point, when there are at most ``enum_limit`` of
them; otherwise by projecting the box and the constraints onto the affine with integer
Fourier–Motzkin (each derived inequality divided by its gcd, its constant floored), whose bounds
are never tighter than the truth, giving up past ``fm_limit`` inequalities. ``stripe.verify``
checks every access's bounds with it (and sets both limits).
"""

from __future__ import annotations

import math

import numpy as np

from stripe.ir import Block
from tile.affine import Affine
from tile.bounds import poly_interval

Box = dict[str, tuple[int, int]]
_T = "\0access"  # the projected variable; no index can have this name


class IndexPoints:
    def __init__(self, block: Block, parent_box: Box | None, enum_limit: int, fm_limit: int):
        self.b = block
        self.fm_limit = fm_limit
        self.points: dict[str, np.ndarray] | None = None  # every valid index point, when few enough
        self.box = self._box(parent_box, enum_limit)  # None when the block never runs

    def _box(self, parent_box: Box | None, enum_limit: int) -> Box | None:
        """Each index's range of values, tightened by the constraints; None if the block never runs."""
        if parent_box is None or any(i.range <= 0 for i in self.b.idxs):
            return None
        box: Box = {}
        for i in self.b.idxs:
            lo, hi = poly_interval(i.affine, parent_box) if i.affine is not None else (0, 0)
            box[i.name] = (int(lo), int(hi) + i.range - 1)
        if not self.b.constraints:
            return box
        self.points = enumerate_points(box, self.b.constraints, enum_limit)
        if self.points is not None:
            if not len(next(iter(self.points.values()))):
                return None  # no point meets the constraints
            return {v: (int(p.min()), int(p.max())) for v, p in self.points.items()}
        try:
            tight = {v: project(self.ineqs(box), Affine.var(v), self.fm_limit) for v in box}
        except Empty:
            return None
        return {v: tight[v] or box[v] for v in box}

    def ineqs(self, box: Box) -> list[Ineq]:
        out = [ineq(c) for c in self.b.constraints]
        for v, (lo, hi) in box.items():
            out += [ineq(Affine.var(v) - lo), ineq(hi - Affine.var(v))]
        return [i for i in out if i is not None]

    def access_range(self, a: Affine) -> tuple[int, int] | None:
        """The access's least and greatest value over the block's points (None: too costly to tell).
        Only for a block that runs (``box`` is not None)."""
        box = self.box
        assert box is not None
        if not self.b.constraints or a.is_constant:
            lo, hi = poly_interval(a, box)
            return int(lo), int(hi)
        if self.points is not None and small(a):
            values = evaluate(a, self.points)
            return int(values.min()), int(values.max())
        try:
            return project(self.ineqs(box), a, self.fm_limit)
        except Empty:  # pragma: no cover - _box() already found the block empty
            return None


# ---------------------------------------------------------------------- enumeration
def enumerate_points(box: Box, constraints: tuple[Affine, ...], limit: int) -> dict[str, np.ndarray] | None:
    """The index points of ``box`` meeting every constraint, as one array per index; None when the
    box has more than ``limit`` points or coefficients too large for int64."""
    sizes = [hi - lo + 1 for lo, hi in box.values()]
    if math.prod(sizes) > limit or not box:
        return None
    if any(abs(x) > 2**20 for lo, hi in box.values() for x in (lo, hi)) or not all(map(small, constraints)):
        return None
    axes = [np.arange(lo, hi + 1, dtype=np.int64) for lo, hi in box.values()]
    grid = {v: g.ravel() for v, g in zip(box, np.meshgrid(*axes, indexing="ij"))}
    keep = np.ones(math.prod(sizes), dtype=bool)
    for k in constraints:
        keep &= evaluate(k, grid) >= 0
    return {v: g[keep] for v, g in grid.items()}


def small(a: Affine) -> bool:
    """Whether ``a`` evaluates in int64 without overflow over points with coordinates below 2**20."""
    return abs(a.const) < 2**40 and all(abs(c) < 2**30 for _, c in a.terms) and len(a.terms) < 256


def evaluate(a: Affine, points: dict[str, np.ndarray]) -> np.ndarray:
    n = len(next(iter(points.values())))
    out = np.full(n, int(a.const), dtype=np.int64)
    for v, c in a.terms:
        out += int(c) * points[v]
    return out


# ---------------------------------------------------------------------- integer Fourier–Motzkin
# An inequality ``sum(a_v * v) + c >= 0`` over integer points, as (sorted integer coefficients, c).
Ineq = tuple[tuple[tuple[str, int], ...], int]


class Empty(Exception):
    """The polyhedron has no integer point."""


def ineq(a: Affine) -> Ineq | None:
    """``a >= 0`` divided by the gcd of its coefficients, the constant floored (sound for integer
    points, and it tightens); None when it always holds; ``Empty`` when it never does."""
    coeffs = {v: int(c) for v, c in a.terms}
    const = int(a.const)
    if not coeffs:
        if const < 0:
            raise Empty
        return None
    g = math.gcd(*coeffs.values())
    return tuple(sorted((v, c // g) for v, c in coeffs.items())), const // g


def project(ineqs: list[Ineq], target: Affine, limit: int) -> tuple[int, int] | None:
    """The least and greatest integer value ``target`` may take (an over-approximation: the real
    shadow with gcd tightening); None when elimination grows past ``limit`` inequalities."""
    work = [*ineqs, ineq(Affine.var(_T) - target), ineq(target - Affine.var(_T))]
    rows: dict[tuple, int] = {}
    for i in work:
        if i is not None and (i[0] not in rows or i[1] < rows[i[0]]):
            rows[i[0]] = i[1]
    while True:
        if len(rows) > limit:
            return None
        others = {v for coeffs in rows for v, _ in coeffs if v != _T}
        if not others:
            break
        var = min(sorted(others), key=lambda v: _cost(rows, v))
        rows = _eliminate(rows, var)
    lo = hi = None
    for coeffs, const in rows.items():
        ((_, a),) = coeffs  # only the target is left, with coefficient +-1 after tightening
        if a > 0:
            lo = -const if lo is None else max(lo, -const)
        else:
            hi = const if hi is None else min(hi, const)
    assert lo is not None and hi is not None, "the index box bounds every access"
    if lo > hi:
        raise Empty
    return lo, hi


def _cost(rows: dict[tuple, int], v: str) -> int:
    p = sum(1 for coeffs in rows if dict(coeffs).get(v, 0) > 0)
    n = sum(1 for coeffs in rows if dict(coeffs).get(v, 0) < 0)
    return p * n - p - n


def _eliminate(rows: dict[tuple, int], var: str) -> dict[tuple, int]:
    pos, neg, out = [], [], {}
    for coeffs, const in rows.items():
        a = dict(coeffs).get(var, 0)
        if a == 0:
            out[coeffs] = const
        else:
            (pos if a > 0 else neg).append((dict(coeffs), const, a))
    for pc, pk, pa in pos:
        for nc, nk, na in neg:
            merged = {v: pc.get(v, 0) * -na + nc.get(v, 0) * pa for v in set(pc) | set(nc) if v != var}
            i = ineq(Affine.build(merged, pk * -na + nk * pa))
            if i is not None and (i[0] not in out or i[1] < out[i[0]]):
                out[i[0]] = i[1]
    return out
