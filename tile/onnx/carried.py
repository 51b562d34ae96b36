"""ONNX types Tile has no dtype for, carried in one it has.

ONNX's 8-bit floats (float8 e4m3fn, e4m3fnuz, e5m2, e5m2fnuz, e8m0fnu), float4 e2m1fn and its 4-
and 2-bit integers are not Tile dtypes (docs/semantics.md §13). Every value of them is a value of a
wider Tile type, so ``tile.onnx`` carries such a tensor in that type: the floats in float32 (each
is a float32 number, subnormals included), int4/int2 in int8 and uint4/uint2 in uint8. A ``Value``
that carries one names it (``Value.carried``); the Tile program holds the numbers, and only the
operators that convert (Cast, CastLike, QuantizeLinear, DequantizeLinear) and Identity take such a
value: those converters round to the carried type's values (``ops_carried``), so that a carried
tensor never holds a number its type lacks. Everything else refuses it (arithmetic in float32 on
float8 inputs would not round like float8 arithmetic).

At the edges the backend converts: an input array of the ONNX type to the carrier (exact), an
output back (exact, and checked to be so: a value the type lacks is a bug of a converter).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tile.dtypes import DType
from tile.onnx.errors import TileOnnxError


@dataclass(frozen=True)
class Format:
    """An ONNX element type Tile lacks: its numpy (ml_dtypes) ``name``, ONNX ``elem`` number, the
    Tile ``carrier``; for integers ``bits`` and ``signed``; for floats the exponent and mantissa
    widths, the exponent ``bias``, the largest finite value and what it has of inf, nan, -0."""

    name: str
    elem: int
    carrier: DType
    bits: int = 0
    signed: bool = False
    ebits: int = 0
    mbits: int = 0
    bias: int = 0
    largest: float = 0.0
    has_inf: bool = False
    has_nan: bool = True
    negative_zero: bool = True

    @property
    def is_float(self) -> bool:
        return self.carrier.is_float

    @property
    def smallest_normal_exponent(self) -> int:
        return 1 - self.bias


def _float(name, elem, ebits, mbits, bias, largest, **kw) -> Format:
    return Format(name, elem, DType.FLOAT32, ebits=ebits, mbits=mbits, bias=bias, largest=largest, **kw)


FORMATS: dict[int, Format] = {f.elem: f for f in (
    _float("float8_e4m3fn", 17, 4, 3, 7, 448.0),
    _float("float8_e4m3fnuz", 18, 4, 3, 8, 240.0, negative_zero=False),
    _float("float8_e5m2", 19, 5, 2, 15, 57344.0, has_inf=True),
    _float("float8_e5m2fnuz", 20, 5, 2, 16, 57344.0, negative_zero=False),
    Format("uint4", 21, DType.UINT8, bits=4),
    Format("int4", 22, DType.INT8, bits=4, signed=True),
    _float("float4_e2m1fn", 23, 2, 1, 1, 6.0, has_nan=False),
    # powers of two only: 2^-127 .. 2^127 and nan; no sign, no zero
    _float("float8_e8m0fnu", 24, 8, 0, 127, 2.0**127, negative_zero=False),
    Format("uint2", 25, DType.UINT8, bits=2),
    Format("int2", 26, DType.INT8, bits=2, signed=True),
)}
BY_NAME: dict[str, Format] = {f.name: f for f in FORMATS.values()}


def numpy_type(fmt: Format) -> np.dtype:
    """The numpy dtype ONNX uses for ``fmt`` (an ml_dtypes type)."""
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, fmt.name))


def to_carrier(array: np.ndarray, fmt: Format) -> np.ndarray:
    """An array of ``fmt`` (or of any type, converted by numpy) as its carrier's numbers."""
    return np.asarray(array).astype(fmt.carrier.numpy)


def from_carrier(array: np.ndarray, fmt: Format, what: str) -> np.ndarray:
    """The carrier's numbers as an array of ``fmt``; each must be a value of ``fmt``."""
    array = np.asarray(array)
    out = array.astype(numpy_type(fmt))
    back = out.astype(fmt.carrier.numpy)
    same = back == array
    if fmt.is_float:
        same |= np.isnan(back) & np.isnan(array)
    if not same.all():
        bad = np.flatnonzero(~same)
        raise TileOnnxError(f"{what} holds {array.ravel()[bad[0]]!r}, which {fmt.name} does not have "
                            f"({len(bad)} such elements)", None,
                            "a converter let a value through unrounded: this is a bug in tile.onnx")
    return out


__all__ = ["BY_NAME", "FORMATS", "Format", "from_carrier", "numpy_type", "to_carrier"]
