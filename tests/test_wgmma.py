"""Warp-group products (Hopper's ``wgmma``, ``backends.cuda.wgmma``), checked without a GPU: which
devices keep them, the tile ``gemm_tile`` plans for them, the generated kernel (its marked sm_90a
PTX, descriptors and swizzled staging), what falls back to the warp-level products, and the PTX
retargeting (``backends.cuda.ptx``). Running them needs an H100 (compute capability 9.0):
tests/test_tensor_cores_gpu.py, whose kernels take this path there."""

from __future__ import annotations

import itertools
import re
from types import SimpleNamespace

import numpy as np
import pytest

from backends.cuda.mma import instruction
from backends.cuda.ptx import for_sm90a, needs_sm90a
from backends.cuda.render import swizzled_destination
from backends.cuda.wgmma import SM90A
from backends.driver import config_for
from stripe.passes import optimize
from tests.pass_support import lowered
from tests.test_tensorize import MM, PADDED_CONV, UNIT, VALID_CONV, fake_device, plans, source

HOPPER = SimpleNamespace(optimizer="opencl_gpu", hardware=lambda hw: hw)  # the config's unit, whole
WG = UNIT.warpgroup


def optimized(src: str, shapes: dict, dtype, precision: str | None = None):
    settings = {"precision": precision} if precision else {}
    return optimize(lowered(src, shapes, dtype), config_for(HOPPER, settings))


@pytest.mark.parametrize("cc,kept", [((9, 0), True), ((8, 0), False), ((8, 9), False), ((10, 0), False)])
def test_only_compute_capability_9_0_keeps_the_warp_group_products(cc, kept):
    """sm_90a instructions exist on 9.0 alone (not forward-compatible); the unit stays either way."""
    dev = fake_device("NVIDIA Corporation", "cl_nv_device_attribute_query", cc)
    assert dev.has_unit(UNIT)
    assert (dev.unit_here(UNIT).warpgroup is not None) is kept


