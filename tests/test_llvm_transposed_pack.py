"""``A @ B.T``'s B, gathered along the micro-kernel's vector index but contiguous along the
innermost reduction index, is packed ``W`` reduction points at a time: ``W`` contiguous vectors
transposed in registers (backends/llvm/packing.py, ``pack_transposed``), the points past the last
whole group lane by lane. The shuffles are checked as a permutation; the products stay exact on
integer data over K remainders, K blocks, two reduction indexes, float64 and thread counts."""

from __future__ import annotations

import numpy as np
import pytest
from llvmlite import ir

from backends.llvm import LlvmCpuDevice
from backends.llvm.match import VectorConfig
from backends.llvm.packing import transpose
from tests.llvm_runner import contraction_match, execute, lowered, small_ints

ABT = "function (A[M, K], B[N, K]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[j, k]); }"
HEADS = ("function (Q[T, D], K[T, D]) -> (C) "
         "{ C[h, i, j: 4, T, T] = +(Q[i, 32*h + k] * K[j, 32*h + k]), k < 32; }")
TWO = "function (A[M, K, L], B[N, K, L]) -> (C) { C[i, j: M, N] = +(A[i, k, l] * B[j, k, l]); }"
THREE = LlvmCpuDevice(threads=3)
CFG = VectorConfig(vector_bytes=64, fma=True, reassoc=True, l1_bytes=48 << 10, l2_bytes=2 << 20)




@pytest.mark.parametrize("width", [4, 8, 16])
def test_the_shuffles_transpose(width):
    """Each lane of the result names the (row, lane) it came from: a transpose."""
    module = ir.Module()
    vt = ir.VectorType(ir.IntType(32), width)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "t")
    b = ir.IRBuilder(fn.append_basic_block())
    rows = [ir.Constant(vt, [1000 * r + c for c in range(width)]) for r in range(width)]
    out = transpose(b, rows)

    def value(v):  # constant-fold the shuffles
        if isinstance(v, ir.Constant):
            return [int(x.constant) for x in v.constant]
        x, y, mask = v.operands
        both = value(x) + value(y)
        return [both[int(m.constant)] for m in mask.constant]

    assert [value(v) for v in out] == [[1000 * r + t for r in range(width)] for t in range(width)]


def test_a_b_transposed_operand_is_packed_by_transposes():
    rng = np.random.default_rng(0)
    kernel, mk = contraction_match(ABT, {"A": small_ints(rng, 64, 64), "B": small_ints(rng, 64, 64)}, CFG)
    names = {r.into: r.source for r in kernel.refs}
    assert mk is not None and {names[r] for r in mk.pack_refs if mk.transposable(r)} == {"B"}


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("shape", [(64, 64, 64), (13, 37, 70), (30, 700, 96), (7, 15, 40)])
def test_transposed_packs_give_exact_products(shape, threads):
    m, k, n = shape
    rng = np.random.default_rng(m + k + n)
    a, b = small_ints(rng, m, k), small_ints(rng, n, k)
    got, _ = execute(lowered(ABT, {"A": a, "B": b}), {"A": a, "B": b}, {"threads": threads}, THREE)
    np.testing.assert_array_equal(got["C"], a @ b.T, err_msg=f"{shape}, threads={threads}")


def test_heads_two_reductions_and_float64_stay_exact():
    rng = np.random.default_rng(4)
    q, kk = small_ints(rng, 64, 128), small_ints(rng, 64, 128)
    got, _ = execute(lowered(HEADS, {"Q": q, "K": kk}), {"Q": q, "K": kk}, {"threads": 1})
    want = np.einsum("ihk,jhk->hij", q.reshape(64, 4, 32), kk.reshape(64, 4, 32))
    np.testing.assert_array_equal(got["C"], want)
    a, b = small_ints(rng, 20, 6, 21), small_ints(rng, 80, 6, 21)
    got, _ = execute(lowered(TWO, {"A": a, "B": b}), {"A": a, "B": b}, {"threads": 1})
    np.testing.assert_array_equal(got["C"], np.einsum("ikl,jkl->ij", a, b))
    a64, b64 = small_ints(rng, 24, 45, dtype=np.float64), small_ints(rng, 40, 45, dtype=np.float64)
    got, _ = execute(lowered(ABT, {"A": a64, "B": b64}), {"A": a64, "B": b64}, {"threads": 1})
    np.testing.assert_array_equal(got["C"], a64 @ b64.T)
