"""float32 ``exp``, ``tanh`` and ``log`` as straight-line LLVM IR the loop vectorizer can widen.

A libm call per element keeps a loop scalar; these inline helpers compute in double precision
(each step's relative error near 2^-52, the polynomials' truncation below 2^-40) and round to
float once, so a result is the correctly rounded value except when the exact one lies within
about 2^-16 ulp of a rounding boundary, and then one ulp away: always within 1 ulp
(docs/semantics.md §8.3), as glibc's ``expf``/``tanhf``/``logf`` are. Edge cases follow IEEE
and numpy: overflow to inf, underflow through the subnormals (one rounding, from double) to 0,
``exp(-inf) = 0``, ``tanh(±inf) = ±1``, ``tanh(-0) = -0``, ``log(0) = -inf``, ``log(x < 0)``
and nan give nan. Used outside strict mode only (``Emitter.inline_math``); strict keeps libm.

Method: ``exp(y) = 2^n * e^r`` with ``n = rint(y / ln 2)``, ``r = y - n ln 2`` (two-part ln 2,
so ``n * LN2_HI`` is exact), ``|r| <= 0.35``, ``e^r - 1`` by its Taylor series to degree 10;
``tanh(x) = copysign(m / (m + 2), x)`` with ``m = expm1(2|x|)`` (no cancellation near 0);
``log(x) = e ln 2 + 2 atanh(s)``, ``x = f 2^e`` with ``f`` in [sqrt(1/2), sqrt(2)),
``s = (f - 1) / (f + 1)``, ``|s| <= 0.172``, the odd series of ``atanh`` to ``s^21``.
"""

from __future__ import annotations

import math

from llvmlite import ir

from backends.llvm.scalars import F32, F64, I32, I64, Emitter

SUPPORTED = frozenset({"exp", "tanh", "log"})

_LN2_HI = 6.93147180369123816490e-01  # 0x3FE62E42FEE00000: n * _LN2_HI is exact for |n| < 2^11
_LN2_LO = 1.90821492927058770002e-10
_CLAMP = 200.0  # exp(±200) is far outside float's range but inside double's: inf and 0 after rounding


def _d(v: float) -> ir.Constant:
    return ir.Constant(F64, v)


def _expm1_parts(em: Emitter, b: ir.IRBuilder, y: ir.Value) -> tuple[ir.Value, ir.Value]:
    """``(q, scale)`` with ``exp(y) = scale * (1 + q)``, ``scale = 2^n`` (``y`` finite, |y| <= 200)."""
    n = em.unary_intrinsic("llvm.rint", b.fmul(y, _d(1 / math.log(2))))
    r = b.fsub(b.fsub(y, b.fmul(n, _d(_LN2_HI))), b.fmul(n, _d(_LN2_LO)))
    q = _d(1 / math.factorial(10))
    for k in range(9, 0, -1):
        q = _muladd(em, q, r, _d(1 / math.factorial(k)))
    q = b.fmul(q, r)
    bits = b.shl(b.add(b.fptosi(n, I64), ir.Constant(I64, 1023)), ir.Constant(I64, 52))
    return q, b.bitcast(bits, F64)


def _muladd(em: Emitter, a: ir.Value, x: ir.Value, c: ir.Value) -> ir.Value:
    """``a * x + c``, fused where the host has fma (the error bounds hold either way)."""
    return em.call("llvm.fmuladd.f64", F64, [a, x, c])


def _finite(b: ir.IRBuilder, y: ir.Value) -> ir.Value:
    """``y`` clamped to [-200, 200], nan replaced by 0 (its result is chosen apart)."""
    y = b.select(b.fcmp_ordered(">", y, _d(_CLAMP)), _d(_CLAMP), y)
    y = b.select(b.fcmp_ordered("<", y, _d(-_CLAMP)), _d(-_CLAMP), y)
    return b.select(b.fcmp_unordered("uno", y, y), _d(0.0), y)


def _exp(em: Emitter, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    d = b.fpext(x, F64)
    q, scale = _expm1_parts(em, b, _finite(b, d))
    out = b.fptrunc(b.fmul(b.fadd(q, _d(1.0)), scale), F32)
    return b.select(b.fcmp_unordered("uno", x, x), x, out)


def _tanh(em: Emitter, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    y = _finite(b, b.fmul(em.unary_intrinsic("llvm.fabs", b.fpext(x, F64)), _d(2.0)))
    q, scale = _expm1_parts(em, b, y)
    m = b.fadd(b.fmul(q, scale), b.fsub(scale, _d(1.0)))  # expm1(y): exactly q when n = 0
    t = b.fptrunc(b.fdiv(m, b.fadd(m, _d(2.0))), F32)
    sign = b.and_(b.bitcast(x, I32), ir.Constant(I32, -(1 << 31)))
    out = b.bitcast(b.or_(b.bitcast(t, I32), sign), F32)  # t >= 0: copysign(t, x)
    return b.select(b.fcmp_unordered("uno", x, x), x, out)


def _log(em: Emitter, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    d = b.fpext(x, F64)  # float subnormals are normal doubles
    bits = b.bitcast(d, I64)
    c = lambda n: ir.Constant(I64, n)  # noqa: E731
    # f = mantissa scaled into [sqrt(1/2), sqrt(2)): bias the exponent by sqrt(2)'s mantissa bits
    shifted = b.add(bits, c(0x3FF0000000000000 - 0x3FE6A09E667F3BCD))
    e = b.sub(b.ashr(shifted, c(52)), c(0x3FF))
    fbits = b.add(b.and_(shifted, c((1 << 52) - 1)), c(0x3FE6A09E667F3BCD))
    f = b.bitcast(fbits, F64)
    s = b.fdiv(b.fsub(f, _d(1.0)), b.fadd(f, _d(1.0)))
    s2 = b.fmul(s, s)
    p = _d(1 / 21)
    for k in range(19, 0, -2):
        p = _muladd(em, p, s2, _d(1 / k))
    ef = b.sitofp(e, F64)
    out = b.fadd(b.fmul(ef, _d(_LN2_LO)), b.fmul(_d(2.0), b.fmul(s, p)))
    out = b.fptrunc(b.fadd(b.fmul(ef, _d(_LN2_HI)), out), F32)
    zero = ir.Constant(F32, 0.0)
    out = b.select(b.fcmp_ordered("==", x, ir.Constant(F32, math.inf)), x, out)
    out = b.select(b.fcmp_ordered("==", x, zero), ir.Constant(F32, -math.inf), out)
    out = b.select(b.fcmp_ordered("<", x, zero), ir.Constant(F32, math.nan), out)
    return b.select(b.fcmp_unordered("uno", x, x), x, out)


_BODIES = {"exp": _exp, "tanh": _tanh, "log": _log}


def emit(em: Emitter, name: str, x: ir.Value) -> ir.Value:
    """``name`` (one of ``SUPPORTED``) of the float register ``x``, through an always-inlined helper."""
    assert x.type == F32 and name in SUPPORTED, (name, x.type)

    def body(b: ir.IRBuilder, fn: ir.Function) -> None:
        saved = em.builder
        em.builder = b
        try:
            b.ret(_BODIES[name](em, b, fn.args[0]))
        finally:
            em.builder = saved

    return em.builder.call(em._helper(f"tile.v{name}f", F32, [F32], body), [x])
