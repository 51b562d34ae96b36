"""The micro-kernel's rows a tile (backends/llvm/match.py, ``row_tile``): of the heights that fit the
accumulator budget, the one whose tiles (whole ones, then one per power of two of the remainder)
take the fewest FMA cycles, a tile of fewer than 8 accumulators waiting on the FMA latency; the
old height (at most 12) where it is as good. 64 rows of one vector (``C[i, j: 64, 10]``, an MLP's
last layer) run in 4 tiles of 16, not 5 of 12 and one of 4 at half speed. Products stay exact."""

from __future__ import annotations

import numpy as np
import pytest

from backends.llvm import LlvmCpuDevice
from backends.llvm.host import host_target
from backends.llvm.match import LATENCY_FMAS, ROWS_CAP, VectorConfig, host_vector_bytes, row_tile
from backends.llvm.microkernel import kernel_match
from tests.llvm_runner import execute, lowered

NARROW = "function (A[M, K], W[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * W[k, j]); }"
CFG = VectorConfig(vector_bytes=64, fma=True, reassoc=True)


def _cycles(rows: int, nv: int, m: int) -> int:
    rest = rows % m
    parts = [m] * (rows // m) + [1 << b for b in range(rest.bit_length()) if rest >> b & 1]
    return sum(max(r * nv, LATENCY_FMAS) for r in parts)


def test_heights():
    assert row_tile(64, 1, 24) == 16  # 4 x 16, not 5 x 12 + 4
    assert row_tile(64, 4, 24) == 6  # 10 x 6 + 4: the 4-row tile still fills the FMA pipes
    assert row_tile(64, 2, 24) == 12
    assert row_tile(60, 1, 24) == 12  # 12 divides it: kept
    assert row_tile(5, 1, 24) == 5 and row_tile(1, 4, 24) == 1


@pytest.mark.parametrize("nv, budget", [(1, 24), (2, 24), (3, 24), (4, 24), (1, 12), (2, 12)])
def test_never_worse_than_the_old_height_and_it_where_as_good(nv, budget):
    for rows in range(1, 300):
        old = max(1, min(rows, budget // nv, ROWS_CAP))
        m = row_tile(rows, nv, budget)
        assert 1 <= m <= min(rows, budget // nv, ROWS_CAP + 4 if nv == 1 else ROWS_CAP)
        assert _cycles(rows, nv, m) <= _cycles(rows, nv, old), (rows, m, old)
        if _cycles(rows, nv, m) == _cycles(rows, nv, old):
            assert m == old, (rows, m, old)


def test_the_narrow_product_takes_sixteen_rows():
    rng = np.random.default_rng(0)
    a = rng.integers(-3, 4, (64, 512)).astype(np.float32)
    w = rng.integers(-3, 4, (512, 10)).astype(np.float32)
    program = lowered(NARROW, {"A": a, "W": w})
    (kernel,) = [k for k in program.stmts[0].stmts if "contraction" in k.tags]
    dims = {r.into: r.shape.dims for r in kernel.refs}
    mk = kernel_match(None, kernel, dims, {r.into: r.shape.dtype for r in kernel.refs}, None, CFG, None, None)
    assert mk.nv == 1 and mk.mr == 16


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m, n", [(64, 10), (61, 10), (17, 16), (33, 7), (64, 20)])
def test_narrow_products_stay_exact(m, n, threads):
    if not host_vector_bytes(host_target()[1]):
        pytest.skip("the host has no vector unit the micro-kernel uses")
    rng = np.random.default_rng(m * n)
    a, w = rng.integers(-3, 4, (m, 300)).astype(np.float32), rng.integers(-3, 4, (300, n)).astype(np.float32)
    got, _ = execute(lowered(NARROW, {"A": a, "W": w}), {"A": a, "W": w}, {"threads": threads},
                     LlvmCpuDevice(threads=threads))
    np.testing.assert_array_equal(got["C"], a @ w)
