"""Tile's element types and the promotion rules of the original Tile (PlaidML v0).

* A float side wins, whatever its width (``int64 + float16 -> float16``).
* Otherwise the wider type wins; on equal widths the **left** operand wins
  (``int32 + uint32 -> int32``, ``uint32 + int32 -> uint32``).
* ``bool`` takes part as a 1-bit integer, so ``bool + int8 -> int8``; arithmetic whose result
  would still be ``bool`` (``bool + bool``, ``+``/``*`` aggregation of bools) is done in int32.
* Integer literals are int32 (int64 when the value does not fit), float literals float32.
* ``bfloat16`` (8 exponent bits, 8 significant bits; numpy arrays of ``ml_dtypes.bfloat16``) is a
  16-bit float like ``float16``; the two mixed give ``float32``, which holds both exactly
  (``bfloat16 + float16 -> float32``, either order, as in JAX).
"""

from __future__ import annotations

from enum import Enum
from functools import cache

import numpy as np


@cache
def bfloat16_numpy() -> np.dtype:
    """numpy's dtype for bfloat16 (``ml_dtypes.bfloat16``). ml_dtypes is imported here, at first
    use, not with this module: importing it takes most of a second, and a program without bfloat16
    never needs it (an array that already is bfloat16 was made by a caller that imported it)."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def is_bfloat16(dtype: np.dtype) -> bool:
    """Whether the numpy dtype ``dtype`` is bfloat16, told by its name so that asking does not load
    ml_dtypes (an array of it exists only where something loaded ml_dtypes already)."""
    return dtype.name == "bfloat16"


def __getattr__(name: str):
    # ``BFLOAT16_NUMPY``, the dtype itself, made at first use (PEP 562): see bfloat16_numpy
    if name == "BFLOAT16_NUMPY":
        return bfloat16_numpy()
    raise AttributeError(f"module 'tile.dtypes' has no attribute '{name}'")


_BITS = {"bool": 1, "int8": 8, "uint8": 8, "float16": 16, "bfloat16": 16, "int16": 16, "uint16": 16,
         "int32": 32, "uint32": 32, "float32": 32, "int64": 64, "uint64": 64, "float64": 64}


class DType(Enum):
    BOOL = "bool"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    UINT8 = "uint8"
    UINT16 = "uint16"
    UINT32 = "uint32"
    UINT64 = "uint64"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"

    @property
    def bits(self) -> int:
        return _BITS[self.value]

    @property
    def is_float(self) -> bool:
        return self.value.startswith(("float", "bfloat"))

    @property
    def is_narrow_float(self) -> bool:
        """float16 or bfloat16: stored in 16 bits, computed in float32 and rounded back."""
        return self is DType.FLOAT16 or self is DType.BFLOAT16

    @property
    def is_int(self) -> bool:
        """Signed or unsigned integer (not bool)."""
        return self.value.startswith(("int", "uint"))

    @property
    def is_signed(self) -> bool:
        return self.value.startswith("int") or self.is_float

    @property
    def numpy(self) -> np.dtype:
        return bfloat16_numpy() if self is DType.BFLOAT16 else np.dtype(self.value)

    @staticmethod
    def of(array_dtype: np.dtype | type | str) -> DType:
        """The Tile type of a numpy dtype; ``TypeError`` for types Tile does not have."""
        if array_dtype == "bfloat16":  # by name, before ml_dtypes (which makes numpy know it) is loaded
            return DType.BFLOAT16
        name = np.dtype(array_dtype).name
        try:
            return DType(name)
        except ValueError:
            raise TypeError(f"numpy dtype '{name}' has no Tile equivalent") from None

    def __str__(self) -> str:
        return self.value


def promote(lhs: DType, rhs: DType) -> DType:
    """The common type of a binary operation, by the original Tile rules (left wins ties)."""
    if {lhs, rhs} == {DType.FLOAT16, DType.BFLOAT16}:
        return DType.FLOAT32  # neither holds the other: float32 holds both exactly
    if lhs.is_float != rhs.is_float:
        return lhs if lhs.is_float else rhs
    return rhs if rhs.bits > lhs.bits else lhs


def promote_all(types: list[DType]) -> DType:
    assert types
    out = types[0]
    for t in types[1:]:
        out = promote(out, t)
    return out


def arithmetic(t: DType) -> DType:
    """The type arithmetic is done in: bool counts as int32 so that True + True == 2."""
    return DType.INT32 if t is DType.BOOL else t


def float_of(t: DType) -> DType:
    """The type a float builtin (exp, sqrt, ...) returns: floats keep theirs, others get float32."""
    return t if t.is_float else DType.FLOAT32


def literal_int_type(value: int) -> DType:
    return DType.INT32 if -(2**31) <= value < 2**31 else DType.INT64


INT_BITS = {8: DType.INT8, 16: DType.INT16, 32: DType.INT32, 64: DType.INT64}
UINT_BITS = {8: DType.UINT8, 16: DType.UINT16, 32: DType.UINT32, 64: DType.UINT64}
FLOAT_BITS = {16: DType.FLOAT16, 32: DType.FLOAT32, 64: DType.FLOAT64}
