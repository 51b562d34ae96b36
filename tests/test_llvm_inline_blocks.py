"""A product whose packed panels would not fit the calling thread's stack allowance runs in K
blocks of one panel (backends/llvm/microkernel.py, ``inline_blocks``), so its kernel runs inline
(and on raw addresses: backends/lane.py) instead of on the dispatcher thread; results stay exact."""

from __future__ import annotations

import numpy as np
import pytest

from backends.llvm import LlvmCpuDevice
from backends.llvm.device import INLINE_STACK_BYTES
from backends.llvm.host import host_target
from backends.llvm.inline_blocks import INLINE_SCRATCH, inline_blocks
from backends.llvm.match import analyse, host_vector_bytes
from tests.llvm_runner import execute, lowered

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"


def needs_vectors():
    if not host_vector_bytes(host_target()[1]):
        pytest.skip("the host has no vector unit the micro-kernel uses")


@pytest.mark.parametrize("m, k, n", [(64, 512, 512), (64, 256, 512), (30, 1000, 130)])
@pytest.mark.parametrize("threads", [1, 2])
def test_large_panels_run_inline_and_exact(m, k, n, threads):
    needs_vectors()
    rng = np.random.default_rng(k)
    a = rng.integers(-3, 4, (m, k)).astype(np.float32)
    b = rng.integers(-3, 4, (k, n)).astype(np.float32)
    device = LlvmCpuDevice(threads=threads)
    got, kernels = execute(lowered(MATMUL, {"A": a, "B": b}), {"A": a, "B": b}, {"threads": threads}, device)
    np.testing.assert_array_equal(got["C"], a @ b)
    product = kernels[-1]  # (the product: a zero fill may come before it)
    stack = product.library.handle.stack[-1]
    assert stack <= INLINE_STACK_BYTES and product.inline, stack


def test_blocks_are_even_and_whole_panels():
    a, b = np.zeros((64, 512), np.float32), np.zeros((512, 512), np.float32)
    block = lowered(MATMUL, {"A": a, "B": b}).stmts[0].stmts[-1]
    dims = {r.into: r.shape.dims for r in block.refs}
    shape = analyse(block, dims, {r.into: r.shape.dtype for r in block.refs}, None)
    step, nc, chunk = inline_blocks(None, block, shape, 64, 1)
    assert nc == 64 and chunk == step and step * 64 * 4 <= INLINE_SCRATCH
    assert -(-512 // step) * step - 512 < -(-512 // step)  # even blocks: the last is at most one short
    assert inline_blocks(None, block, shape, 16, 1) is None  # 512 x 16 floats fit already


def test_blocks_count_every_reduction_index():
    """Two reduction indexes (``A[k0, i, k1]``, a panel-major operand's): a block of 2 points of
    ``k0`` is 128 reduction points, worth a block (the check once compared 2 with 64: no blocks)."""
    two = ("function (A[P2, M, Q2], W[P, K, Q]) -> (C) "
           "{ C[p, i, q: P, M, Q] = +(A[k0, i, k1] * W[p, 64*k0 + k1, q]); }")
    a, w = np.zeros((8, 64, 64), np.float32), np.zeros((4, 512, 64), np.float32)
    block = lowered(two, {"A": a, "W": w}).stmts[0].stmts[-1]
    dims = {r.into: r.shape.dims for r in block.refs}
    shape = analyse(block, dims, {r.into: r.shape.dtype for r in block.refs}, None)
    assert len(shape.red) == 2
    step, nc, chunk = inline_blocks(None, block, shape, 64, 1)
    assert (step, nc, chunk) == (2, 64, 128) and chunk * 64 * 4 <= INLINE_SCRATCH
    # blocks of fewer than 64 reduction points are still not taken
    assert inline_blocks(None, block, shape, 64, 8) is None


@pytest.mark.parametrize("threads", [1, 2])
def test_blocks_over_two_reduction_indexes_stay_exact(threads):
    needs_vectors()
    two = ("function (A[P2, M, Q2], W[P, K, Q]) -> (C) "
           "{ C[p, i, q: P, M, Q] = +(A[k0, i, k1] * W[p, 64*k0 + k1, q]); }")
    rng = np.random.default_rng(7)
    a = rng.integers(-3, 4, (8, 70, 64)).astype(np.float32)
    w = rng.integers(-3, 4, (3, 512, 64)).astype(np.float32)
    device = LlvmCpuDevice(threads=threads)
    got, _ = execute(lowered(two, {"A": a, "W": w}), {"A": a, "W": w}, {"threads": threads}, device)
    want = np.einsum("aik,paqk->piq", a, w.reshape(3, 8, 64, 64).transpose(0, 1, 3, 2))
    np.testing.assert_array_equal(got["C"], want)
