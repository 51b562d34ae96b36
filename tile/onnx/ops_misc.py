"""Scatter/gather by index tuples, cumulative products, quantization and TopK.

Scatters use ``tile.ops.scatter_add`` (ScatterElements) or the ``scatter`` builtin over a
linearized index (ScatterND), with a count of the writes to each element: ``none`` takes the
update where the count is non-zero; ``mul``/``max``/``min`` combine it with the data, which is
exact when no element is written twice (ONNX leaves duplicates under ``none`` undefined).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

import tile.ops
from tile.dtypes import DType
from tile.onnx import carried
from tile.onnx.context import Context, Value
from tile.onnx.ops_carried import to_format
from tile.onnx.ops_elementwise import round_half_even
from tile.onnx.ops_reduce import cumulative
from tile.onnx.ops_shape import axis_of, idx, reshape, take, target, wrap_negative
from tile.onnx.registry import converter

_IDENTITY = {"mul": ("*", 1.0), "max": (">", -math.inf), "min": ("<", math.inf)}


def _combine(ctx: Context, data: Value, added: Value, count: Value, reduction: str) -> Value:
    """The scatter's result from the reduced updates and the write counts (both data-shaped)."""
    zero = ctx.lit(0, count.dtype)
    hit = f"{count} > {zero}"
    if reduction == "add":
        return ctx.cast(ctx.let(f"{data} + {added}", "Scatter"), data.dtype)
    expr = {"none": f"{added}", "mul": f"{data} * {added}", "max": f"max({data}, {added})",
            "min": f"min({data}, {added})"}.get(reduction)
    if expr is None:
        raise ctx.unsupported(f"reduction '{reduction}'")
    return ctx.cast(ctx.let(f"{hit} ? {expr} : {data}", "Scatter"), data.dtype)


def _pairwise(ctx: Context, ind: Value, positions: Value, upd: Value, reduction: str, j: int,
              out_shape) -> Value:
    """``reduction`` of the updates written to each position: ``ind`` and ``upd`` have a size-1
    axis where ``positions`` (a constant, size-1 elsewhere) runs over the target's positions, and
    axis ``j`` of the pairs (the updates) is reduced. Updates that miss a position count as the
    aggregation's identity."""
    agg, ident = _IDENTITY[reduction]
    sel = ctx.let(f"{ind} == {positions} ? {upd} : {ctx.lit(ident, upd.dtype)}", "Pairs")
    i = idx(sel.rank)
    kept = [*i[:j], *i[j + 1:]]
    return ctx.emit(f"{target('$', kept, out_shape)} = {agg}({sel}[{', '.join(i)}])", "Reduced")


@converter("ScatterElements", "Scatter")
def scatter_elements(ctx: Context, node) -> list[Value]:
    data, ind, upd = ctx.input(0), ctx.input(1), ctx.input(2)
    a = axis_of(ctx, ctx.attr("axis", 0), data.rank)
    ind = wrap_negative(ctx, ind, data.shape[a])
    op = tile.ops.scatter_add(rank=data.rank, axis=a)
    reduction = ctx.attr("reduction", "none")
    ones = ctx.constant(np.ones(upd.shape, np.int32))
    count = ctx.call(op, ctx.constant(np.zeros(data.shape, np.int32)), ind, ones)[0]
    if reduction in _IDENTITY:
        pair = [*ind.shape[:a + 1], 1, *ind.shape[a + 1:]]
        where = [1] * (data.rank + 1)
        where[a + 1] = data.shape[a]
        positions = ctx.constant(np.arange(data.shape[a]).reshape(where).astype(ind.dtype.numpy), ind.dtype)
        shape = list(ind.shape)
        shape[a] = data.shape[a]
        red = _pairwise(ctx, reshape(ctx, ind, pair), positions, reshape(ctx, upd, pair), reduction, a, shape)
        if tuple(shape) != data.shape:  # indices cover less than the data: the rest is never written
            grow = [p for k in reversed(range(data.rank)) for p in (0, data.shape[k] - shape[k])]
            red = ctx.call(tile.ops.pad(rank=data.rank, pad=grow), red)[0]
        return [_combine(ctx, data, red, count, reduction)]
    zeros = ctx.constant(np.zeros(data.shape, data.dtype.numpy), data.dtype)
    added = ctx.call(op, zeros, ind, upd)[0]
    return [_combine(ctx, data, added, count, reduction)]


