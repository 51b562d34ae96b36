"""The ``fusion`` pass: Before/Expected pairs in Stripe text, meaning by the interpreter
on Hypothesis-drawn programs, and a fused program run on the LLVM CPU backend."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ref_interp.stripe_exec import run_stripe
from stripe.ir import Block
from stripe.parser import parse_stripe
from stripe.passes.tiling import can_split, split
from stripe.printer import format_block
from tests.pass_support import assert_same_meaning, check_rewrite, inputs_for, lowered, programs, run_pass

MATMUL_BIAS_RELU = """
function (A[M, K], B[K, N], Bias[N]) -> (R) {
    C[i, j : M, N] = +(A[i, k] * B[k, j]);
    D = C + Bias;
    R = relu(D);
}
"""

MATMUL_BIAS_RELU_FUSED = """
0: #program block [] ( // program
    #input #user none A[0, 0] fp32(4:3, 3:1)
    #input #user none B[0, 0] fp32(3:5, 5:1)
    #input #user none Bias[0] fp32(5:1)
    #tmp none C[0, 0] fp32(4:5, 5:1)
    #tmp none D[0, 0] fp32(4:5, 5:1)
    #output #user none R[0, 0] fp32(4:5, 5:1)
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(4:3, 3:1)
      in B[0, 0] fp32(3:5, 5:1)
      in Bias[0] fp32(5:1)
      inout C[0, 0] fp32(4:5, 5:1)
      inout D[0, 0] fp32(4:5, 5:1)
      out R[0, 0] fp32(4:5, 5:1)
  ) {
    0: #kernel #special #zero block [] ( // k0_C
        out C[0, 0]:assign fp32(4:5, 5:1)
    ) {
      0: C = zero()
    }
    1: #agg_op_add #comb_op_mul #contraction #eltwise #eltwise_add #eltwise_relu #fused #kernel
       block [i0:4, i1:5] ( // k1_C+k2_D+k3_R
        in A[i0, 0] fp32(1:3, 3:1)
        in B[0, i1] fp32(3:5, 1:1)
        inout C[i0, i1] fp32(1:5, 1:1)
        in Bias[i1] fp32(1:1)
        inout D[i0, i1] fp32(1:5, 1:1)
        out R[i0, i1]:assign fp32(1:5, 1:1)
    ) {
      0: #agg_op_add #comb_op_mul #contraction block [k:3] ( // k1_C
          // C[i, j: 4, 5] = +(A[i, k] * B[k, j]);
          in A[0, k] fp32(1:3, 1:1)
          in B[k, 0] fp32(1:5, 1:1)
          out C[0, 0]:add fp32(1:5, 1:1)
      ) {
        0: $A = load(A)
        1: $B = load(B)
        2: $v = mul($A, $B):fp32
        3: C = store($v)
      }
      1: #eltwise #eltwise_add block [] ( // k2_D
          in C[0, 0] fp32(1:5, 1:1)
          in Bias[0] fp32(1:1)
          out D[0, 0]:assign fp32(1:5, 1:1)
      ) {
        0: $C = load(C)
        1: $Bias = load(Bias)
        2: $t2 = add($C, $Bias):fp32
        3: D = store($t2)
      }
      2: #eltwise #eltwise_relu block [] ( // k3_R
          in D[0, 0] fp32(1:5, 1:1)
          out R[0, 0]:assign fp32(1:5, 1:1)
      ) {
        0: $D = load(D)
        1: $t1 = relu($D):fp32
        2: R = store($t1)
      }
    }
  }
}
"""


def mm_program():
    return lowered(MATMUL_BIAS_RELU, {"A": (4, 3), "B": (3, 5), "Bias": (5,)})


def test_matmul_bias_relu():
    """Default params fuse the whole chain. So does contraction+eltwise alone (the fused block is
    tagged eltwise too, so it takes the relu as well); eltwise+eltwise first, then the contraction
    with that fused block (a consumer that is itself fused), ends in the same one-level block."""
    before = mm_program()
    text = format_block(before)
    out = check_rewrite("fusion", {}, text, MATMUL_BIAS_RELU_FUSED)
    assert_same_meaning(before, out)
    check_rewrite("fusion", {"a_reqs": ["contraction"], "b_reqs": ["eltwise"]}, text, MATMUL_BIAS_RELU_FUSED)
    mid = run_pass("fusion", {"a_reqs": ["eltwise"], "b_reqs": ["eltwise"]}, before)
    assert [s.name for s in mid.stmts[0].stmts] == ["k0_C", "k1_C", "k2_D+k3_R"]
    check_rewrite("fusion", {"a_reqs": ["contraction"]}, format_block(mid), MATMUL_BIAS_RELU_FUSED)


def test_params_select_and_limit():
    before = mm_program()
    out = run_pass("fusion", {"a_reqs": ["eltwise"], "b_reqs": ["eltwise_relu"]}, before)
    assert [s.name for s in out.stmts[0].stmts] == ["k0_C", "k1_C", "k2_D+k3_R"]
    assert run_pass("fusion", {"a_reqs": ["contraction"], "b_reqs": ["eltwise_relu"]}, before) == before
    assert run_pass("fusion", {"parent_reqs": ["no_such_tag"]}, before) == before
    # k1_C + k2_D would need A, B, C, Bias, D (5); k2_D + k3_R needs C, Bias, D, R (4).
    out = run_pass("fusion", {"max_refs": 4}, before)
    assert [s.name for s in out.stmts[0].stmts] == ["k0_C", "k1_C", "k2_D+k3_R"]
    assert_same_meaning(before, out)
    # A broadcast consumer keeps a loop over i0 per outer point i1: b_fully_fused refuses it.
    bcast = lowered("function (X[N, M], V[M]) -> (S) { W = V + 1; S = X * W; }", {"X": (2, 3), "V": (3,)})
    assert run_pass("fusion", {}, bcast).stmts[0].stmts[0].name == "k0_W+k1_S"
    assert run_pass("fusion", {"b_fully_fused": True}, bcast) == bcast


ELTWISE_CHAIN = """
0: #program block [] ( // program
    #input #user none X[0, 0] fp32(2:3, 3:1)
    #tmp none T1[0, 0] fp32(2:3, 3:1)
    #tmp none T2[0, 0] fp32(2:3, 3:1)
    #output #user none R[0, 0] fp32(2:3, 3:1)
) {
  0: #main block [] ( // main
      in X[0, 0] fp32(2:3, 3:1)
      inout T1[0, 0] fp32(2:3, 3:1)
      inout T2[0, 0] fp32(2:3, 3:1)
      out R[0, 0] fp32(2:3, 3:1)
  ) {
    0: #eltwise #kernel block [i0:2, i1:3] ( // k0_T1
        in X[i0, i1] fp32(1:3, 1:1)
        out T1[i0, i1]:assign fp32(1:3, 1:1)
    ) {
      0: $X = load(X)
      1: $t = neg($X):fp32
      2: T1 = store($t)
    }
    1: #eltwise #kernel block [i0:2, i1:3] ( // k1_T2
        in T1[i0, i1] fp32(1:3, 1:1)
        in X[i0, i1] fp32(1:3, 1:1)
        out T2[i0, i1]:assign fp32(1:3, 1:1)
    ) {
      0: $T1 = load(T1)
      1: $X = load(X)
      2: $t = mul($T1, $X):fp32
      3: T2 = store($t)
    }
    2: #eltwise #kernel block [j0:2, j1:3] ( // k2_R
        -j0 - j1 + 2 >= 0
        in T2[j0, j1] fp32(1:3, 1:1)
        out R[j0, j1]:assign fp32(1:3, 1:1)
    ) {
      0: $T2 = load(T2)
      1: $j = load_index(j1)
      2: $t = add($T2, $j):fp32
      3: R = store($t)
    }
  }
}
"""

ELTWISE_CHAIN_FUSED = """
0: #program block [] ( // program
    #input #user none X[0, 0] fp32(2:3, 3:1)
    #tmp none T1[0, 0] fp32(2:3, 3:1)
    #tmp none T2[0, 0] fp32(2:3, 3:1)
    #output #user none R[0, 0] fp32(2:3, 3:1)
) {
  0: #main block [] ( // main
      in X[0, 0] fp32(2:3, 3:1)
      inout T1[0, 0] fp32(2:3, 3:1)
      inout T2[0, 0] fp32(2:3, 3:1)
      out R[0, 0] fp32(2:3, 3:1)
  ) {
    0: #chain #eltwise #kernel block [j0:2, j1:3] ( // k0_T1+k1_T2+k2_R
        in X[j0, j1] fp32(1:3, 1:1)
        inout T1[j0, j1] fp32(1:3, 1:1)
        inout T2[j0, j1] fp32(1:3, 1:1)
        out R[j0, j1]:assign fp32(1:3, 1:1)
    ) {
      0: #eltwise block [] ( // k0_T1
          in X[0, 0] fp32(1:3, 1:1)
          out T1[0, 0]:assign fp32(1:3, 1:1)
      ) {
        0: $X = load(X)
        1: $t = neg($X):fp32
        2: T1 = store($t)
      }
      1: #eltwise block [] ( // k1_T2
          in T1[0, 0] fp32(1:3, 1:1)
          in X[0, 0] fp32(1:3, 1:1)
          out T2[0, 0]:assign fp32(1:3, 1:1)
      ) {
        0: $T1 = load(T1)
        1: $X = load(X)
        2: $t = mul($T1, $X):fp32
        3: T2 = store($t)
      }
      2: #eltwise block [j0_o:1 = j0, j1_o:1 = j1] ( // k2_R
          -j0_o - j1_o + 2 >= 0
          in T2[0, 0] fp32(1:3, 1:1)
          out R[0, 0]:assign fp32(1:3, 1:1)
      ) {
        0: $T2 = load(T2)
        1: $j = load_index(j1_o)
        2: $t = add($T2, $j):fp32
        3: R = store($t)
      }
    }
  }
}
"""


def test_eltwise_chain_of_three():
    """The first pair fuses, then the fused block takes the third (with B's index names, its
    constraint and load_index through passthroughs); X, read by two blocks, has one outer view."""
    out = check_rewrite("fusion", {"fused_set": ["chain"]}, ELTWISE_CHAIN, ELTWISE_CHAIN_FUSED)
    assert_same_meaning(parse_stripe(ELTWISE_CHAIN), out)


CONV_CONV = """
function (I[X, Y, CI], K1[KX, KY, CI, CO], K2[CO, C2]) -> (O2) {
    O1[x, y, co : X, Y, CO] = +(I[x + i - 1, y + j - 1, ci] * K1[i, j, ci, co]);
    O2[x, y, c2 : X, Y, C2] = +(O1[x, y, co] * K2[co, c2]);
}
"""

CONV_CONV_FUSED = """
#CONV #agg_op_add #comb_op_mul #contraction #fused #kernel block [x:4, y:4] ( // k1_O1+k3_O2
    in I[x - 1, y - 1, 0] fp32(3:8, 3:2, 2:1)
    in K1[0, 0, 0, 0] fp32(3:18, 3:6, 2:3, 3:1)
    inout O1[x, y, 0] fp32(1:12, 1:3, 3:1)
    in K2[0, 0] fp32(3:2, 2:1)
    out O2[x, y, 0]:add fp32(1:8, 1:2, 2:1)
) {
  0: #agg_op_add #comb_op_mul #contraction block [co:3, i:3, j:3, ci:2, x_o:1 = x, y_o:1 = y] ( // k1_O1
      // O1[x, y, co: 4, 4, 3] = +(I[i + x - 1, j + y - 1, ci] * K1[i, j, ci, co]);
      i + x_o - 1 >= 0
      -i - x_o + 4 >= 0
      j + y_o - 1 >= 0
      -j - y_o + 4 >= 0
      in I[i, j, ci] fp32(1:8, 1:2, 1:1)
      in K1[i, j, ci, co] fp32(1:18, 1:6, 1:3, 1:1)
      out O1[0, 0, co]:add fp32(1:12, 1:3, 1:1)
  ) {
    0: $I = load(I)
    1: $K1 = load(K1)
    2: $v = mul($I, $K1):fp32
    3: O1 = store($v)
  }
  1: #agg_op_add #comb_op_mul #contraction block [c2:2, co:3] ( // k3_O2
      // O2[x, y, c2: 4, 4, 2] = +(O1[x, y, co] * K2[co, c2]);
      in O1[0, 0, co] fp32(1:12, 1:3, 1:1)
      in K2[co, c2] fp32(1:2, 1:1)
      out O2[0, 0, c2]:add fp32(1:8, 1:2, 1:1)
  ) {
    0: $O1 = load(O1)
    1: $K2 = load(K2)
    2: $v = mul($O1, $K2):fp32
    3: O2 = store($v)
  }
}
"""


def test_conv_then_1x1_conv():
    """The seed's case: fused on x, y; O1's outer view is one (x, y) point with every channel, the
    padding constraints move inside with passthroughs, and the zero kernel of O2 (which the first
    conv does not touch) moves before it so that the two contractions meet."""
    before = lowered(CONV_CONV, {"I": (4, 4, 2), "K1": (3, 3, 2, 3), "K2": (3, 2)})
    params = {"a_reqs": ["contraction"], "b_reqs": ["contraction"], "fused_set": ["CONV", "fused"]}
    names = ["k0_O1", "k2_O2", "k1_O1+k3_O2"]
    check_fused_kernel(params, before, CONV_CONV_FUSED, names)


def check_fused_kernel(params: dict, before: Block, expected: str, names: list[str]) -> Block:
    """The pass's output: #main's kernels are ``names``, the fused one is ``expected`` (Stripe
    text), the buffers and #main's refinements are unchanged, and the meaning is kept."""
    out = run_pass("fusion", params, before)
    main = out.stmts[0]
    assert [s.name for s in main.stmts] == names
    fused = next(s for s in main.stmts if "+" in s.name)
    assert fused == parse_stripe(expected), f"got\n{format_block(fused)}"
    assert out.refs == before.refs and main.refs == before.stmts[0].refs
    assert_same_meaning(before, out)
    return out


