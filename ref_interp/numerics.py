"""How values are stored and converted in each precision mode.

* ``native``  — every tensor in its declared Tile dtype (float32 stays float32; bfloat16 is an
  ``ml_dtypes.bfloat16`` array, each operation computed in float32 and rounded once). A `+`
  contraction of `*` products of float16/bfloat16 accumulates in float32 (``contraction``).
* ``tf32``, ``3xtf32`` — native, except float32 `+` contractions of `*` products, whose operands
  are rounded to TF32 (or split into two TF32 parts) as a matrix unit would (``contraction``).
* ``float64`` — float tensors computed in float64; integers and bools as declared.
* ``exact``   — float tensors as object arrays of ``fractions.Fraction`` (no rounding ever);
  integers and bools as declared (numpy integer arithmetic is already exact, with wrap-around).
  Results that have no rational value (inf, nan, transcendental functions) are Python floats.

Conversions follow Tile's rules: to bool is ``x != 0``; float to integer truncates toward zero and
wraps modulo 2**bits, with nan and ±inf giving 0; integer to integer wraps.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np

from tile.dtypes import DType, is_bfloat16
from tile.errors import TilePrecisionWarning
from tile.precision import PRECISIONS, check_precision, to_bfloat16

__all__ = ["PRECISIONS", "Numerics"]


def _to_fraction(x):
    if isinstance(x, Fraction):
        return x
    if isinstance(x, (int, np.integer, bool, np.bool_)):
        return Fraction(int(x))
    f = float(x)
    return Fraction(f) if math.isfinite(f) else f


_frac = np.frompyfunc(_to_fraction, 1, 1)


class Numerics:
    def __init__(self, precision: str = "native"):
        self.precision = check_precision(precision)
        self.exact = precision == "exact"
        self._warned: set[str] = set()

    def storage(self, dt: DType) -> np.dtype:
        if dt.is_float:
            if self.exact:
                return np.dtype(object)
            if self.precision == "float64":
                return np.dtype(np.float64)
        return dt.numpy

    def fallback(self, what: str) -> None:
        """Note once per run that exact mode computed ``what`` in float64."""
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(
                f"exact precision: {what} has no exact rational value; computed in float64",
                TilePrecisionWarning,
                stacklevel=3,
            )

    # ------------------------------------------------------------------ conversions
    def const(self, value, dt: DType) -> np.ndarray:
        """A 0-D array holding ``value`` (int, Fraction or float) converted to ``dt``."""
        if dt.is_float and self.exact:
            out = np.empty((), dtype=object)
            out[()] = _to_fraction(value)
            return out
        if dt.is_float:
            if is_bfloat16(self.storage(dt)):
                return to_bfloat16(np.asarray(float(value)))
            return np.asarray(float(value), dtype=self.storage(dt))
        return self.cast(
            np.asarray(int(value) if isinstance(value, Fraction) and value.denominator == 1 else value), dt
        )

    def cast(self, arr: np.ndarray, dt: DType) -> np.ndarray:
        """``arr`` (in any storage) converted to ``dt``'s storage with Tile's conversion rules."""
        arr = np.asarray(arr)
        target = self.storage(dt)
        if arr.dtype == target and not (arr.dtype == object and not dt.is_float):
            return arr
        if dt is DType.BOOL:
            return np.asarray(arr != 0, dtype=bool)
        if dt.is_float:
            if target == np.dtype(object):
                return np.asarray(_frac(arr), dtype=object) if arr.size else arr.astype(object)
            if arr.dtype == object:
                arr = np.asarray(arr.astype(np.float64))
            if is_bfloat16(target):
                return to_bfloat16(arr)  # one rounding, also from float64 (ml_dtypes rounds twice)
            if arr.dtype == object:
                return np.asarray(arr, dtype=target)
            with np.errstate(all="ignore"):
                return arr.astype(target)
        # to an integer type
        if arr.dtype == object or arr.dtype.kind == "f" or is_bfloat16(arr.dtype):
            return _float_to_int(arr, dt)
        return arr.astype(target)


    def float32_values(self, arr: np.ndarray) -> np.ndarray:
        """``arr`` (in any storage) as a numpy float32 array, each value rounded once to float32 as
        ``as_float(x, 32)`` rounds it in ``native`` mode, whatever this mode stores: for a builtin
        whose result is a float32 value in every mode (``round_tf32``)."""
        arr = np.asarray(arr)
        if arr.dtype == object:  # exact mode's Fractions: directly (through float64 is two roundings)
            return np.asarray(np.frompyfunc(_fraction_to_float32, 1, 1)(arr), dtype=np.float32)
        with np.errstate(all="ignore"):
            return arr.astype(np.float32)


def _fraction_to_float32(x) -> float:
    """A Fraction rounded to the nearest float32 value, ties to even (inf past the largest); the
    floats exact mode keeps (inf, nan) as they are."""
    if isinstance(x, float) or x == 0:
        return float(x)
    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()  # floor(log2(a)) is e or e - 1
    if a < Fraction(2) ** e:
        e -= 1
    q = max(e, -126) - 23  # the value of the last of float32's 24 bits (subnormals: 2^-149)
    m = round(a / Fraction(2) ** q)  # Fraction's round: to nearest, ties to even
    v = math.inf if m * Fraction(2) ** q >= 2**128 else math.ldexp(m, q)
    return -v if x < 0 else v


def _float_to_int(arr: np.ndarray, dt: DType) -> np.ndarray:
    """Truncate toward zero, wrap modulo 2**bits; nan and ±inf give 0."""
    if arr.dtype == object:
        flat = [_trunc_obj(x) for x in arr.reshape(-1)]
        mod = 1 << dt.bits
        half = mod >> 1
        wrapped = [(v % mod) - (mod if dt.is_signed and (v % mod) >= half else 0) for v in flat]
        return np.array(wrapped, dtype=dt.numpy).reshape(arr.shape)
    with np.errstate(all="ignore"):
        f = np.asarray(arr, dtype=np.float64)
        f = np.where(np.isfinite(f), np.trunc(f), 0.0)
        # fmod is exact; folding into [-2**63, 2**63) keeps every step exact, and the final
        # int64 -> narrower cast wraps modulo 2**bits.
        m = np.fmod(f, 2.0**64)
        m = np.where(m >= 2.0**63, m - 2.0**64, m)
        m = np.where(m < -(2.0**63), m + 2.0**64, m)
        return m.astype(np.int64).astype(dt.numpy)


def _trunc_obj(x) -> int:
    if isinstance(x, float) and not math.isfinite(x):
        return 0
    return math.trunc(x)
