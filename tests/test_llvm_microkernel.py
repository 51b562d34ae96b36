"""The LLVM backend's register-blocked micro-kernel (``backends/llvm/microkernel.py``): what it
matches, exact answers on sizes that are no multiple of its tiles, bit-identical float sums under
``strict`` (and no fused multiply-add there), the cache-tiled pipeline, and the thread setting."""

from __future__ import annotations

import numpy as np
import pytest

import ref_interp
import tile
from backends.llvm import LlvmCpuDevice
from backends.llvm.device import env_threads
from backends.llvm.match import analyse
from ref_interp.stripe_exec import run_stripe
from tests.llvm_runner import assert_same, execute, lowered
from tile.errors import TileRuntimeError

RNG = np.random.default_rng(14)
MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
CONV = """function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {
    O[n, x, y, co: N, H, W, CO] = +(I[n, x + kx - 1, y + ky - 1, ci] * K[kx, ky, ci, co]);
}"""
FOUR = LlvmCpuDevice(threads=4)
# (M, K, N): ones, primes, fewer columns than a vector, a partial last vector and row block
SHAPES = [(1, 1, 1), (3, 5, 7), (17, 33, 31), (100, 3, 129), (13, 64, 50), (64, 64, 64)]


def ints(*shape: int, dtype=np.float32) -> np.ndarray:
    return RNG.integers(-3, 4, shape).astype(dtype)


def kernel_of(program):
    return program.stmts[0].stmts[-1]


def parent_info(block):
    return {r.into: r.shape.dims for r in block.refs}, {r.into: r.shape.dtype for r in block.refs}


def test_matches_contractions_with_a_contiguous_output_index():
    mm = kernel_of(lowered(MATMUL, {"A": ints(8, 4), "B": ints(4, 32)}))
    shape = analyse(mm, *parent_info(mm), None)
    names = [ix.name for ix in mm.idxs]
    assert shape is not None and names[shape.v] == "j" and names[shape.r] == "i"
    assert [names[k] for k in shape.red] == ["k"]
    # a row sum's vector index (i) is 32 apart in X and no rows share X: a gather at every
    # reduction point, so the emitter declines it and the plain loops run (their innermost j as
    # vectors: backends/llvm/rowreduce.py)
    x = ints(8, 32)
    program = lowered("function (X[M, N]) -> (O) { O[i: M] = +(X[i, j]); }", {"X": x})
    rows = kernel_of(program)
    assert analyse(rows, *parent_info(rows), None) is not None
    got, kernels = execute(program, {"X": x}, {"optimize": False})
    source = kernels[-1].library.source
    assert "llvm.vector.reduce.fadd" in source and "llvm.fma" not in source
    np.testing.assert_array_equal(got["O"], x.sum(axis=1))
    # integer contractions are not (the vector code is float): plain loops
    a = ints(8, 4, dtype=np.int32)
    ex = kernel_of(lowered(MATMUL, {"A": a, "B": ints(4, 32, dtype=np.int32)}))
    assert analyse(ex, *parent_info(ex), None) is None


@pytest.mark.parametrize("src", ["O[j: N] = >(X[i, j])", "O[j: N] = <(X[i, j])", "O[] = >(X[i, j])"])
def test_max_and_min_keep_the_nan_rule(src):
    # the micro-kernel applies the scalar code's NaN-wins select lane-wise, in the same order
    # (signed zeros are left out: max(-0, +0) already differs between the scalar code and the
    # interpreter, which follows np.maximum)
    x = RNG.standard_normal((300, 37)).astype(np.float32)
    x[5, 3] = x[7, 9] = np.nan
    program = lowered(f"function (X[M, N]) -> (O) {{ {src}; }}", {"X": x})
    for how in ({}, {"microkernel": False}):
        got, _ = execute(program, {"X": x}, {**how, "strict": True})
        want = run_stripe(program, {"X": x})
        assert_same(got, want)
    f = tile.compile(f"function (X[M, N]) -> (O) {{ {src}; }}", "llvm_cpu.0", {"cache": False})
    assert_same(f(X=x), ref_interp.run(f"function (X[M, N]) -> (O) {{ {src}; }}", {"X": x}))


@pytest.mark.parametrize("m, k, n", SHAPES)
@pytest.mark.parametrize("threads", [1, 4])
def test_matmul_odd_sizes_exact(m, k, n, threads):
    a, b = ints(m, k), ints(k, n)
    got, kernels = execute(lowered(MATMUL, {"A": a, "B": b}), {"A": a, "B": b}, {"threads": threads}, FOUR)
    np.testing.assert_array_equal(got["C"], a @ b)


@pytest.mark.parametrize("m, k, n", SHAPES[1:])
def test_strict_is_bit_identical_and_has_no_fma(m, k, n):
    a = RNG.standard_normal((m, k)).astype(np.float32)
    b = RNG.standard_normal((k, n)).astype(np.float32)
    program = lowered(MATMUL, {"A": a, "B": b})
    got, kernels = execute(program, {"A": a, "B": b}, {"strict": True, "min_parallel_points": 1}, FOUR)
    assert_same(got, run_stripe(program, {"A": a, "B": b}))
    source = kernels[-1].library.source
    assert " x float>" in source and "llvm.fma" not in source
    # not strict: fused multiply-adds, within the reduction-length tolerance
    loose, kernels = execute(program, {"A": a, "B": b}, {}, FOUR)
    assert "llvm.fma" in kernels[-1].library.source
    eps = float(np.finfo(np.float32).eps)
    bound = 2 * eps * k * np.maximum(np.abs(a) @ np.abs(b), 1)
    assert (np.abs(loose["C"] - got["C"]) <= bound).all()


