"""TF32 and 3xTF32 GEMMs on the launched kernel (``backends.cuda.tma``), checked without a GPU:
the ``kmajor`` pass (``backends.cuda.kmajor``) gives a TF32 GEMM a K-major copy of B in a kernel
of its own, so that the unit, which reads 32-bit operands K-major only, takes both tiles from the
tensor memory accelerator, and a 3xTF32 GEMM both operands split into TF32 parts along 3K; the
plans, the kernels' products and their tensor maps, and (the interpreter) the meaning. Running
them needs an H100 or H200: tests/test_tma_gpu.py."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

import ref_interp
from backends.cuda.kmajor import COPY_TAG
from backends.driver import config_for
from ref_interp.stripe_exec import run_stripe
from stripe.ir import Block, Constant, RefDir, walk
from stripe.passes import optimize
from stripe.passes.gemm_tile import SPLIT_TAG
from tests.pass_support import assert_same_meaning, lowered
from tests.test_tensorize import BMM, MM, plans
from tests.test_tma import LAUNCH, SHAPES, generated, hopper, optimized
from tile.affine import Affine
from tile.precision import UNIT_ROUNDOFF, split_3xtf32

MM_BT = "function (A[M, K], B[N, K]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[n, k]); }"
MLP = """function (X[B, I], W[I, O], Bias[O]) -> (Y) {
  Z[b, o : B, O] = +(X[b, i] * W[i, o]);
  Y = relu(Z + Bias);
}"""


def copies(program: Block) -> list[Block]:
    return [b for b in walk(program) if COPY_TAG in b.tags]


def test_a_tf32_matmul_reads_a_k_major_copy_of_b_on_the_launched_tiles():
    p, cfg = optimized(MM, SHAPES, np.float32, precision="tf32")
    (copy,) = copies(p)
    k, n = SHAPES["B"]
    assert [i.range for i in copy.idxs] == [n, k]  # every element of the [N, K] copy, once
    (plan,) = plans(p)
    assert plan.unit == "tensor_core.tf32"
    assert (plan.tm, plan.tn) in LAUNCH.tiles and plan.kt * 4 == LAUNCH.k_bytes
    (buf,) = [r for r in p.refs if "tmp" in r.tags]
    assert buf.shape.sizes == (n, k)


@pytest.mark.parametrize("precision,n_copies", [("tf32", 1), ("3xtf32", 2)])
def test_the_copies_keep_the_programs_meaning(precision, n_copies):
    """Integer operands: exact in TF32 and float32, and their own TF32 high parts (low parts 0),
    so the interpreter's answer is unchanged by B's copy (tf32) or both operands' split (3xtf32)."""
    shapes = {"A": (256, 128), "B": (128, 256)}
    p, _ = optimized(MM, shapes, np.float32, precision=precision)
    assert len(copies(p)) == n_copies
    assert_same_meaning(lowered(MM, shapes, np.float32), p)


def test_the_launched_tf32_kernel_takes_both_tiles_k_major():
    p, cfg = optimized(MM, SHAPES, np.float32, precision="tf32")
    copy_kernel, gemm = generated(p, cfg)
    assert copy_kernel.launch is None and gemm.launch is not None
    (m, k), (_, n) = SHAPES["A"], SHAPES["B"]
    (pa, dims_a, row_a, box_a, dt_a), (pb, dims_b, row_b, box_b, dt_b) = gemm.launch["maps"]
    # (TFLOAT32: the copies round to TF32, backends.cuda.launch.MAP_TYPES)
    assert (dims_a, row_a, box_a, dt_a) == ((k, m), 4 * k, (32, 256), "tfloat32")
    assert (dims_b, row_b, box_b, dt_b) == ((k, n), 4 * k, (32, 128), "tfloat32")  # B[n, k]: K innermost
    wgmma = r"wgmma\.mma_async\.sync\.aligned\.(\w+)\.f32\.tf32\.tf32 \{[^}]*\}, %\d+, %\d+, p, 1, 1; \}"
    products = re.findall(wgmma, gemm.text)
    assert products == ["m64n128k8"] * 4  # a K step of 32: four slices of 8, no transposition flags
    assert gemm.text.count("cp.async.bulk.tensor") == 2  # per step: A's tile and B's, one copy each


def test_a_b_stored_k_major_needs_no_copy():
    shapes = {"A": SHAPES["A"], "B": SHAPES["B"][::-1]}
    p, cfg = optimized(MM_BT, shapes, np.float32, precision="tf32")
    assert not copies(p)
    (plan,) = plans(p)
    assert (plan.tm, plan.tn) in LAUNCH.tiles and plan.kt == 32
    (gemm,) = generated(p, cfg)
    assert gemm.launch is not None


