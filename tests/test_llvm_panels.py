"""Threads over the micro-kernel's panels (``backends/llvm/match.panel_split``): a matmul with
enough ``NR``-wide panels of B is split over its column index in whole panels (each thread packs
only its own), else over rows as ``schedule.plan`` chose; and its cache blocks
(``microkernel.cache_blocks``: K and N blocks sized from L1 and L2). Exact answers on sizes that
are no multiple of a panel or block, bit-identical under ``strict``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import tile
from backends.llvm import LlvmCpuDevice
from backends.llvm.device import chunk_ranges
from backends.llvm.host import host_target
from backends.llvm.match import (
    VectorConfig,
    analyse,
    cache_blocks,
    from_nest,
    host_vector_bytes,
    panel,
    panel_split,
    row_tile,
)
from backends.llvm.schedule import plan
from ref_interp.stripe_exec import run_stripe
from stripe.config import target_config
from stripe.gemm_nest import read as read_nest
from stripe.ir import Block
from stripe.passes import optimize
from tests.llvm_runner import assert_same, buffer_names, execute, lowered
from tests.pass_support import run_pass
from tile.dtypes import DType

RNG = np.random.default_rng(41)
MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
BATCHED = "function (A[Q, M, K], B[Q, K, N]) -> (C) { C[q, i, j: Q, M, N] = +(A[q, i, k] * B[q, k, j]); }"
EIGHT = LlvmCpuDevice(threads=8)
CFG = VectorConfig(host_vector_bytes(host_target()[1]), fma=True, reassoc=True)


def ints(*shape: int) -> np.ndarray:
    return RNG.integers(-3, 4, shape).astype(np.float32)


def nr() -> int:
    w, nv = panel(1 << 20, CFG, DType.FLOAT32)
    return w * nv


def schedule(src: str, inputs: dict, threads: int):
    k = lowered(src, inputs).stmts[0].stmts[-1]
    return k, panel_split(k, plan(k, buffer_names(k), threads), threads, CFG, {})


def test_chunks_start_at_whole_grains():
    assert chunk_ranges(200, 4, 64) == [(0, 64), (64, 128), (128, 192), (192, 200)]
    assert chunk_ranges(130, 4, 64) == [(0, 64), (64, 128), (128, 130)]  # 3 grains: 3 chunks
    assert chunk_ranges(512, 3, 64) == [(0, 128), (128, 320), (320, 512)]
    assert chunk_ranges(10, 4) == [(0, 2), (2, 5), (5, 7), (7, 10)]  # grain 1: as before
    assert chunk_ranges(1, 4, 64) == [(0, 1)]


@pytest.mark.parametrize(
    ("panels", "threads", "split"),
    [(4, 4, True), (8, 4, True), (5, 2, False), (9, 2, True), (5, 5, True), (1, 1, False), (3, 4, False)],
)
def test_which_matmuls_split_over_panels(panels, threads, split):
    n = nr() * panels - 7  # a partial last panel
    k, sched = schedule(MATMUL, {"A": ints(60, 9), "B": ints(9, n)}, threads)
    j = [ix.name for ix in k.idxs].index("j")
    assert (sched.split_index == j and sched.grain == nr()) == split
    if not split:
        assert sched.grain == 1


def test_a_batch_split_stays():
    k, sched = schedule(BATCHED, {"A": ints(64, 6, 5), "B": ints(64, 5, 4 * nr())}, 4)
    assert k.idxs[sched.split_index].name == "q" and sched.grain == 1


@pytest.mark.parametrize(
    ("m", "kk", "panels", "threads"), [(50, 37, 4, 4), (7, 3, 3, 3), (61, 70, 8, 4), (20, 5, 9, 2)]
)
def test_panel_split_exact_and_strict_bit_identical(m, kk, panels, threads):
    n = nr() * panels - 5
    a, b = ints(m, kk), ints(kk, n)
    program = lowered(MATMUL, {"A": a, "B": b})
    how = {"threads": threads, "min_parallel_points": 1}
    got, kernels = execute(program, {"A": a, "B": b}, how, EIGHT)
    np.testing.assert_array_equal(got["C"], a @ b)
    chunks = kernels[-1].ranges()
    assert len(chunks) == threads and all(lo % nr() == 0 for lo, _ in chunks), chunks
    assert chunks[-1][1] == n and len(set(kernels[-1].last_threads)) == threads
    x = RNG.standard_normal((m, kk)).astype(np.float32)
    y = RNG.standard_normal((kk, n)).astype(np.float32)
    program = lowered(MATMUL, {"A": x, "B": y})
    strict, _ = execute(program, {"A": x, "B": y}, {**how, "strict": True}, EIGHT)
    assert_same(strict, run_stripe(program, {"A": x, "B": y}))
    rows, kernels = execute(program, {"A": x, "B": y}, {**how, "strict": True, "panel_split": False}, EIGHT)
    assert kernels[-1].schedule.grain == 1
    np.testing.assert_array_equal(rows["C"], strict["C"])  # the same sums in the same order


SMALL_CACHES = {"L1": 4096, "L2": 65536}  # KC = 64 points, NC = 2 panels: many blocks on small sizes


@pytest.mark.parametrize(("m", "kk", "panels"), [(23, 150, 5), (6, 64, 2), (13, 65, 1), (40, 7, 3)])
@pytest.mark.parametrize("threads", [1, 3])
def test_cache_blocks_exact_and_strict_bit_identical(m, kk, panels, threads):
    """The cache-blocked path (K blocks of 64 points, two panels a block, partial last ones,
    leftover columns and rows) sums every element in the same order as the whole-K tiles."""
    n = nr() * panels + 9
    x = RNG.standard_normal((m, kk)).astype(np.float32)
    y = RNG.standard_normal((kk, n)).astype(np.float32)
    program = lowered(MATMUL, {"A": x, "B": y})
    how = {"threads": threads, "min_parallel_points": 1, "cache_bytes": SMALL_CACHES}
    strict, kernels = execute(program, {"A": x, "B": y}, {**how, "strict": True}, EIGHT)
    assert_same(strict, run_stripe(program, {"A": x, "B": y}))
    whole, plain = execute(program, {"A": x, "B": y}, {**how, "strict": True, "cache_blocks": False}, EIGHT)
    np.testing.assert_array_equal(whole["C"], strict["C"])
    blocked = kernels[-1].library.source != plain[-1].library.source
    # blocked when the micro-kernel packs (two row tiles or more) and there are two blocks or more
    assert blocked == (m >= 12 and kk > 64)
    a, b = ints(m, kk), ints(kk, n)
    got, _ = execute(program, {"A": a, "B": b}, how, EIGHT)
    np.testing.assert_array_equal(got["C"], a @ b)


def test_cache_blocks_follow_the_cache_sizes():
    k = lowered(MATMUL, {"A": ints(64, 2000), "B": ints(2000, 512)}).stmts[0].stmts[-1]
    dims = {r.into: r.shape.dims for r in k.refs}
    shape = analyse(k, dims, {r.into: r.shape.dtype for r in k.refs}, None)
    assert cache_blocks(k, shape, 6, 64, CFG) is None  # no cache sizes: whole reductions
    big = replace(CFG, l1_bytes=48 << 10, l2_bytes=2 << 20)
    assert cache_blocks(k, shape, 6, 64, big) == (512, 512, 512)  # 6 rows of A: 12 KiB; B: 1 MiB
    small = replace(CFG, l1_bytes=32 << 10, l2_bytes=1 << 20)
    assert cache_blocks(k, shape, 6, 64, small) == (320, 384, 320)


def _fill_body(exe) -> str:
    """The zero fill's internal function (kernel 0) of a compiled program, as LLVM IR text."""
    source = next(iter(exe._compiled.values())).library.source
    head = source.index('define internal void @"tile_k0_zero.body"')
    return source[head : source.index("}", head)]


