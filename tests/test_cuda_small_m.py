"""Matrix products of few rows on ``cuda.0`` (issue 41's small M, "a max error 15x cuBLAS's"): the
error against a float64 product of the same data, within a bound argued from K and the result
type's unit roundoff u (docs/semantics.md 8.1.1: products exact in float32, sums in float32, the
result rounded once). Skips without an NVIDIA GPU; the kernels' text is checked offline in
``tests/test_split_halves.py``.

* **Exact data.** ``A = i / 16``, ``B = j / 16`` with small integers i, j: every product is a
  multiple of 2^-8 and, with ``S = max Σ_k |a_ik b_kj| < 2^16`` (checked), every partial sum in
  any order is a float32 value, so a kernel that keeps its partials in float32 gives the exact
  product rounded once: bit for bit ``C64.astype(float16)``, an error of at most ``u |C64|``. The
  ranges make many products need 12 or 13 significant bits, so rounding a product, a partial or a
  running sum to float16 shows.
* **Random normal data.** The γ_K bound of a float32 sum whose additions may round toward zero
  (the tensor cores'), plus the final rounding: ``|C - C64| <= u |C64| + K 2^-23 S_ij`` elementwise.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tile
from backends import registry

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n: M, N] = +(A[m, k] * B[k, n]); }"
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
SHAPES = [(1, 4096, 4096), (8, 4096, 4096), (16, 4096, 4096), (33, 4096, 4096), (64, 4096, 4096),
          (16, 4096, 11008), (16, 11008, 4096)]


def _gpu():
    if "cuda.0" not in registry.devices():
        pytest.skip("no cuda.0 here (needs an NVIDIA GPU, its driver, cuda-bindings and NVRTC)")


def _dtype(name: str):
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.float16


def exact_data(m: int, n: int, k: int, dtype, seed: int = 0) -> dict[str, np.ndarray]:
    """``i / 16`` and ``j / 16`` (module docstring), ranges scaled to K so that S stays below 2^16."""
    rng = np.random.default_rng(seed)
    ra = 127  # 7 bits: exact in float16 and bfloat16, as j / 16 is
    rb = max(3, min(63, int(2**25 / (k * ra))))  # S about K ra rb / 1024 <= 2^15
    a = rng.integers(-ra, ra + 1, (m, k)) / 16
    b = rng.integers(-rb, rb + 1, (k, n)) / 16
    return {"A": a.astype(dtype), "B": b.astype(dtype)}


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_small_m_is_the_exact_product_rounded_once(m, n, k, dt):
    _gpu()
    if dt == "bfloat16" and (m, n, k) not in ((16, 4096, 4096), (1, 4096, 4096)):
        pytest.skip("bfloat16: two shapes are enough")
    arrays = exact_data(m, n, k, _dtype(dt))
    a64, b64 = (arrays[x].astype(np.float64) for x in "AB")
    s = np.abs(a64) @ np.abs(b64)
    assert s.max() < 2.0**16, s.max()  # every partial sum: a multiple of 2^-8 below 2^16, 24 bits
    exact = a64 @ b64
    got = np.asarray(tile.compile(MATMUL, device="cuda.0")(**arrays)["C"]).astype(np.float64)
    err = np.abs(got - exact)
    assert np.all(err <= UNIT_ROUNDOFF[dt] * np.abs(exact)), (err.max(), np.argmax(err))
    np.testing.assert_array_equal(got, exact.astype(_dtype(dt)).astype(np.float64))


@pytest.mark.parametrize("m,n,k", [(16, 4096, 4096), (1, 4096, 11008), (64, 4096, 4096)])
def test_small_m_random_normal_within_the_float32_bound(m, n, k):
    _gpu()
    rng = np.random.default_rng(1)
    arrays = {"A": rng.standard_normal((m, k)).astype(np.float16),
              "B": rng.standard_normal((k, n)).astype(np.float16)}
    a64, b64 = (arrays[x].astype(np.float64) for x in "AB")
    exact, s = a64 @ b64, np.abs(a64) @ np.abs(b64)
    got = np.asarray(tile.compile(MATMUL, device="cuda.0")(**arrays)["C"]).astype(np.float64)
    bound = 2.0**-11 * np.abs(exact) + k * 2.0**-23 * s
    err = np.abs(got - exact)
    assert np.all(err <= bound), (err.max(), float((err / bound).max()))
