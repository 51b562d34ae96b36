"""How a C-like target spells Tile's scalars: types, literals, conversions, loads and stores.

``CTarget`` is plain C99 (``stdint.h``); a dialect (``backends.opencl.target``) overrides the few
methods that differ: type names, bit casts, half-precision memory and the kernel's signature.

Representation (the one convention every other module of ``clike`` relies on):

* **registers**: ``bool`` is ``bool`` (0 or 1), integers their C type, ``float32``/``float64``
  ``float``/``double``; ``float16`` is a ``float`` that always holds a value exactly representable in
  half precision: every float16 operation computes in float and rounds once (numpy's behaviour;
  the double rounding is harmless since 24 >= 2 * 11 + 2 bits); ``bfloat16`` likewise (a float
  whose low 16 bits are zero).
* **memory**: ``bool`` one byte 0/1, ``float16`` IEEE half bits, ``bfloat16`` the float's high 16
  bits (``tile_f2bf``: bit shifts, round to nearest even, nan kept nan), the others as in registers.
* **signed arithmetic** is done in the unsigned type of the same width, so overflow wraps instead of
  being undefined; conversions between integer types wrap (two's complement, as every C compiler).

Conversions follow ``ref_interp.numerics``: to bool is ``x != 0`` (nan is true); float to integer
truncates toward zero and wraps modulo 2**bits, nan and ±inf giving 0 (``tile_f2l``/``tile_d2l``);
rounding to float16 or bfloat16 is one correct rounding (a double or a 32/64-bit integer reaches
bfloat16 through float rounded to odd, so it needs float64 on the device). A ``Constant`` stays a
compile-time value: each use converts it in Python (``const_convert``) and emits a literal of the
type it is used in, so a float literal needs no ``double`` arithmetic on the device unless an
operation really is float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tile.dtypes import DType
from tile.precision import to_bfloat16

_C_TYPES = {
    DType.BOOL: "bool",
    DType.INT8: "int8_t",
    DType.INT16: "int16_t",
    DType.INT32: "int32_t",
    DType.INT64: "int64_t",
    DType.UINT8: "uint8_t",
    DType.UINT16: "uint16_t",
    DType.UINT32: "uint32_t",
    DType.UINT64: "uint64_t",
    DType.FLOAT16: "float",
    DType.BFLOAT16: "float",
    DType.FLOAT32: "float",
    DType.FLOAT64: "double",
}


@dataclass(frozen=True)
class Value:
    """A ``$scalar``: its C expression (a variable or a literal), the dtype the expression holds, the
    dtype Stripe declared (type rules use it) and, for a ``Constant``, its compile-time value. Held
    and declared differ only for float constants, which stay double until an operation converts them.
    """

    expr: str
    dtype: DType
    declared: DType
    const: int | float | bool | None = None


def wrap(value: int, dt: DType) -> int:
    """``value`` modulo 2**bits as a value of integer ``dt``."""
    mod = 1 << dt.bits
    v = int(value) % mod
    return v - mod if dt.is_signed and v >= mod >> 1 else v


def const_convert(value, src: DType, dst: DType):
    """A compile-time value of ``src`` converted to ``dst`` with Tile's rules (as a Python value)."""
    if src is dst:
        return value
    if dst is DType.BOOL:
        return bool(value != 0)
    if dst.is_float:
        with np.errstate(all="ignore"):
            if dst is DType.BFLOAT16:  # one rounding (ml_dtypes rounds a double twice)
                return float(to_bfloat16(np.asarray(value, dtype=src.numpy)))
            return float(np.asarray(value, dtype=src.numpy).astype(dst.numpy))
    if src.is_float:
        f = float(value)
        return 0 if not math.isfinite(f) else wrap(math.trunc(f), dst)
    return wrap(int(value), dst)


def unsigned_of(dt: DType) -> DType:
    """The unsigned type integer arithmetic of ``dt`` wraps in (at least 32 bits wide)."""
    return DType.UINT64 if dt.bits == 64 else DType.UINT32