def _linear(ctx: Context, ind: Value, dims) -> Value:
    """Index tuples (last axis) of a tensor with sizes ``dims`` as row-major offsets (int64)."""
    k = ind.shape[-1]
    dims = [int(d) for d in dims[:k]]
    sizes = ctx.constant(np.array(dims, np.int64))
    ind = ctx.cast(ind, DType.INT64)
    zero = ctx.lit(0, DType.INT64)
    wrapped = ctx.let(f"{ind} < {zero} ? {ind} + {sizes} : {ind}", "Index")
    strides = ctx.constant(np.array([math.prod(dims[j + 1:]) for j in range(k)], np.int64))
    i = idx(ind.rank - 1)
    return ctx.emit(f"{target('$', i, ind.shape[:-1])} = +({wrapped}[{', '.join([*i, 'j'])}] * {strides}[j])",
                    "Offset")


@converter("ScatterND")
def scatter_nd(ctx: Context, node) -> list[Value]:
    data, ind, upd = ctx.input(0), ctx.input(1), ctx.input(2)
    k = ind.shape[-1]
    rest = data.shape[k:]
    lin = _linear(ctx, ind, data.shape)
    m = math.prod(ind.shape[:-1])
    flat = reshape(ctx, data, (math.prod(data.shape[:k]), *rest))
    lin = reshape(ctx, lin, (m,))
    reduction = ctx.attr("reduction", "none")
    upd = reshape(ctx, upd, (m, *rest))
    if reduction in _IDENTITY:
        rows = flat.shape[0]
        positions = ctx.constant(np.arange(rows).reshape((1, rows) + (1,) * len(rest)).astype(np.int64))
        pair = reshape(ctx, lin, (m, 1, *([1] * len(rest))))
        added = _pairwise(ctx, pair, positions, reshape(ctx, upd, (m, 1, *rest)), reduction, 0, flat.shape)
    else:
        added = ctx.let(f"scatter({upd}, {lin}, {flat})", "Scatter")
    ones = ctx.constant(np.ones((m,), np.int32))
    count = ctx.let(f"scatter({ones}, {lin}, {flat})", "Count")
    count = reshape(ctx, count, (count.shape[0], *([1] * len(rest))))
    y = _combine(ctx, flat, added, count, reduction)
    return [reshape(ctx, y, data.shape)]


@converter("GatherND")
def gather_nd(ctx: Context, node) -> list[Value]:
    data, ind = ctx.input(0), ctx.input(1)
    b = ctx.attr("batch_dims", 0)
    k = ind.shape[-1]
    lin = _linear(ctx, ind, data.shape[b:])
    inner = math.prod(data.shape[b:b + k])
    rest = data.shape[b + k:]
    if b:
        batch = math.prod(data.shape[:b])
        offsets = np.arange(batch, dtype=np.int64).reshape(data.shape[:b]) * inner
        offsets = offsets.reshape(data.shape[:b] + (1,) * (lin.rank - b))
        lin = ctx.let(f"{lin} + {ctx.constant(offsets)}", "Offset")
    flat = reshape(ctx, data, (math.prod(data.shape[:b]) * inner, *rest))
    return [ctx.let(f"gather({flat}, {lin})", "GatherND")]


