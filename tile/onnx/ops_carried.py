"""Cast and CastLike, and rounding to the ONNX types Tile carries in wider ones (``carried``).

A conversion to float8, float4 or float8 e8m0 rounds the value, in float64 (where each step is
exact), to the type's grid and writes it in its float32 carrier: the binade comes from
``floor_log2`` (at least the type's smallest normal one, so subnormals get the finest step), the
step is ``2^(e - mantissa bits)``, and the value divided by the step is rounded half to even.
Overflow saturates to the largest finite value where ``saturate`` is set (ONNX's default), else
gives inf (e5m2) or nan (the types without inf); nan stays nan. The ``fnuz`` types have no -0.
Integers to int4/uint4/int2/uint2 wrap (the low bits, as a cast between integer types does);
floats to them truncate, and a value outside the type's range gives 0 (ONNX leaves it undefined;
its reference, ml_dtypes, gives 0). Converting *from* a carried type is the carrier's cast: its
numbers are exactly the carried values.
"""

from __future__ import annotations

import dataclasses

from tile.dtypes import DType
from tile.onnx import carried
from tile.onnx.carried import Format
from tile.onnx.context import Context, Value
from tile.onnx.importer import onnx_dtype
from tile.onnx.ops_bitcast import floor_log2
from tile.onnx.ops_elementwise import round_half_even
from tile.onnx.registry import converter


def convert(ctx: Context, x: Value, elem: int, saturate: bool = True, round_mode: str = "up") -> Value:
    """``x`` converted to ONNX element type ``elem``: a Tile dtype, or one Tile carries."""
    fmt = carried.FORMATS.get(elem)
    if fmt is None:
        return ctx.cast(x, onnx_dtype(elem, f"{ctx.where}'s target type"))
    return to_format(ctx, x, fmt, saturate, round_mode)


def to_format(ctx: Context, x: Value, fmt: Format, saturate: bool = True, round_mode: str = "up") -> Value:
    """``x`` rounded to ``fmt``'s values, in its carrier, marked as carrying ``fmt``."""
    if x.carried == fmt.name:
        y = ctx.let(f"ident({x})")
    elif not fmt.is_float:
        y = _to_integer(ctx, x, fmt)
    elif fmt.mbits == 0:
        y = _to_e8m0(ctx, x, saturate, round_mode)
    else:
        y = _to_float(ctx, x, fmt, saturate)
    return dataclasses.replace(y, carried=fmt.name)


def _f(ctx: Context, v: float) -> str:
    return ctx.lit(v, DType.FLOAT64)


def _to_integer(ctx: Context, x: Value, fmt: Format) -> Value:
    lo, hi = (-(1 << (fmt.bits - 1)), (1 << (fmt.bits - 1)) - 1) if fmt.signed else (0, (1 << fmt.bits) - 1)
    if x.dtype.is_float:
        xf = ctx.cast(x, DType.FLOAT64)
        t = ctx.let(f"{xf} < {_f(ctx, 0)} ? ceil({xf}) : floor({xf})", "Truncated")
        y = ctx.let(f"({t} >= {_f(ctx, lo)}) & ({t} <= {_f(ctx, hi)}) ? {t} : {_f(ctx, 0)}", "InRange")
        return ctx.cast(y, fmt.carrier)
    i = lambda v: ctx.lit(v, DType.INT64)  # noqa: E731
    low = ctx.let(f"{ctx.cast(x, DType.INT64)} & {i((1 << fmt.bits) - 1)}", "LowBits")
    if fmt.signed:
        low = ctx.let(f"{low} > {i(hi)} ? {low} - {i(1 << fmt.bits)} : {low}", "Signed")
    return ctx.cast(low, fmt.carrier)


def _negative(ctx: Context, xf: Value) -> str:
    """Whether float64 ``xf`` has its sign set (-0 included)."""
    zero = _f(ctx, 0)
    return f"(({xf} < {zero}) | (({xf} == {zero}) & (recip({xf}) < {zero})))"