MERGE = """
0: #program block [] ( // program
    #input #user none X[0] fp32(4:1)
    #tmp none T[0] fp32(3:1)
    #output #user none R[0] fp32(3:1)
) {
  0: #main block [] ( // main
      in X[0] fp32(4:1)
      inout T[0] fp32(3:1)
      out R[0] fp32(3:1)
  ) {
    0: #kernel block [i:3] ( // k0_T
        in X[i] fp32(1:1)
        in W = X[i + 1] fp32(1:1)
        out T[i]:assign fp32(1:1)
    ) {
      0: $X = load(X)
      1: $W = load(W)
      2: $t = sub($X, $W):fp32
      3: T = store($t)
    }
    1: #kernel block [j:3] ( // k1_R
        in T[j] fp32(1:1)
        in W = X[j] fp32(1:1)
        in X[-j + 2] fp32(1:1)
        out R[j]:assign fp32(1:1)
    ) {
      0: $T = load(T)
      1: $W = load(W)
      2: $X = load(X)
      3: $s = add($T, $W):fp32
      4: $t = mul($s, $X):fp32
      5: R = store($t)
    }
  }
}
"""

MERGE_FUSED = """
#fused #kernel block [j:3] ( // k0_T+k1_R
    in X[j] fp32(1:1)
    in W = X[j] fp32(2:1)
    inout T[j] fp32(1:1)
    in X_1 = X[-j + 2] fp32(1:1)
    out R[j]:assign fp32(1:1)
) {
  0: block [] ( // k0_T
      in X[0] fp32(1:1)
      in W[1] fp32(1:1)
      out T[0]:assign fp32(1:1)
  ) {
    0: $X = load(X)
    1: $W = load(W)
    2: $t = sub($X, $W):fp32
    3: T = store($t)
  }
  1: block [] ( // k1_R
      in T[0] fp32(1:1)
      in W[0] fp32(1:1)
      in X = X_1[0] fp32(1:1)
      out R[0]:assign fp32(1:1)
  ) {
    0: $T = load(T)
    1: $W = load(W)
    2: $X = load(X)
    3: $s = add($T, $W):fp32
    4: $t = mul($s, $X):fp32
    5: R = store($t)
  }
}
"""