@converter("CumProd")
def cumprod(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    ones = ctx.constant(np.ones(x.shape, x.dtype.numpy), x.dtype)  # the empty products
    return [cumulative(ctx, "*", "CumProd", ones)]


def _axis(ctx: Context, scale: Value, x: Value, block: int) -> int:
    if scale.rank == 0 or scale.size == 1 and not block:
        return 0  # per-tensor: no axis
    return axis_of(ctx, ctx.attr("axis", 1), x.rank)


def _per_axis(ctx: Context, v: Value, x: Value, axis: int, block: int) -> Value:
    """A scale or zero point (scalar, per-axis 1-D, or blocked) shaped to broadcast against x."""
    if v.rank == 0 or v.size == 1 and block == 0:
        return reshape(ctx, v, ())
    if block:
        v = take(ctx, v, axis, np.arange(x.shape[axis]) // block)
        return v
    shape = [1] * x.rank
    shape[axis] = v.size
    return reshape(ctx, v, shape)


@converter("DequantizeLinear")
def dequantize(ctx: Context, node) -> list[Value]:
    x, scale = ctx.input(0), ctx.input(1)
    block = ctx.attr("block_size", 0)
    a = _axis(ctx, scale, x, block)
    s = _per_axis(ctx, scale, x, a, block)
    xf = ctx.cast(x, DType.FLOAT32)
    if ctx.has(2):
        zp = ctx.cast(_per_axis(ctx, ctx.input(2), x, a, block), DType.FLOAT32)
        xf = ctx.let(f"{xf} - {zp}", "Centered")
    return [ctx.cast(ctx.let(f"{xf} * {ctx.cast(s, DType.FLOAT32)}", "Dequantize"), scale.dtype)]


@converter("QuantizeLinear")
def quantize(ctx: Context, node) -> list[Value]:
    """Integers: the scaled value rounded half to even, shifted and saturated; float8 and float4
    (carried in float32, ``tile.onnx.carried``): the scaled value (plus the zero point) rounded to
    the type, saturating unless ``saturate`` is 0."""
    from tile.onnx.importer import tensor_type

    x, scale = ctx.input(0), ctx.input(1)
    block = ctx.attr("block_size", 0)
    a = _axis(ctx, scale, x, block)
    zp = ctx.input(2) if ctx.has(2) else None
    if zp is not None:
        out, fmt = zp.dtype, zp.carried and carried.BY_NAME[zp.carried]
    elif ctx.attr("output_dtype", 0):
        out, fmt = tensor_type(ctx.attr("output_dtype"), "output_dtype")
    else:
        out, fmt = DType.UINT8, None
    if out.is_float and fmt is None:
        raise ctx.unsupported(f"quantizing to {out}")
    s = ctx.cast(_per_axis(ctx, scale, x, a, block), DType.FLOAT32)
    q = ctx.let(f"{ctx.cast(x, DType.FLOAT32)} / {s}", "Scaled")
    if fmt is None or not fmt.is_float:
        q = round_half_even(ctx, q)
    if zp is not None:
        q = ctx.let(f"{q} + {ctx.cast(_per_axis(ctx, zp, x, a, block), DType.FLOAT32)}", "Shifted")
    if fmt is not None and fmt.is_float:
        return [to_format(ctx, q, fmt, bool(ctx.attr("saturate", 1)))]
    if fmt is not None:
        half = 1 << (fmt.bits - 1)
        low, high = (-half, half - 1) if fmt.signed else (0, 2 * half - 1)
    else:
        low, high = np.iinfo(out.numpy).min, np.iinfo(out.numpy).max
    lo, hi = ctx.lit(low, DType.FLOAT32), ctx.lit(high, DType.FLOAT32)
    q = ctx.let(f"{q} < {lo} ? {lo} : {q} > {hi} ? {hi} : {q}", "Saturated")
    q = ctx.cast(q, out)
    return [q if fmt is None else dataclasses.replace(q, carried=fmt.name)]


@converter("TopK")
def topk(ctx: Context, node) -> list[Value]:
    """Each element's rank along the axis is counted (how many come before it: larger, or equal
    at a smaller index), then the elements of rank 0 .. K-1 are picked in order."""
    x = ctx.input(0)
    k = int(np.asarray(ctx.const(1)).ravel()[0])
    a = axis_of(ctx, ctx.attr("axis", -1), x.rank)
    largest = ctx.attr("largest", 1)
    n = x.shape[a]
    ex = list(x.shape)
    ex.insert(a + 1, 1)
    mine = reshape(ctx, x, ex)          # x[.., k, 1, ..]: the element ranked
    other_shape = list(x.shape)
    other_shape.insert(a, 1)
    other = reshape(ctx, x, other_shape)  # x[.., 1, k2, ..]: the elements compared with it
    pos = np.arange(n)
    mine_at = ctx.constant(pos.reshape([n if j == a else 1 for j in range(x.rank + 1)]).astype(np.int32))
    other_at = ctx.constant(pos.reshape([n if j == a + 1 else 1 for j in range(x.rank + 1)]).astype(np.int32))
    cmp = ">" if largest else "<"
    before = ctx.let(f"({other} {cmp} {mine}) | (({other} == {mine}) & ({other_at} < {mine_at}))", "Before")
    i = idx(x.rank + 1)
    kept = [*i[:a + 1], *i[a + 2:]]
    before = ctx.cast(before, DType.INT32)
    rank = ctx.emit(f"{target('$', kept, x.shape)} = +({before}[{', '.join(i)}])", "Rank")
    out_shape = list(x.shape)
    out_shape[a] = k
    wanted = ctx.constant(np.arange(k, dtype=np.int32))
    j = idx(x.rank)
    src = list(j)
    src[a] = "r"
    at = f"{rank}[{', '.join(src)}] == {wanted}[{j[a]}]"
    values = ctx.emit(f"{target('$', j, out_shape)} = +({at} ? {x}[{', '.join(src)}])", "TopK")
    where = ctx.let(f"index({x}, {a})", "Position")
    indices = ctx.emit(f"{target('$', j, out_shape)} = +({at} ? {where}[{', '.join(src)}])", "TopKIndex")
    return [ctx.cast(values, x.dtype), ctx.cast(indices, DType.INT64)]


def _row_wise(ctx: Context, v: Value, x: Value) -> Value:
    """A per-row zero point or scale of a 2-D+ left operand ([M] -> [M, 1]); scalars stay."""
    if v.rank == 1 and v.size > 1:
        return reshape(ctx, v, (v.size, 1))
    return v


def _centered(ctx: Context, x: Value, zp: Value | None, left: bool) -> Value:
    xi = ctx.cast(x, DType.INT32)
    if zp is None:
        return xi
    z = ctx.cast(_row_wise(ctx, zp, x) if left else zp, DType.INT32)
    return ctx.let(f"{xi} - {z}", "Centered")


@converter("MatMulInteger")
def matmul_integer(ctx: Context, node) -> list[Value]:
    from tile.onnx.ops_linalg import matmul

    a = _centered(ctx, ctx.input(0), ctx.input(2) if ctx.has(2) else None, True)
    b = _centered(ctx, ctx.input(1), ctx.input(3) if ctx.has(3) else None, False)
    return [ctx.cast(matmul(ctx, a, b), DType.INT32)]


@converter("QLinearMatMul")
def qlinear_matmul(ctx: Context, node) -> list[Value]:
    """The integer product of the centered operands, scaled by ``a_scale * b_scale / y_scale``
    (in the scales' type) in float64, rounded half to even, shifted and saturated."""
    from tile.onnx.ops_linalg import matmul

    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = ctx.inputs()
    acc = matmul(ctx, _centered(ctx, a, a_zp, True), _centered(ctx, b, b_zp, False))
    factor = ctx.let(f"{_row_wise(ctx, a_s, a)} * {b_s} / {y_s}", "Factor")
    d = ctx.let(f"{ctx.cast(acc, DType.FLOAT64)} * {ctx.cast(factor, DType.FLOAT64)}", "Scaled")
    out = y_zp.dtype if y_zp is not None else a.dtype
    if y_zp is not None:
        d = ctx.let(f"{d} + {ctx.cast(y_zp, DType.FLOAT64)}", "Shifted")
    q = round_half_even(ctx, d)
    info = np.iinfo(out.numpy)
    lo, hi = ctx.lit(info.min, DType.FLOAT64), ctx.lit(info.max, DType.FLOAT64)
    return [ctx.cast(ctx.let(f"{q} < {lo} ? {lo} : {q} > {hi} ? {hi} : {q}", "Saturated"), out)]


@converter("ReverseSequence")
def reverse_sequence(ctx: Context, node) -> list[Value]:
    """Each batch entry's first ``len`` steps reversed: a gather along the time axis at the
    positions ``t < len ? len - 1 - t : t`` (GatherElements' conditional contraction)."""
    x, lens = ctx.input(0), ctx.input(1)
    t_axis, b_axis = ctx.attr("time_axis", 0), ctx.attr("batch_axis", 1)
    shape = [1] * x.rank
    shape[b_axis] = x.shape[b_axis]
    n = reshape(ctx, ctx.cast(lens, DType.INT64), shape)
    t = ctx.cast(ctx.let(f"index({x}, {t_axis})", "Step"), DType.INT64)
    one = ctx.lit(1, DType.INT64)
    pos = ctx.let(f"{t} < {n} ? {n} - {one} - {t} : {t}", "Position")
    return ctx.call(tile.ops.gather(rank=x.rank, axis=t_axis), x, pos)


@converter("Col2Im")
def col2im(ctx: Context, node) -> list[Value]:
    """Blocks summed back into the image: one ``+`` contraction whose output index is
    ``stride*l + dilation*k - pad_begin`` per spatial axis (padding falls outside, unwritten)."""
    x = ctx.input(0)
    image = [int(v) for v in np.asarray(ctx.const(1)).ravel()]
    block = [int(v) for v in np.asarray(ctx.const(2)).ravel()]
    nd = len(image)
    strides = list(ctx.attr("strides", [1] * nd))
    dil = list(ctx.attr("dilations", [1] * nd))
    pads = list(ctx.attr("pads", [0] * 2 * nd))
    counts = [(image[j] + pads[j] + pads[nd + j] - dil[j] * (block[j] - 1) - 1) // strides[j] + 1
              for j in range(nd)]
    n, cb, length = x.shape
    c = cb // math.prod(block)
    if length != math.prod(counts):
        raise ctx.error(f"{length} blocks do not tile an image of {image} with blocks {block}")
    cols = reshape(ctx, x, (n, c, *block, *counts))
    k, l_ = idx(nd, "k"), idx(nd, "l")
    spatial = [f"{strides[j]}*{l_[j]} + {dil[j]}*{k[j]} - {pads[j]}" for j in range(nd)]
    src = ", ".join(["n", "c", *k, *l_])
    return [ctx.emit(f"{target('$', ['n', 'c', *spatial], [n, c, *image])} = +({cols}[{src}])", "Col2Im")]


@converter("Det")
def det(ctx: Context, node) -> list[Value]:
    """Leibniz's sum over permutations (n! products; refused past 5 x 5)."""
    x = ctx.input(0)
    size = x.shape[-1]
    if size > 5:
        raise ctx.unsupported(f"a determinant of {size} x {size} (at most 5 x 5)")
    lead = x.shape[:-2]
    entries = {}
    for i in range(size):
        row = take(ctx, x, x.rank - 2, [i])
        for j in range(size):
            entries[i, j] = reshape(ctx, take(ctx, row, x.rank - 1, [j]), lead)
    terms = []
    for perm in itertools.permutations(range(size)):
        inversions = sum(perm[a] > perm[b] for a in range(size) for b in range(a + 1, size))
        product = " * ".join(entries[i, perm[i]].name for i in range(size))
        terms.append(("- " if inversions % 2 else "+ ") + product)
    text = " ".join(terms)
    text = text[2:] if text.startswith("+ ") else f"{ctx.lit(0, x.dtype)} {text}"
    return [ctx.cast(ctx.let(text, "Det"), x.dtype)]


@converter("TensorScatter")
def tensor_scatter(ctx: Context, node) -> list[Value]:
    """``update`` written into the cache along ``axis`` from each batch entry's write index
    (wrapping around in ``circular`` mode): a gather of the update at ``position - index``."""
    cache, update = ctx.input(0), ctx.input(1)
    a = axis_of(ctx, ctx.attr("axis", -2), cache.rank)
    if a == 0:
        raise ctx.error("the axis must not be the batch axis")
    size, count = cache.shape[a], update.shape[a]
    if ctx.has(2):
        shape = [cache.shape[0]] + [1] * (cache.rank - 1)
        start = reshape(ctx, ctx.cast(ctx.input(2), DType.INT64), shape)
    else:
        start = ctx.let(ctx.lit(0, DType.INT64))
    pos = ctx.cast(ctx.let(f"index({cache}, {a})", "Position"), DType.INT64)
    rel = ctx.let(f"{pos} - {start}", "Relative")
    if ctx.attr("mode", "linear") == "circular":
        n = ctx.lit(size, DType.INT64)
        rel = ctx.let(f"mod({rel} + {n}, {n})", "Relative")
    zero, top = ctx.lit(0, DType.INT64), ctx.lit(count, DType.INT64)
    written = ctx.call(tile.ops.gather(rank=cache.rank, axis=a), update, rel)[0]
    return [ctx.cast(ctx.let(f"({rel} >= {zero}) & ({rel} < {top}) ? {written} : {cache}", "Scattered"),
                     cache.dtype)]
