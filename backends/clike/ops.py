"""Every elementwise builtin of ``tile.builtins`` as a C expression, with Tile's exact semantics.

``intrinsic(t, tmp, name, args, dt)`` mirrors ``ref_interp.elementwise`` (and the LLVM backend's
``intrinsics``): operands are converted to ``dt`` (comparisons: to the promotion of their declared
dtypes; ``cond``: the condition to bool), then

* integer ``+ - *`` wrap (computed in the unsigned type of the width); ``/`` truncates toward zero,
  ``x / 0`` is 0 and ``INT_MIN / -1`` wraps (neither reaches the C division, which would trap);
  ``mod`` is C's ``%`` (``x mod 0`` and ``x mod -1`` are 0 without reaching it) and ``fmod`` on floats;
* ``recip(x)`` is ``1 / x``, correctly rounded (``native_recip`` only where ``fast_math`` has one);
* float ``/`` is IEEE and correctly rounded (``CTarget.fdiv``); ``max``/``min`` propagate nan (the
  first operand's when both are nan); ``round`` is ``trunc(x) + (|x - trunc(x)| >= 0.5 ? sign : 0)``;
* shift counts are taken modulo the width; ``>>`` is arithmetic on signed types;
* float16 computes in float and rounds after every operation, ``sigmoid`` after every step;
* ``round_tf32`` converts to float and rounds its bits (``round_tf32``), exactly as the interpreter.

``tmp(expr, dt)`` binds an expression to a fresh variable (operands used more than once are bound
first, so each is evaluated once). Transcendental functions are the C library's (OpenCL's
built-ins). In strict mode (``t.contract`` off) a float16, bfloat16 or float32 one is the double
routine rounded once to the type, as the interpreter defines it (``ref_interp.libm``), which gives
its bits wherever the two double routines round alike (docs/semantics.md §8.3); otherwise the float
routine, within the platform's documented ulps.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from backends.clike.target import CTarget, Value, unsigned_of
from stripe.specials import CASTS, check_intrinsic
from tile.dtypes import DType, promote

Tmp = Callable[[str, DType], str]

CMP = {"cmp_eq": "==", "cmp_ne": "!=", "cmp_lt": "<", "cmp_gt": ">", "cmp_le": "<=", "cmp_ge": ">="}
_MIRROR = {"==": "==", "!=": "!=", "<": ">", ">": "<", "<=": ">=", ">=": "<="}
LIBM = ("exp", "log", "sin", "cos", "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan")
LIBM += ("asinh", "acosh", "atanh")
ARITH = ("add", "sub", "mul", "div", "neg", "abs", "relu", "max", "min")
BITS = ("bit_and", "bit_or", "bit_xor", "bit_not", "bit_left", "bit_right")
SUPPORTED = frozenset(
    {*CMP, *CASTS, *LIBM, *ARITH, *BITS, "sqrt", "floor", "ceil", "round", "sigmoid", "pow", "cond"}
    | {"mod", "recip", "round_tf32"}
)


def intrinsic(t: CTarget, tmp: Tmp, name: str, args: list[Value], dt: DType, where: str) -> str:
    """The C expression (a register of ``dt``) of builtin ``name`` applied to ``args``."""
    check_intrinsic(name, len(args), SUPPORTED, where)
    if name in CMP:
        return compare(t, CMP[name], args[0], args[1])
    if name == "cond":
        c = t.to(args[0], DType.BOOL)
        return f"({c} ? {t.to(args[1], dt)} : {t.to(args[2], dt)})"
    if name in CASTS:
        return t.to(args[0], dt)
    if name in ("bit_left", "bit_right"):
        work = DType.INT32 if dt is DType.BOOL else dt
        x = tmp(t.to(args[0], work), work)
        count = f"({t.to(args[1], work)} & {work.bits - 1})"
        if name == "bit_left":
            u = t.reg(unsigned_of(work))
            out = t.cast(work, f"(({u}){x} << {count})")
        else:
            out = t.cast(work, f"({x} >> {count})")
        return t.convert(out, work, dt)
    if name == "round_tf32":  # of its input converted to float32, whatever dt is
        x = _bound(t, tmp, args[0], DType.FLOAT32)
        return t.convert(round_tf32(t, tmp, x), DType.FLOAT32, dt)
    if dt is DType.BOOL and name in ("add", "sub", "mul", "div", "mod", "neg"):
        # not produced by Tile's typing (bool arithmetic is int32); as numpy: + is or, * is and
        inner = tmp(intrinsic(t, tmp, name, args, DType.INT32, where), DType.INT32)
        return t.convert(inner, DType.INT32, DType.BOOL)
    xs = [_bound(t, tmp, a, dt) for a in args]
    if name in ("add", "sub", "mul", "div", "max", "min"):
        return binary(t, name, xs[0], xs[1], dt)
    if name == "mod":
        return remainder(t, xs[0], xs[1], dt)
    if name in ("bit_and", "bit_or", "bit_xor"):
        op = {"bit_and": "&", "bit_or": "|", "bit_xor": "^"}[name]
        return t.cast(dt, f"({xs[0]} {op} {xs[1]})")
    x = xs[0]
    if name == "bit_not":
        return f"(!{x})" if dt is DType.BOOL else t.cast(dt, f"(~{x})")
    zero = t.literal(0, dt)
    if name == "neg":
        return f"(-{x})" if dt.is_float else _wrapping(t, f"{t.literal(0, dt)}", "-", x, dt)
    if name in ("abs", "relu"):
        if dt.is_float and name == "abs":
            return t.math("fabs", dt, [x])
        if dt is DType.BOOL or not dt.is_signed:
            return x
        below = _wrapping(t, zero, "-", x, dt) if name == "abs" else zero
        return f"({x} < {zero} ? {below} : {x})"
    if not dt.is_float:
        # a float builtin with an integer result type (never produced by Tile's typing):
        # computed in float64 and converted back
        wide = [t.convert(v, dt, DType.FLOAT64) for v in xs]
        out = tmp(float_fn(t, tmp, name, [tmp(w, DType.FLOAT64) for w in wide], DType.FLOAT64), DType.FLOAT64)
        return t.convert(out, DType.FLOAT64, dt)
    return float_fn(t, tmp, name, xs, dt)


def _bound(t: CTarget, tmp: Tmp, v: Value, dt: DType) -> str:
    expr = t.to(v, dt)
    return expr if v.const is not None or expr == v.expr else tmp(expr, dt)


def _wrapping(t: CTarget, x: str, op: str, y: str, dt: DType) -> str:
    """Integer ``x op y`` wrapping modulo 2**bits (no signed overflow, which C leaves undefined)."""
    u = t.reg(unsigned_of(dt))
    return t.cast(dt, f"(({u}){x} {op} ({u}){y})")


_FLOAT_REGS = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)  # held in a float register


def compare(t: CTarget, op: str, a: Value, b: Value) -> str:
    common = promote(a.declared, b.declared)
    if common is DType.FLOAT64:
        # a float32/float16 register against a double constant: decided in float, exactly, so a
        # float literal in a comparison needs no double arithmetic
        if b.const is not None and a.const is None and a.dtype in _FLOAT_REGS:
            return _float_vs_const(t, op, a.expr, float(b.const))
        if a.const is not None and b.const is None and b.dtype in _FLOAT_REGS:
            return _float_vs_const(t, _MIRROR[op], b.expr, float(a.const))
    return f"({t.to(a, common)} {op} {t.to(b, common)})"


def _float_vs_const(t: CTarget, op: str, x: str, c: float) -> str:
    """``x op c`` for a float register ``x`` and a double ``c``, in float arithmetic."""
    if c != c:
        return "1" if op == "!=" else "0"
    with np.errstate(over="ignore"):
        f = np.float32(c)
    if float(f) == c:
        return f"({x} {op} {t.float_literal(float(f), DType.FLOAT32)})"
    # c lies strictly between two adjacent floats lo < c < hi
    if float(f) < c:
        lo, hi = f, np.nextafter(f, np.float32(np.inf))
    else:
        lo, hi = np.nextafter(f, np.float32(-np.inf)), f
    if op in ("<", "<="):
        return f"({x} <= {t.float_literal(float(lo), DType.FLOAT32)})"
    if op in (">", ">="):
        return f"({x} >= {t.float_literal(float(hi), DType.FLOAT32)})"
    return "1" if op == "!=" else "0"


def binary(t: CTarget, op: str, x: str, y: str, dt: DType) -> str:
    """``add sub mul div max min`` of two register expressions of ``dt`` (also the aggregations'
    combine); ``x`` and ``y`` are variables or literals (they may be used more than once)."""
    if dt is DType.BOOL:
        if op in ("add", "max"):
            return f"({x} | {y})"
        if op in ("mul", "min"):
            return f"({x} & {y})"
    if op in ("max", "min"):
        keep = f"{x} {'>' if op == 'max' else '<'} {y}"
        if dt.is_float:
            # NaN wins: x when x is NaN, else y when the comparison fails (y NaN, y beyond x, or
            # equal: numpy's rule, max(-0.0, +0.0) is +0.0); one isnan, not two (a GPU max
            # reduction's loop is this select chain).
            return f"(({keep}) || {t.isnan(x)} ? {x} : {y})"
        return f"({keep} ? {x} : {y})"
    sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[op]
    if dt.is_float:
        work = DType.FLOAT32 if dt.is_narrow_float else dt
        out = t.fdiv(x, y, work) if op == "div" else f"({x} {sym} {y})"
        return t.narrow(out, dt)
    if op != "div":
        return _wrapping(t, x, sym, y, dt)
    zero = t.literal(0, dt)
    if not dt.is_signed:
        return f"({y} == {zero} ? {zero} : {t.cast(dt, f'({x} / {y})')})"
    neg = _wrapping(t, zero, "-", x, dt)
    return f"({y} == {zero} ? {zero} : {y} == {t.literal(-1, dt)} ? {neg} : {t.cast(dt, f'({x} / {y})')})"


def remainder(t: CTarget, x: str, y: str, dt: DType) -> str:
    """``mod`` of two register expressions of ``dt`` (variables or literals): the remainder of
    truncating division, with the sign of ``x``."""
    if dt.is_float:
        work = DType.FLOAT32 if dt.is_narrow_float else dt
        out = t.math("fmod", work, [x, y])
        return t.narrow(out, dt)
    zero = t.literal(0, dt)
    # x mod 0 is 0, and x mod -1 is 0 (INT_MIN % -1 would trap)
    trivial = f"{y} == {zero}" + (f" || {y} == {t.literal(-1, dt)}" if dt.is_signed else "")
    return f"({trivial} ? {zero} : {t.cast(dt, f'({x} % {y})')})"


def round_tf32(t: CTarget, tmp: Tmp, x: str) -> str:
    """The float variable (or literal) ``x`` rounded to TF32 on its bits, as
    ``tile.precision.round_tf32``: half a TF32 ulp (0x1000) added to the magnitude and the low 13
    bits dropped round to nearest, ties away from zero (a carry into the exponent is right, and
    past the largest finite value gives inf); nan and ±inf (exponent all ones) are kept."""
    bits = tmp(t.bits(x, DType.FLOAT32), DType.UINT32)
    rounded = t.float_of_bits(f"(({bits} + 0x1000u) & 0xffffe000u)")
    return f"(({bits} & 0x7f800000u) == 0x7f800000u ? {x} : {rounded})"


def float_fn(t: CTarget, tmp: Tmp, name: str, xs: list[str], dt: DType) -> str:
    """A float builtin on register expressions of float ``dt`` (float16, bfloat16: computed in
    float, rounded once per step)."""
    work = DType.FLOAT32 if dt.is_narrow_float else dt
    x = xs[0]

    def done(e: str) -> str:
        return t.narrow(e, dt)

    def fn(f: str, args: list[str]) -> str:
        """The platform's ``f`` rounded to ``dt``. Strict mode (no contraction) on a device with
        double: the double routine on the exact double arguments, rounded once, as the interpreter
        computes it (``ref_interp.libm``; docs/semantics.md §8.3); else the float one."""
        if not t.contract and t.fp64 and work is not DType.FLOAT64:
            wide = t.math(f, DType.FLOAT64, [t.convert(a, dt, DType.FLOAT64) for a in args])
            return t.convert(wide, DType.FLOAT64, dt)
        fast = t.native(f, work, args) if t.fast_math and work is DType.FLOAT32 else None
        return done(fast or t.math(f, work, args))

    if name == "sqrt":
        fast = t.native("sqrt", work, [x]) if t.fast_math and work is DType.FLOAT32 else None
        return done(fast or t.fsqrt(x, work))
    if name in ("floor", "ceil"):
        return t.math(name, work, [x])
    if name in LIBM or name == "pow":
        return fn(name, xs)
    one = t.literal(1, dt)
    if name == "recip":
        fast = t.native("recip", work, [x]) if t.fast_math and work is DType.FLOAT32 else None
        return done(fast or t.fdiv(one, x, work))
    if name == "sigmoid":
        e = tmp(fn("exp", [f"(-{x})"]), dt)
        s = tmp(done(f"({one} + {e})"), dt)
        return done(t.fdiv(one, s, work))
    assert name == "round", name
    zero = t.literal(0, dt)
    tr = tmp(t.math("trunc", work, [x]), dt)
    frac = t.math("fabs", work, [f"({x} - {tr})"])
    sign = f"({x} > {zero} ? {one} : {x} < {zero} ? {t.literal(-1, dt)} : {x})"
    return f"({tr} + ({frac} >= {t.literal(0.5, dt)} ? {sign} : {zero}))"
