"""BitCast: the same bits read as another type of the same width.

Integer to integer (and bool to uint8) is a wrapping conversion, which keeps the bits. Between
floats and integers the IEEE fields are computed: float to bits from the exponent (``log`` rounded
and then corrected with exact powers of two) and the mantissa; bits to float as
``(-1)^s * (1 + m / 2^p) * 2^(e - bias)`` (subnormals, infinities and nan included), all in
float64, where each step is exact.
"""

from __future__ import annotations

from tile.dtypes import DType
from tile.onnx.context import Context, Value
from tile.onnx.importer import onnx_dtype
from tile.onnx.registry import converter

# float type -> (exponent bits, mantissa bits, the integer type of its width)
_LAYOUT = {DType.FLOAT32: (8, 23, DType.INT64), DType.FLOAT64: (11, 52, DType.INT64)}


def floor_log2(ctx: Context, a: Value) -> Value:
    """``floor(log2(a))`` of a float64 ``a > 0``, exactly: ``log`` gives a guess that may be one off
    next to a power of two, and comparing with exact powers of two corrects it (-inf for 0)."""
    f = lambda v: ctx.lit(v, DType.FLOAT64)  # noqa: E731
    guess = ctx.let(f"floor(log({a}) / {f(0.6931471805599453)})", "Log2")
    low = ctx.let(f"pow({f(2)}, {guess}) > {a} ? {guess} - {f(1)} : {guess}", "Log2")
    return ctx.let(f"pow({f(2)}, {low} + {f(1)}) <= {a} ? {low} + {f(1)} : {low}", "Log2")


def _float_from_bits(ctx: Context, x: Value, to: DType) -> Value:
    ebits, mbits, _ = _LAYOUT[to]
    width = to.bits
    u = ctx.let(f"as_uint({x}, {width})", "Bits")
    one = ctx.lit(1, DType.UINT64)
    i64 = lambda v: ctx.lit(v, DType.UINT64)  # noqa: E731
    f = lambda v: ctx.lit(v, DType.FLOAT64)  # noqa: E731
    sign = ctx.let(f"as_uint({u}, 64) >> {i64(width - 1)}", "Sign")
    exp = ctx.let(f"(as_uint({u}, 64) >> {i64(mbits)}) & {i64((1 << ebits) - 1)}", "Exponent")
    man = ctx.let(f"as_uint({u}, 64) & (({one} << {i64(mbits)}) - {one})", "Mantissa")
    bias = (1 << (ebits - 1)) - 1
    mf, ef = ctx.let(f"as_float({man}, 64)"), ctx.let(f"as_float({exp}, 64)")
    normal = f"({f(1)} + {mf} * {f(2.0 ** -mbits)}) * pow({f(2)}, {ef} - {f(bias)})"
    tiny = f"{mf} * {f(2.0 ** (1 - bias - mbits))}"
    special = f"({mf} == {f(0)} ? {f(float('inf'))} : {f(float('nan'))})"
    top = ctx.lit((1 << ebits) - 1, DType.UINT64)
    mag = ctx.let(f"{exp} == {top} ? {special} : {exp} == {i64(0)} ? {tiny} : {normal}", "Magnitude")
    return ctx.cast(ctx.let(f"{sign} == {one} ? -{mag} : {mag}", "Value"), to)


def _bits_from_float(ctx: Context, x: Value, to: DType) -> Value:
    ebits, mbits, _ = _LAYOUT[x.dtype]
    bias = (1 << (ebits - 1)) - 1
    f = lambda v: ctx.lit(v, DType.FLOAT64)  # noqa: E731
    i = lambda v: ctx.lit(v, DType.INT64)  # noqa: E731
    xf = ctx.cast(x, DType.FLOAT64)
    a = ctx.let(f"abs({xf})", "Abs")
    e = floor_log2(ctx, a)
    smallest = 2.0 ** (1 - bias)
    normal_m = f"({a} * pow({f(2)}, -{e}) - {f(1)}) * {f(2.0 ** mbits)}"
    tiny_m = f"{a} * {f(2.0 ** (bias - 1))} * {f(2.0 ** mbits)}"
    nan = f"{xf} != {xf}"
    inf = f"{a} == {f(float('inf'))}"
    man = ctx.let(f"{nan} ? {f(2.0 ** (mbits - 1))} : {inf} ? {f(0)} : {a} < {f(smallest)} ? {tiny_m} : "
                  f"{normal_m}", "Mantissa")
    top = f((1 << ebits) - 1)
    exp = ctx.let(f"({nan}) | ({inf}) ? {top} : {a} < {f(smallest)} ? {f(0)} : {e} + {f(bias)}", "Exponent")
    negative = f"({xf} < {f(0)}) | (({xf} == {f(0)}) & (recip({xf}) < {f(0)}))"
    sign = ctx.let(f"{negative} ? {i(1)} : {i(0)}", "Sign")
    width = to.bits
    bits = ctx.let(f"({sign} << {i(width - 1)}) | (as_int({exp}, 64) << {i(mbits)}) | as_int({man}, 64)",
                   "Bits")
    return ctx.cast(bits, to)


@converter("BitCast")
def bitcast(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    to = onnx_dtype(ctx.attr("to"), f"{ctx.where}'s 'to'")
    if (x.dtype.bits if x.dtype is not DType.BOOL else 8) != to.bits:
        raise ctx.error(f"{x.dtype} and {to} differ in width")
    if x.dtype is to:
        return [ctx.let(f"ident({x})")]
    if not x.dtype.is_float and not to.is_float:
        return [ctx.cast(x, to)]  # integers wrap: the bits stay
    if to in _LAYOUT and not x.dtype.is_float:
        return [_float_from_bits(ctx, x, to)]
    if x.dtype in _LAYOUT and not to.is_float:
        return [_bits_from_float(ctx, x, to)]
    raise ctx.unsupported(f"a bit cast from {x.dtype} to {to}")
