"""Exact evaluation of one contraction by chunked enumeration of its index box.

The box comes from ``tile.bounds.index_box`` (exact rational projection, rounded inward). Each
chunk of box points is filtered exactly: every index expression must be an integer (checked on the
integer numerator ``L * poly`` for the common denominator ``L``) in range, and every constraint
must hold; conditions the box already implies are skipped. Survivors gather their operands,
combine them, and aggregate with ``ufunc.at`` into the output. Elements nothing writes keep 0 or
the ``default`` tensor's value. Memory is bounded by the chunk size whatever the box size.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ref_interp.numerics import Numerics
from tile.ast import AggOp, CombOp
from tile.bounds import Range, empty_error, index_box, ranges
from tile.dtypes import DType, promote
from tile.errors import TileRuntimeError
from tile.shapes import row_major_strides
from tile.typed import TContraction

DEFAULT_MAX_POINTS = 10**9
CHUNK = 1 << 20


def max_points_default() -> int:
    return int(os.environ.get("TILE_INTERP_MAX_POINTS", DEFAULT_MAX_POINTS))


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
    # Interval of the poly over the box; the condition is implied when integrality is certain
    # (den == 1) and the interval lies inside [lo, hi].
    lo_v = hi_v = Fraction(const, den)
    for pos, c in coeffs:
        a, b = box[pos]
        lo_v += Fraction(min(c * a, c * b), den)
        hi_v += Fraction(max(c * a, c * b), den)
    needed = den != 1 or lo_v < r.lo or hi_v > r.hi
    return _Cond(coeffs, const, den, int(r.lo), int(r.hi), needed)


def evaluate(
    c: TContraction,
    env: dict[str, np.ndarray],
    nx: Numerics,
    max_points: int | None = None,
    box: dict[str, tuple[int, int]] | None = None,
    report_shape: tuple[int, ...] | None = None,
) -> np.ndarray:
    """The value of contraction ``c`` given every tensor it reads in ``env`` (in ``nx`` storage).

    ``box`` may give index bounds already known to hold every valid tuple (the flat form's ranges);
    otherwise they are computed exactly from the conditions. ``report_shape`` is the shape error
    messages name output elements in (the flat form evaluates a 1-D view of the output).
    """
    shape = c.type.shape
    dtype = c.type.dtype
    size = int(np.prod(shape, dtype=np.int64))
    init = _initial(c, env, nx)
    if size == 0 or any(env[a.tensor].size == 0 for a in c.operands):
        return init.reshape(shape)  # nothing can be aggregated: 0 (or default) everywhere
    names = list(c.index_names)
    box_map = box if box is not None else index_box(c)
    box = [box_map[v] for v in names]
    extents = [hi - lo + 1 for lo, hi in box]
    total = int(np.prod(extents, dtype=object))  # 1 for a contraction without indices
    limit = max_points if max_points is not None else max_points_default()
    if total > limit:
        raise TileRuntimeError(
            f"the index space of '{c.name}' has {total} points, more than the interpreter's limit of {limit}",
            c.span,
            hint="use smaller inputs, or raise the limit (max_points=..., --max-points, or "
            "TILE_INTERP_MAX_POINTS)",
        )
    order = {v: k for k, v in enumerate(names)}
    conds_src = ranges(c)
    conds = [_compile(r, order, box) for r in conds_src]
    accesses = [c.output, *c.operands]
    strides = [row_major_strides(a.type.shape) for a in accesses]
    operand_values = [_operand_storage(c, k, env, nx) for k in range(len(c.operands))]
    acc = _identity_buffer(c.agg, dtype, size, nx)
    written = np.zeros(size, dtype=bool)
    writer = np.full(size, -1, dtype=np.int64) if c.agg is AggOp.ASSIGN else None
    box_strides = row_major_strides(tuple(extents))
    any_valid = False
    for vals, grid in _blocks(box, extents):
        ok = np.ones(grid, dtype=bool)
        idx_values = []
        for cond in conds:
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
        any_valid = True
        flats = []
        pos = 0
        for a, st in zip(accesses, strides):
            f = sum((idx_values[pos + k] * st[k] for k in range(len(a.polys))), np.zeros((), np.int64))
            flats.append(np.broadcast_to(f, grid).reshape(-1)[sel])
            pos += len(a.polys)
        values = _combine(c, [ov[f] for ov, f in zip(operand_values, flats[1:])], nx)
        out_flat = flats[0]
        if writer is not None:
            lin = sum(
                (
                    (np.broadcast_to(v, grid).reshape(-1)[sel] - lo) * st
                    for v, (lo, _), st in zip(vals, box, box_strides)
                ),
                np.zeros(len(sel), np.int64),
            )
            _check_single_writer(c, out_flat, lin, writer, names, box, extents, report_shape or shape)
            acc[out_flat] = values
        else:
            _aggregate(c.agg, acc, out_flat, values)
        written[out_flat] = True
    if not any_valid:
        raise empty_error(c, _diagnose_empty(conds, conds_src, box, extents))
    return np.where(written, acc, init.reshape(-1)).reshape(shape)


def _blocks(box: list[tuple[int, int]], extents: list[int]):
    """Cover the box with grids of at most ``CHUNK`` points.

    Yields ``(vals, grid)``: one array per index, broadcastable to the ``grid`` shape (scalars
    for the outer indices iterated in Python, an ``arange`` along its own axis for the others).
    """
    n = len(extents)
    k, inner = n, 1
    while k > 0 and inner * extents[k - 1] <= CHUNK:
        k -= 1
        inner *= extents[k]
    if k == 0:
        yield _grid_vals(box, extents, 0, [], None), tuple(extents)
        return
    split = k - 1  # the index whose range is cut into steps; those before it are iterated
    step = max(1, CHUNK // inner)
    outer_ranges = [range(lo, hi + 1) for lo, hi in box[:split]]
    for outer in itertools.product(*outer_ranges):
        lo, hi = box[split]
        for s in range(lo, hi + 1, step):
            part = (s, min(hi, s + step - 1))
            yield (
                _grid_vals(box, extents, split, list(outer), part),
                (part[1] - part[0] + 1, *extents[split + 1 :]),
            )


def _grid_vals(box, extents, split, outer, part) -> list[np.ndarray]:
    vals: list[np.ndarray] = [np.asarray(v, dtype=np.int64) for v in outer]
    axes = box[split:] if part is None else [part, *box[split + 1 :]]
    for axis, (lo, hi) in enumerate(axes):
        shape = [1] * len(axes)
        shape[axis] = hi - lo + 1
        vals.append(np.arange(lo, hi + 1, dtype=np.int64).reshape(shape))
    return vals


# ------------------------------------------------------------------------- helpers
def _decode(lin: int, box, extents) -> list[int]:
    out = []
    for k in range(len(box) - 1, -1, -1):
        out.append(lin % extents[k] + box[k][0])
        lin //= extents[k]
    return out[::-1]


def _initial(c: TContraction, env, nx: Numerics) -> np.ndarray:
    if c.default is not None:
        return np.array(nx.cast(env[c.default], c.type.dtype), copy=True)
    out = np.zeros(c.type.shape, dtype=nx.storage(c.type.dtype))
    if out.dtype == object:
        out[...] = Fraction(0)
    return out


def _identity_buffer(agg: AggOp, dt: DType, size: int, nx: Numerics) -> np.ndarray:
    storage = nx.storage(dt)
    if agg is AggOp.PROD:
        ident = Fraction(1) if storage == np.dtype(object) else 1
    elif agg in (AggOp.MAX, AggOp.MIN):
        low = agg is AggOp.MAX
        if dt is DType.BOOL:
            ident = not low
        elif dt.is_float:
            ident = -np.inf if low else np.inf
            ident = float(ident) if storage == np.dtype(object) else ident
        else:
            info = np.iinfo(dt.numpy)
            ident = info.min if low else info.max
    else:
        ident = Fraction(0) if storage == np.dtype(object) else 0
    buf = np.empty(size, dtype=storage)
    buf[...] = ident
    return buf


def _operand_storage(c: TContraction, k: int, env, nx: Numerics) -> np.ndarray:
    """Operand ``k`` flattened, converted to the type it is combined in."""
    arr = env[c.operands[k].tensor]
    if c.comb in (CombOp.EQ, CombOp.COND) and k < 2:
        common = promote(c.operands[0].type.dtype, c.operands[1].type.dtype)
        return np.ascontiguousarray(nx.cast(arr, common)).reshape(-1)
    return np.ascontiguousarray(nx.cast(arr, c.type.dtype)).reshape(-1)


def _combine(c: TContraction, vals: list[np.ndarray], nx: Numerics) -> np.ndarray:
    with np.errstate(all="ignore"):
        if c.comb is CombOp.NONE:
            return vals[0]
        if c.comb is CombOp.MUL:
            return vals[0] * vals[1]
        if c.comb is CombOp.ADD:
            return vals[0] + vals[1]
        eq = np.asarray(vals[0] == vals[1], dtype=bool)
        if c.comb is CombOp.EQ:
            return nx.cast(eq, c.type.dtype)
        return np.where(eq, vals[2], nx.const(0, c.type.dtype))


_AT = {AggOp.SUM: np.add, AggOp.PROD: np.multiply}


def _aggregate(agg: AggOp, acc: np.ndarray, where: np.ndarray, values: np.ndarray) -> None:
    with np.errstate(all="ignore"):
        if agg in _AT:
            _AT[agg].at(acc, where, values)
        elif acc.dtype == object:
            # object arrays mix Fractions with float ±inf/nan: compare one by one, nan wins
            pick = (lambda a, b: a if a > b else b) if agg is AggOp.MAX else (lambda a, b: a if a < b else b)
            for w, v in zip(where.tolist(), values.tolist()):
                cur = acc[w]
                acc[w] = cur if cur != cur else v if v != v else pick(cur, v)
        else:
            (np.maximum if agg is AggOp.MAX else np.minimum).at(acc, where, values)


def _check_single_writer(c, out_flat, lin, writer, names, box, extents, shape) -> None:
    """`=` writes each output element at most once; name the element and both writers if not."""
    order = np.argsort(out_flat, kind="stable")
    sorted_flat = out_flat[order]
    dup = np.flatnonzero(sorted_flat[1:] == sorted_flat[:-1])
    clash = np.flatnonzero(writer[out_flat] >= 0)
    if len(dup):
        k = dup[0]
        pos, first, second = sorted_flat[k], lin[order[k]], lin[order[k + 1]]
    elif len(clash):
        k = clash[0]
        pos, first, second = out_flat[k], writer[out_flat[k]], lin[k]
    else:
        writer[out_flat] = lin
        return
    where = np.unravel_index(int(pos), shape)

    def tuple_of(lin: int) -> str:
        return ", ".join(f"{v}={x}" for v, x in zip(names, _decode(lin, box, extents)))

    raise TileRuntimeError(
        f"`=` writes {c.name}[{', '.join(str(int(w)) for w in where)}] more than once: from "
        f"({tuple_of(int(first))}) and ({tuple_of(int(second))})",
        c.span,
        hint="`=` needs each output element written by one index tuple; use +, >, < or * to combine "
        "several values, or add a constraint",
    )


def _diagnose_empty(conds, conds_src, box, extents) -> Range:
    """The first condition (in order) after which no point of the box survives."""
    alive = np.zeros(len(conds), dtype=np.int64)
    for vals, grid in _blocks(box, extents):
        ok = np.ones(grid, dtype=bool)
        for k, cond in enumerate(conds):
            v = cond.value(vals)
            ok &= (v % cond.den == 0) & (v // cond.den >= cond.lo) & (v // cond.den <= cond.hi)
            alive[k] += int(ok.sum())
    return conds_src[int(np.flatnonzero(alive == 0)[0])]