def test_outer_views_merge_or_rename():
    """``W`` (X at i + 1 in A, at j in B) differs only by a constant: one outer view covering both,
    the inner views shifted; B's ``X`` (at 2 - j) cannot share A's, so it is renamed ``X_1``."""
    check_fused_kernel({}, parse_stripe(MERGE), MERGE_FUSED, ["k0_T+k1_R"])


def test_reduction_consumer_fuses_on_the_kept_index():
    """``R[x] = +(T[x, y])``: fusing on y would split the sum over outer points (and reorder it),
    so only x is fused; T's outer view is one row, whole."""
    before = lowered("function (X[N, M]) -> (R) { T = X * 2; R[x : N] = +(T[x, y]); }", {"X": (3, 4)})
    out = run_pass("fusion", {}, before)
    fused = out.stmts[0].stmts[-1]
    assert [(i.name, i.range) for i in fused.idxs] == [("x", 3)]
    t = fused.ref("T")
    assert [str(a) for a in t.access] == ["x", "0"] and t.shape.sizes == (1, 4)
    assert [[i.name for i in s.idxs] for s in fused.stmts] == [["i1"], ["y"]]
    assert_same_meaning(before, out)


def test_transposed_consumer_fuses_when_ownership_holds():
    """B reads T[x, y] while writing R[y, x]: each outer point still reads only what it wrote."""
    before = lowered("function (X[N, M]) -> (R) { T = X + X; R[y, x : M, N] = =(T[x, y]); }", {"X": (3, 4)})
    out = run_pass("fusion", {}, before)
    assert out.stmts[0].stmts[-1].name == "k0_T+k2_R"
    assert_same_meaning(before, out)


