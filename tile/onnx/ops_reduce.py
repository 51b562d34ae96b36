"""Reductions and their relatives: Reduce*, ArgMax/ArgMin, Softmax/LogSoftmax/Hardmax, CumSum.

A reduction is one contraction (``tile.ops.reduce.contraction``); a reduction over an empty axis
has no valid index tuple in Tile, so its (constant) result is written directly: ONNX's identity of
the aggregation (0, 1, -inf, inf).
"""

from __future__ import annotations

import math

import numpy as np

from tile.dtypes import DType
from tile.onnx.context import Context, Value
from tile.onnx.ops_shape import axes_arg, axis_of, idx, reshape, target
from tile.onnx.registry import converter
from tile.ops.reduce import contraction

# op -> (before, aggregation, after): elementwise text around one contraction ({x}: the tensor)
_REDUCE = {
    "ReduceSum": ("{x}", "+", "{x}"),
    "ReduceMean": ("{x}", "+", "{x} / {n}"),
    "ReduceMax": ("{x}", ">", "{x}"),
    "ReduceMin": ("{x}", "<", "{x}"),
    "ReduceProd": ("{x}", "*", "{x}"),
    "ReduceL1": ("abs({x})", "+", "{x}"),
    "ReduceL2": ("{x} * {x}", "+", "sqrt({x})"),
    "ReduceSumSquare": ("{x} * {x}", "+", "{x}"),
    "ReduceLogSum": ("{x}", "+", "log({x})"),
    "ReduceLogSumExp": ("exp({x})", "+", "log({x})"),
}
_EMPTY = {"+": 0.0, "*": 1.0, ">": -math.inf, "<": math.inf}


