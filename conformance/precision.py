"""Tolerances of the precision modes (``--precision=MODE``; docs/semantics.md §8.1).

Under ``--precision=tf32`` (or ``3xtf32``) every family compiles with ``settings={"precision":
MODE}`` and compares against ``ref_interp.run(..., precision=MODE)``. A target may use the mode's
matrix unit or compute full float32 (both are allowed), so the tolerance must hold between any
two results within the mode's error bound of the exact value.

**Derivation (matrix products, the ``products`` family).** Two unit roundoffs describe a mode:

* ``u``, the relative error of one product from rounding its operands: ``2^-24`` for float32
  (the product's own rounding), ``2^-11`` for TF32 (each operand keeps 11 significant bits; the
  product of two is then exact), ``2^-22`` for 3xTF32 (``hi + lo`` keeps 22 bits of each operand,
  and the dropped ``lo*lo`` term is below ``2^-22 |ab|``), ``2^-11`` / ``2^-8`` for float16 /
  bfloat16 operands (their product is exact in float32; ``u`` is the output's rounding);
* ``u_acc``, the rounding of each step of the running sum: ``2^-24`` (float32 accumulation,
  to nearest), ``2^-23`` in ``tf32``/``3xtf32`` (a tensor core's float32 additions round toward
  zero: up to a whole ulp), ``2^-11`` / ``2^-8`` for float16 / bfloat16, since a target may
  accumulate in the narrow type.

With ``c <= 5`` operand, term and final roundings per product, the standard ``γ_K`` bound (first
order) puts each result within ``(c·u + K·u_acc)·S`` of the exact sum, ``S = Σ_k |a_k b_k|``.
Two results that both obey it differ by at most twice that, so for every output element

    |got - want| <= 2 · (5·u + K·u_acc) · max S

(``S`` is the contraction of ``|A|`` and ``|B|``, computed in float64). Never a blanket 1e-3:
a 64-long TF32 product of normal data gets about 0.2, a float32 one 5e-4.
"""

from __future__ import annotations

import numpy as np

import ref_interp
from conformance.report import Tolerance
from tile.dtypes import DType
from tile.precision import MATRIX_MODES, UNIT_ROUNDOFF

MODES = ("native", *MATRIX_MODES)  # the modes a compiled target is checked in
MODE = "native"  # this run's (--precision), set by conftest
TERMS = 5  # c: roundings per product besides the running sum's


def unit_roundoff(mode: str, dtype: DType) -> float:
    """``u`` of a matrix product of ``dtype`` operands computed in ``mode``."""
    if dtype is DType.FLOAT32 and mode in MATRIX_MODES:
        return UNIT_ROUNDOFF[mode]
    return UNIT_ROUNDOFF[dtype.value]


def accumulation_roundoff(mode: str, dtype: DType) -> float:
    """``u_acc``: float32 sums (2^-24), or 2^-23 where a matrix unit may add (its additions may
    round toward zero: a whole ulp); the narrow type's where a target may sum in it."""
    if dtype.is_narrow_float:
        return UNIT_ROUNDOFF[dtype.value]
    return 2 * UNIT_ROUNDOFF["float32"] if mode in MATRIX_MODES else UNIT_ROUNDOFF["float32"]


def product_tolerance(mode: str, dtype: DType, length: int, magnitude: float) -> Tolerance:
    """The tolerance of a ``+`` contraction of ``*`` products of ``dtype`` operands with reduction
    length ``length`` in ``mode``; ``magnitude`` is ``max S`` (``magnitude``)."""
    u, acc = unit_roundoff(mode, dtype), accumulation_roundoff(mode, dtype)
    bound = 2 * (TERMS * u + length * acc) * max(magnitude, np.finfo(np.float64).tiny)
    return Tolerance(exact=False, ulps=bound / u, length=1, eps=u, relative=False)


def magnitude(source: str, inputs: dict[str, np.ndarray]) -> float:
    """``max S``: the largest element of the program run on the absolute values of its inputs, in
    float64 (for a product ``C = +(A * B)``, ``max Σ |a| |b|``)."""
    wide = {k: np.abs(v.astype(np.float64)) for k, v in inputs.items()}
    return max(float(np.max(o, initial=0.0)) for o in ref_interp.run(source, wide, "float64").values())


def program_eps(mode: str, floats: list[DType]) -> float:
    """The epsilon the general families scale by (``report.Tolerance.eps``): the coarsest float
    type's, or in a matrix mode for a float32 program ``2·u(mode)`` (an epsilon is two unit
    roundoffs), whichever is coarser."""
    eps = [2 * UNIT_ROUNDOFF[d.value] for d in floats]
    if mode in MATRIX_MODES and DType.FLOAT32 in floats:
        eps.append(2 * UNIT_ROUNDOFF[mode])
    return max(eps, default=0.0)
