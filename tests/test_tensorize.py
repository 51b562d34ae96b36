"""Tensor cores from Stripe, checked without a GPU: the matrix unit in ``opencl_gpu``'s hardware
model (its fragment stencils cover each operand exactly once), which devices keep it, the
``tensorize`` marks, ``gemm_tile``'s nest around the unit (its plan, and its meaning under the
Stripe interpreter), and the OpenCL text the unit's plan generates (``backends.cuda.mma``).
Running the kernels needs an NVIDIA GPU of compute capability 8.0 or more:
tests/test_tensor_cores_gpu.py."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from backends.clike.program import generate
from backends.cuda.mma import instruction
from backends.driver import config_for, kernels
from backends.opencl.device import OpenCLDevice
from stripe.config import target_config
from stripe.ir import walk
from stripe.parser import parse_stripe
from stripe.passes import optimize
from stripe.passes.gemm_tile import marked
from stripe.plans import GemmPlan
from stripe.printer import format_block
from tests.pass_support import assert_located_config_error, assert_same_meaning, lowered

MM = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"
BMM = "function (A[Q, M, K], B[Q, K, N]) -> (C) { C[q, m, n : Q, M, N] = +(A[q, m, k] * B[q, k, n]); }"
VALID_CONV = """function (I[N, X, Y, CI], F[KX, KY, CI, CO]) -> (O) {
  O[n, x, y, co : N, X - 2, Y - 2, CO] = +(I[n, x + i, y + j, ci] * F[i, j, ci, co]);
}"""
PADDED_CONV = """function (I[N, X, Y, CI], F[KX, KY, CI, CO]) -> (O) {
  O[n, x, y, co : N, X, Y, CO] = +(I[n, x + i - 1, y + j - 1, ci] * F[i, j, ci, co]);
}"""
MLP = """function (X[B, I], W[I, O], Bias[O]) -> (Y) {
  Z[b, o : B, O] = +(X[b, i] * W[i, o]);
  Y = relu(Z + Bias);
}"""
UNIT = target_config("opencl_gpu").hardware.matrix_units["tensor_core"]


def ampere(hw):
    """The config's hardware as an Ampere-class device (capability 8.x) has it: the unit without
    its warp-group products (those are tests/test_wgmma.py's)."""
    return replace(hw, matrix_units={k: replace(u, warpgroup=None) for k, u in hw.matrix_units.items()})


GPU = SimpleNamespace(optimizer="opencl_gpu", hardware=ampere)


def config(float32: str = "fp32"):
    """opencl_gpu's config as the driver fills it for the ``precision`` setting ``float32``."""
    return config_for(GPU, {"precision": float32} if float32 != "fp32" else {})


def optimized(src: str, shapes: dict, dtype, float32: str = "fp32", strict: bool = False):
    return optimize(lowered(src, shapes, dtype), config(float32), strict=strict)


def plans(program) -> list[GemmPlan]:
    return [b.plan for b in walk(program) if isinstance(b.plan, GemmPlan)]


# ------------------------------------------------------------------------------ the unit as data
@pytest.mark.parametrize("mode", sorted(UNIT.shapes))
def test_fragments_cover_each_tile_once(mode):
    """Over the unit's lanes, each fragment stencil names every element of its tile exactly once
    (A m x k, B k x n, C m x n): the layout data a code generator trusts."""
    op = UNIT.shapes[mode]
    for frag, rows, cols in ((op.a, op.m, op.k), (op.b, op.k, op.n), (op.c, op.m, op.n)):
        seen = [
            frag.at(lane // UNIT.group, lane % UNIT.group, e)
            for lane in range(UNIT.lanes)
            for e in range(len(frag.elements))
        ]
        assert sorted(seen) == sorted(itertools.product(range(rows), range(cols))), (mode, frag)


def fake_device(vendor: str, extensions: str, cc=(9, 0), launch_bytes: int = 0):
    """An OpenCL device as its query reports it, launching through CUDA with ``launch_bytes``."""
    d = SimpleNamespace(
        vendor=vendor, extensions=extensions,
        compute_capability_major_nv=cc[0], compute_capability_minor_nv=cc[1],
    )
    dev = object.__new__(OpenCLDevice)
    dev.cl_device = d
    dev.launch_bytes = lambda: launch_bytes
    return dev


@pytest.mark.parametrize(
    "vendor,ext,cc,has",
    [
        ("NVIDIA Corporation", "cl_khr_fp64 cl_nv_device_attribute_query", (9, 0), True),
        ("NVIDIA Corporation", "cl_nv_device_attribute_query", (8, 0), True),
        ("NVIDIA Corporation", "cl_nv_device_attribute_query", (7, 5), False),  # Turing: no TF32/BF16 mma
        ("NVIDIA Corporation", "cl_khr_fp64", (9, 0), False),  # no capability reported
        ("Portable Computing Language", "cl_khr_fp64", (9, 0), False),
    ],
)
def test_devices_keep_the_unit_only_when_they_have_it(vendor, ext, cc, has):
    assert fake_device(vendor, ext, cc).has_unit(UNIT) is has


# ------------------------------------------------------------------------------ tensorize
def test_float16_matmul_is_marked_and_planned_on_the_unit():
    p = optimized(MM, {"A": (256, 128), "B": (128, 192)}, np.float16)
    (plan,) = plans(p)
    assert plan.unit == "tensor_core.f16"
    op = UNIT.shapes["f16"]
    assert plan.rm % op.m == 0 and plan.rn % op.n == 0 and plan.kt % op.k == 0
    assert (plan.tm // plan.rm, plan.tn // plan.rn) == (2, 2)  # the config's warps


def test_float32_stays_off_the_unit_unless_the_precision_allows():
    shapes = {"A": (256, 128), "B": (128, 256)}
    assert [pl.unit for pl in plans(optimized(MM, shapes, np.float32))] == [""]
    for mode in ("tf32", "3xtf32"):
        assert [pl.unit for pl in plans(optimized(MM, shapes, np.float32, mode))] == [f"tensor_core.{mode}"]


def test_strict_mode_never_tensorizes():
    p = optimized(MM, {"A": (256, 128), "B": (128, 192)}, np.float32, "tf32", strict=True)
    assert all(not pl.unit for pl in plans(p))
    assert not any(marked(b) for b in walk(p))


def test_small_kernels_and_guarded_b_stay_off_the_unit():
    small = optimized(MM, {"A": (16, 16), "B": (16, 16)}, np.float16)
    assert not any(marked(b) for b in walk(small))
    # B with a guard on its own N index: a skipped point must add nothing (not 0 x inf), which
    # the code generator handles only for A
    # the padded input as B (the output's last indexes are its): its guards are on N
    flipped = """function (I[N, X, Y, CI], F[KX, KY, CI, CO]) -> (O) {
      O[co, n, x, y : CO, N, X, Y] = +(F[i, j, ci, co] * I[n, x + i - 1, y + j - 1, ci]);
    }"""
    got = optimized(flipped, {"I": (2, 16, 16, 32), "F": (3, 3, 32, 32)}, np.float16)
    assert not any(marked(b) for b in walk(got))
    padded = optimized(PADDED_CONV, {"I": (2, 16, 16, 32), "F": (3, 3, 32, 32)}, np.float16)
    assert [pl.unit for pl in plans(padded)] == ["tensor_core.f16"]  # A's guards: on the unit


def test_precision_setting_fills_the_config():
    for setting, want in ((None, "fp32"), ("native", "fp32"), ("tf32", "tf32"), ("3xtf32", "3xtf32")):
        cfg = config_for(GPU, {"precision": setting} if setting else {})
        (step,) = [s for s in cfg.passes if s.pass_ == "tensorize"]
        assert step.params.float32 == want


# ------------------------------------------------------------------------------ the nest's meaning
@pytest.mark.parametrize(
    "src,shapes",
    [
        (MM, {"A": (130, 48), "B": (48, 70)}),  # edges on M and N
        (BMM, {"A": (2, 64, 32), "B": (2, 32, 40)}),
        (VALID_CONV, {"I": (2, 10, 10, 16), "F": (3, 3, 16, 16)}),
        (MLP, {"X": (64, 64), "W": (64, 80), "Bias": (80,)}),  # a fused epilogue
    ],
)
def test_unit_nests_keep_meaning(src, shapes):
    """The nest ``gemm_tile`` builds around the unit (warps as its work-items, 8-row layout) is
    ordinary Stripe: the interpreter gives the same answer before and after (float32 with tf32
    allowed, small integers: exact)."""
    before = lowered(src, shapes, np.float32)
    after = optimize(before, replace(config("tf32"), passes=tuple(
        replace(s, params=replace(s.params, min_macs=1)) if s.pass_ == "tensorize" else s
        for s in config("tf32").passes)))
    assert [pl.unit for pl in plans(after)] == ["tensor_core.tf32"]
    assert_same_meaning(before, after)


def test_unit_plan_prints_and_reads_back():
    p = optimized(MM, {"A": (256, 128), "B": (128, 192)}, np.float16)
    text = format_block(p)
    assert "unit: `tensor_core.f16`" in text  # a name with a dot is written between backticks
    assert plans(parse_stripe(text)) == plans(p)
    plain = optimized(MM, {"A": (256, 128), "B": (128, 192)}, np.float32)
    assert "unit:" not in format_block(plain)  # an empty unit is not written


# ------------------------------------------------------------------------------ generated text
def source(p, units=True):
    from backends.opencl.target import OpenCLTarget

    t = OpenCLTarget(
        fp64=True, fp16=False, exact_div=True, fast_math=False, half_extension=False, contract=True
    )
    t.workgroups = True
    t.matrix_units = dict(target_config("opencl_gpu").hardware.matrix_units) if units else {}
    return "\n".join(k.text for k in generate(t, kernels(p), {}))


def test_float16_kernel_issues_the_units_operation():
    text = source(optimized(MM, {"A": (512, 256), "B": (256, 512)}, np.float16))
    assert instruction(UNIT.shapes["f16"]) in text
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in text  # A as stored
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in text  # B (N fastest) transposed
    assert "cp.async.cg.shared.global" in text and "cp.async.wait_group" in text
    assert re.search(r"reqd_work_group_size\(128, 1, 1\)", text)  # 4 warps of 32


def test_3xtf32_splits_operands_and_sums_steps_to_nearest():
    text = source(optimized(MM, {"A": (512, 256), "B": (256, 512)}, np.float32, "3xtf32"))
    op = UNIT.shapes["tf32"]
    per_step = text.count(instruction(op))
    assert per_step and per_step % 3 == 0
    assert "cvt.rna.tf32.f32" in text
    assert re.search(r"c0_0_0 \+= s0_0_0;", text)  # each K step's sum added to the running one


def test_padded_convolution_keeps_skipped_points_out():
    """A's flags staged beside it, B's copied values looked at, and a plain loop for a K step
    holding an infinite or NaN B value (backends.cuda.mma_skips)."""
    text = source(optimized(PADDED_CONV, {"I": (32, 56, 56, 64), "F": (3, 3, 64, 64)}, np.float16))
    assert instruction(UNIT.shapes["f16"]) in text
    assert "Am[" in text and "nonfinite[buf] = ks" in text and "if (nonfinite[buf] == ks) {" in text
    assert "vload_half(" in text  # the plain loop reads the staged half values


def test_unaligned_operands_take_the_register_staged_loop():
    """Rows of 301 half values leave odd rows 2-byte aligned: no asynchronous copies (4, 8 or 16
    bytes), the loads go through registers (two buffers); rows of 300 take 8-byte copies."""
    assert "cp.async.ca.shared.global [%0], [%1], 8," in source(
        optimized(MM, {"A": (512, 300), "B": (300, 512)}, np.float16)
    )
    text = source(optimized(MM, {"A": (512, 301), "B": (301, 512)}, np.float16))
    assert instruction(UNIT.shapes["f16"]) in text
    assert "cp.async" not in text and "barrier(CLK_LOCAL_MEM_FENCE)" in text


def test_without_the_unit_the_code_generator_stays_simt():
    """A plan naming a unit the target does not issue (a device without it, here by hand) runs
    on the SIMT kernel, the same answer's code path."""
    text = source(optimized(MM, {"A": (256, 128), "B": (128, 256)}, np.float32, "tf32"), units=False)
    assert "mma.sync" not in text and "asm" not in text


def test_a_float32_mode_the_pass_does_not_know_is_a_located_config_error():
    assert_located_config_error("tensorize", "float32", "tf16", "'tf16' is not a float32 mode")
