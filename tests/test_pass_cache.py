"""The ``cache`` pass: Before/Expected pairs in Stripe text (a tiled matmul with partial tiles),
refusals, meaning by the interpreter on Hypothesis-drawn tiled programs, and a cached program run
on the LLVM CPU backend."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ref_interp.stripe_exec import run_stripe
from stripe.ir import Block, Constant, Intrinsic, Load, LoadIndex, Store, walk
from stripe.parser import parse_stripe
from stripe.passes.rewrite import Context, rewrite
from stripe.passes.tiling import can_split, split
from tests.llvm_runner import execute
from tests.pass_support import assert_same_meaning, check_rewrite, inputs_for, lowered, programs, run_pass

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }"
CACHE_IN_OUT = {
    "reqs": ["outer"],
    "dirs": ["in", "out"],
    "mem_loc": {"name": "SRAM"},
    "xfer_loc": {"name": "DMA"},
}


def tiled(program: Block, tiles: int | dict[str, int]) -> Block:
    """Split each leaf contraction kernel into outer (``#outer``) and inner (``#inner``) blocks
    with ``tiles`` per index (as autotile would, views clipped to their parents)."""

    def fn(b: Block, ctx: Context) -> Block | None:
        if not can_split(b) or not all(
            isinstance(s, (Load, Store, Intrinsic, Constant, LoadIndex)) for s in b.stmts
        ):
            return None
        sizes = {r.into: ctx.parent.ref(r.source).shape.sizes for r in b.refs}
        t = {i.name: tiles for i in b.idxs} if isinstance(tiles, int) else tiles
        return split(b, t, outer_tags={"outer"}, inner_tags={"inner"}, parent_sizes=sizes)

    return rewrite(program, fn, ["contraction"])




# 5x4 times 4x3 in tiles of i:2, j:2, k:3: the last tiles of i and k are partial, so the outer
# views of A (2x3 at A[2*i, 3*k]) overhang A; the copies are constrained to A's 5x4.
TILED_MATMUL = """
    0: #program block [] ( // program
        #input #user none A[0, 0] fp32(5:4, 4:1)
        #input #user none B[0, 0] fp32(4:3, 3:1)
        #output #user none C[0, 0] fp32(5:3, 3:1)
    ) {
      0: #main block [] ( // main
          in A[0, 0] fp32(5:4, 4:1)
          in B[0, 0] fp32(4:3, 3:1)
          out C[0, 0] fp32(5:3, 3:1)
      ) {
        0: #kernel #special #zero block [] ( // k0_C
            out C[0, 0]:assign fp32(5:3, 3:1)
        ) {
          0: C = zero()
        }
        1: #agg_op_add #comb_op_mul #contraction #kernel #outer block [i:3, j:2, k:2] ( // k1_C
            // C[i, j: 5, 3] = +(A[i, k] * B[k, j]);
            in A[2*i, 3*k] fp32(2:4, 3:1)
            in B[3*k, 2*j] fp32(3:3, 2:1)
            out C[2*i, 2*j]:add fp32(2:3, 2:1)
        ) {
          0: #inner block [i:2, j:2, k:3, i_o:1 = i, j_o:1 = j, k_o:1 = k] ( // k1_C
              -i - 2*i_o + 4 >= 0
              -j - 2*j_o + 2 >= 0
              -k - 3*k_o + 3 >= 0
              in A[i, k] fp32(1:4, 1:1)
              in B[k, j] fp32(1:3, 1:1)
              out C[i, j]:add fp32(1:3, 1:1)
          ) {
            0: $A = load(A)
            1: $B = load(B)
            2: $v = mul($A, $B):fp32
            3: C = store($v)
          }
        }
      }
    }
"""

TILED_MATMUL_CACHED = """
    0: #program block [] ( // program
        #input #user none A[0, 0] fp32(5:4, 4:1)
        #input #user none B[0, 0] fp32(4:3, 3:1)
        #output #user none C[0, 0] fp32(5:3, 3:1)
    ) {
      0: #main block [] ( // main
          in A[0, 0] fp32(5:4, 4:1)
          in B[0, 0] fp32(4:3, 3:1)
          out C[0, 0] fp32(5:3, 3:1)
      ) {
        0: #kernel #special #zero block [] ( // k0_C
            out C[0, 0]:assign fp32(5:3, 3:1)
        ) {
          0: C = zero()
        }
        1: #agg_op_add #comb_op_mul #contraction #kernel #outer block [i:3, j:2, k:2] ( // k1_C
            // C[i, j: 5, 3] = +(A[i, k] * B[k, j]);
            in A[2*i, 3*k] fp32(2:4, 3:1)
            in B[3*k, 2*j] fp32(3:3, 2:1)
            out C[2*i, 2*j]:add fp32(2:3, 2:1)
            none<SRAM> A_c[0, 0] fp32(2:3, 3:1)
            none<SRAM> B_c[0, 0] fp32(3:2, 2:1)
            none<SRAM> C_c[0, 0] fp32(2:2, 2:1)
        ) {
          0: #xfer block<DMA> [d0:2, d1:3, i:1 = i, k:1 = k] ( // A_c <- A
              -d0 - 2*i + 4 >= 0
              -d1 - 3*k + 3 >= 0
              in A[d0, d1] fp32(1:4, 1:1)
              out A_c[d0, d1]:assign fp32(1:3, 1:1)
          ) {
            0: $x = load(A)
            1: A_c = store($x)
          }
          1: #xfer block<DMA> [d0:3, d1:2, j:1 = j, k:1 = k] ( // B_c <- B
              -d0 - 3*k + 3 >= 0
              -d1 - 2*j + 2 >= 0
              in B[d0, d1] fp32(1:3, 1:1)
              out B_c[d0, d1]:assign fp32(1:2, 1:1)
          ) {
            0: $x = load(B)
            1: B_c = store($x)
          }
          2: #inner block [i:2, j:2, k:3, i_o:1 = i, j_o:1 = j, k_o:1 = k] ( // k1_C
              -i - 2*i_o + 4 >= 0
              -j - 2*j_o + 2 >= 0
              -k - 3*k_o + 3 >= 0
              in<SRAM> A = A_c[i, k] fp32(1:3, 1:1)
              in<SRAM> B = B_c[k, j] fp32(1:2, 1:1)
              out<SRAM> C = C_c[i, j]:add fp32(1:2, 1:1)
          ) {
            0: $A = load(A)
            1: $B = load(B)
            2: $v = mul($A, $B):fp32
            3: C = store($v)
          }
          3: #xfer block<DMA> [d0:2, d1:2, i:1 = i, j:1 = j] ( // C_c -> C
              -d0 - 2*i + 4 >= 0
              -d1 - 2*j + 2 >= 0
              in C_c[d0, d1] fp32(1:2, 1:1)
              out C[d0, d1]:add fp32(1:3, 1:1)
          ) {
            0: $x = load(C_c)
            1: C = store($x)
          }
        }
      }
    }
