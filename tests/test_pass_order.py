"""order_indexes: Before/Expected, meaning on drawn tiled programs, and LLVM execution."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings

from ref_interp.stripe_exec import run_stripe
from stripe.ir import Block
from stripe.parser import parse_stripe
from stripe.passes.rewrite import rewrite
from stripe.passes.tiling import can_split, split
from tests.llvm_runner import execute
from tests.pass_support import assert_same_meaning, check_rewrite, inputs_for, lowered, programs, run_pass

BEFORE = """\
0: #program block [] ( // p
    #input #user none A[0, 0] fp32(4:6, 6:1)
    #input #user none B[0, 0] fp32(6:5, 5:1)
    #output #user none C[0, 0] fp32(4:5, 5:1)
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(4:6, 6:1)
      in B[0, 0] fp32(6:5, 5:1)
      out C[0, 0] fp32(4:5, 5:1)
  ) {
    0: #kernel #tile block [j:5, i:4, k:6] ( // mm
        in A[i, k] fp32(1:6, 1:1)
        in B[k, j] fp32(1:5, 1:1)
        out C[i, j]:add fp32(1:5, 1:1)
    ) {
      0: $a = load(A)
      1: $b = load(B)
      2: $c = mul($a, $b):fp32
      3: C = store($c)
    }
  }
}
"""


def test_a_matmul_runs_rows_then_the_reduction_then_contiguous_columns():
    # C's strides: i 5, j 1; k is not in C. So: i (the larger output stride), k, then j.
    out = check_rewrite("order_indexes", {"reqs": ["tile"]}, BEFORE,
                        BEFORE.replace("[j:5, i:4, k:6]", "[i:4, k:6, j:5]"))
    assert_same_meaning(parse_stripe(BEFORE), out)


def test_blocks_without_the_tag_and_ordered_blocks_are_unchanged():
    check_rewrite("order_indexes", {"reqs": ["other"]}, BEFORE, BEFORE)
    ordered = BEFORE.replace("[j:5, i:4, k:6]", "[i:4, k:6, j:5]")
    check_rewrite("order_indexes", {"reqs": ["tile"]}, ordered, ordered)


def _tiled(program: Block, tile: int) -> Block:
    def fn(b, ctx):
        if not can_split(b) or any(isinstance(s, Block) for s in b.stmts):
            return None
        sizes = {r.into: ctx.parent.ref(r.source).shape.sizes for r in b.refs}
        return split(b, {i.name: tile for i in b.idxs}, inner_tags={"tile"}, parent_sizes=sizes)

    return rewrite(program, fn, ["contraction"])


@settings(derandomize=True, deadline=None, max_examples=40,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(programs(("contractions", "mixed")))
def test_reordering_keeps_meaning_on_drawn_tiled_programs(drawn):
    program, inputs = drawn
    tiled = _tiled(program, 2)
    out = run_pass("order_indexes", {"reqs": ["tile"]}, tiled)
    assert_same_meaning(tiled, out, inputs)


def test_reordered_tiles_run_on_llvm():
    program = _tiled(lowered("function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }",
                             {"A": (9, 7), "B": (7, 5)}), 4)
    out = run_pass("order_indexes", {"reqs": ["tile"]}, program)
    inner = out.stmts[0].stmts[1].stmts[0]
    assert [i.name for i in inner.idxs if i.affine is None] == ["i", "k", "j"]
    inputs = inputs_for(program)
    got, _ = execute(out, inputs)
    want = run_stripe(program, inputs)
    np.testing.assert_array_equal(got["C"], want["C"])
