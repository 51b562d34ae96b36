"""Every elementwise builtin of ``tile.builtins`` as LLVM IR, with Tile's exact semantics.

``emit_intrinsic(em, stmt, args)`` mirrors ``ref_interp.elementwise``: operands are converted to
the intrinsic's ``dtype`` (comparisons: to the promotion of their declared dtypes; ``cond``: the
condition to bool), then

* integer arithmetic wraps; integer ``/`` truncates toward zero, ``x / 0`` is 0 and
  ``INT_MIN / -1`` wraps (neither reaches ``sdiv``, which would trap); ``mod`` is ``srem``/``urem``
  with ``x mod 0`` and ``x mod -1`` 0 (neither reaches ``srem``), and ``frem`` (C's ``fmod``) on floats;
* ``recip(x)`` is ``1 / x``, IEEE;
* float ``/`` is IEEE; ``max``/``min`` propagate nan (the first operand's when both are nan);
* ``round`` is numpy's ``trunc(x) + (|x - trunc(x)| >= 0.5 ? sign(x) : 0)`` (half away from zero);
* shift counts are taken modulo the width; ``>>`` is arithmetic on signed types;
* float functions call the C library: in strict mode (``em.strict``) the double routine (``exp``)
  for every float type, its result rounded once to the type, which is how the interpreter defines
  them (``ref_interp.libm``, §8.3); otherwise ``expf`` for float32, float16 and bfloat16 (``exp``
  for float64), except float32/float16 ``exp``, ``tanh`` and ``log`` (``em.inline_math``): inline
  code of ``vmath`` that vectorizes, within 1 ulp (§8.3); other float16 operations compute in
  float and round once, as numpy does, and ``sigmoid`` is ``1 / (1 + exp(-x))`` rounded after
  every step, as the interpreter evaluates it;
* ``round_tf32`` converts to float and rounds its bits (``round_tf32``), exactly as the interpreter.
"""

from __future__ import annotations

from llvmlite import ir

from backends.llvm import vmath
from backends.llvm.scalars import F32, F64, I32, Emitter, Scalar
from stripe.specials import CASTS, check_intrinsic
from tile.dtypes import DType, promote

_CMP = {"cmp_eq": "==", "cmp_ne": "!=", "cmp_lt": "<", "cmp_gt": ">", "cmp_le": "<=", "cmp_ge": ">="}
# the C library functions, by builtin (float32 and float16 use the ``f`` suffixed one)
_LIBM = {
    "exp": "exp",
    "log": "log",
    "sin": "sin",
    "cos": "cos",
    "tan": "tan",
    "sinh": "sinh",
    "cosh": "cosh",
    "tanh": "tanh",
    "asin": "asin",
    "acos": "acos",
    "atan": "atan",
    "asinh": "asinh",
    "acosh": "acosh",
    "atanh": "atanh",
}
_LLVM_UNARY = {"sqrt": "llvm.sqrt", "floor": "llvm.floor", "ceil": "llvm.ceil"}
# the builtins computed by a function of tens of operations a value (libm's, ``vmath``'s, ``pow``)
TRANSCENDENTAL = frozenset(_LIBM) | {"pow", "sigmoid"}
SUPPORTED = frozenset(
    {*_CMP, *CASTS, *_LIBM, *_LLVM_UNARY, "round", "sigmoid", "pow", "cond", "bit_left", "bit_right"}
    | {"mod", "recip", "round_tf32"}
    | {"add", "sub", "mul", "div", "neg", "abs", "relu", "max", "min", "bit_and", "bit_or", "bit_xor"}
    | {"bit_not"}
)