"""


def test_tiled_matmul_with_partial_tiles_caches_inputs_and_the_sum():
    out = check_rewrite("cache", CACHE_IN_OUT, TILED_MATMUL, TILED_MATMUL_CACHED)
    program = lowered(MATMUL, {"A": (5, 4), "B": (4, 3)})
    assert_same_meaning(program, out)


def test_dirs_in_leaves_the_output_alone():
    out = run_pass("cache", {**CACHE_IN_OUT, "dirs": ["in"]}, parse_stripe(TILED_MATMUL))
    names = {r.into for b in walk(out) for r in b.refs}
    assert {"A_c", "B_c"} <= names and "C_c" not in names


def test_outputs_that_do_not_add_are_not_cached():
    # max-pooling style: C[i] = >(A[i, k]); the copy-out could not leave untouched elements alone.
    program = tiled(lowered("function (A[M, K]) -> (C) { C[i : M] = >(A[i, k]); }", {"A": (5, 4)}), 2)
    out = run_pass("cache", {**CACHE_IN_OUT, "dirs": ["out"]}, program)
    assert out == program


def test_an_output_assigned_below_is_not_cached():
    # The inner view overwrites instead of adding: a zero-started copy added back would not be it.
    text = TILED_MATMUL.replace("out C[i, j]:add fp32(1:3, 1:1)", "out C[i, j]:assign fp32(1:3, 1:1)")
    out = check_rewrite("cache", CACHE_IN_OUT, text, None)
    names = {r.into for b in walk(out) for r in b.refs}
    assert {"A_c", "B_c"} <= names and "C_c" not in names


def test_a_view_the_nested_block_overhangs_is_cached_with_the_overhang():
    # The inner block reads A one column past its tile view (k + 1), inside A thanks to its
    # constraint: the cached region is what it touches, columns 1..3 of the view.
    text = TILED_MATMUL.replace("in A[i, k] fp32(1:4, 1:1)", "in A[i, k + 1] fp32(1:4, 1:1)").replace(
        "-k - 3*k_o + 3 >= 0", "-k - 3*k_o + 2 >= 0"
    )
    out = check_rewrite("cache", {**CACHE_IN_OUT, "dirs": ["in"]}, text, None)
    outer = out.stmts[0].stmts[1]
    assert outer.ref("A_c").shape.sizes == (2, 3)
    copy, inner = outer.stmts[0], outer.stmts[2]
    assert [str(a) for a in copy.ref("A").access] == ["d0", "d1 + 1"]
    assert [str(a) for a in inner.ref("A").access] == ["i", "k"]
    assert_same_meaning(parse_stripe(text), out)


def test_ref_reqs_select_refinements_by_tag():
    program = parse_stripe(TILED_MATMUL)
    assert run_pass("cache", {**CACHE_IN_OUT, "ref_reqs": ["hot"]}, program) == program


# ------------------------------------------------------------------------------ meaning
SETTINGS = settings(
    derandomize=True,
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def test_cache_keeps_the_meaning_of_tiled_programs():
    changed = []

    @SETTINGS
    @given(
        programs(("contractions", "mixed")),
        st.sampled_from([2, 3]),
        st.sampled_from([["in"], ["in", "out"]]),
    )
    def prop(case, tile, dirs):
        program, inputs = case
        before = tiled(program, tile)
        after = run_pass("cache", {**CACHE_IN_OUT, "dirs": dirs}, before)
        assert_same_meaning(program, after, inputs)
        changed.append(after != before)

    prop()
    assert sum(changed) >= len(changed) // 3, f"only {sum(changed)} of {len(changed)} programs changed"


# ------------------------------------------------------------------------------ LLVM
def test_cached_program_runs_on_llvm_like_the_interpreter():
    program = tiled(lowered(MATMUL, {"A": (7, 5), "B": (5, 6)}), 3)
    out = run_pass("cache", CACHE_IN_OUT, program)
    assert any("xfer" in b.tags for b in walk(out))
    inputs = inputs_for(out, seed=3)
    got, _ = execute(out, inputs)
    want = run_stripe(program, inputs)
    np.testing.assert_array_equal(got["C"], want["C"])
