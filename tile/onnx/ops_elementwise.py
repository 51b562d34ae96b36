"""Elementwise converters: math, activations, comparisons, logic, bit operations, casts, Where, Clip.

ONNX broadcasts multidirectionally, as Tile's elementwise statements do (numpy's rule), so a
binary operator is one statement. Literals are written in the operand's type (``ctx.lit``), so a
float16 tensor times a constant stays float16.
"""

from __future__ import annotations

import functools
import math

import tile.ops
from tile.dtypes import DType
from tile.onnx.context import Context, Value
from tile.onnx.layout import from_last, last_of
from tile.onnx.panels import from_panels, panel_of
from tile.onnx.registry import converter
from tile.ops._build import function
from tile.ops.activation import erf_lines

_UNARY = {
    "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Sin": "sin", "Cos": "cos", "Tan": "tan", "Sinh": "sinh",
    "Cosh": "cosh", "Tanh": "tanh", "Asin": "asin", "Acos": "acos", "Atan": "atan", "Asinh": "asinh",
    "Acosh": "acosh", "Atanh": "atanh", "Sigmoid": "sigmoid", "Floor": "floor", "Ceil": "ceil",
    "Reciprocal": "recip", "Abs": "abs", "Relu": "relu",
}


def _float_only(ctx: Context, v: Value) -> None:
    if not v.dtype.is_float:
        raise ctx.unsupported(f"{ctx.node.op_type} of {v.dtype} is not supported (float types only)")


@converter(*_UNARY)
def unary(ctx: Context, node) -> list[Value]:
    """An activation of a convolution's output is computed on its channels-last copy (``layout``),
    where it fuses into the convolution's kernel, and permuted back only if something reads that."""
    x = ctx.input(0)
    last = last_of(ctx, x)
    if last is not None:
        return [from_last(ctx, _unary(ctx, last, _UNARY[node.op_type]), node.op_type)]
    panels = panel_of(ctx, x)  # a panel-major product's output: the activation on its panels
    if panels is not None:
        return [from_panels(ctx, _unary(ctx, panels, _UNARY[node.op_type]), node.op_type)]
    return [_unary(ctx, x, _UNARY[node.op_type])]


def _unary(ctx: Context, x: Value, fn: str) -> Value:
    if fn in ("abs", "relu"):
        return ctx.let(f"{fn}({x})")
    if fn in ("floor", "ceil") and not x.dtype.is_float:
        return ctx.let(f"ident({x})")
    return ctx.cast(ctx.let(f"{fn}({x})"), x.dtype)