@pytest.mark.parametrize("dtype,mode", [(np.float16, "f16"), ("bfloat16", "bf16")])
def test_16_bit_matmuls_are_planned_on_the_warp_group_tile(dtype, mode):
    import ml_dtypes

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else dtype
    (plan,) = plans(optimized(MM, {"A": (2048, 256), "B": (256, 2048)}, dt))
    assert plan.unit == f"tensor_core.{mode}"
    assert (plan.tm, plan.tn) == WG.tiles[0] and (plan.tm // plan.rm, plan.tn // plan.rn) == WG.warps
    assert plan.kt * 2 == WG.k_bytes


def test_tf32_keeps_the_warp_level_tiles():
    (plan,) = plans(optimized(MM, {"A": (512, 256), "B": (256, 512)}, np.float32, "tf32"))
    assert plan.unit == "tensor_core.tf32" and plan.rm != 16


def test_the_kernel_issues_marked_wgmma_from_swizzled_tiles():
    text = source(optimized(MM, {"A": (2048, 256), "B": (256, 2048)}, np.float16))
    assert needs_sm90a(text)
    # A (K contiguous) as stored, B (N contiguous) transposed: the last two immediates
    assert f"{SM90A}{{ .reg .pred p;" in text
    product = r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.f16\.f16 \{%0,.*%63\}, %64, %65, "
    assert re.search(product + r"p, 1, 1, 0, 1;", text)
    for op in ("fence.proxy.async.shared::cta;", "wgmma.fence.sync.aligned;",
               "wgmma.commit_group.sync.aligned;", "wgmma.wait_group.sync.aligned 0;"):
        assert f'asm volatile("{SM90A}{op}"' in text
    # each step's products are awaited before the next step's barrier, after which the buffer
    # the previous step read is refilled (products left running across a refill went wrong where
    # two work-groups shared an SM: backends.cuda.wgmma's module docstring); one barrier a step
    assert "wait_group.sync.aligned 1" not in text
    loop = text[text.index("for (int ks = 0;"):text.index("const uint Cs_at = As_at;")]
    assert loop.count("barrier(") == 2  # one a step; one before the output rows reuse the buffers
    assert loop.index("barrier(") < loop.index("cp.async.cg") < loop.index("wgmma.fence") \
        < loop.index("wgmma.commit_group") < loop.index("wgmma.wait_group.sync.aligned 0")
    assert "__attribute__((aligned(1024)))" in text and "reqd_work_group_size(256, 1, 1)" in text
    assert "mma.sync" not in text and "ldmatrix" not in text
    # every wgmma-only instruction is behind the mark (the OpenCL C compiler targets sm_90)
    for line in text.splitlines():
        if "wgmma" in line or "fence.proxy" in line:
            assert SM90A in line, line
    # 64-byte rows of A: 64-byte swizzle (2 << 62), 8-row groups 512 bytes apart; B: 128-byte
    # swizzle (1 << 62), panels of 64 columns 32 rows x 128 bytes apart, 8-row groups 1024 apart
    assert "| 0x8000002000010000UL" in text and "| 0x4000004001000000UL" in text


def test_64_columns_take_the_narrow_tile():
    """A convolution with 64 output channels: 128 x 64 tiles and m64n64k16 products, not half-empty
    128 x 128 ones."""
    p = optimized(VALID_CONV, {"I": (8, 58, 58, 64), "F": (3, 3, 64, 64)}, np.float16)
    (plan,) = plans(p)
    assert (plan.tm, plan.tn, plan.rm, plan.rn) == (128, 64, 16, 64)
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0," in source(p)


def test_convolutions_take_them_a_padded_input_with_a_plain_recount_for_nonfinite_weights():
    """Implicit GEMM takes warp-group products. A padded input's skipped points are copied as
    zeros (``0 x b`` adds nothing unless ``b`` is infinite or NaN, which makes the sum NaN):
    each work-item looks at its sums once the products are done, and a tile where one is
    infinite or NaN (``tainted``) is summed again, restaged with A's flags, in ``mma_skips``'s
    plain loop."""
    shapes = {"I": (8, 58, 58, 64), "F": (3, 3, 64, 64)}
    valid = source(optimized(VALID_CONV, shapes, np.float16))
    assert needs_sm90a(valid) and "tainted" not in valid and "Am[" not in valid
    padded = source(optimized(PADDED_CONV, {"I": (8, 56, 56, 64), "F": (3, 3, 64, 64)}, np.float16))
    assert needs_sm90a(padded) and instruction(UNIT.shapes["f16"]) not in padded
    assert "nv.s" not in padded  # no per-step look at B's values
    check = padded.index("bad |= (as_uint(c0_7_3) & 0x7f800000) == 0x7f800000;")
    assert padded.rindex("wgmma.wait_group.sync.aligned 0;") < check < padded.index("if (bad) tainted = 1;")
    tail = padded[padded.index("if (tainted) {"):]
    assert "Am[" in tail and "if (ka0_0) c0_0_0 = fma(va0_0, vb0_0, c0_0_0);" in tail
    assert "wgmma" not in tail  # after the unit's last products


def test_unaligned_rows_fall_back_to_the_warp_level_products():
    """Rows of 300 half values cannot move in 16-byte copies."""
    text = source(optimized(MM, {"A": (512, 300), "B": (300, 512)}, np.float16))
    assert not needs_sm90a(text) and instruction(UNIT.shapes["f16"]) in text


@pytest.mark.parametrize("kfast", [True, False])
def test_each_16_byte_chunk_of_a_staged_tile_has_its_own_place(kfast):
    """The swizzled destinations of a K step's chunks (8 half values each) are distinct, 16-byte
    aligned and inside the stage; within each group of 8 rows (K-major) or K rows (M/N-major)
    the chunks of one column position fall in 8 distinct 16-byte bank groups."""
    tile = 128
    expr = swizzled_destination("A", "p", "0", tile * 32, kfast, 32, 2).replace("A_at", "0")
    seen = {}
    for mm, kk in itertools.product(range(tile), range(32)):
        if (kk if kfast else mm) % 8:
            continue
        at = eval(expr.replace("p_mm", str(mm)).replace("p_kk", str(kk)))
        seen[(mm, kk)] = at
    assert len(set(seen.values())) == len(seen) == tile * 32 // 8
    assert all(a % 16 == 0 and 0 <= a < tile * 32 * 2 for a in seen.values())
    # eight stored rows (K-major: M rows; M/N-major: K rows) at one chunk column: 8 bank groups
    key = (lambda mm, kk: (mm // 8, kk // 8)) if kfast else (lambda mm, kk: (kk // 8, mm // 8))
    groups: dict = {}
    for (mm, kk), at in seen.items():
        groups.setdefault(key(mm, kk), set()).add((at // 16) % 8)
    assert len(groups) == tile * 32 // 64 and all(len(g) == 8 for g in groups.values())


PTX = b""".version 9.0
.target sm_90
.address_size 64
.visible .entry k()
{
\t// begin inline asm
\t//sm_90a wgmma.fence.sync.aligned;
\t// end inline asm
\tret;
}
"""


def test_ptx_is_uncommented_and_retargeted():
    out = for_sm90a(PTX).decode()
    assert ".target sm_90a\n" in out and "\twgmma.fence.sync.aligned;" in out and SM90A not in out


@pytest.mark.parametrize("bad,why", [
    (b"\x7fELF....", "not PTX for sm_90"),
    (PTX.replace(b"sm_90", b"sm_80"), "not PTX for sm_90"),
    (PTX.replace(SM90A.encode(), b""), "lost the sm_90a instructions"),
])
def test_ptx_that_cannot_be_retargeted_is_refused(bad, why):
    with pytest.raises(ValueError, match=why):
        for_sm90a(bad)


def test_a_config_can_leave_the_warp_group_products_out(tmp_path):
    """What the OpenCL compiler's error suggests when the sm_90a rebuild fails: a config without
    them runs the warp-level ``mma.sync`` kernels instead."""
    import json

    from stripe.config import load_config

    path = tmp_path / "no_wgmma.json"
    path.write_text(json.dumps({"extends": "opencl_gpu", "name": "no_wgmma",
                                "hardware": {"matrix_units": {"tensor_core": {"warpgroup": None}}}}))
    cfg = load_config(path)
    p = optimize(lowered(MM, {"A": (2048, 256), "B": (256, 2048)}, np.float16), cfg)
    (plan,) = plans(p)
    assert plan.unit == "tensor_core.f16" and plan.rm != 16
    text = source(p)
    assert not needs_sm90a(text) and instruction(UNIT.shapes["f16"]) in text
