"""What a conformance example is (``Case``) and the small integer-valued inputs most families draw:
shared by the program strategies (``conformance.strategies`` and the modules it gathers)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

AGGS = ["+", "*", ">", "<", "="]
INT_DTYPES = [np.int32, np.int8, np.int64, np.uint8]
FLOAT_DTYPES = [np.float32, np.float64, np.float16]
CONTRACTION_DTYPES = [np.float32, np.int32, np.float64, np.int8, np.uint8, np.int64]


@dataclass
class Case:
    family: str
    source: str
    inputs: dict[str, np.ndarray]
    exact: bool = True
    ulps: float = 0.0  # tolerance in output-type epsilons, times the reduction length
    length: int = 1
    notes: dict = field(default_factory=dict)


def small_ints(rng: np.random.Generator, shape, dtype, lo=-3, hi=3) -> np.ndarray:
    """Integers in [lo, hi] (unsigned: from 0) of ``dtype``: sums and products of a few are exact."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind == "u":
        lo = 0
    return rng.integers(lo, hi + 1, shape).astype(dtype)
