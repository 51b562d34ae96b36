"""The micro-kernel's next-panel prefetch (backends/llvm/prefetch.py): a product reading its weight's
panels in place (``Packing.in_place``) prefetches, during row tiles 1..RATE*NV of each panel (or K
block), the memory right after it (every point, or every other one with rows for 2 NV + 1 tiles);
nothing else prefetches. A prefetch changes no value: the products stay
exact on integer data over panels, K blocks, row remainders and thread counts."""

from __future__ import annotations

import numpy as np
import pytest

from backends.llvm import LlvmCpuDevice
from backends.llvm.host import host_target
from backends.llvm.match import VectorConfig
from backends.llvm.prefetch import Prefetch
from tests.llvm_runner import build, contraction_match, execute, lowered, small_ints

PANELS = "function (A[M, K], W[P, K, Q]) -> (C) { C[p, i, q: P, M, Q] = +(A[i, k] * W[p, k, q]); }"
KMAJOR = "function (A[M, K], W[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * W[k, j]); }"
CFG = VectorConfig(vector_bytes=64, fma=True, reassoc=True, l1_bytes=48 << 10, l2_bytes=2 << 20)
AVX512 = "+avx512f" in host_target()[1].split(",")


def _mk(src: str, inputs: dict, blocks=None):
    _, mk = contraction_match(src, inputs, CFG, blocks)
    assert mk is not None
    return mk


def test_only_in_place_panels_with_several_row_tiles_prefetch():
    rng = np.random.default_rng(0)
    mk = _mk(PANELS, {"A": small_ints(rng, 64, 128), "W": small_ints(rng, 4, 128, 64)})
    assert mk.in_place_refs and isinstance(mk.prefetch, Prefetch)
    assert not mk.blocking and mk.prefetch.span() == 128 * 64  # the next panel: right after this one
    assert mk.mr == 6 and mk.prefetch.rate == 2  # 10 whole tiles: every other point, over 8 tiles
    mk = _mk(PANELS, {"A": small_ints(rng, 30, 128), "W": small_ints(rng, 4, 128, 64)})
    assert mk.prefetch.rate == 1  # 5 tiles: every point, over 4
    # a weight packed each call (its scratch is already near): no prefetch
    mk = _mk(KMAJOR, {"A": small_ints(rng, 64, 256), "W": small_ints(rng, 256, 256)})
    assert mk.pack_refs and not mk.in_place_refs and mk.prefetch is None
    # one row tile per panel (fewer than 2 MR rows): nothing to spread the next panel over
    mk = _mk(PANELS, {"A": small_ints(rng, 8, 512), "W": small_ints(rng, 4, 512, 64)})
    assert mk.prefetch is None


def test_k_blocks_prefetch_the_next_block():
    rng = np.random.default_rng(1)
    mk = _mk(PANELS, {"A": small_ints(rng, 64, 512), "W": small_ints(rng, 4, 512, 64)}, blocks=(96, 64))
    assert mk.blocking and mk.blocking[2] == 96
    assert mk.prefetch.span() == 96 * 64


@pytest.mark.skipif(not AVX512, reason="the panels are 64 floats wide on AVX-512 hosts only (else packed)")
def test_the_panel_product_emits_prefetches_and_the_k_major_one_none():
    rng = np.random.default_rng(2)
    inputs = {"A": small_ints(rng, 64, 256), "W": small_ints(rng, 4, 256, 64)}
    library, _ = build(lowered(PANELS, inputs), {"cache": False, "threads": 1}, LlvmCpuDevice(threads=1))
    assert "llvm.prefetch" in library.source
    inputs = {"A": small_ints(rng, 64, 256), "W": small_ints(rng, 256, 256)}
    library, _ = build(lowered(KMAJOR, inputs), {"cache": False, "threads": 1}, LlvmCpuDevice(threads=1))
    assert "llvm.prefetch" not in library.source


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("shape", [(64, 256, 4), (70, 512, 3), (25, 64, 2), (12, 96, 5), (61, 129, 3)])
def test_products_with_prefetches_stay_exact(shape, threads):
    m, k, p = shape
    rng = np.random.default_rng(m + k + p)
    a, wp = small_ints(rng, m, k), small_ints(rng, p, k, 64)
    inputs = {"A": a, "W": wp}
    settings = {"threads": threads, "cache": False}
    got, _ = execute(lowered(PANELS, inputs), inputs, settings, LlvmCpuDevice(threads=threads))
    np.testing.assert_array_equal(got["C"], np.einsum("ik,pkq->piq", a, wp), err_msg=f"{shape}, {threads}")