def test_the_fused_epilogue_keeps_its_copy_and_its_meaning():
    shapes = {"X": (256, 128), "W": (128, 256), "Bias": (256,)}
    p, cfg = optimized(MLP, shapes, np.float32, precision="tf32")
    assert len(copies(p)) == 1
    assert_same_meaning(lowered(MLP, shapes, np.float32), p)
    assert [k.launch is not None for k in generated(p, cfg)] == [False, True]


def test_without_tiled_kernels_there_is_no_copy():
    """``tiled=False`` leaves out the steps that tile kernels, this one with ``gemm_tile``."""
    cfg = config_for(hopper(227 * 1024), {"precision": "tf32", "tiled": False})
    p = optimize(lowered(MM, SHAPES, np.float32), cfg)
    assert not copies(p) and not plans(p)


@pytest.mark.parametrize("src,shapes,dtype,precision,launch_bytes", [
    (MM, SHAPES, np.float32, "tf32", 0),  # the device launches nothing: mma.sync, B as it is
    (MM, SHAPES, np.float32, "3xtf32", 0),  # the device launches nothing: mma.sync splits itself
    (MM, {"A": (1000, 1000), "B": (1000, 1000)}, np.float32, "3xtf32", 227 * 1024),  # no whole tiles
    (MM, SHAPES, np.float32, None, 227 * 1024),  # float32 stays off the unit
    (MM, SHAPES, np.float16, None, 227 * 1024),  # 16-bit: B is read N-major
    (MM, {"A": (1000, 1000), "B": (1000, 1000)}, np.float32, "tf32", 227 * 1024),  # no whole tiles
    (BMM, {"A": (4, 512, 256), "B": (4, 256, 512)}, np.float32, "tf32", 227 * 1024),  # batched
], ids=["no-launch", "3xtf32-no-launch", "3xtf32-1000^3", "fp32", "fp16", "1000^3", "batched"])
def test_other_gemms_get_no_copy(src, shapes, dtype, precision, launch_bytes):
    p, _ = optimized(src, shapes, dtype, launch_bytes=launch_bytes, precision=precision)
    assert not copies(p)


# ------------------------------------------------------------------------------ 3xtf32
def split_gemm(p: Block) -> Block:
    (gemm,) = [b for b in walk(p) if SPLIT_TAG in b.tags]
    return gemm


@pytest.mark.parametrize("src,b_shape", [(MM, (2048, 512)), (MM_BT, (512, 2048))], ids=["B[K,N]", "B[N,K]"])
def test_a_3xtf32_matmul_reads_split_copies_along_3k_on_the_fold_tiles(src, b_shape):
    shapes = {"A": SHAPES["A"], "B": b_shape}
    p, cfg = optimized(src, shapes, np.float32, precision="3xtf32")
    (m, k), n = SHAPES["A"], 512
    split_a, split_b = copies(p)
    assert [i.range for i in split_a.idxs] == [m, 3, k] and [i.range for i in split_b.idxs] == [n, 3, k]
    assert sorted(r.shape.sizes for r in p.refs if "tmp" in r.tags) == sorted([(m, 3 * k), (n, 3 * k)])
    (plan,) = plans(p)
    assert plan.unit == "tensor_core.3xtf32"
    assert (plan.tm, plan.tn) in LAUNCH.fold_tiles and plan.kt * 4 == LAUNCH.k_bytes
    steps = [b for b in walk(split_gemm(p)) if "gpu_kstep" in b.tags]
    assert [i.range for i in steps[0].idxs] == [3 * k // plan.kt]
    # A's parts [lo | hi | hi] against B's [hi | lo | hi]: lo·hi + hi·lo + hi·hi
    for copy, lo_at in zip((split_a, split_b), (0, 1)):
        (out,) = [r for r in copy.refs if r.dir == RefDir.OUT]
        assert out.access[1] == Affine.var("k") + Affine.var("p") * k  # part p at p·K + k
        (at_lo,) = [s.value for s in copy.stmts if isinstance(s, Constant) and s.into == "$at_lo"]
        assert at_lo == lo_at


def test_a_split_gemm_keeps_its_fused_epilogue_and_its_meaning():
    shapes = {"X": (256, 128), "W": (128, 256), "Bias": (256,)}
    p, cfg = optimized(MLP, shapes, np.float32, precision="3xtf32")
    assert len(copies(p)) == 2 and "+" in split_gemm(p).name  # the product and bias + relu, fused
    assert_same_meaning(lowered(MLP, shapes, np.float32), p)
    assert [k.launch is not None for k in generated(p, cfg)] == [False, False, True]


def test_the_split_sums_the_three_products_of_tf32_parts():
    """Random normals through the interpreter: the split program's C is lo·hi + hi·lo + hi·hi of
    ``tile.precision.split_3xtf32``'s parts (float32 sums), within 3xtf32's bound of the exact
    product, and far closer than TF32 alone."""
    shapes = {"A": (128, 256), "B": (256, 128)}
    p, _ = optimized(MM, shapes, np.float32, precision="3xtf32")
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal(shapes[x]).astype(np.float32) for x in "AB")
    got = run_stripe(p, {"A": a, "B": b})["C"].astype(np.float64)
    (ha, la), (hb, lb) = (tuple(x.astype(np.float64) for x in split_3xtf32(v)) for v in (a, b))
    k = shapes["A"][1]
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    three = la @ hb + ha @ lb + ha @ hb
    assert np.all(np.abs(got - three) <= 3 * k * 2.0**-24 * scale)  # float32 sums of those products
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.all(np.abs(got - exact) <= (3 * UNIT_ROUNDOFF["3xtf32"] + k * 2.0**-24) * scale)
    assert np.max(np.abs(got - exact)) < np.max(np.abs(ha @ hb - exact)) / 100


