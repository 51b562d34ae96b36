"""The tensor-core GEMM kernel's schedule as data (``backends.cuda.schedule``) and its renderer on
schedules edited by hand (``backends.cuda.render``), without a GPU.

The planner's figures are worked out here from its rules: an OpenCL work-group's 48 KiB of local
memory (the target's default), an H100's 227 KiB for a launched kernel and its 132 compute units
(``tests/gemm_corpus.py``'s profiles), 16-bit operands of 2 bytes. The renderer must follow
whatever the schedule says, so a schedule changed by hand changes the text the same way."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from backends.cuda import tile_store
from backends.cuda.schedule import GemmSchedule, Staging, TileOrder, Warps, tma_fits, wgmma_fits
from tests.gemm_corpus import BMM, MLP, MM, MM_BT, PADDED_CONV, nest_of

BIG = {"A": (4096, 4096), "B": (4096, 4096)}
H100_LAUNCH = 227 * 1024


# ------------------------------------------------------------------------------ schedules as data
def test_a_4096_fp16_gemm_on_sm_90_through_opencl_plans_3_stages_and_2_warp_groups():
    s = nest_of(MM, BIG, np.float16, prof="hopper").plan()
    assert s.kernel == "wgmma" and s.mode == "f16"
    assert (s.tiles.tm, s.tiles.tn, s.tiles.kt) == (128, 128, 32)
    # one K step: (128 + 128) x 32 halves = 16 KiB; 48 KiB hold 3
    assert s.loads == "async" and s.stages == 3
    assert s.warps == Warps(8, 0, "unit") and s.warps.multiplying // 4 == 2 and s.threads == 256
    # A (K contiguous) in 64-byte K-major rows, B (N contiguous) in 128-byte panels; 16-byte copies
    assert s.a == Staging(kfast=True, width=8, elements=128 * 32, swizzle=64)
    assert s.b == Staging(kfast=False, width=8, elements=128 * 32, swizzle=128)
    assert s.k_steps == 4096 // 32 and s.groups == 32 * 32 and s.edges == ()
    assert s.fragments == (1, 128 // 8) and s.epilogue and s.lines is not None  # whole-line stores
    assert s.launch is None


def test_a_4096_fp16_gemm_launched_through_cuda_plans_4_stages_a_loading_warp_and_bands():
    s = nest_of(MM, BIG, np.float16, prof="launch_cu").plan()
    assert s.kernel == "tma" and s.loads == "tensor"
    assert (s.tiles.tm, s.tiles.tn, s.tiles.kt) == (256, 128, 64)
    step = (256 + 128) * 64 * 2  # 48 KiB, and a 16-byte barrier pair per stage
    assert s.stages == min(4, H100_LAUNCH // (step + 16)) == 4
    # 16 multiplying warps (4 warp groups of 64 rows) and one loading warp
    assert s.warps == Warps(16, 1, "unit") and s.threads == 17 * 32
    assert s.order == TileOrder(rows=16, cols=32, launched=132, band=4)
    # the warps' output rows (2 KiB each) fit after the 4 stages: the whole-line stores stay
    assert s.lines is not None and s.out_bytes == 16 * tile_store.WARP_BYTES
    assert s.local_bytes == 4 * (step + 16) + s.out_bytes <= H100_LAUNCH
    a, b = s.maps
    assert (a.param, a.dims, a.row_bytes, a.box, a.dtype) == (0, (4096, 4096), 8192, (64, 256), "float16")
    assert (b.param, b.dims, b.row_bytes, b.box, b.dtype) == (1, (4096, 4096), 8192, (64, 64), "float16")
    assert s.launch == {"local_bytes": s.local_bytes, "maps": [tuple(vars(m).values()) for m in s.maps]}


def test_less_launch_memory_plans_fewer_stages_and_drops_the_line_stores_that_would_cost_one():
    nest = nest_of(MM, BIG, np.float16, prof="launch_cu")
    step = (256 + 128) * 64 * 2 + 16
    t = replace_target(nest.t, launch_bytes=2 * step + 1024)  # two stages, not the 16 warps' rows
    s = nest.plan(t)
    assert s.kernel == "tma" and s.stages == 2 and s.lines is None and s.out_bytes == 0
    assert s.local_bytes == 2 * step
    # below two stages the launched kernel does not fit: the warp-group one takes the nest
    small = replace_target(nest.t, launch_bytes=2 * step - 1)
    assert not tma_fits(small, nest.g, nest.tiles, nest.unit, nest.mode)


def replace_target(t, **changes):
    """A copy of target ``t`` with ``changes`` (its attributes)."""
    other = object.__new__(type(t))
    other.__dict__.update(t.__dict__, **changes)
    return other


def test_k_not_a_multiple_of_the_k_step_gives_a_remainder_band():
    s = nest_of(MM, {"A": (256, 200), "B": (200, 256)}, np.float16, prof="ampere").plan()
    assert s.kernel == "mma" and s.tiles.kt == 16
    assert s.k_steps == 13 and 200 % 16 == 8  # 12 whole steps and one of 8 points, guarded
    assert s.edges == ("k",)


def test_rows_no_copy_can_move_stage_through_registers_in_two_buffers():
    """67 halves a row: no aligned 4-byte copy, so the loads go through registers."""
    s = nest_of(MM, {"A": (97, 67), "B": (67, 53)}, np.float16, prof="ampere").plan()
    assert s.kernel == "mma" and (s.a.width, s.b.width) == (1, 1)
    assert s.loads == "registers" and s.stages == 2
    assert s.edges == ("m", "n", "k")


def test_mma_pads_its_staged_rows_and_reads_fragments_with_ldmatrix():
    s = nest_of(MM, {"A": (256, 256), "B": (256, 256)}, np.float16, prof="ampere").plan()
    assert s.kernel == "mma" and s.warps == Warps(4, 0, "nest")
    kt, tm, tn = s.tiles.kt, s.tiles.tm, s.tiles.tn
    assert s.a == Staging(True, 8, tm * (kt + 8), row=kt + 8, fragments="")  # rows of K + 16 bytes
    assert s.b == Staging(False, 8, kt * (tn + 8), row=tn + 8, fragments=".trans")  # rows of N + 8
    # K steps in flight: as many as fit 48 KiB, at most 4
    assert s.stages == max(2, min(4, 48 * 1024 // ((s.a.elements + s.b.elements) * 2)))


def test_32_bit_operands_staged_along_n_are_read_element_by_element():
    """``ldmatrix`` transposes 16-bit values only."""
    s = nest_of(MM, {"A": (256, 256), "B": (256, 256)}, np.float32, "tf32", prof="ampere").plan()
    assert s.mode == "tf32" and s.element_bytes == 4 and not s.fold
    assert s.a.fragments == "" and not s.b.kfast and s.b.fragments is None
    bt = nest_of(MM_BT, {"A": (256, 256), "B": (256, 256)}, np.float32, "tf32", prof="ampere").plan()
    assert bt.b.kfast and bt.b.fragments == ""


def test_a_launched_3xtf32_gemm_folds_its_sums_and_reads_split_k_major_operands():
    s = nest_of(MM, BIG, np.float32, "3xtf32", prof="launch_cu").plan()
    assert s.kernel == "tma" and s.fold and s.element_bytes == 4
    assert (s.tiles.tm, s.tiles.tn) == (128, 128)  # the fold tiles: two accumulators fit
    assert s.a.kfast and s.b.kfast  # kmajor's copies: A3[M, 3K], B3[N, 3K]
    assert s.k_steps == 3 * 4096 // s.tiles.kt
    assert all(m.dtype == "tfloat32" and m.dims == (3 * 4096, 4096) for m in s.maps)


def test_a_padded_convolution_keeps_as_skipped_points_out_on_either_kernel():
    shapes = {"I": (8, 32, 32, 64), "F": (3, 3, 64, 128)}
    wg = nest_of(PADDED_CONV, shapes, np.float16, prof="hopper").plan()
    mma = nest_of(PADDED_CONV, shapes, np.float16, prof="ampere").plan()
    assert (wg.kernel, mma.kernel) == ("wgmma", "mma") and wg.skips and mma.skips
    assert wg.order is None and wg.launch is None


def test_batched_and_fused_gemms():
    b = nest_of(BMM, {"A": (4, 512, 256), "B": (4, 256, 512)}, np.float16, prof="launch_cu").plan()
    assert b.kernel == "wgmma" and b.lines is None  # a batch does not stream and stores in place
    shapes = {"X": (1024, 512), "W": (512, 1024), "Bias": (1024,)}
    f = nest_of(MLP, shapes, np.float16, prof="launch_cu").plan()
    assert f.kernel == "tma" and f.epilogue and f.lines is not None and f.lines.source == "Y"


def test_the_planner_tries_the_launched_kernel_then_warp_groups_then_warp_level_products():
    nest = nest_of(MM, BIG, np.float16, prof="hopper")
    assert not tma_fits(nest.t, nest.g, nest.tiles, nest.unit, nest.mode)  # OpenCL only: no launch
    assert wgmma_fits(nest.g, nest.tiles, nest.unit, nest.mode)
    ampere = nest_of(MM, BIG, np.float16, prof="ampere")
    assert not wgmma_fits(ampere.g, ampere.tiles, ampere.unit, ampere.mode)
    assert ampere.plan().kernel == "mma"


def test_schedules_are_frozen_values():
    s = nest_of(MM, {"A": (256, 256), "B": (256, 256)}, np.float16, prof="ampere").plan()
    with pytest.raises(AttributeError):
        s.stages = 3  # type: ignore[misc]
    assert s == replace(s) and isinstance(s, GemmSchedule)


# ------------------------------------------------------------------------------ the renderer
def test_rendering_the_planned_schedule_is_the_generated_kernel():
    """(Two nests of the same program: a fused epilogue names its temporaries afresh per use.)"""
    from backends.cuda.render import unit_emitter

    nest, again = (nest_of(MM, BIG, np.float16, prof="launch_cu") for _ in range(2))
    kernel = unit_emitter(nest.t, nest.g, nest.ptrs, nest.tiles, f"tensor_core.{nest.mode}", nest.epilogue)
    text, work, local = kernel.source(nest.symbol, nest.params)
    s = again.plan()
    assert kernel.schedule == s and kernel.launch == s.launch
    assert text == again.render(s) and local == s.threads and work == 132 * local


def test_the_renderer_prints_the_stages_it_is_given():
    nest = nest_of(MM, BIG, np.float16, prof="hopper")
    s = nest.plan()
    for stages in (2, 3, 4):
        text = nest.render(replace(s, stages=stages))
        assert f"__local uint4 As4[{stages * 128 * 32 * 2 // 16}]" in text
        assert f'cp.async.wait_group {stages - 2};' in text and f"ks % {stages}" in text


def test_the_renderer_stores_in_place_when_the_schedule_has_no_line_stores():
    nest = nest_of(MM, BIG, np.float16, prof="hopper")
    s = nest.plan()
    lines, in_place = nest.render(s), nest.render(replace(s, lines=None))
    assert "bar.warp.sync" in lines and "Cs_at" in lines
    assert "bar.warp.sync" not in in_place and "Cs_at" not in in_place and "c0_15_3" in in_place


def test_the_renderer_follows_the_tile_order():
    nest = nest_of(MM, BIG, np.float16, prof="launch_cu")
    s = nest.plan()
    text = nest.render(replace(s, order=TileOrder(rows=16, cols=32, launched=7, band=2)))
    assert text.count("tile += 7) {") == 2  # the loading warp's loop and the multiplying warps'
    assert "const int first = tile / 64 * 2;" in text and "(int)2)" in text


def test_the_renderer_reads_fragments_as_the_schedule_says():
    nest = nest_of(MM, {"A": (256, 256), "B": (256, 256)}, np.float16, prof="ampere")
    s = nest.plan()
    both = nest.render(s)
    a_by_element = nest.render(replace(s, a=replace(s.a, fragments=None)))
    assert "const int al0 =" in both and "ldmatrix.sync.aligned.m8n8.x4.trans" in both
    assert "const int al0 =" not in a_by_element and "const int ao0_0 =" in a_by_element
    assert "ldmatrix.sync.aligned.m8n8.x4.trans" in a_by_element  # B's stay


def test_the_renderer_puts_warps_on_the_rows_the_schedule_gives_them():
    nest = nest_of(MM, {"A": (256, 256), "B": (256, 256)}, np.float16, prof="ampere")
    s = nest.plan()
    nest_rows, unit_rows = nest.render(s), nest.render(replace(s, warps=replace(s.warps, rows="unit")))
    assert "wy * 8" in nest_rows and f"(wy * {s.tiles.rm} + (" not in nest_rows
    assert f"(wy * {s.tiles.rm} + (" in unit_rows


def test_the_renderer_folds_3xtf32_sums_only_where_the_schedule_does():
    nest = nest_of(MM, {"A": (256, 256), "B": (256, 256)}, np.float32, "3xtf32", prof="ampere")
    s = nest.plan()
    assert s.kernel == "mma" and s.fold
    folded, plain = nest.render(s), nest.render(replace(s, fold=False))
    assert "c0_0_0 += s0_0_0; s0_0_0 = 0.0f;" in folded and "s0_0_0" not in plain


def test_a_hand_built_schedule_renders():
    """A schedule written out field by field (a 2 x 2 warp, 64 x 64 tile of float16 on warp-level
    products, two register buffers) prints a kernel of that shape."""
    nest = nest_of(MM, {"A": (64, 64), "B": (64, 64)}, np.float16, prof="ampere")
    planned = nest.plan()
    tl = planned.tiles
    s = GemmSchedule(
        kernel="mma", mode="f16", op=nest.op, lanes=32, group=4, tiles=tl, int_type="int", element_bytes=2,
        a=Staging(True, 1, tl.tm * (tl.kt + 8), row=tl.kt + 8, fragments=None),
        b=Staging(False, 1, tl.kt * (tl.tn + 8), row=tl.tn + 8, fragments=None),
        loads="registers", stages=2, skips=False, fragments=(tl.rm // 16, tl.rn // 8), warps=Warps(tl.warps),
        k_steps=64 // tl.kt, groups=(64 // tl.tm) * (64 // tl.tn), fold=False, edges=(), epilogue=True,
    )
    text = nest.render(s)
    assert "ldmatrix" not in text and "cp.async" not in text  # element reads, register loads
    assert f"reqd_work_group_size({tl.warps * 32}, 1, 1)" in text
    assert text.count("mma.sync.aligned.m16n8k16") == (tl.kt // 16) * s.fragments[0] * s.fragments[1]
    assert "buf ^= 1;" in text and f"for (int ks = 0; ks < {s.k_steps}; ks++)" in text