@pytest.mark.parametrize("caches", [None, SMALL_CACHES])
def test_the_zero_fill_folds_into_a_micro_kernel_that_writes_every_element(caches):
    """``C``'s zero fill (kernel 0) does nothing when the micro-kernel writes all of ``C``: its
    tiles start from zero (in the first K block when blocked), garbage in ``C`` never shows."""
    x = RNG.standard_normal((40, 150)).astype(np.float32)
    y = RNG.standard_normal((150, nr() * 2 + 3)).astype(np.float32)
    how = {"threads": 2, "min_parallel_points": 1, "strict": True, "cache": False}
    if caches:
        how["cache_bytes"] = caches
    exe = tile.compile(MATMUL, "llvm_cpu.0", how)
    want = run_stripe(lowered(MATMUL, {"A": x, "B": y}), {"A": x, "B": y})
    for _ in range(3):  # the output's memory is reused: filled with garbage between calls
        out = exe(A=x, B=y)["C"]
        assert_same({"C": out}, want)
        out[...] = np.nan
        del out
    assert "store" not in _fill_body(exe) and "memset" not in _fill_body(exe)


def test_a_partly_written_output_keeps_its_zero_fill():
    src = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]), i < 3; }"
    a, b = ints(20, 9), ints(9, 70)
    got, kernels = execute(lowered(src, {"A": a, "B": b}), {"A": a, "B": b}, {"threads": 2}, EIGHT)
    want = a @ b
    want[3:] = 0
    np.testing.assert_array_equal(got["C"], want)
    exe = tile.compile(src, "llvm_cpu.0")
    for _ in range(2):
        out = exe(A=a, B=b)["C"]
        np.testing.assert_array_equal(out, want)
        out[...] = np.nan
        del out