@converter(*_REDUCE)
def reduce(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    before, agg, after = _REDUCE[node.op_type]
    takes_input = node.op_type == "ReduceSum" and ctx.opset >= 13 or ctx.opset >= 18
    axes = axes_arg(ctx, x.rank, "axes" if not takes_input else "axes_absent", 1)
    keep = bool(ctx.attr("keepdims", 1))
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return [ctx.let(f"ident({x})")]
        axes = list(range(x.rank))
    out_shape = [1 if a in axes else d for a, d in enumerate(x.shape) if keep or a not in axes]
    count = math.prod(x.shape[a] for a in axes)
    if count == 0:
        value = _EMPTY[agg]
        if node.op_type in ("ReduceLogSum", "ReduceLogSumExp"):
            value = -math.inf
        elif node.op_type == "ReduceMean":
            value = math.nan
        if x.dtype is DType.BOOL and math.isinf(value):
            value = value > 0  # the empty max is false, the empty min true
        elif not x.dtype.is_float and math.isinf(value):
            info = np.iinfo(x.dtype.numpy)
            value = info.min if value < 0 else info.max
        return [ctx.folded(np.full(out_shape, value), x.dtype)]
    src = x
    if node.op_type == "ReduceLogSumExp":  # the max taken out, so large inputs do not overflow
        top = ctx.emit(contraction("$", ">", x.name, x.rank, axes, True, [str(d) for d in x.shape]), "Max")
        shifted = ctx.let(f"{x} - {top}")
        s = ctx.emit(contraction("$", "+", f"{ctx.let(f'exp({shifted})')}", x.rank, axes, keep,
                                 [str(d) for d in x.shape]), "Sum")
        top = reshape(ctx, top, out_shape)
        return [ctx.cast(ctx.let(f"log({s}) + {top}"), x.dtype)]
    if before != "{x}":
        src = ctx.let(before.format(x=x))
    red = ctx.emit(contraction("$", agg, src.name, x.rank, axes, keep, [str(d) for d in x.shape]), "Reduce")
    if after != "{x}":
        red = ctx.let(after.format(x=red, n=ctx.lit(count, red.dtype)))
    return [ctx.cast(red, x.dtype)]


@converter("ArgMax", "ArgMin")
def arg(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    a = axis_of(ctx, ctx.attr("axis", 0), x.rank)
    keep = bool(ctx.attr("keepdims", 1))
    last = bool(ctx.attr("select_last_index", 0))
    dims = [str(d) for d in x.shape]
    agg = ">" if node.op_type == "ArgMax" else "<"
    top = ctx.emit(contraction("$", agg, x.name, x.rank, [a], True, dims), "Top")
    # ties: the first index (min over the matches) or the last (max); non-matches never win
    miss = str(x.shape[a]) if not last else "(-1)"
    where = ctx.let(f"{x} == {top} ? index({x}, {a}) : {miss}", "Where")
    y = ctx.emit(contraction("$", ">" if last else "<", where.name, x.rank, [a], keep, dims), "Arg")
    return [ctx.cast(y, DType.INT64)]


@converter("Softmax", "LogSoftmax")
def softmax(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    log = node.op_type == "LogSoftmax"
    if ctx.opset < 13:  # the input is taken as 2-D: [prod(shape[:axis]), prod(shape[axis:])]
        a = axis_of(ctx, ctx.attr("axis", 1), x.rank)
        flat = reshape(ctx, x, (math.prod(x.shape[:a]), math.prod(x.shape[a:])))
        return [reshape(ctx, _softmax(ctx, flat, 1, log), x.shape)]
    return [_softmax(ctx, x, axis_of(ctx, ctx.attr("axis", -1), x.rank), log)]


def _softmax(ctx: Context, x: Value, a: int, log: bool) -> Value:
    """(Log)softmax along axis ``a`` as the maximum and the sum of exponentials, each a contraction
    (``tile.ops.softmax`` sends the last axis to the ``builtin_softmax`` row kernel instead, which
    ``llvm_cpu.0`` runs 3-5 times slower than these kernels at any row length from 16 to 32768:
    bench/RESULTS.md, "ONNX, third session"). The roundings are the builtin's (docs/semantics.md
    §5): the exponentials in x's type, their sum in float32 for float16 and bfloat16, rounded
    once."""
    dims = [str(d) for d in x.shape]
    top = ctx.emit(contraction("$", ">", x.name, x.rank, [a], True, dims), "Top")
    shift = ctx.cast(ctx.let(f"{x} - {top}", "Shift"), x.dtype)
    e = ctx.cast(ctx.let(f"exp({shift})", "Exp"), x.dtype)
    wide = ctx.cast(e, DType.FLOAT32) if x.dtype.is_narrow_float else e
    total = ctx.cast(ctx.emit(contraction("$", "+", wide.name, x.rank, [a], True, dims), "Total"), x.dtype)
    y = ctx.let(f"{shift} - log({total})" if log else f"{e} / {total}", "Softmax")
    return ctx.cast(y, x.dtype)


@converter("Hardmax")
def hardmax(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    if ctx.opset < 13:
        a = axis_of(ctx, ctx.attr("axis", 1), x.rank)
        flat = reshape(ctx, x, (math.prod(x.shape[:a]), math.prod(x.shape[a:])))
        y = _hardmax(ctx, flat, 1)
        return [reshape(ctx, y, x.shape)]
    return [_hardmax(ctx, x, axis_of(ctx, ctx.attr("axis", -1), x.rank))]


def _hardmax(ctx: Context, x: Value, a: int) -> Value:
    dims = [str(d) for d in x.shape]
    top = ctx.emit(contraction("$", ">", x.name, x.rank, [a], True, dims), "Top")
    where = ctx.let(f"{x} == {top} ? index({x}, {a}) : {x.shape[a]}", "Where")
    first = ctx.emit(contraction("$", "<", where.name, x.rank, [a], True, dims), "First")
    one, zero = ctx.lit(1, x.dtype), ctx.lit(0, x.dtype)
    return ctx.let(f"index({x}, {a}) == {first} ? {one} : {zero}", "Hardmax")


@converter("CumSum")
def cumsum(ctx: Context, node) -> list[Value]:
    return [cumulative(ctx, "+", "CumSum")]


def cumulative(ctx: Context, agg: str, name: str, default: Value | None = None) -> Value:
    """CumSum / CumProd of input 0 along the axis in input 1 (``exclusive``, ``reverse``): a
    contraction over ``k`` up to (or from) each position; ``default`` where nothing is aggregated."""
    x = ctx.input(0)
    a = axis_of(ctx, int(np.asarray(ctx.const(1)).ravel()[0]), x.rank)
    exclusive, rev = ctx.attr("exclusive", 0), ctx.attr("reverse", 0)
    i = idx(x.rank)
    src = list(i)
    src[a] = "k"
    poly = ("k - " + i[a]) if rev else (i[a] + " - k")
    if exclusive:
        poly += " - 1"
    tail = f" default {default}" if default is not None else ""
    head = f"{target('$', i, x.shape)} = {agg}({x}[{', '.join(src)}])"
    y = ctx.emit(f"{head}, {poly} < {x.shape[a]}{tail}", name)
    return ctx.cast(y, x.dtype)