def emit_intrinsic(em: Emitter, name: str, args: list[Scalar], dt: DType, where: str) -> ir.Value:
    """The value (a register of ``dt``) of builtin ``name`` applied to ``args``."""
    check_intrinsic(name, len(args), SUPPORTED, where)
    b = em.builder
    if name in _CMP:
        common = promote(args[0].declared, args[1].declared)
        x, y = (em.to(a, common) for a in args)
        return compare(em, _CMP[name], x, y, common)
    if name == "cond":
        c = em.to(args[0], DType.BOOL)
        return b.select(c, em.to(args[1], dt), em.to(args[2], dt))
    if name in CASTS:
        return em.to(args[0], dt)
    if name in ("bit_left", "bit_right"):
        work = DType.INT32 if dt is DType.BOOL else dt
        x = em.to(args[0], work)
        count = b.and_(em.to(args[1], work), em.const(work.bits - 1, work))
        if name == "bit_left":
            out = b.shl(x, count)
        else:
            out = b.ashr(x, count) if work.is_signed else b.lshr(x, count)
        return em.convert(out, work, dt)
    if name == "round_tf32":  # of its input converted to float32, whatever dt is
        return em.convert(round_tf32(em, em.to(args[0], DType.FLOAT32)), DType.FLOAT32, dt)
    if dt is DType.BOOL and name in ("add", "sub", "mul", "div", "mod", "neg"):
        # not produced by Tile's typing (bool arithmetic is int32); as numpy: + is or, * is and
        inner = emit_intrinsic(em, name, args, DType.INT32, where)
        return em.convert(inner, DType.INT32, DType.BOOL)
    xs = [em.to(a, dt) for a in args]
    if name in ("add", "sub", "mul", "div", "max", "min"):
        return binary(em, name, xs[0], xs[1], dt)
    if name == "mod":
        return remainder(em, xs[0], xs[1], dt)
    if name in ("bit_and", "bit_or", "bit_xor"):
        return {"bit_and": b.and_, "bit_or": b.or_, "bit_xor": b.xor}[name](xs[0], xs[1])
    if name == "bit_not":
        return b.not_(xs[0])
    x = xs[0]
    if name == "neg":
        return b.fneg(x) if dt.is_float else b.sub(em.zero(dt), x)
    if name == "abs":
        if dt.is_float:
            return em.unary_intrinsic("llvm.fabs", x)
        if dt is DType.BOOL or not dt.is_signed:
            return x
        return b.select(b.icmp_signed("<", x, em.zero(dt)), b.sub(em.zero(dt), x), x)
    if name == "relu":
        if dt.is_float:
            return b.select(b.fcmp_ordered("<", x, em.zero(dt)), em.zero(dt), x)
        if dt is DType.BOOL or not dt.is_signed:
            return x
        return b.select(b.icmp_signed("<", x, em.zero(dt)), em.zero(dt), x)
    if not dt.is_float:
        # a float builtin with an integer result type (never produced by Tile's typing):
        # compute in float64 and convert back
        out = float_fn(em, name, [em.convert(v, dt, DType.FLOAT64) for v in xs], DType.FLOAT64)
        return em.convert(out, DType.FLOAT64, dt)
    return float_fn(em, name, xs, dt)


def compare(em: Emitter, op: str, x: ir.Value, y: ir.Value, dt: DType) -> ir.Value:
    b = em.builder
    if dt.is_float:
        return b.fcmp_unordered(op, x, y) if op == "!=" else b.fcmp_ordered(op, x, y)
    if dt.is_signed:
        return b.icmp_signed(op, x, y)
    return b.icmp_unsigned(op, x, y)  # unsigned and bool (False < True)


def binary(em: Emitter, op: str, x: ir.Value, y: ir.Value, dt: DType) -> ir.Value:
    """``add sub mul div max min`` of two registers of ``dt`` (also the aggregations' combine)."""
    b = em.builder
    if dt is DType.BOOL:
        if op in ("add", "max"):
            return b.or_(x, y)
        if op in ("mul", "min"):
            return b.and_(x, y)
    if op in ("max", "min"):
        if dt.is_float:
            # numpy's rule: x if x is nan, else x if x > y (max), else y. So a nan y wins over
            # a number x (the comparison is false), x wins when both are nan, and y when they
            # tie (max(-0.0, +0.0) is +0.0): the later value of an aggregation. The inner
            # select is x86's maxps/minps exactly, so a lane costs a max, a compare and a blend.
            out = b.select(b.fcmp_ordered(">" if op == "max" else "<", x, y), x, y)
            return b.select(b.fcmp_unordered("uno", x, x), x, out)
        pick = compare(em, ">=" if op == "max" else "<=", x, y, dt)
        return b.select(pick, x, y)
    if dt.is_float:
        fn = {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv}[op]
        out = fn(x, y)
        return em.narrow(out, dt)
    if op != "div":
        return {"add": b.add, "sub": b.sub, "mul": b.mul}[op](x, y)
    zero = em.zero(dt)
    y_zero = b.icmp_unsigned("==", y, zero)
    if not dt.is_signed:
        q = b.udiv(x, b.select(y_zero, em.const(1, dt), y))
        return b.select(y_zero, zero, q)
    minus_one = b.icmp_signed("==", y, em.const(-1, dt))
    q = b.sdiv(x, b.select(b.or_(y_zero, minus_one), em.const(1, dt), y))
    return b.select(y_zero, zero, b.select(minus_one, b.sub(zero, x), q))