@pytest.mark.parametrize(("m", "kk", "n", "threads"), [(100, 300, 200, 4), (37, 70, 131, 3), (8, 5, 64, 1)])
def test_a_gemm_tile_nest_runs_as_a_flat_gemm_with_its_tiles(m, kk, n, threads):
    """The optimizer's ``gemm_tile`` nest (here with the GPU config's tiles): the LLVM code
    generator reads it back (``from_nest``) and runs the flat GEMM in the nest's cache tiles,
    bit-identical to the untiled program under ``strict`` (each element's sum in K order)."""
    x = RNG.standard_normal((m, kk)).astype(np.float32)
    y = RNG.standard_normal((kk, n)).astype(np.float32)
    program = lowered(MATMUL, {"A": x, "B": y})
    nest = run_pass("gemm_tile", {"reqs": ["contraction", "kernel"]}, program, "opencl_gpu")
    kernel = nest.stmts[0].stmts[-1]
    got = from_nest(kernel)
    assert got is not None and not any(isinstance(s, Block) for s in got[0].stmts)
    how = {"threads": threads, "min_parallel_points": 1, "strict": True}
    out, kernels = execute(nest, {"A": x, "B": y}, how, EIGHT)
    assert_same(out, run_stripe(program, {"A": x, "B": y}))
    assert kernels[-1].info.block is kernel  # the runner's view: the nest (names, work)
    a, b = ints(m, kk), ints(kk, n)
    out, _ = execute(nest, {"A": a, "B": b}, {"threads": threads}, EIGHT)
    np.testing.assert_array_equal(out["C"], a @ b)


def test_a_nest_with_an_epilogue_runs_as_it_is():
    src = "function (A[M, K], B[K, N]) -> (O) { C[i, j: M, N] = +(A[i, k] * B[k, j]); O = relu(C); }"
    a, b = ints(12, 9), ints(9, 20)
    nest = optimize(lowered(src, {"A": a, "B": b}), target_config("opencl_gpu"))  # fused, tiled
    kernel = next(k for k in nest.stmts[0].stmts if "gpu_group" in k.tags)
    assert read_nest(kernel).gemm.epilogue is not None and from_nest(kernel) is None
    out, _ = execute(nest, {"A": a, "B": b}, {"threads": 2}, EIGHT)
    np.testing.assert_array_equal(out["O"], np.maximum(a @ b, 0))


def test_llvm_cpu_takes_its_cache_tiles_from_gemm_tile():
    """``llvm_cpu`` ends with ``gemm_tile`` (``model: cpu``): K and N tiles from the config's L1
    and L2 (6 rows of A in a quarter of L1, the K x N block of B in half of L2), M whole; the
    compiled kernel blocks by them and matches numpy exactly on integers."""
    cfg = target_config("llvm_cpu")
    l1, l2 = (cfg.hardware.mem_bytes(m) for m in ("L1", "L2"))
    a, b = ints(100, 1000), ints(1000, 700)
    program = optimize(lowered(MATMUL, {"A": a, "B": b}), cfg)
    nest = read_nest(program.stmts[0].stmts[-1])
    kt = l1 // (4 * 6 * 4) // 64 * 64
    tn = 1 << ((l2 // 2 // (kt * 4)).bit_length() - 1)
    assert (nest.shape.tm, nest.shape.tn, nest.shape.kt) == (128, min(tn, 1024), kt)
    exe = tile.compile(MATMUL, "llvm_cpu.0", {"threads": 2, "cache": False})
    np.testing.assert_array_equal(exe(A=a, B=b)["C"], a @ b)
    cp = next(iter(exe._compiled.values()))
    assert from_nest(cp.kernels[-1].info.block) is not None  # the runner ran the nest


def test_the_cpu_rule_on_tiny_caches():
    cfg = target_config("llvm_cpu")
    mems = {**cfg.hardware.mem_units}
    mems["L1"] = replace(mems["L1"], size_KiB=1)
    mems["L2"] = replace(mems["L2"], size_KiB=2)
    hw = replace(cfg.hardware, mem_units=mems)
    p = lowered(MATMUL, {"A": ints(9, 300), "B": ints(300, 200)})
    out = optimize(p, replace(cfg, hardware=hw))
    nest = read_nest(out.stmts[0].stmts[-1])
    assert (nest.shape.tn, nest.shape.kt) == (64, 64)  # at least a panel and 64 points
    a, b = ints(9, 300), ints(300, 200)
    got, _ = execute(out, {"A": a, "B": b}, {"threads": 3}, EIGHT)
    np.testing.assert_array_equal(got["C"], a @ b)


@pytest.mark.parametrize("vector_bytes, nv, mr", [(64, 4, 6), (32, 2, 6), (16, 2, 6)])
def test_the_register_tile_fits_the_vector_registers(vector_bytes, nv, mr):
    """A tile keeps MR x NV accumulators, NV vectors of B and a broadcast of A: AVX-512's 32
    registers hold 6 x 4; AVX2's 16 hold 6 x 2 (15), where 3 x 4 (17) spilled and ran at half the
    speed (bench/RESULTS.md). Wide N, many rows: the widest tile the registers take."""
    from backends.llvm.microkernel import ACC_BUDGET

    cfg = VectorConfig(vector_bytes=vector_bytes, fma=True, reassoc=True, l1_bytes=48 << 10, l2_bytes=2 << 20)
    width, got = panel(4096, cfg, DType.FLOAT32)
    assert (width, got) == (vector_bytes // 4, nv)
    assert row_tile(4096, got, ACC_BUDGET[vector_bytes]) == mr
    assert mr * nv + nv + 1 <= (32 if vector_bytes == 64 else 16)
