"""An operand already laid out as the micro-kernel's packed panels (backends/llvm/packing.py,
``in_place``: contiguous along the vector index, ``NV * W`` elements a reduction point, the
reduction points row-major) is read where it is, not copied into scratch. The decision is checked
on the matched kernel; the products stay exact on integer data over K blocks, row remainders, two
reduction indexes, thread counts and a fused epilogue."""

from __future__ import annotations

import numpy as np
import pytest

import tile
from backends.llvm import LlvmCpuDevice
from backends.llvm.match import VectorConfig
from tests.llvm_runner import contraction_match, execute, lowered, small_ints

# W panel by panel: W[p, k, q] is column 64*p + q of a K-major [K, 64*P] weight
PANELS = "function (A[M, K], W[P, K, Q]) -> (C) { C[p, i, q: P, M, Q] = +(A[i, k] * W[p, k, q]); }"
# the rows of A panel-major too (the previous panel product's output), summed over k0 and k1
TWO = ("function (A[P2, M, Q2], W[P, K, Q]) -> (C) "
       "{ C[p, i, q: P, M, Q] = +(A[k0, i, k1] * W[p, 64*k0 + k1, q]); }")
KMAJOR = "function (A[M, K], W[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * W[k, j]); }"
BIAS = ("function (A[M, K], W[P, K, Q], D[P, N1, Q]) -> (Y) "
        "{ C[p, i, q: P, M, Q] = +(A[i, k] * W[p, k, q]); Y = relu(C + D); }")
THREE = LlvmCpuDevice(threads=3)
CFG = VectorConfig(vector_bytes=64, fma=True, reassoc=True, l1_bytes=48 << 10, l2_bytes=2 << 20)


def _mk(src: str, inputs: dict):
    kernel, mk = contraction_match(src, inputs, CFG)
    assert mk is not None
    return {r.into: r.source for r in kernel.refs}, mk


def _panels(w: np.ndarray, width: int = 64) -> np.ndarray:
    """A K-major ``[K, N]`` weight as ``[N / width, K, width]`` panels."""
    k, n = w.shape
    return np.ascontiguousarray(w.reshape(k, n // width, width).transpose(1, 0, 2))


def _product(a: np.ndarray, wp: np.ndarray) -> np.ndarray:
    """``PANELS``'s answer: ``C[p, i, q] = sum_k A[i, k] W[p, k, q]``."""
    return np.einsum("ik,pkq->piq", a, wp)


def test_panel_laid_out_operands_are_read_in_place_and_others_packed():
    rng = np.random.default_rng(0)
    names, mk = _mk(PANELS, {"A": small_ints(rng, 64, 256), "W": small_ints(rng, 4, 256, 64)})
    assert mk.pack_refs and {names[r] for r in mk.in_place_refs} == {"W"}
    names, mk = _mk(TWO, {"A": small_ints(rng, 4, 64, 64), "W": small_ints(rng, 4, 256, 64)})
    assert {names[r] for r in mk.in_place_refs} == {"W"}
    # a K-major weight wider than one panel, and 96 columns (a 64-wide panel, then a 32-wide
    # one): still packed
    names, mk = _mk(KMAJOR, {"A": small_ints(rng, 64, 256), "W": small_ints(rng, 256, 256)})
    assert mk.pack_refs and not mk.in_place_refs
    names, mk = _mk(PANELS, {"A": small_ints(rng, 64, 256), "W": small_ints(rng, 4, 256, 96)})
    assert not mk.in_place_refs


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("shape", [(64, 256, 4), (13, 700, 2), (70, 40, 3), (12, 64, 1)])
def test_in_place_panels_give_exact_products(shape, threads):
    m, k, p = shape
    rng = np.random.default_rng(m * k + p)
    a, wp = small_ints(rng, m, k), small_ints(rng, p, k, 64)
    got, _ = execute(lowered(PANELS, {"A": a, "W": wp}), {"A": a, "W": wp}, {"threads": threads}, THREE)
    np.testing.assert_array_equal(got["C"], _product(a, wp), err_msg=f"{shape}, threads={threads}")


def test_two_reduction_indexes_and_the_optimized_program_stay_exact():
    rng = np.random.default_rng(5)
    w = small_ints(rng, 512, 256)
    a3, wp = small_ints(rng, 8, 64, 64), _panels(w)
    want = _product(a3.transpose(1, 0, 2).reshape(64, 512), wp)
    got, _ = execute(lowered(TWO, {"A": a3, "W": wp}), {"A": a3, "W": wp}, {"threads": 1})
    np.testing.assert_array_equal(got["C"], want)
    c = tile.compile(TWO, "llvm_cpu.0", {"threads": 1})(A=a3, W=wp)["C"]
    np.testing.assert_array_equal(c, want)


def test_a_fused_epilogue_on_in_place_panels_is_exact():
    rng = np.random.default_rng(7)
    a, w, d = small_ints(rng, 64, 256), small_ints(rng, 256, 512), small_ints(rng, 512)
    wp, dp = _panels(w), d.reshape(8, 1, 64)
    y = tile.compile(BIAS, "llvm_cpu.0", {"threads": 1})(A=a, W=wp, D=dp)["Y"]
    want = np.maximum(a @ w + d, 0)  # in panel order: [P, M, 64]
    np.testing.assert_array_equal(y, want.reshape(64, 8, 64).transpose(1, 0, 2))