def unordered_minmax(em: Emitter, op: str, x: ir.Value, y: ir.Value) -> ir.Value:
    """Float ``max``/``min`` for aggregations that may run in any order (§8.3): LLVM's
    ``maximum``/``minimum`` propagate nan, and a tie of zeros gives either (``nsz``), so the result
    is the value of one order of the aggregation, and the loop vectorizer widens them as
    reductions, which it does not do for ``binary``'s order-keeping select."""
    suffix = "f64" if x.type == F64 else "f32"
    fn = em.declare(f"llvm.{op}imum.{suffix}", x.type, [x.type, x.type])
    # nsz: either zero may come out of a tie, as in some order (saves two blends a vector)
    return em.builder.call(fn, [x, y], fastmath=("nsz",))


def remainder(em: Emitter, x: ir.Value, y: ir.Value, dt: DType) -> ir.Value:
    """``mod``: the remainder of truncating division, with the sign of ``x``."""
    b = em.builder
    if dt.is_float:
        out = b.frem(x, y)
        return em.narrow(out, dt)
    zero = em.zero(dt)
    # x mod 0 is 0, and x mod -1 is 0 (INT_MIN srem -1 would trap): both divide by 1 instead
    trivial = b.icmp_unsigned("==", y, zero)
    if dt.is_signed:
        trivial = b.or_(trivial, b.icmp_signed("==", y, em.const(-1, dt)))
    safe = b.select(trivial, em.const(1, dt), y)
    return b.srem(x, safe) if dt.is_signed else b.urem(x, safe)


def round_tf32(em: Emitter, x: ir.Value) -> ir.Value:
    """A float register rounded to TF32 on its bits, as ``tile.precision.round_tf32``: half a TF32
    ulp (0x1000) added to the magnitude and the low 13 bits dropped round to nearest, ties away
    from zero (a carry into the exponent is right, and past the largest finite value gives inf);
    nan and ±inf (exponent all ones) are kept. Integer operations and a select: it vectorizes."""
    b = em.builder
    bits = b.bitcast(x, I32)
    exp_mask = em.const(0x7F800000, DType.UINT32)
    special = b.icmp_unsigned("==", b.and_(bits, exp_mask), exp_mask)
    rounded = b.and_(b.add(bits, em.const(0x1000, DType.UINT32)), em.const(0xFFFFE000, DType.UINT32))
    return b.bitcast(b.select(special, bits, rounded), F32)


def float_fn(em: Emitter, name: str, xs: list[ir.Value], dt: DType) -> ir.Value:
    """A float builtin on registers of float ``dt`` (float16: computed in float, rounded once)."""
    b = em.builder
    x = xs[0]
    def done(v: ir.Value) -> ir.Value:
        return em.narrow(v, dt)

    if name in _LLVM_UNARY:
        return done(em.unary_intrinsic(_LLVM_UNARY[name], x))
    if name in vmath.SUPPORTED and em.inline_math and x.type == F32:
        return done(vmath.emit(em, name, x))
    if name in _LIBM or name == "pow":
        return elementary(em, _LIBM.get(name, name), xs, dt)
    if name == "recip":
        return done(b.fdiv(em.const(1, dt), x))
    if name == "sigmoid":
        one = em.const(1, dt)
        e = float_fn(em, "exp", [b.fneg(x)], dt)
        return done(b.fdiv(one, done(b.fadd(one, e))))
    assert name == "round", name
    t = em.unary_intrinsic("llvm.trunc", x)
    frac = em.unary_intrinsic("llvm.fabs", b.fsub(x, t))
    one, zero = em.const(1, dt), em.zero(dt)
    sign = b.select(b.fcmp_ordered(">", x, zero), one, b.select(b.fcmp_ordered("<", x, zero), b.fneg(one), x))
    step = b.select(b.fcmp_ordered(">=", frac, em.const(0.5, dt)), sign, zero)
    return done(b.fadd(t, step))


def elementary(em: Emitter, fn: str, xs: list[ir.Value], dt: DType) -> ir.Value:
    """The C library's ``fn`` of float registers of float ``dt``, rounded to ``dt``. Strict mode
    calls the double routine on the exact double arguments and rounds its result once, as the
    interpreter does (``ref_interp.libm``, the same routine of the same process): the interpreter's
    bits for every float type. Otherwise float32, float16 and bfloat16 call the float routine
    (``expf``), and float16/bfloat16 round its result again."""
    if em.strict and xs[0].type == F32:
        wide = libm(em, fn, [em.builder.fpext(x, F64) for x in xs])
        return em.convert(wide, DType.FLOAT64, dt)
    return em.narrow(libm(em, fn, xs), dt)


def libm(em: Emitter, fn: str, args: list[ir.Value]) -> ir.Value:
    typ = args[0].type
    name = fn if typ == F64 else f"{fn}f"
    assert typ in (F32, F64)
    return em.call(name, typ, args)