class CTarget:
    """Plain C99. ``fp64``/``fp16``: whether the device has them (the code generator notes every
    use in ``uses`` so that a compiler can refuse a program the device cannot run); ``exact_div``:
    whether ``/`` and ``sqrt`` of float are correctly rounded (else computed in double, exact by the
    same double-rounding argument); ``fast_math``: allow contracted and native functions."""

    name = "c"
    function_qualifier = "static inline "
    workgroups = False  # has work-groups, __local memory and barriers (tiled contractions)
    TYPES = _C_TYPES
    INT_SUFFIX = {DType.INT64: "LL", DType.UINT64: "ULL", DType.UINT32: "U"}

    def __init__(self, fp64: bool = True, fp16: bool = True, exact_div: bool = True, fast_math: bool = False):
        self.fp64 = fp64
        self.fp16 = fp16
        self.exact_div = exact_div
        self.fast_math = fast_math
        self.contract = False  # may fuse a*b+c into fma and reorder a float sum (not strict mode)
        self.uses: dict[DType, str] = {}  # dtype -> where it was first needed
        self.where = ""  # what is being generated, for ``uses``
        self.helpers: set[str] = set()  # helper functions the code calls
        self.matrix_units: dict = {}  # the hardware's matrix units, by name (stripe.hardware.MatrixUnit)
        self.local_bytes = 48 * 1024  # __local memory per work-group (the OpenCL device's, when known)
        self.compute_units = 0  # the device's (0: unknown)

    def unit_emitter(self, g, ptrs: dict[str, str], tiles, unit: str, epilogue):
        """The emitter of a tiled GEMM (``tiled.Tiles``) whose plan names matrix unit ``unit``
        (``name.mode``, ``stripe.plans.GemmPlan``), or None: the portable tiled kernel. A dialect
        whose devices have matrix units returns its vendor's kernel; plain C has none."""
        return None

    def attention_kernel(self, em):
        """A dialect's own kernel (``KernelSource``) of the ``attention`` block ``em`` emits (an
        ``AttentionPlan`` or ``AttentionBackwardPlan``), or None: the portable fused kernel
        (``backends.clike.attention``, ``attention_backward``). A dialect whose devices have matrix
        units may issue the chain's products on them."""
        return None

    # ---------------------------------------------------------------------- types
    def note(self, dt: DType) -> None:
        if dt in (DType.FLOAT16, DType.FLOAT64):
            self.uses.setdefault(dt, self.where)

    def reg(self, dt: DType) -> str:
        """The C type of a register of ``dt``."""
        self.note(dt)
        return self.TYPES[dt]

    def mem(self, dt: DType) -> str:
        """The C type of a buffer element of ``dt``."""
        self.note(dt)
        if dt is DType.BOOL:
            return self.TYPES[DType.UINT8]
        if dt is DType.FLOAT16:
            return self.half_mem_type()
        if dt is DType.BFLOAT16:
            return self.TYPES[DType.UINT16]
        return self.TYPES[dt]

    def half_mem_type(self) -> str:
        return "uint16_t"

    def cast(self, dt: DType, expr: str) -> str:
        return f"(({self.reg(dt)}){expr})"

    # ------------------------------------------------------------------- literals
    def literal(self, value, dt: DType) -> str:
        """A C literal of ``value`` (already a value of ``dt``) with the type of a register of ``dt``."""
        if dt is DType.BOOL:
            return "1" if value else "0"
        if dt.is_float:
            return self.float_literal(float(value), DType.FLOAT64 if dt is DType.FLOAT64 else DType.FLOAT32)
        v = int(value)
        suffix = self.INT_SUFFIX.get(dt, "")
        if dt.is_signed and v == -(1 << (dt.bits - 1)):
            text = f"(-{(1 << (dt.bits - 1)) - 1}{suffix} - 1{suffix})"
        else:
            text = f"{v}{suffix}" if v >= 0 else f"(-{-v}{suffix})"
        return text if dt in (DType.INT32, DType.INT64, DType.UINT32, DType.UINT64) else self.cast(dt, text)

    def float_literal(self, v: float, dt: DType) -> str:
        self.note(dt)
        f = "" if dt is DType.FLOAT64 else "f"
        if math.isnan(v):
            text = "NAN"
        elif math.isinf(v):
            text = "INFINITY" if v > 0 else "(-INFINITY)"
        else:
            text = f"{v.hex()}{f}"
            return f"({text})" if text.startswith("-") else text
        return text if dt is not DType.FLOAT64 else f"((double){text})"

    def const(self, value, src: DType, dst: DType) -> str:
        return self.literal(const_convert(value, src, dst), dst)

    # ---------------------------------------------------------------- conversions
    def to(self, v: Value, dst: DType) -> str:
        """``v`` as an expression of a register of ``dst``."""
        if v.const is not None:
            return self.const(v.const, v.dtype, dst)
        return self.convert(v.expr, v.dtype, dst)

    def convert(self, x: str, src: DType, dst: DType) -> str:
        """Tile's conversion of the register expression ``x`` from ``src`` to ``dst``."""
        if src is dst:
            return x
        if dst is DType.BOOL:
            return f"({x} != 0)"
        if dst.is_float:
            if src.is_float:
                if dst is DType.FLOAT64:
                    return self.cast(dst, x)
                if src is DType.FLOAT64:
                    if dst is DType.BFLOAT16:
                        return self.round_bfloat_double(x)
                    return self.cast(dst, x) if dst is DType.FLOAT32 else self.round_half_double(x)
                return self.narrow(x, dst)  # float16 / bfloat16 / float32 to each other
            if dst is DType.BFLOAT16 and src.bits > 16:
                # an int32 to float rounds, and bfloat16 again: exact double, then one rounding
                return self.round_bfloat_double(self.cast(DType.FLOAT64, x))
            wide = DType.FLOAT64 if dst is DType.FLOAT64 else DType.FLOAT32
            out = self.cast(wide, x)
            # |int| < 65520 converts exactly to float, larger ones stay >= 65520 (-> inf)
            return self.narrow(out, dst)
        if src.is_float:
            helper = "tile_d2l" if src is DType.FLOAT64 else "tile_f2l"
            self.helpers.add(helper)
            return self.cast(dst, f"{helper}({x})")
        return self.cast(dst, x)

    # --------------------------------------------------------------- float16
    def round_half(self, x: str) -> str:
        """A float expression rounded to the nearest float16 value (kept in a float)."""
        self.helpers.add("tile_rh")
        return f"tile_rh({x})"

    def round_half_double(self, x: str) -> str:
        """A double rounded once to the nearest float16 value (as a float)."""
        self.helpers.add("tile_rhd")
        return f"tile_rhd({x})"

    # -------------------------------------------------------------- bfloat16
    def round_bfloat(self, x: str) -> str:
        """A float expression rounded to the nearest bfloat16 value (kept in a float)."""
        self.helpers.add("tile_rbf")
        return f"tile_rbf({x})"

    def round_bfloat_double(self, x: str) -> str:
        """A double rounded once to the nearest bfloat16 value (as a float)."""
        self.helpers.add("tile_rbfd")
        return f"tile_rbfd({x})"

    def narrow(self, x: str, dt: DType) -> str:
        """A float expression rounded to ``dt`` when that is float16 or bfloat16, else ``x``."""
        if dt is DType.FLOAT16:
            return self.round_half(x)
        if dt is DType.BFLOAT16:
            return self.round_bfloat(x)
        return x

    # ------------------------------------------------------------------- memory
    def load(self, ptr: str, off: str, dt: DType) -> str:
        """The register value of element ``off`` of buffer ``ptr`` holding ``dt``."""
        self.note(dt)
        if dt is DType.BOOL:
            return f"({ptr}[{off}] != 0)"
        if dt is DType.FLOAT16:
            self.helpers.add("tile_h2f")
            return f"tile_h2f({ptr}[{off}])"
        if dt is DType.BFLOAT16:
            self.helpers.add("tile_bf2f")
            return f"tile_bf2f({ptr}[{off}])"
        return f"{ptr}[{off}]"

    def store(self, ptr: str, off: str, value: str, dt: DType) -> str:
        """The statement storing the register expression ``value`` of ``dt`` into ``ptr[off]``."""
        self.note(dt)
        if dt is DType.BOOL:
            return f"{ptr}[{off}] = ({self.TYPES[DType.UINT8]})({value});"
        if dt is DType.FLOAT16:
            self.helpers.add("tile_f2h")
            return f"{ptr}[{off}] = tile_f2h({value});"
        if dt is DType.BFLOAT16:
            self.helpers.add("tile_f2bf")
            return f"{ptr}[{off}] = tile_f2bf({value});"
        return f"{ptr}[{off}] = {value};"

    # ------------------------------------------------------------------- math
    def math(self, fn: str, dt: DType, args: list[str]) -> str:
        """A C math function (``exp``, ``fabs``, ``trunc``, ...) on float (or double) arguments."""
        name = fn if dt is DType.FLOAT64 else f"{fn}f"
        return f"{name}({', '.join(args)})"

    def native(self, fn: str, dt: DType, args: list[str]) -> str | None:
        """A faster, less exact version of ``fn`` for ``fast_math`` (None: there is none)."""
        return None

    def fdiv(self, a: str, b: str, dt: DType) -> str:
        """Correctly rounded float (``dt`` float32 or float16-in-float) or double division."""
        if dt is DType.FLOAT64 or self.exact_div or not self.fp64:
            return f"({a} / {b})"
        return f"((float)((double)({a}) / (double)({b})))"

    def fsqrt(self, a: str, dt: DType) -> str:
        if dt is DType.FLOAT64 or self.exact_div or not self.fp64:
            return self.math("sqrt", dt, [a])
        return f"((float)sqrt((double)({a})))"

    def mad(self, a: str, b: str, c: str, dt: DType) -> str | None:
        """``a * b + c`` in one operation under ``fast_math`` (None: not available)."""
        return None

    def isnan(self, x: str) -> str:
        return f"isnan({x})"

    def bits(self, x: str, dt: DType) -> str:
        """The IEEE bits of a float (uint32) or double (uint64) register, as an unsigned integer."""
        helper = "tile_bits_d" if dt is DType.FLOAT64 else "tile_bits_f"
        self.helpers.add(helper)
        return f"{helper}({x})"

    def float_of_bits(self, x: str) -> str:
        """The float whose IEEE bits are the uint32 expression ``x``."""
        self.helpers.add("tile_f_of_bits")
        return f"tile_f_of_bits({x})"

    # --------------------------------------------------------------- program text
    def header(self) -> list[str]:
        """Lines opening the file (includes, pragmas), once the kernels are generated."""
        return ["#include <math.h>", "#include <stdbool.h>", "#include <stdint.h>", "#include <string.h>"]

    def kernel(self, name: str, params: list[tuple[str, DType]], body: list[str], work_items: int) -> str:
        """One kernel: ``name(void **bufs, int64_t lo, int64_t hi)`` runs work-items [lo, hi)."""
        lines = [f"void {name}(void **bufs, int64_t lo, int64_t hi)", "{"]
        for k, (p, dt) in enumerate(params):
            lines.append(f"    {self.mem(dt)}* restrict {p} = ({self.mem(dt)}*)bufs[{k}];")
        lines.append(f"    if (hi > {work_items}) hi = {work_items};")
        lines.append("    for (int64_t gid = lo; gid < hi; gid++) {")
        lines += [f"        {b}" if b else "" for b in body]
        lines += ["    }", "}"]
        return "\n".join(lines)

    def group_kernel(self, name: str, params: list[tuple[str, DType]], local: int, body: list[str],
                     plain: frozenset[str] = frozenset()) -> str:
        """A kernel run in work-groups of ``local`` work-items (a target with ``workgroups``): its
        signature, every buffer ``restrict`` but those in ``plain``, around ``body`` (lines as
        written)."""
        raise NotImplementedError(f"{type(self).__name__} has no work-groups")

    def helper_text(self, name: str) -> str | None:
        """A dialect's own definition of helper ``name`` (None: the plain C one,
        ``backends.clike.helpers``, which writes the definitions the code calls)."""
        return None


__all__ = ["CTarget", "Value", "const_convert", "unsigned_of", "wrap"]