TILED_FUSED = """
#agg_op_add #comb_op_mul #contraction #eltwise #eltwise_add #eltwise_relu #fused #kernel
block [i0:2, i1:2] ( // k1_C+k2_D+k3_R
    in A[2*i0, 0] fp32(2:4, 4:1)
    in B[0, 2*i1] fp32(4:4, 2:1)
    inout C[2*i0, 2*i1] fp32(2:4, 2:1)
    in Bias[2*i1] fp32(2:1)
    inout D[2*i0, 2*i1] fp32(2:4, 2:1)
    out R[2*i0, 2*i1]:assign fp32(2:4, 2:1)
) {
  0: #agg_op_add #comb_op_mul #contraction block [k:2, i0_o:1 = i0] ( // k1_C
      // C[i, j: 3, 4] = +(A[i, k] * B[k, j]);
      in A[0, 2*k] fp32(2:4, 2:1)
      in B[2*k, 0] fp32(2:4, 2:1)
      out C[0, 0]:add fp32(2:4, 2:1)
  ) {
    0: block [i:2, j:2, k:2, i_o:1 = i0_o] ( // k1_C
        -i - 2*i_o + 2 >= 0
        in A[i, k] fp32(1:4, 1:1)
        in B[k, j] fp32(1:4, 1:1)
        out C[i, j]:add fp32(1:4, 1:1)
    ) {
      0: $A = load(A)
      1: $B = load(B)
      2: $v = mul($A, $B):fp32
      3: C = store($v)
    }
  }
  1: #eltwise #eltwise_add block [i0:2, i1:2, i0_o:1 = i0] ( // k2_D
      -i0 - 2*i0_o + 2 >= 0
      in C[i0, i1] fp32(1:4, 1:1)
      in Bias[i1] fp32(1:1)
      out D[i0, i1]:assign fp32(1:4, 1:1)
  ) {
    0: $C = load(C)
    1: $Bias = load(Bias)
    2: $t2 = add($C, $Bias):fp32
    3: D = store($t2)
  }
  2: #eltwise #eltwise_relu block [i0:2, i1:2, i0_o:1 = i0] ( // k3_R
      -i0 - 2*i0_o + 2 >= 0
      in D[i0, i1] fp32(1:4, 1:1)
      out R[i0, i1]:assign fp32(1:4, 1:1)
  ) {
    0: $D = load(D)
    1: $t1 = relu($D):fp32
    2: R = store($t1)
  }
}
"""


