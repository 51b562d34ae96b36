"""The valid index tuples of a contraction, enumerated in blocks, and the single-writer rule of `=`.

A contraction's index space is the box from ``tile.bounds.index_box`` (exact rational projection,
rounded inward). ``blocks`` covers it with grids of at most ``CHUNK`` points and keeps, exactly,
the points where every index expression is an integer (checked on the integer numerator
``L * poly`` for the common denominator ``L``) in range and every constraint holds; conditions the
box already implies are skipped. The interpreter evaluates contractions over these blocks; the
same blocks let ``check_assignments`` apply the rule that `=` writes each output element at most
once (§6.6) from the shapes alone, so a compiled program refuses what the interpreter refuses.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from tile.ast import AggOp
from tile.bounds import Range, empty_error, index_box, ranges
from tile.errors import TileError, TileRuntimeError
from tile.shapes import row_major_strides
from tile.typed import BoundProgram, TContraction

CHUNK = 1 << 20
CHECK_MAX_POINTS = 1 << 26  # check_assignments enumerates at most this many points


@dataclass
class _Cond:
    """One validity condition compiled to integer arithmetic: ``lo <= (coeffs·x + const) / den <= hi``."""

    coeffs: list[tuple[int, int]]  # (variable position, integer numerator coefficient)
    const: int
    den: int
    lo: int
    hi: int
    needed: bool  # False when the box already implies it

    def value(self, vals: list[np.ndarray]) -> np.ndarray:
        """``coeffs·x + const`` over a block, broadcast over the axes of the indices it uses."""
        out = np.asarray(self.const, dtype=np.int64)
        for pos, c in self.coeffs:
            out = out + (vals[pos] if c == 1 else c * vals[pos])
        return out


def _compile(r: Range, order: dict[str, int], box: list[tuple[int, int]]) -> _Cond:
    den = r.poly.denominator
    coeffs = [(order[v], int(c * den)) for v, c in r.poly.terms]
    const = int(r.poly.const * den)
    # The box implies the condition when the polynomial is integral over it (den == 1) and the
    # interval lies inside [lo, hi].
    lo_v = hi_v = Fraction(const, den)
    for pos, c in coeffs:
        a, b = box[pos]
        lo_v += Fraction(min(c * a, c * b), den)
        hi_v += Fraction(max(c * a, c * b), den)
    needed = den != 1 or lo_v < r.lo or hi_v > r.hi
    return _Cond(coeffs, const, den, int(r.lo), int(r.hi), needed)


@dataclass
class Space:
    """The index box of one contraction and its validity conditions (``ranges`` order: the access
    dimensions, output first, then the constraints)."""

    c: TContraction
    names: list[str]
    box: list[tuple[int, int]]
    extents: list[int]
    conds: list[_Cond]
    sources: list[Range]

    @property
    def points(self) -> int:
        return int(np.prod(self.extents, dtype=object))  # 1 for a contraction without indices

    def any_valid(self, limit: int = CHECK_MAX_POINTS) -> bool | None:
        """Whether some point of the box is a valid tuple, looking grid by grid and stopping at
        the first one found; None when ``limit`` points were looked at without finding one (the
        box is larger: not known)."""
        seen = 0
        for vals, grid in grids(self.box, self.extents):
            ok = np.ones(grid, dtype=bool)
            for cond in self.conds:
                if cond.needed:
                    v = cond.value(vals)
                    ok &= (v % cond.den == 0) & (v // cond.den >= cond.lo) & (v // cond.den <= cond.hi)
            if ok.any():
                return True
            seen += int(np.prod(grid, dtype=np.int64))
            if seen >= limit:
                return None
        return False

    def fail_empty(self) -> None:
        """Raise the located error naming the first condition that rules out every point."""
        alive = np.zeros(len(self.conds), dtype=np.int64)
        for vals, grid in grids(self.box, self.extents):
            ok = np.ones(grid, dtype=bool)
            for k, cond in enumerate(self.conds):
                v = cond.value(vals)
                ok &= (v % cond.den == 0) & (v // cond.den >= cond.lo) & (v // cond.den <= cond.hi)
                alive[k] += int(ok.sum())
        raise empty_error(self.c, self.sources[int(np.flatnonzero(alive == 0)[0])])


def space(c: TContraction, box: dict[str, tuple[int, int]] | None = None) -> Space:
    """``c``'s index space; ``box`` may give bounds already known to hold every valid tuple."""
    names = list(c.index_names)
    box_map = box if box is not None else index_box(c)
    boxes = [box_map[v] for v in names]
    order = {v: k for k, v in enumerate(names)}
    sources = ranges(c)
    conds = [_compile(r, order, boxes) for r in sources]
    return Space(c, names, boxes, [hi - lo + 1 for lo, hi in boxes], conds, sources)


@dataclass
class Block:
    """The valid tuples of one grid of the box: ``flats[k]`` is the row-major element offset each
    reads or writes in access ``k`` (output first), in the order of ``sel``."""

    vals: list[np.ndarray]
    grid: tuple[int, ...]
    sel: np.ndarray  # positions of the valid points in the flattened grid
    flats: list[np.ndarray]

    def linear(self, sp: Space) -> np.ndarray:
        """Each valid tuple's position in the row-major order of the whole box."""
        strides = row_major_strides(tuple(sp.extents))
        return sum(
            (
                (np.broadcast_to(v, self.grid).reshape(-1)[self.sel] - lo) * st
                for v, (lo, _), st in zip(self.vals, sp.box, strides)
            ),
            np.zeros(len(self.sel), np.int64),
        )


