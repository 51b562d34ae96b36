"""float32 ``exp``, ``tanh`` and ``log`` as straight-line LLVM IR the loop vectorizer can widen.

A libm call per element keeps a loop scalar; ``tanh`` and ``log`` compute in double precision
(each step's relative error near 2^-52, the polynomials' truncation below 2^-40) and round to
float once, so a result is the correctly rounded value except when the exact one lies within
about 2^-16 ulp of a rounding boundary, and then one ulp away. ``exp`` computes in float32 (twice
the lanes a vector, no conversions; the softmax's ``exp(x - max)`` 0.05 -> 0.025 ms for 65,536
floats): its error before the last rounding stays below about 0.3 ulp, so a result is within 1 ulp
of the correctly rounded one (every float32 input checked: 0.1% are 1 ulp away, the rest correctly
rounded; subnormal results round twice, still within 1 ulp). All are within 1 ulp
(docs/semantics.md §8.3), as glibc's ``expf``/``tanhf``/``logf`` are. Edge cases follow IEEE
and numpy: overflow to inf, underflow through the subnormals (one rounding, from double) to 0,
``exp(-inf) = 0``, ``tanh(±inf) = ±1``, ``tanh(-0) = -0``, ``log(0) = -inf``, ``log(x < 0)``
and nan give nan. Used outside strict mode only (``Emitter.inline_math``); strict keeps libm.

Method: ``exp(y) = 2^n * e^r`` with ``n = rint(y / ln 2)``, ``r = y - n ln 2`` (two-part ln 2,
so ``n * LN2_HI`` is exact), ``|r| <= 0.35``, ``e^r - 1`` by its Taylor series to degree 10 (for
``tanh``; float32 ``exp``: ``_exp``'s docstring);
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
# float32 exp: inputs clamped to [-104, 89] (exp(-104) rounds to 0, exp(89) to inf; n in [-150, 128]);
# ln 2 as a 16-bit head (0x3F317200) and its float tail; S(r) = (e^r - 1 - r) / r^2 on |r| <= ln(2)/2
# interpolated at 6 Chebyshev nodes (mpmath, 40 digits): e^r within 2.2e-10 relative (2^-32)
_EXP_LO, _EXP_HI = -104.0, 89.0
_LN2_HI_F = 0.693145751953125
_LN2_LO_F = 1.428606765330187e-06
_EXP_S = (0.500000001346581, 0.16666666681623232, 0.041666464925285904, 0.0083333109254809,
          0.0013933649996309251, 0.00019890990824673654)


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


def _f(v: float) -> ir.Constant:
    return ir.Constant(F32, v)


def _exp(em: Emitter, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """float32 ``exp`` in float32 arithmetic (16 lanes a vector on AVX-512, where the double
    method runs 8 and converts twice): ``r = y - n ln 2`` as ``r + r_lo`` (a 16-bit ``ln 2``
    head, so ``n * _LN2_HI_F`` is exact), ``e^r = 1 + r + r^2 S(r)`` with ``1 + r`` split exactly
    (``hi + e``), so the one large rounding is the last addition; ``2^n`` in two normal factors,
    the second rounding once into the subnormals or to inf."""
    fma = lambda a, c, d: em.call("llvm.fmuladd.f32", F32, [a, c, d])  # noqa: E731
    y = b.select(b.fcmp_ordered(">", x, _f(_EXP_LO)), x, _f(_EXP_LO))  # (nan: chosen apart below)
    y = b.select(b.fcmp_ordered("<", y, _f(_EXP_HI)), y, _f(_EXP_HI))
    n = em.unary_intrinsic("llvm.rint", b.fmul(y, _f(1 / math.log(2))))
    r1 = fma(n, _f(-_LN2_HI_F), y)  # exact
    t = b.fmul(n, _f(_LN2_LO_F))
    r = b.fsub(r1, t)
    r_lo = b.fsub(b.fsub(r1, r), t)  # what r lost (Fast2Sum)
    s = _f(_EXP_S[-1])
    for c in reversed(_EXP_S[:-1]):
        s = fma(s, r, _f(c))
    lo = fma(b.fmul(r, r), s, r_lo)
    hi = b.fadd(_f(1.0), r)
    e = b.fadd(b.fsub(_f(1.0), hi), r)  # 1 + r - hi, exactly
    p = b.fadd(hi, b.fadd(e, lo))
    k = b.fptosi(n, I32)
    k1 = b.ashr(k, ir.Constant(I32, 1))
    out = p
    for part in (k1, b.sub(k, k1)):  # each in [-75, 64]: a normal power of two
        bits = b.shl(b.add(part, ir.Constant(I32, 127)), ir.Constant(I32, 23))
        out = b.fmul(out, b.bitcast(bits, F32))
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