def tiled(program: Block, draw_tiles) -> Block:
    """``program`` with each leaf kernel that ``draw_tiles(kernel)`` gives tiles for split by them."""
    main = program.stmts[0]
    kernels = []
    for k in main.stmts:
        leaf = can_split(k) and not any(isinstance(s, Block) for s in k.stmts)
        tiles = draw_tiles(k) if leaf else None
        if tiles:
            k = split(k, tiles, parent_sizes={r.into: main.ref(r.source).shape.sizes for r in k.refs})
        kernels.append(k)
    return replace(program, stmts=(replace(main, stmts=tuple(kernels)),))


def test_tiled_contraction_fuses_by_tiles():
    """A contraction tiled 2x2 (with a partial row tile and reduction tiles): the elementwise
    consumers are split into 2x2 tiles to match and fuse on the tile numbers; the reduction tiles
    stay in the contraction's inner block; the remainder constraints keep the partial tile inside."""
    before = lowered(MATMUL_BIAS_RELU, {"A": (3, 4), "B": (4, 4), "Bias": (4,)})
    before = tiled(before, lambda k: {"i": 2, "j": 2, "k": 2} if "contraction" in k.tags else None)
    check_fused_kernel({"b_fully_fused": True}, before, TILED_FUSED, ["k0_C", "k1_C+k2_D+k3_R"])


