"""Transposes tiled through ``__local`` memory: the ``transpose`` pass attaches a ``TransposePlan``
to a permuting copy kernel whose input and output are contiguous along different indexes (a Tile
transpose, ``kmajor``'s K-major copy of B) and to nothing else; the plan prints and parses back
and ``verify`` checks it; the OpenCL code generator emits the planned kernel as 32 x 32 tiles in
``__local`` memory (``backends/clike/transpose.py``), the general kernel without the plan or
without work-groups; and on the local OpenCL device (PoCL runs the work-group kernels as a GPU
would) the results equal the Tile interpreter's exactly."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import ref_interp
import tile
from backends import registry
from backends.clike import generate
from backends.driver import compile_bound
from backends.driver import kernels as kernel_infos
from backends.opencl.target import OpenCLTarget
from stripe.config import target_config
from stripe.ir import Block, walk
from stripe.parser import parse_stripe
from stripe.passes import optimize
from stripe.plans import TransposePlan
from stripe.printer import format_block
from stripe.verify import StripeError, verify
from tests.opencl_support import DEVICE_ID, requires_opencl
from tests.pass_support import assert_located_config_error, check_rewrite, lowered, run_pass
from tests.test_plans import _sources  # the kernels' OpenCL sources, with or without their plans
from tile.affine import Affine
from tile.bind import bind
from tile.inputs import input_types

TRANSPOSE = "function (C[M, N]) -> (D) { D[n, m : N, M] = =(C[m, n]); }"
BATCHED = "function (C[B, M, N]) -> (D) { D[b, n, m : B, N, M] = =(C[b, m, n]); }"
COPY = "function (C[M, N]) -> (D) { D[m, n : M, N] = =(C[m, n]); }"
CONSTRAINED = "function (C[M, N]) -> (D) { D[n, m : N, M] = =(C[m, n]), m < 70; }"
CAST = "function (C[M, N]) -> (D) { T[n, m : N, M] = =(C[m, n]); D = as_int(T, 32); }"
PARAMS = {"reqs": ["kernel"], "min_extent": 64, "tile": 32}

# kmajor's copy of B[K, N] into a #tmp Bt[N, K] (backends/cuda/kmajor.py), K = 256, N = 128
KMAJOR = """0: #program block [] ( // program
    #input #user none B[0, 0] fp32(256:128, 128:1)
    #tmp none B_kmajor[0, 0] fp32(128:256, 256:1)
) {
  0: #main block [] ( // main
      in B[0, 0] fp32(256:128, 128:1)
      inout B_kmajor[0, 0] fp32(128:256, 256:1)
  ) {
    0: #kernel #kmajor_copy block [n:128, k:256] ( // k0_B_kmajor
        PLAN
        in B = B[k, n] fp32(1:128, 1:1)
        out Bt = B_kmajor[n, k]:assign fp32(1:256, 1:1)
    ) {
      0: $B = load(B)
      1: $v = assign($B):fp32
      2: Bt = store($v)
    }
  }
}"""
KMAJOR_PLAN = "plan transpose(rows: k, cols: n, src: B, out: Bt, tile: 32)"


def _optimized(src: str, shapes: dict, dtype=np.float32) -> Block:
    return optimize(lowered(src, shapes, dtype), target_config("opencl_gpu"), check=True)  # verify each pass


def _plans(program: Block) -> list[TransposePlan]:
    return [b.plan for b in walk(program) if isinstance(b.plan, TransposePlan)]


# ------------------------------------------------------------------------------ the pass
def test_a_transpose_gets_its_plan():
    (plan,) = _plans(_optimized(TRANSPOSE, {"C": (1024, 512)}))
    assert plan == TransposePlan(rows="m", cols="n", src="C", out="D", tile=32)
    (plan,) = _plans(_optimized(BATCHED, {"C": (3, 100, 70)}))
    assert (plan.rows, plan.cols) == ("m", "n")  # b stays a batch index


def test_a_k_major_copy_gets_its_plan():
    """The copy ``kmajor`` inserts, as its own kernel: the input contiguous along n, the output
    along k (Before/Expected)."""
    check_rewrite("transpose", PARAMS, KMAJOR.replace("PLAN", ""), KMAJOR.replace("PLAN", KMAJOR_PLAN))


@pytest.mark.parametrize("src,shape", [
    (COPY, (256, 256)),  # both sides contiguous along n: nothing to tile
    (CONSTRAINED, (256, 256)),  # a constraint (and an output not covered once)
    (TRANSPOSE, (32, 1024)),  # too few rows to be worth tiles
    (TRANSPOSE, (1024, 63)),
])
def test_other_kernels_get_no_plan(src, shape):
    assert not _plans(_optimized(src, {"C": shape}))


def test_a_constraint_or_another_statement_refuses_the_copy():
    """The K-major copy with a constraint, reading a second buffer, or adding into its output."""
    before = KMAJOR.replace("PLAN", "")
    for edit in (("// k0_B_kmajor", "// k0_B_kmajor\n        k - 1 >= 0"),
                 ("$v = assign($B):fp32", "$v = neg($B):fp32"),
                 ("B_kmajor[n, k]:assign", "B_kmajor[n, k]:add")):
        out = run_pass("transpose", PARAMS, parse_stripe(before.replace(*edit)))
        assert not _plans(out), edit
    assert _plans(run_pass("transpose", {**PARAMS, "min_extent": 128}, parse_stripe(before)))
    assert not _plans(run_pass("transpose", {**PARAMS, "min_extent": 129}, parse_stripe(before)))


def test_a_bad_tile_is_a_located_config_error():
    assert_located_config_error("transpose", "tile", 24, "not a power of two")


def test_a_conversion_stays_in_the_copy():
    """A transpose converted on its way (fused with its elementwise reader) is still a copy."""
    (plan,) = _plans(_optimized(CAST, {"C": (128, 96)}))
    assert plan == TransposePlan(rows="i1", cols="i0", src="C", out="D", tile=32)  # fusion's names


# ------------------------------------------------------------------------------ the plan as IR
def test_the_plan_prints_and_parses_back():
    program = _optimized(TRANSPOSE, {"C": (100, 300)})
    text = format_block(program)
    assert "plan transpose(rows: m, cols: n, src: C, out: D, tile: 32)" in text
    assert parse_stripe(text) == program


@pytest.mark.parametrize("change,message", [
    ({"rows": "x"}, "names the index 'x', which the block does not have"),
    ({"out": "Q"}, "names the refinement 'Q', which the block does not have"),
    ({"rows": "n"}, "names 'n' as both its rows and its columns"),
    ({"src": "D", "out": "C"}, "reads 'D' or writes 'C'"),
    ({"tile": 24}, "has the tile 24, not a power of two"),
    ({"stmts": 2}, "is on a block that does not load 'C', convert and store into 'D'"),
    ({"constraints": 1}, "is on a block with constraints or index affines"),
])
def test_verify_rejects_a_plan_inconsistent_with_its_block(change, message):
    program = _optimized(TRANSPOSE, {"C": (100, 300)})
    main = program.stmts[0]
    def changed(k: Block) -> Block:
        if "stmts" in change:  # the plan's block without its store
            return replace(k, stmts=k.stmts[:-1])
        if "constraints" in change:
            return replace(k, constraints=(Affine.var("m") - 1,))
        return replace(k, plan=replace(k.plan, **change))

    kernels = [changed(k) if isinstance(k.plan, TransposePlan) else k for k in main.stmts]
    with pytest.raises(StripeError, match=f"its transpose plan {message}"):
        verify(replace(program, stmts=(replace(main, stmts=tuple(kernels)),)))


# ------------------------------------------------------------------------------ generated text
def _without_workgroups(program: Block) -> list:
    t = OpenCLTarget()
    t.workgroups = False  # (tiled=False)
    return generate(t, kernel_infos(program), {})


@pytest.mark.parametrize("dtype,cell", [(np.float32, "float"), (np.float16, "float"), (np.int8, "char")])
def test_the_planned_kernel_stages_a_padded_local_tile(dtype, cell):
    program = _optimized(TRANSPOSE, {"C": (100, 300)}, dtype)
    (k,) = [s for s in _sources(program, False) if s.local]
    assert f"__local {cell} tile[32][33];" in k.text and "barrier(CLK_LOCAL_MEM_FENCE);" in k.text
    assert "reqd_work_group_size(256, 1, 1)" in k.text and k.local == 256
    assert k.work_items == 4 * 10 * 256  # 100 / 32 -> 4 row tiles, 300 / 32 -> 10 column tiles
    assert "[tx][ty + 24]" in k.text  # the output's rows from the tile's columns
    for plain in (_sources(program, True), _without_workgroups(program)):  # no plan, no work-groups
        assert not any(s.local or "__local" in s.text for s in plain)


# ------------------------------------------------------------------------------ results
def _compiled(src: str, inputs: dict, settings: dict | None = None):
    prog = tile.parse(src)
    dev = registry.get(DEVICE_ID)
    settings = {"config": "opencl_gpu", "cache": False, **(settings or {})}
    return compile_bound(bind(prog, input_types(prog, inputs)), dev, settings)


def _check(src: str, inputs: dict, settings: dict | None = None, planned: bool = True) -> None:
    cp = _compiled(src, inputs, settings)
    assert any(isinstance(i.block.plan, TransposePlan) for i in cp.infos) == planned
    got, want = cp(inputs), ref_interp.run(src, inputs)
    for name in want:
        assert got[name].dtype == want[name].dtype
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"{src} {name}")


@requires_opencl
@pytest.mark.parametrize("shape", [(1024, 512), (100, 300)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_tiled_transpose_is_exact(shape, dtype):
    """Every element (distinct values, ragged edge tiles included) lands where the interpreter
    puts it."""
    x = (np.arange(np.prod(shape)) % 2039 - 1000).reshape(shape).astype(dtype)
    _check(TRANSPOSE, {"C": x})


@requires_opencl
@pytest.mark.parametrize("src,shape,dtype", [
    (BATCHED, (3, 100, 70), np.float32),
    (TRANSPOSE, (65, 129), np.int8),
    (TRANSPOSE, (96, 64), np.bool_),
    (CAST, (128, 96), np.float32),
])
def test_batches_types_and_conversions_are_exact(src, shape, dtype):
    x = (np.arange(np.prod(shape)) % 251 - 125).reshape(shape).astype(dtype)
    _check(src, {"C": x})


@requires_opencl
def test_without_kernel_tiling_the_general_kernel_runs():
    """``tiled=False`` leaves the kernel-tiling steps out: no plan, the same results."""
    x = np.arange(100 * 300, dtype=np.float32).reshape(100, 300)
    _check(TRANSPOSE, {"C": x}, {"tiled": False}, planned=False)