def test_infinite_operands_give_what_the_interpreters_3xtf32_gives():
    """An infinite x has ``hi = x`` and ``lo = 0`` (not inf - inf), as ``split_3xtf32``."""
    shapes = {"A": (256, 128), "B": (128, 256)}
    p, _ = optimized(MM, shapes, np.float32, precision="3xtf32")
    rng = np.random.default_rng(6)
    a, b = (rng.integers(-3, 4, shapes[x]).astype(np.float32) for x in "AB")
    a[3, 5], b[7, 9] = np.inf, -np.inf
    got = run_stripe(p, {"A": a, "B": b})["C"]
    want = ref_interp.run(MM, {"A": a, "B": b}, precision="3xtf32")["C"]
    np.testing.assert_array_equal(got, want)


def test_the_launched_3xtf32_kernel_folds_each_k_steps_sums():
    p, cfg = optimized(MM, SHAPES, np.float32, precision="3xtf32")
    *splits, gemm = generated(p, cfg)
    assert [k.launch is None for k in splits] == [True, True] and gemm.launch is not None
    (m, k), (_, n) = SHAPES["A"], SHAPES["B"]
    maps = gemm.launch["maps"]
    assert [(dims, row, box) for _, dims, row, box, _ in maps] == [
        ((3 * k, m), 12 * k, (32, 128)), ((3 * k, n), 12 * k, (32, 128))]
    wgmma = (r"wgmma\.mma_async\.sync\.aligned\.m64n128k8\.f32\.tf32\.tf32 [^;]*; \}\" : ([^:]*) : "
             r"[^:]*\"r\"\((\d)\)")
    products = re.findall(wgmma, gemm.text)
    # a K step's four slices into the step's own sums, the first replacing them
    assert [(outs.split(",")[0].strip(), scale) for outs, scale in products] == [
        ('"+f"(s0_0_0)', "0"), ('"+f"(s0_0_0)', "1"), ('"+f"(s0_0_0)', "1"), ('"+f"(s0_0_0)', "1")]
    loop = gemm.text[gemm.text.index("for (int ks"):]
    assert loop.index("wait_group.sync.aligned 0") < loop.index("c0_0_0 += s0_0_0;") < loop.index(
        "mbarrier.arrive.shared::cta.b64 _, [%0];")
    assert "(ks - 1)" not in loop  # the step's own buffer is released, once its products are done


def test_an_unsplit_3xtf32_gemm_takes_no_launched_tile():
    """Without the pass (its step left out) the GEMM's operands are not split: the launched
    kernel, which does not split them, is not ranked for it."""
    cfg = config_for(hopper(227 * 1024), {"precision": "3xtf32"})
    cfg = replace(cfg, passes=tuple(s for s in cfg.passes if s.name != "kmajor_b"))
    p = optimize(lowered(MM, SHAPES, np.float32), cfg)
    (plan,) = plans(p)
    assert plan.unit == "tensor_core.3xtf32"
    assert (plan.tm, plan.tn) not in LAUNCH.fold_tiles + LAUNCH.tiles