@pytest.mark.parametrize("h, ci, co", [(5, 3, 17), (9, 8, 32), (14, 32, 32)])
def test_padded_convolution_rows_guarded_bit_identical(h, ci, co):
    # the row index (x) is in the padding constraints: full tiles inside, masked rows at the edges
    ins = {
        "I": RNG.standard_normal((1, h, h + 2, ci)).astype(np.float32),
        "K": RNG.standard_normal((3, 3, ci, co)).astype(np.float32),
    }
    program = lowered(CONV, ins)
    got, _ = execute(program, ins, {"strict": True})
    assert_same(got, run_stripe(program, ins))
    plain, _ = execute(program, ins, {"strict": True, "microkernel": False})
    assert_same(got, plain)


def test_float64_and_inf_nan_propagate_as_the_interpreter():
    a = RNG.standard_normal((19, 23))
    b = RNG.standard_normal((23, 11))
    a[3, 4], b[5, 6] = np.inf, np.nan
    program = lowered(MATMUL, {"A": a, "B": b})
    got, kernels = execute(program, {"A": a, "B": b}, {"strict": True})
    assert " x double>" in kernels[-1].library.source
    assert_same(got, run_stripe(program, {"A": a, "B": b}))


@pytest.mark.parametrize("m, k, n", [(3, 5, 7), (130, 67, 200), (257, 300, 33)])
def test_cache_tiled_pipeline_exact(m, k, n):
    a, b = ints(m, k), ints(k, n)
    for config in ("llvm_cpu_tiled", None):
        f = tile.compile(MATMUL, "llvm_cpu.0", {"cache": False, **({"config": config} if config else {})})
        np.testing.assert_array_equal(f(A=a, B=b)["C"], a @ b)


def test_tiled_conv_and_batch_against_the_interpreter():
    ins = {"I": ints(2, 11, 7, 5), "K": ints(3, 3, 5, 19)}
    f = tile.compile(CONV, "llvm_cpu.0", {"cache": False, "config": "llvm_cpu_tiled", "threads": 3})
    np.testing.assert_array_equal(f(**ins)["O"], ref_interp.run(CONV, ins)["O"])


def test_thread_pool_size_from_the_environment(monkeypatch):
    monkeypatch.setenv("TILE_NUM_THREADS", "3")
    assert env_threads() == 3
    dev = LlvmCpuDevice()
    assert dev.pool.size == 3 and "3 threads (TILE_NUM_THREADS)" in dev.description
    assert LlvmCpuDevice(threads=5).pool.size == 5  # an explicit count wins
    monkeypatch.setenv("TILE_NUM_THREADS", "zero")
    with pytest.raises(TileRuntimeError, match="TILE_NUM_THREADS"):
        env_threads()
    monkeypatch.delenv("TILE_NUM_THREADS")
    assert env_threads() is None


def test_threads_setting_splits_the_micro_kernel_chunks():
    a, b = ints(96, 40), ints(40, 48)
    program = lowered(MATMUL, {"A": a, "B": b})
    for threads in (1, 3, 4, 7):
        how = {"threads": threads, "min_parallel_points": 1}
        got, kernels = execute(program, {"A": a, "B": b}, how, FOUR)
        np.testing.assert_array_equal(got["C"], a @ b)
        assert len(kernels[-1].ranges()) == threads
        assert len(set(kernels[-1].last_threads)) == min(threads, 4)


@pytest.mark.parametrize("threads", [1, 4])
def test_a_long_reduction_packs_a_megabyte_panel_on_the_kernel_threads_stack(threads):
    # K = 4096: the packed B panel (4096 x 64 floats) is 1 MiB of stack scratch, on the
    # dispatcher (one chunk) or a pool thread; their stacks are sized for it
    a, b = ints(40, 4096), ints(4096, 64)
    f = tile.compile(MATMUL, "llvm_cpu.0", {"cache": False, "threads": threads, "min_parallel_points": 1})
    np.testing.assert_array_equal(f(A=a, B=b)["C"], a @ b)


@pytest.mark.parametrize("m, k, n", [(5, 3, 7), (37, 19, 70), (64, 32, 129)])
def test_strided_operands_are_gathered(m, k, n):
    # A @ B.T: B's elements along the vector index j are K apart: gathered (packed once per
    # panel when the rows share it), exact on full tiles, partial vectors and single rows
    src = "function (A[M, K], B[N, K]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[j, k]); }"
    a = RNG.standard_normal((m, k)).astype(np.float32)
    b = RNG.standard_normal((n, k)).astype(np.float32)
    program = lowered(src, {"A": a, "B": b})
    kern = kernel_of(program)
    assert analyse(kern, *parent_info(kern), None) is not None
    how = {"strict": True, "threads": 3, "min_parallel_points": 1}
    got, _ = execute(program, {"A": a, "B": b}, how, FOUR)
    assert_same(got, run_stripe(program, {"A": a, "B": b}))