# ------------------------------------------------------------------------------ meaning
SEEN = {"examples": 0, "fused": 0}
DRAWN = settings(
    derandomize=True,
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@DRAWN
@given(programs(families=("mixed", "elementwise")))
def _fusion_keeps_meaning(case):
    program, inputs = case
    out = run_pass("fusion", {}, program)
    assert_same_meaning(program, out, inputs)
    main = out.stmts[0]
    assert all(isinstance(s, type(main)) and "kernel" in s.tags for s in main.stmts)
    SEEN["examples"] += 1
    if out != program:
        SEEN["fused"] += 1
        # The two-step configuration (contraction+eltwise, then eltwise+eltwise) keeps meaning too.
        staged = run_pass("fusion", {"a_reqs": ["contraction"], "b_reqs": ["eltwise"]}, program)
        staged = run_pass("fusion", {"a_reqs": ["eltwise"], "b_reqs": ["eltwise"]}, staged)
        assert_same_meaning(program, staged, inputs)


def test_fusion_keeps_meaning_on_drawn_programs():
    """Counted over the run, so that the test cannot pass with fusion never happening."""
    SEEN.update(examples=0, fused=0)
    _fusion_keeps_meaning()
    assert SEEN["examples"] >= 30, SEEN
    assert SEEN["fused"] >= SEEN["examples"] // 4, SEEN


@DRAWN
@given(programs(families=("mixed", "elementwise")), st.data())
def _fusion_keeps_meaning_tiled(case, data):
    program, inputs = case
    program = tiled(program, lambda k: data.draw(st.one_of(st.none(), _tiles(k))))
    out = run_pass("fusion", {}, program)
    assert_same_meaning(program, out, inputs)
    SEEN["examples"] += 1
    nested = [c for k in out.stmts[0].stmts for c in k.stmts if isinstance(c, Block)]
    SEEN["fused"] += any(isinstance(s, Block) for c in nested for s in c.stmts)


def test_fusion_keeps_meaning_on_randomly_tiled_programs():
    """Kernels split into random tiles (partial tiles included) before fusing; counted: fusions
    whose inner blocks hold tiles."""
    SEEN.update(examples=0, fused=0)
    _fusion_keeps_meaning_tiled()
    assert SEEN["examples"] >= 30 and SEEN["fused"] >= 4, SEEN


def _tiles(kernel: Block):
    return st.fixed_dictionaries({i.name: st.integers(1, i.range) for i in kernel.idxs})


# ------------------------------------------------------------------------------ LLVM
def test_fused_matmul_bias_relu_runs_on_llvm():
    """Plain and tiled (3 levels: fused block, reduction tiles, tile), compared with the interpreter
    exactly on integer-valued inputs."""
    from tests.llvm_runner import assert_same, execute

    before = lowered(MATMUL_BIAS_RELU, {"A": (9, 7), "B": (7, 6), "Bias": (6,)})
    inputs = inputs_for(before, seed=3)
    want = run_stripe(before, inputs)
    assert np.any(want["R"] > 0) and np.any(want["R"] == 0)  # relu cut some values and kept others
    tiles = {"i": 4, "j": 4, "k": 3}
    for program in (before, tiled(before, lambda k: tiles if "contraction" in k.tags else None)):
        out = run_pass("fusion", {}, program)
        assert [s.name for s in out.stmts[0].stmts] == ["k0_C", "k1_C+k2_D+k3_R"]
        got, kernels = execute(out, inputs)
        assert len(kernels) == 2
        assert_same(got, want)