def _to_float(ctx: Context, x: Value, fmt: Format, saturate: bool) -> Value:
    f = lambda v: _f(ctx, v)  # noqa: E731
    xf = ctx.cast(x, DType.FLOAT64)
    a = ctx.let(f"abs({xf})", "Abs")
    emin = fmt.smallest_normal_exponent
    e = floor_log2(ctx, a)
    e = ctx.let(f"{e} < {f(emin)} ? {f(emin)} : {e}", "Binade")
    step = ctx.let(f"pow({f(2)}, {e} - {f(fmt.mbits)})", "Step")
    q = ctx.let(f"{round_half_even(ctx, ctx.let(f'{a} / {step}', 'Steps'))} * {step}", "Rounded")
    # float4 has neither inf nor nan: it saturates, and nan gives 0
    over = f(fmt.largest) if saturate or not fmt.has_nan else f(float("inf") if fmt.has_inf else float("nan"))
    nan = f(float("nan")) if fmt.has_nan else f(0)
    too_big = f"({a} == {f(float('inf'))}) | ({q} > {f(fmt.largest)})"
    mag = ctx.let(f"{a} != {a} ? {nan} : {too_big} ? {over} : {q}", "Magnitude")
    negative = _negative(ctx, xf)
    if not fmt.negative_zero:
        negative = f"{negative} & ({mag} != {f(0)})"
    return ctx.cast(ctx.let(f"{negative} ? -{mag} : {mag}", "Signed"), DType.FLOAT32)


def _to_e8m0(ctx: Context, x: Value, saturate: bool, round_mode: str) -> Value:
    """A power of two 2^-127 .. 2^127 from float32 ``x``'s exponent (the sign ignored), rounded
    ``up`` (a fraction takes the next power), ``down`` or to ``nearest`` (a fraction of half or
    more takes the next), as ONNX's reference reads float32's bits: 0 is 2^-127, a float32
    subnormal 2^-126 (up, or nearest above 2^-127); inf and nan give nan; past 2^127 saturates or
    gives nan."""
    if round_mode not in ("up", "down", "nearest"):
        raise ctx.error(f"round_mode '{round_mode}' is none of up, down, nearest")
    f = lambda v: _f(ctx, v)  # noqa: E731
    a = ctx.let(f"abs({ctx.cast(ctx.cast(x, DType.FLOAT32), DType.FLOAT64)})", "Abs")
    e = floor_log2(ctx, a)
    fraction = ctx.let(f"{a} / pow({f(2)}, {e}) - {f(1)}", "Fraction")
    more = {"up": f"{fraction} > {f(0)}", "down": f"{f(0)} > {f(1)}", "nearest": f"{fraction} >= {f(0.5)}"}
    up = f"({more[round_mode]})" + (f" & ({e} < {f(127)})" if saturate else "")
    r = ctx.let(f"{up} ? {e} + {f(1)} : {e}", "Exponent")
    tiny = f(2.0**-126) if round_mode == "up" else f(2.0**-127)
    if round_mode == "nearest":
        tiny = f"({a} > {f(2.0**-127)} ? {f(2.0**-126)} : {f(2.0**-127)})"
    zero_or_tiny = f"{a} == {f(0)} ? {f(2.0**-127)} : {tiny}"
    special = f"({a} != {a}) | ({a} == {f(float('inf'))}) | ({r} > {f(127)})"
    y = ctx.let(f"{special} ? {f(float('nan'))} : {a} < {f(2.0**-126)} ? {zero_or_tiny} : pow({f(2)}, {r})",
                "PowerOfTwo")
    return ctx.cast(y, DType.FLOAT32)


@converter("Cast")
def cast(ctx: Context, node) -> list[Value]:
    return [convert(ctx, ctx.input(0), ctx.attr("to"), bool(ctx.attr("saturate", 1)),
                    ctx.attr("round_mode", "up"))]


@converter("CastLike")
def cast_like(ctx: Context, node) -> list[Value]:
    x, like = ctx.input(0), ctx.raw(1)
    if like.carried:
        fmt = carried.BY_NAME[like.carried]
        return [to_format(ctx, x, fmt, bool(ctx.attr("saturate", 1)), ctx.attr("round_mode", "up"))]
    return [ctx.cast(x, like.dtype)]
