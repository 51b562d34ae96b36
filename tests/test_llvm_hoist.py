"""A batched product whose packed operand is the same for every batch packs it once
(backends/llvm/hoist.py): the micro-kernel's batch loop runs inside the packing. Exact on integer
data at any batch count, row remainder, K block, thread count and with a fused epilogue; a packed
operand that depends on the batch keeps its loop outside."""

from __future__ import annotations

import numpy as np
import pytest

import tile
from backends.llvm import LlvmCpuDevice
from backends.llvm.hoist import hoisted
from backends.llvm.match import VectorConfig
from tests.llvm_runner import contraction_match, execute, lowered, small_ints

SHARED = "function (A[B, M, K], W[K, N]) -> (C) { C[b, i, j: B, M, N] = +(A[b, i, k] * W[k, j]); }"
OWN = "function (A[B, M, K], W[B, K, N]) -> (C) { C[b, i, j: B, M, N] = +(A[b, i, k] * W[b, k, j]); }"
BIAS = ("function (A[B, M, K], W[K, N], D[N]) -> (Y) { C[b, i, j: B, M, N] = +(A[b, i, k] * W[k, j]); "
        "Y = relu(C + D); }")
THREE = LlvmCpuDevice(threads=3)
CFG = VectorConfig(vector_bytes=64, fma=True, reassoc=True, l1_bytes=48 << 10, l2_bytes=2 << 20)


def _mk(src: str, inputs: dict):
    return contraction_match(src, inputs, CFG)


def test_the_batch_index_runs_inside_the_packing_only_when_the_panels_are_shared():
    rng = np.random.default_rng(0)
    kernel, mk = _mk(SHARED, {"A": small_ints(rng, 4, 64, 128), "W": small_ints(rng, 128, 128)})
    assert mk is not None and mk.pack_refs
    assert [kernel.idxs[k].name for k in hoisted(mk)] == [kernel.idxs[k].name for k in mk.s.outer] != []
    kernel, mk = _mk(OWN, {"A": small_ints(rng, 4, 64, 128), "W": small_ints(rng, 4, 128, 128)})
    assert mk is not None and hoisted(mk) == ()


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("shape", [(4, 64, 128, 128), (3, 13, 40, 70), (2, 7, 700, 96), (5, 1, 33, 64)])
def test_shared_panels_give_exact_products(shape, threads):
    b, m, k, n = shape
    rng = np.random.default_rng(b * m + k)
    a, w = small_ints(rng, b, m, k), small_ints(rng, k, n)
    got, _ = execute(lowered(SHARED, {"A": a, "W": w}), {"A": a, "W": w}, {"threads": threads}, THREE)
    np.testing.assert_array_equal(got["C"], a @ w, err_msg=f"{shape}, threads={threads}")


def test_a_fused_epilogue_and_batch_dependent_panels_stay_exact():
    rng = np.random.default_rng(3)
    a, w, d = small_ints(rng, 4, 30, 64), small_ints(rng, 64, 80), small_ints(rng, 80)
    y = tile.compile(BIAS, "llvm_cpu.0", {"threads": 1})(A=a, W=w, D=d)["Y"]
    np.testing.assert_array_equal(y, np.maximum(a @ w + d, 0))
    w3 = small_ints(rng, 4, 64, 80)
    c = tile.compile(OWN, "llvm_cpu.0", {"threads": 1})(A=a, W=w3)["C"]
    np.testing.assert_array_equal(c, a @ w3)
