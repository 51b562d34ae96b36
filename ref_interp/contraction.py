"""Exact evaluation of one contraction by chunked enumeration of its index box.

``tile.tuples`` enumerates the valid index tuples, block by block, exactly (and owns the rule that
`=` writes an element at most once). Survivors gather their operands,
combine them, and aggregate with ``ufunc.at`` into the output. Elements nothing writes keep 0 or
the ``default`` tensor's value. Memory is bounded by the chunk size whatever the box size.

A `+` contraction of `*` products (the GEMM and convolution shape) is a *matrix product*: with a
float16 or bfloat16 result, outside the float64 and exact modes, each product is computed exactly
in float32, summed in float32 and rounded to the result type once (tensor cores accumulate in
float32). With a float32 result, ``tf32`` and ``3xtf32`` precision round the operands as such a
unit does (``tile.precision``), then multiply and sum in float32. docs/semantics.md §8.1.
"""

from __future__ import annotations

import os
from fractions import Fraction

import numpy as np

from ref_interp.numerics import Numerics
from tile.ast import AggOp, CombOp
from tile.dtypes import DType, promote
from tile.errors import TileLimitError
from tile.precision import MATRIX_MODES, round_tf32, split_3xtf32
from tile.tuples import SingleWriter, blocks, space
from tile.typed import TContraction

DEFAULT_MAX_POINTS = 10**9


def max_points_default() -> int:
    return int(os.environ.get("TILE_INTERP_MAX_POINTS", DEFAULT_MAX_POINTS))


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
    size = int(np.prod(shape, dtype=object))  # exact: `O[i: 10**10, 10**10]` overflows int64
    limit = max_points if max_points is not None else max_points_default()
    empty = size == 0 or any(env[a.tensor].size == 0 for a in c.operands)
    sp = None if empty else space(c, box)
    if sp is not None and sp.points > limit:
        raise TileLimitError(
            f"the index space of '{c.name}' has {sp.points} points, more than the interpreter's limit "
            f"of {limit}",
            c.span,
            hint="use smaller inputs, or raise the limit (max_points=..., --max-points, or "
            "TILE_INTERP_MAX_POINTS)",
        )
    if size > limit:  # found by the front-end fuzz: a MemoryError allocating the output
        raise TileLimitError(
            f"the output '{c.name}' has {size} elements, more than the interpreter's limit of {limit}",
            c.span,
            hint="use smaller sizes, or raise the limit (max_points=..., --max-points, or "
            "TILE_INTERP_MAX_POINTS)",
        )
    init = _initial(c, env, nx)
    if sp is None:
        return init.reshape(shape)  # nothing can be aggregated: 0 (or default) everywhere
    operand_values = [_operand_storage(c, k, env, nx) for k in range(len(c.operands))]
    mode = matrix_mode(c, nx)
    if mode is not None:
        return _matrix_product(c, sp, operand_values, mode, init, nx)
    acc = _identity_buffer(c.agg, dtype, size, nx)
    written = np.zeros(size, dtype=bool)
    rule = SingleWriter(sp, size, report_shape or shape) if c.agg is AggOp.ASSIGN else None
    any_valid = False
    for b in blocks(sp):
        any_valid = True
        out_flat = b.flats[0]
        values = _combine(c, [ov[f] for ov, f in zip(operand_values, b.flats[1:])], nx)
        if rule is not None:
            rule.add(out_flat, b.linear(sp))
            acc[out_flat] = values
        else:
            _aggregate(c.agg, acc, out_flat, values)
        written[out_flat] = True
    if not any_valid:
        sp.fail_empty()
    return np.where(written, acc, init.reshape(-1)).reshape(shape)


def matrix_mode(c: TContraction, nx: Numerics) -> str | None:
    """How the interpreter computes ``c`` if it is a matrix product with its own rounding:
    ``"float32"`` (float16/bfloat16 operands, float32 accumulation), ``"tf32"`` or ``"3xtf32"``
    (float32 in those precision modes); None for every other contraction and mode."""
    if not c.is_matrix_product or nx.precision in ("float64", "exact"):
        return None
    if c.type.dtype.is_narrow_float:
        return "float32"
    if c.type.dtype is DType.FLOAT32 and nx.precision in MATRIX_MODES:
        return nx.precision
    return None


def _matrix_product(c: TContraction, sp, operands: list[np.ndarray], mode: str, init, nx) -> np.ndarray:
    """Sum of exact-in-float32 products in a float32 accumulator, rounded to the result once."""
    size = init.size
    wide = [np.asarray(v, dtype=np.float32) for v in operands]  # exact: float16/bfloat16/float32
    if mode == "tf32":
        wide = [round_tf32(v) for v in wide]
    parts = [split_3xtf32(v) for v in wide] if mode == "3xtf32" else None
    acc = np.zeros(size, dtype=np.float32)
    written = np.zeros(size, dtype=bool)
    for b in blocks(sp):
        out_flat = b.flats[0]
        fa, fb = b.flats[1:]
        with np.errstate(all="ignore"):
            if parts is None:
                values = wide[0][fa] * wide[1][fb]  # exact: at most 11 x 11 significant bits
            else:
                (ha, la), (hb, lb) = parts
                hi_a, hi_b = ha[fa], hb[fb]
                # small terms first, as three MMAs into one accumulator would add them
                values = (hi_a * lb[fb] + la[fa] * hi_b) + hi_a * hi_b
            np.add.at(acc, out_flat, values)
        written[out_flat] = True
    if not written.any():
        sp.fail_empty()
    out = nx.cast(acc, c.type.dtype)
    return np.where(written, out, init.reshape(-1)).reshape(c.type.shape)


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