def blocks(sp: Space, accesses: int | None = None) -> Iterator[Block]:
    """The blocks holding at least one valid tuple, with the offsets of the first ``accesses``
    accesses (all by default)."""
    c = sp.c
    accs = [c.output, *c.operands][:accesses]
    strides = [row_major_strides(a.type.shape) for a in accs]
    for vals, grid in grids(sp.box, sp.extents):
        ok = np.ones(grid, dtype=bool)
        idx_values = []
        for cond in sp.conds:
            v = cond.value(vals)
            if cond.den != 1:
                ok &= v % cond.den == 0
                v = v // cond.den
            if cond.needed:
                ok &= (v >= cond.lo) & (v <= cond.hi)
            idx_values.append(v)
        sel = np.flatnonzero(ok)
        if not len(sel):
            continue
        flats, pos = [], 0
        for a, st in zip(accs, strides):
            f = sum((idx_values[pos + k] * st[k] for k in range(len(a.polys))), np.zeros((), np.int64))
            flats.append(np.broadcast_to(f, grid).reshape(-1)[sel])
            pos += len(a.polys)
        yield Block(vals, grid, sel, flats)


def grids(box: list[tuple[int, int]], extents: list[int], chunk: int | None = None):
    """Cover the box with grids of at most ``chunk`` points (default ``CHUNK``), in row-major order.

    Yields ``(vals, grid)``: one array per index, broadcastable to the ``grid`` shape (scalars
    for the outer indices iterated in Python, an ``arange`` along its own axis for the others).
    """
    chunk = CHUNK if chunk is None else chunk
    n = len(extents)
    k, inner = n, 1
    while k > 0 and inner * extents[k - 1] <= chunk:
        k -= 1
        inner *= extents[k]
    if k == 0:
        yield _grid_vals(box, 0, [], None), tuple(extents)
        return
    split = k - 1  # the index whose range is cut into steps; those before it are iterated
    step = max(1, chunk // inner)
    outer_ranges = [range(lo, hi + 1) for lo, hi in box[:split]]
    for outer in itertools.product(*outer_ranges):
        lo, hi = box[split]
        for s in range(lo, hi + 1, step):
            part = (s, min(hi, s + step - 1))
            yield (
                _grid_vals(box, split, list(outer), part),
                (part[1] - part[0] + 1, *extents[split + 1 :]),
            )


def _grid_vals(box, split, outer, part) -> list[np.ndarray]:
    vals: list[np.ndarray] = [np.asarray(v, dtype=np.int64) for v in outer]
    axes = box[split:] if part is None else [part, *box[split + 1 :]]
    for axis, (lo, hi) in enumerate(axes):
        shape = [1] * len(axes)
        shape[axis] = hi - lo + 1
        vals.append(np.arange(lo, hi + 1, dtype=np.int64).reshape(shape))
    return vals


class SingleWriter:
    """The rule that `=` writes each output element at most once: ``add`` each block's output
    offsets and box positions; the first element written twice raises, naming both tuples."""

    def __init__(self, sp: Space, size: int, shape: tuple[int, ...]):
        self.sp, self.shape = sp, shape
        self.writer = np.full(size, -1, dtype=np.int64)

    def add(self, out_flat: np.ndarray, lin: np.ndarray) -> None:
        order = np.argsort(out_flat, kind="stable")
        sorted_flat = out_flat[order]
        dup = np.flatnonzero(sorted_flat[1:] == sorted_flat[:-1])
        clash = np.flatnonzero(self.writer[out_flat] >= 0)
        if len(dup):
            k = dup[0]
            pos, first, second = sorted_flat[k], lin[order[k]], lin[order[k + 1]]
        elif len(clash):
            k = clash[0]
            pos, first, second = out_flat[k], self.writer[out_flat[k]], lin[k]
        else:
            self.writer[out_flat] = lin
            return
        c, where = self.sp.c, np.unravel_index(int(pos), self.shape)
        raise TileRuntimeError(
            f"`=` writes {c.name}[{', '.join(str(int(w)) for w in where)}] more than once: from "
            f"({self._tuple(int(first))}) and ({self._tuple(int(second))})",
            c.span,
            hint="`=` needs each output element written by one index tuple; use +, >, < or * to "
            "combine several values, or add a constraint",
        )

    def _tuple(self, lin: int) -> str:
        values = []
        for k in range(len(self.sp.box) - 1, -1, -1):
            values.append(lin % self.sp.extents[k] + self.sp.box[k][0])
            lin //= self.sp.extents[k]
        return ", ".join(f"{v}={x}" for v, x in zip(self.sp.names, values[::-1]))


def check_assignments(bound: BoundProgram, max_points: int = CHECK_MAX_POINTS) -> None:
    """Raise the interpreter's error for every `=` contraction of ``bound`` (concrete shapes) that
    writes an element twice. Cheap when each output element has one index tuple by construction
    (transposes, copies, broadcasts: after reduce and defract nothing is summed over); otherwise
    the valid tuples are enumerated, unless there are more than ``max_points``."""
    from tile.transforms import transform

    for c in bound.stmts:
        if not isinstance(c, TContraction) or c.agg is not AggOp.ASSIGN:
            continue
        try:
            flat = transform(c, "flat")
        except TileError:
            continue  # (no valid tuple, say): compiling raises that error itself
        if all(s for s in flat.output.strides):
            continue
        size = int(np.prod(c.type.shape, dtype=np.int64))
        sp = space(c)
        if size == 0 or sp.points > max_points:
            continue
        rule = SingleWriter(sp, size, c.type.shape)
        for b in blocks(sp, accesses=1):
            rule.add(b.flats[0], b.linear(sp))