@converter("Neg")
def neg(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    return [ctx.cast(ctx.let(f"-{x}"), x.dtype)]


@converter("Identity")
def identity(ctx: Context, node) -> list[Value]:
    x = ctx.raw(0)
    return [x if x.name is None else ctx.let(f"ident({x})")]


_BINARY = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/"}


@converter(*_BINARY)
def arithmetic(ctx: Context, node) -> list[Value]:
    """A 0-D constant operand (an exporter's scale, ``x / sqrt(d)``) is written as a literal of
    its type: as a tensor it would be a kernel of its own on a compiled target, each call."""
    a = ctx.raw(0)
    op = _BINARY[node.op_type]
    if a.dtype is DType.BOOL:
        raise ctx.unsupported("arithmetic on bool is not an ONNX operation")
    return [ctx.cast(ctx.let(f"{_operand(ctx, 0)} {op} {_operand(ctx, 1)}"), a.dtype)]


def _operand(ctx: Context, i: int) -> str:
    """Input ``i`` as Tile text: a literal for a 0-D constant (of any type but bfloat16, whose
    literal is a conversion), else the tensor's name."""
    v = ctx.raw(i)
    if v.const is not None and v.rank == 0 and v.dtype is not DType.BFLOAT16:
        return ctx.lit(v.const.item(), v.dtype)
    return ctx.input(i).name


@converter("Pow")
def power(ctx: Context, node) -> list[Value]:
    a, b = ctx.input(0), ctx.input(1)
    if not a.dtype.is_float and b.dtype.is_float:
        b = ctx.cast(b, DType.FLOAT64)
    return [ctx.cast(ctx.let(f"pow({a}, {b})"), a.dtype)]


@converter("Mod")
def modulo(ctx: Context, node) -> list[Value]:
    a, b = ctx.input(0), ctx.input(1)
    r = ctx.let(f"mod({a}, {b})")
    if ctx.attr("fmod", 0) or not a.dtype.is_signed:
        return [ctx.cast(r, a.dtype)]
    zero = ctx.lit(0, r.dtype)
    # Python's rule: the remainder takes the divisor's sign
    fix = f"({r} != {zero}) & (({r} < {zero}) != ({b} < {zero}))"
    return [ctx.cast(ctx.let(f"{fix} ? {r} + {b} : {r}"), a.dtype)]


def _fold_variadic(ctx: Context, fn: str) -> Value:
    vals = ctx.inputs()
    acc = vals[0]
    for v in vals[1:]:
        acc = ctx.let(fn.format(acc, v))
    return acc


@converter("Sum", "Mean", "Max", "Min")
def variadic(ctx: Context, node) -> list[Value]:
    first = ctx.input(0)
    fn = {"Sum": "{} + {}", "Mean": "{} + {}", "Max": "max({}, {})", "Min": "min({}, {})"}[node.op_type]
    acc = _fold_variadic(ctx, fn)
    if len(node.input) == 1:
        acc = ctx.let(f"ident({acc})")
    if node.op_type == "Mean":
        acc = ctx.let(f"{acc} / {ctx.lit(len(node.input), first.dtype)}")
    return [ctx.cast(acc, first.dtype)]


_COMPARE = {"Equal": "==", "Less": "<", "Greater": ">", "LessOrEqual": "<=", "GreaterOrEqual": ">="}


@converter(*_COMPARE)
def compare(ctx: Context, node) -> list[Value]:
    a, b = ctx.input(0), ctx.input(1)
    return [ctx.let(f"{a} {_COMPARE[node.op_type]} {b}")]


_LOGIC = {"And": "&", "Or": "|", "Xor": "^", "BitwiseAnd": "&", "BitwiseOr": "|", "BitwiseXor": "^"}


@converter(*_LOGIC)
def logic(ctx: Context, node) -> list[Value]:
    a, b = ctx.input(0), ctx.input(1)
    return [ctx.cast(ctx.let(f"{a} {_LOGIC[node.op_type]} {b}"), a.dtype)]


@converter("Not", "BitwiseNot")
def invert(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    return [ctx.let(f"~{x}")]


@converter("BitShift")
def shift(ctx: Context, node) -> list[Value]:
    """Counts outside ``0 .. width-1`` give 0 (-1 for a negative value shifted right), where Tile
    takes the count modulo the width."""
    a, b = ctx.input(0), ctx.input(1)
    op = {"LEFT": "<<", "RIGHT": ">>"}[ctx.attr("direction")]
    y = ctx.cast(ctx.let(f"{a} {op} {b}"), a.dtype)
    zero, width = ctx.lit(0, b.dtype), ctx.lit(a.dtype.bits, b.dtype)
    outside = f"({b} >= {width})" + (f" | ({b} < {zero})" if b.dtype.is_signed else "")
    fill = ctx.lit(0, a.dtype)
    if op == ">>" and a.dtype.is_signed:
        fill = f"({a} < {ctx.lit(0, a.dtype)} ? {ctx.lit(-1, a.dtype)} : {ctx.lit(0, a.dtype)})"
    return [ctx.cast(ctx.let(f"{outside} ? {fill} : {y}", "BitShift"), a.dtype)]


@converter("Where")
def where(ctx: Context, node) -> list[Value]:
    c, a, b = ctx.input(0), ctx.input(1), ctx.input(2)
    return [ctx.cast(ctx.let(f"{c} ? {a} : {b}"), a.dtype)]


@converter("Clip")
def clip(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    if ctx.opset < 11:
        lo, hi = ctx.attr("min", None), ctx.attr("max", None)
        lo = None if lo is None else ctx.lit(lo, x.dtype)
        hi = None if hi is None else ctx.lit(hi, x.dtype)
    else:
        lo = ctx.input(1).name if ctx.has(1) else None
        hi = ctx.input(2).name if ctx.has(2) else None
    y = x
    if lo is not None:
        y = ctx.let(f"{y} < {lo} ? {lo} : {y}")
    if hi is not None:
        y = ctx.let(f"{y} > {hi} ? {hi} : {y}")
    return [ctx.cast(y if y is not x else ctx.let(f"ident({x})"), x.dtype)]


@converter("Sign")
def sign(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    one, zero = ctx.lit(1, x.dtype), ctx.lit(0, x.dtype)
    neg = ctx.lit(-1, x.dtype) if x.dtype.is_signed else zero
    y = ctx.let(f"{x} > {zero} ? {one} : {x} < {zero} ? {neg} : {zero}")
    if x.dtype.is_float:
        y = ctx.let(f"{x} != {x} ? {x} : {y}")
    return [y]


def round_half_even(ctx: Context, x: Value) -> Value:
    """Halves to even (numpy's rule); Tile's ``round`` takes them away from zero."""
    half, two = ctx.lit(0.5, x.dtype), ctx.lit(2, x.dtype)
    frac = ctx.let(f"{x} - floor({x})")
    return ctx.let(f"{frac} == {half} ? {two} * round({x} * {half}) : round({x})", "Round")


@converter("Round")
def round_node(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    _float_only(ctx, x)
    return [ctx.cast(round_half_even(ctx, x), x.dtype)]


@converter("IsNaN")
def isnan(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    return [ctx.let(f"{x} != {x}")]


@converter("IsInf")
def isinf(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    inf = ctx.lit(math.inf, x.dtype)
    pos, neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    terms = ([f"({x} == {inf})"] if pos else []) + ([f"({x} == -{inf})"] if neg else [])
    return [ctx.let(" | ".join(terms) if terms else f"{x} != {x} & {x} == {x}")]


# ------------------------------------------------------------------ activations
def _act(ctx: Context, template: str, **attrs) -> list[Value]:
    """One elementwise statement over input ``{x}``; attributes become literals of x's type."""
    x = ctx.input(0)
    _float_only(ctx, x)
    lits = {k: ctx.lit(ctx.attr(k, d), x.dtype) for k, d in attrs.items()}
    lits.update(zero=ctx.lit(0, x.dtype), one=ctx.lit(1, x.dtype))
    return [ctx.cast(ctx.let(template.format(x=x, **lits)), x.dtype)]


@converter("LeakyRelu")
def leaky_relu(ctx, node):
    return _act(ctx, "{x} < {zero} ? {x} * {alpha} : {x}", alpha=0.01)


@converter("Elu")
def elu(ctx, node):
    return _act(ctx, "{x} < {zero} ? {alpha} * (exp({x}) - {one}) : {x}", alpha=1.0)


@converter("Selu")
def selu(ctx, node):
    return _act(ctx, "{x} <= {zero} ? {gamma} * ({alpha} * exp({x}) - {alpha}) : {gamma} * {x}",
                alpha=1.67326319217681884765625, gamma=1.05070102214813232421875)


@converter("Celu")
def celu(ctx, node):
    return _act(ctx, "max({zero}, {x}) + min({zero}, {alpha} * (exp({x} / {alpha}) - {one}))", alpha=1.0)


@converter("HardSigmoid")
def hard_sigmoid(ctx, node):
    return _act(ctx, "max({zero}, min({one}, {alpha} * {x} + {beta}))", alpha=0.2, beta=0.5)


@converter("HardSwish")
def hard_swish(ctx, node):
    x = ctx.input(0)
    sixth, half = ctx.lit(1 / 6, x.dtype), ctx.lit(0.5, x.dtype)
    return _act(ctx, "{x} * max({zero}, min({one}, {x} * " + sixth + " + " + half + "))")


@converter("ThresholdedRelu")
def thresholded_relu(ctx, node):
    return _act(ctx, "{x} > {alpha} ? {x} : {zero}", alpha=1.0)


@converter("Softplus")
def softplus(ctx, node):
    return _act(ctx, "log(exp({x}) + {one})")


@converter("Softsign")
def softsign(ctx, node):
    return _act(ctx, "{x} / ({one} + abs({x}))")


@converter("Mish")
def mish(ctx, node):
    return _act(ctx, "{x} * tanh(log({one} + exp({x})))")


@converter("Shrink")
def shrink(ctx, node):
    x = ctx.input(0)
    lam, bias = ctx.attr("lambd", 0.5), ctx.attr("bias", 0.0)
    lo, hi, bb = ctx.lit(-lam, x.dtype), ctx.lit(lam, x.dtype), ctx.lit(bias, x.dtype)
    zero = ctx.lit(0, x.dtype)
    return [ctx.cast(ctx.let(f"{x} < {lo} ? {x} + {bb} : {x} > {hi} ? {x} - {bb} : {zero}"), x.dtype)]


@converter("PRelu")
def prelu(ctx, node):
    x, slope = ctx.input(0), ctx.input(1)
    zero = ctx.lit(0, x.dtype)
    return [ctx.cast(ctx.let(f"{x} < {zero} ? {x} * {slope} : {x}"), x.dtype)]


@converter("Erf")
def erf(ctx, node):
    """float64 takes ``tile.ops.erf``; narrower types its ``narrow`` fits, the same float32 results
    in 26 polynomial steps instead of 66 (the exact GELU of bench.onnx_models' transformer spent a
    fifth of its time here)."""
    x = ctx.input(0)
    _float_only(ctx, x)
    source = tile.ops.erf() if x.dtype is DType.FLOAT64 else _narrow_erf()
    return [ctx.cast(ctx.call(source, x)[0], x.dtype)]


@functools.cache
def _narrow_erf() -> str:
    return function(["X"], ["Y"], erf_lines("X", "Y", narrow=True))


@converter("Gelu")
def gelu(ctx, node):
    x = ctx.input(0)
    _float_only(ctx, x)
    approximate = ctx.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.unsupported(f"approximate='{approximate}'")
    return [ctx.cast(ctx.call(tile.ops.gelu(approximate), x)[0], x.dtype)]
