"""Scalars in LLVM IR: how each Tile dtype is held, loaded, stored and converted.

Representation (the backend's one convention, used by every other module):

* **registers**: ``bool`` is ``i1``; integers are ``iN`` (signedness lives in the dtype, not the
  type); ``float32``/``float64`` are ``float``/``double``; ``float16`` is a ``float`` that always
  holds a value exactly representable in half precision (every float16 operation computes in
  ``float`` and rounds back, which is what numpy does, and never needs LLVM's ``half`` arithmetic);
  ``bfloat16`` likewise (a ``float`` whose low 16 bits are zero).
* **memory**: ``bool`` is one byte (0 or 1, as numpy stores it); ``float16`` is its IEEE bits in an
  ``i16``, ``bfloat16`` the high 16 bits of the float (``ml_dtypes.bfloat16``); the others as in
  registers.

Conversions follow ``ref_interp.numerics`` exactly: to bool is ``x != 0`` (nan is true); float to
integer truncates toward zero and wraps modulo 2**bits, nan and ±inf giving 0 (through an exact
reduction modulo 2**64, see ``_ftoi64``); integers wrap; every rounding to float16 is a single
correct rounding (double -> float16 goes through float rounded to odd, which makes the second
rounding exact); rounding to bfloat16 is integer code: nearest even, nan kept a (quiet) nan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from tile.dtypes import DType
from tile.precision import to_bfloat16

I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
PTR = ir.PointerType()
VOID = ir.VoidType()


def reg_type(dt: DType) -> ir.Type:
    if dt is DType.BOOL:
        return I1
    if dt.is_float:
        return F64 if dt is DType.FLOAT64 else F32
    return ir.IntType(dt.bits)


def mem_type(dt: DType) -> ir.Type:
    if dt is DType.BOOL:
        return I8
    if dt.is_narrow_float:
        return I16
    return reg_type(dt)


def declare_function(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    """The module's one way to declare a function (a C library routine, an LLVM intrinsic given by
    its full overloaded name such as ``llvm.fabs.f64``, or a helper about to be defined): the
    existing one when ``name`` is already in the module, else a new declaration. Two separate
    caches (or llvmlite's ``declare_intrinsic`` next to ``ir.Function``) would declare one name
    twice when two helpers use the same intrinsic, which llvmlite refuses."""
    fnty = ir.FunctionType(ret, args)
    old = module.globals.get(name)
    if old is None:
        return ir.Function(module, fnty, name)
    assert isinstance(old, ir.Function) and old.function_type == fnty, (name, old, fnty)
    return old


def i64(n: int) -> ir.Constant:
    return ir.Constant(I64, int(n))


def wrap_int(value: int, bits: int) -> int:
    """``value`` modulo 2**bits, as the signed number LLVM's text format wants."""
    v = int(value) % (1 << bits)
    return v - (1 << bits) if v >= 1 << (bits - 1) else v


@dataclass(frozen=True)
class Scalar:
    """A ``$scalar``: its register value, the dtype it is held in (conversions start from there) and
    the dtype Stripe declared (type rules use it). They differ only for float ``Constant``s, which
    stay double until an operation converts them, as in the interpreter."""

    value: ir.Value
    dtype: DType
    declared: DType


class Emitter:
    """Builds scalar code into ``self.builder``; owns the module's helper and libm declarations."""

    def __init__(self, module: ir.Module, f16c: bool):
        self.module = module
        self.f16c = f16c
        # float32 exp/tanh/log as inline, vectorizable code (backends.llvm.vmath), not libm calls:
        # off in strict mode, which keeps the C library's results
        self.inline_math = False
        # strict mode (docs/semantics.md §8.3): float16/bfloat16/float32 elementary functions are the
        # C library's double routines rounded once, as the interpreter computes them (``ref_interp.libm``)
        self.strict = False
        self.stack_bytes = 0  # what ``alloca`` reserved (the code generator reads it per kernel)
        self.builder: ir.IRBuilder = None  # type: ignore[assignment]  # set per function
        self.alloca_block: ir.Block = None  # type: ignore[assignment]  # set per function
        self.extents: list[ir.Value] = []  # a generic kernel's run-time integers (``symbolic.Slot``)

    def num(self, n) -> ir.Value:
        """An integer of the kernel as an i64: a constant, or a generic kernel's run-time extent."""
        return self.extents[n.k] if type(n).__name__ == "Slot" else i64(int(n))

    # ------------------------------------------------------------------ declarations
    def declare(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        """A function of the process (libm) or an LLVM intrinsic, declared once (``declare_function``)."""
        return declare_function(self.module, name, ret, args)

    def call(self, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
        fn = self.declare(name, ret, [a.type for a in args])
        if not name.startswith("llvm."):
            # a C library call stays that call: no folding pow(2, x) into exp2(x) and the like
            fn.attributes.add("nobuiltin")
        return self.builder.call(fn, args)

    def unary_intrinsic(self, base: str, x: ir.Value) -> ir.Value:
        suffix = "f64" if x.type == F64 else "f32"
        return self.call(f"{base}.{suffix}", x.type, [x])

    def _helper(self, name: str, ret: ir.Type, args: list[ir.Type], body) -> ir.Function:
        """An internal always-inlined function, built once by ``body(builder, fn)``."""
        fn = declare_function(self.module, name, ret, args)
        if not fn.blocks:
            fn.linkage = "internal"
            fn.attributes.add("alwaysinline")
            body(ir.IRBuilder(fn.append_basic_block("entry")), fn)
        return fn

    def alloca(self, typ: ir.Type, count: int | None = None) -> ir.Value:
        """A stack slot in the function's alloca block (``self.alloca_block``, which the code
        generator branches from to the function's body when it is done); mem2reg promotes scalars."""
        b = ir.IRBuilder(self.alloca_block)
        self.stack_bytes += _bytes(typ) * (1 if count is None else count)
        slot = b.alloca(typ, size=None if count is None else i64(count))
        slot.type = PTR  # llvmlite types allocas as typed pointers; LLVM 17+ only has ``ptr``
        return slot

    # ------------------------------------------------------------------------ memory
    def load(self, ptr: ir.Value, index: ir.Value, dt: DType) -> ir.Value:
        b = self.builder
        raw = b.load(b.gep(ptr, [index], inbounds=True, source_etype=mem_type(dt)), typ=mem_type(dt))
        if dt is DType.BOOL:
            return b.icmp_unsigned("!=", raw, ir.Constant(I8, 0))
        if dt is DType.FLOAT16:
            return self.h2f(raw)
        if dt is DType.BFLOAT16:
            return self.bf2f(raw)
        return raw

    def store(self, value: ir.Value, ptr: ir.Value, index: ir.Value, dt: DType) -> None:
        b = self.builder
        if dt is DType.BOOL:
            value = b.zext(value, I8)
        elif dt is DType.FLOAT16:
            value = self.f2h(value)
        elif dt is DType.BFLOAT16:
            value = self.f2bf(value)
        b.store(value, b.gep(ptr, [index], inbounds=True, source_etype=mem_type(dt)))

    # ---------------------------------------------------------------------- constants
    def const(self, value, dt: DType) -> ir.Constant:
        """``value`` (int, float, bool) converted to ``dt`` as a register constant."""
        if dt is DType.BOOL:
            return ir.Constant(I1, int(bool(value)))
        if dt is DType.BFLOAT16:
            return ir.Constant(F32, float(to_bfloat16(np.asarray(float(value)))))  # rounded once
        if dt.is_float:
            v = float(np.asarray(value, dtype=dt.numpy))  # rounds like numpy (float16 included)
            return ir.Constant(reg_type(dt), v)
        return ir.Constant(reg_type(dt), wrap_int(int(value), dt.bits))

    def zero(self, dt: DType) -> ir.Constant:
        return self.const(0, dt)

    # -------------------------------------------------------------------- float16
    def f2h(self, x: ir.Value) -> ir.Value:
        """float -> float16 bits, rounding to nearest even."""
        if self.f16c:
            return self.builder.bitcast(self.builder.fptrunc(x, F16), I16)
        return self.builder.call(self._helper("tile.f2h", I16, [F32], _soft_f2h), [x])

    def h2f(self, h: ir.Value) -> ir.Value:
        """float16 bits -> float (exact)."""
        if self.f16c:
            return self.builder.fpext(self.builder.bitcast(h, F16), F32)
        return self.builder.call(self._helper("tile.h2f", F32, [I16], _soft_h2f), [h])

    def round_half(self, x: ir.Value) -> ir.Value:
        """A float rounded to the nearest float16 value (kept in a float register)."""
        return self.h2f(self.f2h(x))

    # ------------------------------------------------------------------- bfloat16
    def f2bf(self, x: ir.Value) -> ir.Value:
        """float -> bfloat16 bits: round to nearest even; a nan stays a (quiet) nan."""
        b = self.builder
        c32 = lambda n: ir.Constant(I32, n)  # noqa: E731
        bits = b.bitcast(x, I32)
        odd = b.and_(b.lshr(bits, c32(16)), c32(1))
        rounded = b.lshr(b.add(bits, b.add(c32(0x7FFF), odd)), c32(16))
        quiet = b.or_(b.lshr(bits, c32(16)), c32(0x40))
        out = b.select(b.fcmp_unordered("uno", x, x), quiet, rounded)
        return b.trunc(out, I16)

    def bf2f(self, h: ir.Value) -> ir.Value:
        """bfloat16 bits -> float (exact: the high half of the float's bits)."""
        b = self.builder
        return b.bitcast(b.shl(b.zext(h, I32), ir.Constant(I32, 16)), F32)

    def round_bfloat(self, x: ir.Value) -> ir.Value:
        """A float rounded to the nearest bfloat16 value (kept in a float register)."""
        return self.bf2f(self.f2bf(x))

    def narrow(self, x: ir.Value, dt: DType) -> ir.Value:
        """A float register rounded to ``dt`` when that is float16 or bfloat16, else ``x``."""
        if dt is DType.FLOAT16:
            return self.round_half(x)
        if dt is DType.BFLOAT16:
            return self.round_bfloat(x)
        return x

    def round_to_odd_f32(self, d: ir.Value) -> ir.Value:
        """double -> float, truncating and setting the last bit when inexact (round to odd)."""
        b = self.builder
        f = b.fptrunc(d, F32)
        fabs = self.unary_intrinsic("llvm.fabs", b.fpext(f, F64))
        bits = b.bitcast(f, I32)
        too_big = b.fcmp_ordered(">", fabs, self.unary_intrinsic("llvm.fabs", d))
        bits = b.select(too_big, b.sub(bits, ir.Constant(I32, 1)), bits)
        inexact = b.fcmp_ordered("!=", b.fpext(b.bitcast(bits, F32), F64), d)
        bits = b.select(inexact, b.or_(bits, ir.Constant(I32, 1)), bits)
        return b.bitcast(bits, F32)

    # ------------------------------------------------------------------ conversions
    def convert(self, v: ir.Value, src: DType, dst: DType) -> ir.Value:
        """Tile's conversion of a register value from ``src`` to ``dst``."""
        b = self.builder
        if src is dst:
            return v
        if dst is DType.BOOL:
            if src.is_float:
                return b.fcmp_unordered("!=", v, self.zero(src))
            return b.icmp_unsigned("!=", v, self.zero(src))
        if dst.is_float:
            if dst is DType.BFLOAT16 and not src.is_float and src.bits > 16:
                # int32 to float would round once and bfloat16 again: exact double, then odd
                d = b.sitofp(v, F64) if src.is_signed else b.uitofp(v, F64)
                return self.round_bfloat(self.round_to_odd_f32(d))
            if not src.is_float:
                wide = F64 if dst is DType.FLOAT64 else F32
                signed = src.is_signed and src is not DType.BOOL
                out = b.sitofp(v, wide) if signed else b.uitofp(v, wide)
                # |int| < 65520 converts exactly to float, larger ones stay >= 65520 (-> inf)
                return self.narrow(out, dst)  # bfloat16: 16-bit integers are exact in float
            if dst is DType.FLOAT64:
                return b.fpext(v, F64)
            if src is DType.FLOAT64:
                if dst is DType.FLOAT32:
                    return b.fptrunc(v, F32)
                return self.narrow(self.round_to_odd_f32(v), dst)
            # float16 / bfloat16 / float32 to each other (all float registers, one rounding)
            return self.narrow(v, dst)
        to = reg_type(dst)
        if src is DType.BOOL:
            return b.zext(v, to)
        if src.is_float:
            d = v if src is DType.FLOAT64 else b.fpext(v, F64)
            out = b.call(self._helper("tile.ftoi64", I64, [F64], _ftoi64), [d])
            return out if dst.bits == 64 else b.trunc(out, to)
        if src.bits == dst.bits:
            return v
        if src.bits > dst.bits:
            return b.trunc(v, to)
        return b.sext(v, to) if src.is_signed else b.zext(v, to)

    def to(self, s: Scalar, dst: DType) -> ir.Value:
        return self.convert(s.value, s.dtype, dst)


def _bytes(typ: ir.Type) -> int:
    """An upper bound of the stack bytes of one ``typ`` (scalars and vectors of them)."""
    if isinstance(typ, ir.VectorType):
        return typ.count * _bytes(typ.element)
    if isinstance(typ, ir.IntType):
        return max(1, typ.width // 8)
    return 8 if typ == F64 or isinstance(typ, ir.PointerType) else 4


# --------------------------------------------------------------------- helper bodies
def _ftoi64(b: ir.IRBuilder, fn: ir.Function) -> None:
    """double -> int64 modulo 2**64: truncate toward zero; nan and ±inf give 0.

    Below 2**63 in magnitude ``fptosi`` is exact. Above, the value is ``mantissa << e`` with
    ``e >= 11``, so its residue modulo 2**64 is that shift done in 64-bit integers (0 once e >= 64).
    """
    (d,) = fn.args
    fabs = b.call(declare_function(fn.module, "llvm.fabs.f64", F64, [F64]), [d])
    t = b.call(declare_function(fn.module, "llvm.trunc.f64", F64, [F64]), [d])
    small = b.fcmp_ordered("<", fabs, ir.Constant(F64, 2.0**63))
    finite = b.fcmp_ordered("<", fabs, ir.Constant(F64, float("inf")))
    direct = b.fptosi(b.select(small, t, ir.Constant(F64, 0.0)), I64)
    bits = b.bitcast(t, I64)
    e = b.sub(b.and_(b.lshr(bits, i64(52)), i64(0x7FF)), i64(1075))
    mant = b.or_(b.and_(bits, i64((1 << 52) - 1)), i64(1 << 52))
    in_range = b.and_(b.icmp_signed(">=", e, i64(0)), b.icmp_signed("<", e, i64(64)))
    shifted = b.shl(mant, b.select(in_range, e, i64(0)))
    big = b.select(in_range, shifted, i64(0))
    big = b.select(b.icmp_signed("<", bits, i64(0)), b.sub(i64(0), big), big)
    b.ret(b.select(finite, b.select(small, direct, big), i64(0)))


def _soft_f2h(b: ir.IRBuilder, fn: ir.Function) -> None:
    """float -> float16 bits with round to nearest even, in integer arithmetic (no F16C)."""
    (f,) = fn.args
    c32 = lambda n: ir.Constant(I32, n)  # noqa: E731
    x = b.bitcast(f, I32)
    sign = b.trunc(b.lshr(b.and_(x, c32(0x80000000)), c32(16)), I16)
    a = b.and_(x, c32(0x7FFFFFFF))
    nan = b.or_(c32(0x7E00), b.and_(b.lshr(a, c32(13)), c32(0x3FF)))
    special = b.select(b.icmp_unsigned(">", a, c32(0x7F800000)), nan, c32(0x7C00))
    # subnormal halves: adding 0.5 rounds |f| to a multiple of 2**-24 (RNE) in the low bits
    sub = b.sub(b.bitcast(b.fadd(b.bitcast(a, F32), ir.Constant(F32, 0.5)), I32), c32(0x3F000000))
    odd = b.and_(b.lshr(a, c32(13)), c32(1))
    normal = b.lshr(b.add(b.add(a, c32(((15 - 127) << 23) + 0xFFF)), odd), c32(13))
    out = b.select(b.icmp_unsigned("<", a, c32(0x38800000)), sub, normal)
    out = b.select(b.icmp_unsigned(">=", a, c32(0x477FF000)), c32(0x7C00), out)
    out = b.select(b.icmp_unsigned(">=", a, c32(0x7F800000)), special, out)
    b.ret(b.or_(b.trunc(out, I16), sign))


def _soft_h2f(b: ir.IRBuilder, fn: ir.Function) -> None:
    """float16 bits -> float, exactly, in integer arithmetic (no F16C)."""
    (h,) = fn.args
    c32 = lambda n: ir.Constant(I32, n)  # noqa: E731
    x = b.zext(h, I32)
    sign = b.shl(b.and_(x, c32(0x8000)), c32(16))
    em = b.and_(x, c32(0x7FFF))
    inf_nan = b.or_(c32(0x7F800000), b.shl(b.and_(em, c32(0x3FF)), c32(13)))
    normal = b.add(b.shl(em, c32(13)), c32((127 - 15) << 23))
    sub = b.bitcast(b.fmul(b.uitofp(em, F32), ir.Constant(F32, 2.0**-24)), I32)
    out = b.select(b.icmp_unsigned("<", em, c32(0x400)), sub, normal)
    out = b.select(b.icmp_unsigned(">=", em, c32(0x7C00)), inf_nan, out)
    b.ret(b.bitcast(b.or_(out, sign), F32))
