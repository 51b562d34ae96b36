"""The micro-kernel's rows past the last whole ``MR`` tile (backends/llvm/microkernel.py,
``remainder``): one tile per power of two the count has, not one single-row tile per row, and
every row still exact."""

from __future__ import annotations

import numpy as np
import pytest
from llvmlite import ir

from backends.llvm import LlvmCpuDevice
from backends.llvm.loops import remainder
from backends.llvm.scalars import i64
from tests.llvm_runner import execute, lowered

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
THREE = LlvmCpuDevice(threads=3)


def plan(lo: int, hi: int, mr: int) -> list[tuple[int, int]]:
    tiles: list[tuple[int, int]] = []
    remainder(ir.IRBuilder(), i64(lo), i64(hi), mr, lambda r0, p: tiles.append((int(r0.constant), p)))
    return tiles


def test_constant_bounds_take_one_tile_per_bit_of_the_count():
    assert plan(60, 64, 6) == [(60, 4)]  # 64 rows in tiles of 6: one tile of 4, not 4 rows of 1
    assert plan(0, 5, 6) == [(0, 4), (4, 1)]
    assert plan(12, 19, 8) == [(12, 4), (16, 2), (18, 1)]
    assert plan(6, 6, 6) == []
    for mr in range(2, 13):
        for left in range(mr):
            tiles = plan(100, 100 + left, mr)
            assert sum(p for _, p in tiles) == left
            assert all(p < mr for _, p in tiles)
            assert [r for r, _ in tiles] == [100 + sum(p for _, p in tiles[:j]) for j in range(len(tiles))]


def test_run_time_bounds_test_each_bit():
    fn = ir.Function(ir.Module(), ir.FunctionType(ir.VoidType(), [ir.IntType(64)] * 2), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    sizes = []
    remainder(b, fn.args[0], fn.args[1], 6, lambda r0, p: sizes.append(p))
    b.ret_void()
    assert sizes == [4, 2, 1]


@pytest.mark.parametrize("threads", [1, 3])
def test_every_row_count_exact(threads):
    rng = np.random.default_rng(42)
    for m in range(1, 27):
        a = rng.integers(-4, 5, (m, 40)).astype(np.float32)
        b = rng.integers(-4, 5, (40, 70)).astype(np.float32)
        got, _ = execute(lowered(MATMUL, {"A": a, "B": b}), {"A": a, "B": b}, {"threads": threads}, THREE)
        np.testing.assert_array_equal(got["C"], a @ b, err_msg=f"M={m}, threads={threads}")
