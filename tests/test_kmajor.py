"""TF32 GEMMs on the launched kernel (``backends.clike.tma``), checked without a GPU: the
``kmajor`` pass (``stripe.passes.kmajor``) gives such a GEMM a K-major copy of B in a kernel of
its own, so that the unit, which reads 32-bit operands K-major only, takes both tiles from the
tensor memory accelerator; the plan, the kernel's products and its tensor maps. Running them
needs an H100: tests/test_tma_gpu.py."""

from __future__ import annotations

import re

import numpy as np
import pytest

from backends.driver import config_for
from stripe.ir import Block, walk
from stripe.passes import optimize
from stripe.passes.kmajor import COPY_TAG
from tests.pass_support import assert_same_meaning, lowered
from tests.test_tensorize import BMM, MM, plans
from tests.test_tma import SHAPES, WG, generated, hopper, optimized

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
    assert (plan.tm, plan.tn) in WG.launch_tiles and plan.kt * 4 == WG.launch_k_bytes
    (buf,) = [r for r in p.refs if "tmp" in r.tags]
    assert buf.shape.sizes == (n, k)


def test_the_copy_keeps_the_programs_meaning():
    """Integer operands: exact in TF32 and float32, so the interpreter's answer is unchanged."""
    shapes = {"A": (256, 128), "B": (128, 256)}
    p, _ = optimized(MM, shapes, np.float32, precision="tf32")
    assert len(copies(p)) == 1
    assert_same_meaning(lowered(MM, shapes, np.float32), p)


def test_the_launched_tf32_kernel_takes_both_tiles_k_major():
    p, cfg = optimized(MM, SHAPES, np.float32, precision="tf32")
    copy_kernel, gemm = generated(p, cfg)
    assert copy_kernel.launch is None and gemm.launch is not None
    (m, k), (_, n) = SHAPES["A"], SHAPES["B"]
    (pa, dims_a, row_a, box_a, dt_a), (pb, dims_b, row_b, box_b, dt_b) = gemm.launch["maps"]
    # (TFLOAT32: the copies round to TF32, backends.opencl.cuda_launch.MAP_TYPES)
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
    assert (plan.tm, plan.tn) in WG.launch_tiles and plan.kt == 32
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
    (MM, SHAPES, np.float32, "3xtf32", 227 * 1024),  # not a launched mode
    (MM, SHAPES, np.float32, None, 227 * 1024),  # float32 stays off the unit
    (MM, SHAPES, np.float16, None, 227 * 1024),  # 16-bit: B is read N-major
    (MM, {"A": (1000, 1000), "B": (1000, 1000)}, np.float32, "tf32", 227 * 1024),  # no whole tiles
    (BMM, {"A": (4, 512, 256), "B": (4, 256, 512)}, np.float32, "tf32", 227 * 1024),  # batched
], ids=["no-launch", "3xtf32", "fp32", "fp16", "1000^3", "batched"])
def test_other_gemms_get_no_copy(src, shapes, dtype, precision, launch_bytes):
    p, _ = optimized(src, shapes, dtype, launch_bytes=launch_bytes, precision=precision)
    assert not copies(p)
