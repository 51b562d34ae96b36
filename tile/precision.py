"""Precision modes and the roundings they need, in numpy (docs/semantics.md §8.1).

One place for what a mode *is*, so the settings check (``tile.settings``), the interpreter
(``ref_interp.numerics``), the conformance tolerances and a code generator that emits a matrix
unit all read the same definitions:

* ``PRECISIONS``: every value of the ``precision`` setting / argument.
* ``round_tf32(x)``: float32 rounded to TF32 (10 explicit mantissa bits, float32's exponent),
  nearest with ties **away from zero**: NVIDIA's ``cvt.rna.tf32.f32``; nan stays nan, inf inf.
* ``split_3xtf32(x)``: ``(hi, lo)`` with ``hi = round_tf32(x)``, ``lo = round_tf32(x - hi)``.
* ``to_bfloat16(x)``: any float (float64 included) rounded **once** to the nearest bfloat16, ties
  to even (``ml_dtypes`` goes through float32, a double rounding; this goes through float32
  rounded to odd, which makes the second rounding the single correct one).
* ``UNIT_ROUNDOFF``: ``u`` of each element format and contraction mode, the base of every
  tolerance that conformance derives (``|got - want| <= k * u * K * max|x|``).
"""

from __future__ import annotations

import numpy as np

from tile.dtypes import DType, bfloat16_numpy

PRECISIONS = ("native", "float64", "exact", "tf32", "3xtf32")
"""native, float64 and exact: the interpreter's arithmetic. tf32 and 3xtf32: native, except that
float32 `+` contractions of `*` products round their operands as a matrix unit would (and
compiled targets *may* use such a unit; one without computes full float32)."""

MATRIX_MODES = ("tf32", "3xtf32")

UNIT_ROUNDOFF: dict[str, float] = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    # a TF32 operand has 11 significant bits: rounding one costs at most 2^-11 relatively; a
    # product of two rounded operands is off by at most (1 + 2^-11)^2 - 1 ~ 2^-10
    "tf32": 2.0**-11,
    # hi + lo holds 22 significant bits of each operand (|x - hi - lo| <= 2^-11 |x - hi| <=
    # 2^-22 |x|), the dropped lo*lo term is at most 2^-22 |ab|: each product within ~3 * 2^-22
    # of the exact one, then float32 accumulation (2^-24 per step)
    "3xtf32": 2.0**-22,
}


def check_precision(value: object) -> str:
    """``value`` if it names a precision mode; else ``ValueError`` listing the modes."""
    if value not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {value!r}")
    return value  # type: ignore[return-value]


def round_tf32(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32 (kept in float32), nearest with ties away from zero."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    # adding half an ulp of TF32 to the magnitude and dropping the low 13 bits rounds to nearest,
    # ties away from zero; a carry into the exponent is right (and gives inf past the largest)
    rounded = ((bits.astype(np.uint64) + 0x1000) & 0xFFFFE000).astype(np.uint32)
    return np.where(np.isfinite(x), rounded.view(np.float32), x)


def split_3xtf32(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(hi, lo)``: ``hi = round_tf32(x)``, ``lo = round_tf32(x - hi)`` (x - hi is exact)."""
    x = np.asarray(x, dtype=np.float32)
    hi = round_tf32(x)
    with np.errstate(invalid="ignore"):
        lo = round_tf32(np.where(np.isfinite(x), x - hi, np.float32(0)))
    return hi, lo


def _round_to_odd_f32(x: np.ndarray) -> np.ndarray:
    """float64 to float32 rounded to odd: truncated, with the last bit set when inexact."""
    f = x.astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        over = np.abs(f.astype(np.float64)) > np.abs(x)  # rounded away from zero: step back
        f = np.where(over & np.isfinite(x), np.nextafter(f, np.float32(0)), f)
        inexact = (f.astype(np.float64) != x) & np.isfinite(x)
    bits = f.view(np.uint32) | inexact.astype(np.uint32)
    return bits.view(np.float32)


def to_bfloat16(x: np.ndarray) -> np.ndarray:
    """Any numeric array rounded once to the nearest bfloat16 (ties to even), as bfloat16."""
    x = np.asarray(x)
    bf16 = bfloat16_numpy()
    if x.dtype == bf16:
        return x
    if x.dtype in (np.float32, np.float16) or x.dtype == bool or x.dtype.itemsize <= 2:
        return x.astype(np.float32).astype(bf16)  # exact in float32: one rounding
    with np.errstate(all="ignore"):
        wide = x.astype(np.float64)
        return _round_to_odd_f32(wide).astype(bf16)


def narrow(dt: DType):
    """The numpy rounding of float32 (or wider) values to float16/bfloat16 ``dt``."""
    if dt is DType.BFLOAT16:
        return to_bfloat16
    return lambda x: np.asarray(x).astype(dt.numpy)
