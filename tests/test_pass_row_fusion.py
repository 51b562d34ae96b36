"""``row_fusion``: per-row reductions and the elementwise kernels reading them become one row
program (a block over the rows); the interpreter gives the same outputs before and after (it runs
each row's points in their order, so integer-valued results agree exactly)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings

from bench.gpu_reductions import LAYERNORM, SOFTMAX
from stripe.config import target_config
from stripe.ir import Block, Special
from stripe.parser import parse_stripe
from stripe.passes import optimize
from stripe.passes.row_fusion import ROW_TAG
from stripe.plans import RowPlan
from stripe.printer import format_block
from tests.pass_support import assert_same_meaning, check_rewrite, kernels, lowered, programs, run_pass

MAIN = {"reqs": ["main"]}
ANY_ROWS = {"reqs": ["main"], "rows_per_unit": 0}


def rows(program: Block) -> list[Block]:
    return [k for k in kernels(program) if k.has_tags(ROW_TAG)]


def test_a_softmax_is_one_row_program():
    program = run_pass("recompute", MAIN, lowered(SOFTMAX, {"X": (6, 5)}))
    out = run_pass("row_fusion", ANY_ROWS, program)
    (k,) = kernels(out)
    assert k.has_tags(ROW_TAG) and [ix.range for ix in k.idxs] == [6]
    inner = [s for s in k.stmts if isinstance(s, Block)]
    assert [b.index_space for b in inner] == [5, 5, 5]  # the max, the sum, the division
    assert [s.name for s in k.stmts if isinstance(s, Special)] == ["agg_init_max", "zero"]
    assert {r.into for r in out.refs} == {"X", "Y"}  # Mx and S are per-row locals now
    assert parse_stripe(format_block(out)) == out  # the text keeps the tag and the group attribute
    x = np.random.default_rng(0).integers(-3, 4, (6, 5)).astype(np.float32)
    assert_same_meaning(program, out, {"X": x})


MEAN_BEFORE = """
0: #program block [] (
    #input #user none X[0, 0] fp32(3:4, 4:1)
    #tmp none S[0, 0] fp32(3:1, 1:1)
    #tmp none Mu[0, 0] fp32(3:1, 1:1)
    #output #user none Y[0, 0] fp32(3:4, 4:1)
) {
  0: #main block [] (
      in X[0, 0] fp32(3:4, 4:1)
      inout S[0, 0] fp32(3:1, 1:1)
      inout Mu[0, 0] fp32(3:1, 1:1)
      out Y[0, 0] fp32(3:4, 4:1)
  ) {
    0: #kernel block [] ( // k0_S
        out S[0, 0]:assign fp32(3:1, 1:1)
    ) {
      0: S = zero()
    }
    1: #kernel block [i:3, j:4] ( // k1_S
        in X[i, j] fp32(1:4, 1:1)
        out S[i, 0]:add fp32(1:1, 1:1)
    ) {
      0: $X = load(X)
      1: S = store($X)
    }
    2: #kernel block [i0:3, i1:1] ( // k2_Mu
        in S[i0, i1] fp32(1:1, 1:1)
        out Mu[i0, i1]:assign fp32(1:1, 1:1)
    ) {
      0: $S = load(S)
      1: $t1 = (i32)4
      2: $t2 = div($S, $t1):fp32
      3: Mu = store($t2)
    }
    3: #kernel block [i0:3, i1:4] ( // k3_Y
        in X[i0, i1] fp32(1:4, 1:1)
        in Mu[i0, 0] fp32(1:1, 1:1)
        out Y[i0, i1]:assign fp32(1:4, 1:1)
    ) {
      0: $X = load(X)
      1: $Mu = load(Mu)
      2: $t2 = sub($X, $Mu):fp32
      3: Y = store($t2)
    }
  }
}
"""
MEAN_EXPECTED = """
0: #program block [] (
    #input #user none X[0, 0] fp32(3:4, 4:1)
    #output #user none Y[0, 0] fp32(3:4, 4:1)
) {
  0: #main block [] (
      in X[0, 0] fp32(3:4, 4:1)
      out Y[0, 0] fp32(3:4, 4:1)
  ) {
    0: #kernel #row_program #group=4 block [i:3] ( // k1_S_rows
        plan row(rows: [i], values: [S_row, Mu_row], group: 4)
        in X[i, 0] fp32(1:4, 4:1)
        out Y[i, 0]:assign fp32(1:4, 4:1)
        none S_row[0, 0]:assign fp32(1:1, 1:1)
        none Mu_row[0, 0]:assign fp32(1:1, 1:1)
    ) {
      0: S_row = zero()
      1: block [j:4] ( // k1_S
          in X[0, j] fp32(1:4, 1:1)
          out S = S_row[0, 0]:add fp32(1:1, 1:1)
      ) {
        0: $X = load(X)
        1: S = store($X)
      }
      2: block [i1:1] ( // k2_Mu
          in S = S_row[0, 0] fp32(1:1, 1:1)
          out Mu = Mu_row[0, 0]:assign fp32(1:1, 1:1)
      ) {
        0: $S = load(S)
        1: $t1 = (i32)4
        2: $t2 = div($S, $t1):fp32
        3: Mu = store($t2)
      }
      3: block [i1:4] ( // k3_Y
          in X[0, i1] fp32(1:4, 1:1)
          in Mu = Mu_row[0, 0] fp32(1:1, 1:1)
          out Y[0, i1]:assign fp32(1:4, 1:1)
      ) {
        0: $X = load(X)
        1: $Mu = load(Mu)
        2: $t2 = sub($X, $Mu):fp32
        3: Y = store($t2)
      }
    }
  }
}
"""


def test_a_row_value_computed_from_another_becomes_a_local():
    """``Mu = S / 4`` has one point per row (its ``i1`` has range 1) and writes a temporary: it is
    a row value like the sum, a one-point inner block assigning a local, which the division
    across the row reads (before, ``Mu`` was a buffer the group could not read back)."""
    out = check_rewrite("row_fusion", ANY_ROWS, MEAN_BEFORE, MEAN_EXPECTED, "opencl_gpu")
    assert_same_meaning(parse_stripe(MEAN_BEFORE), out)


def test_a_layernorm_is_one_row_program():
    """Sum, mean, variance of the centred row, and the normalisation with gain and bias read along
    the row: one row program with three row values (was four kernels: the sum's fill, the sum,
    the mean, then a row program for the variance and the normalisation)."""
    program = run_pass("recompute", MAIN, lowered(LAYERNORM, {"X": (6, 8), "G": (8,), "Bt": (8,)}))
    out = run_pass("row_fusion", ANY_ROWS, program)
    (k,) = kernels(out)
    assert isinstance(k.plan, RowPlan) and len(k.plan.values) == 3
    assert {r.into for r in out.refs} == {"X", "G", "Bt", "Y"}
    rng = np.random.default_rng(0)
    inputs = {"X": rng.standard_normal((6, 8)).astype(np.float32),
              "G": rng.standard_normal(8).astype(np.float32), "Bt": rng.standard_normal(8).astype(np.float32)}
    assert_same_meaning(program, out, inputs)  # the interpreter runs each row in the same order


def test_the_layernorm_of_the_goals_is_one_kernel_on_the_gpu():
    """8192 x 1024 on ``opencl_gpu`` (issue 24's case): one kernel, planned, its rows the 8192
    rows; in strict mode (no reordering passes) six kernels."""
    program = lowered(LAYERNORM, {"X": (8192, 1024), "G": (1024,), "Bt": (1024,)})
    config = target_config("opencl_gpu")
    (k,) = kernels(optimize(program, config))
    assert isinstance(k.plan, RowPlan) and [ix.range for ix in k.idxs] == [8192]
    assert len(kernels(optimize(program, config, strict=True))) == 6


def test_what_a_computed_row_value_leaves_alone():
    cases = [
        # the mean is an output: it is written anyway, and the normalisation cannot read it back
        "function (X[M, N]) -> (Y, Mu) { S[i, 0: M, 1] = +(X[i, j]); Mu = S / N; Y = X - Mu; }",
        # the mean is read outside the group too (by a contraction over the rows)
        "function (X[M, N]) -> (Y, Z) { S[i, 0: M, 1] = +(X[i, j]); Mu = S / N; Y = X - Mu; "
        "Z[j: N] = +(X[i, j] * Mu[i, 0]); }",
    ]
    for src in cases:
        program = run_pass("recompute", MAIN, lowered(src, {"X": (6, 6)}))
        out = run_pass("row_fusion", ANY_ROWS, program)
        assert all("Mu_row" not in k.plan.values for k in rows(out)), src
        assert_same_meaning(program, out)


def test_other_row_shapes():
    cases = [
        # rows over their sums; the sum read through a column index (row j of S gives column j)
        ("function (X[M, N]) -> (Y) { S[i, 0: M, 1] = +(X[i, j]); Y = X * S; }", {"X": (7, 4)}),
        ("function (X[N, N]) -> (Y) { S[i: N] = +(X[i, j]); Y[i, j: N, N] = =(X[i, j] + S[j]); }",
         {"X": (5, 5)}),
        # two row indexes (a softmax over the last axis of a 3-D tensor), a product and a min
        ("function (X[A, B, C]) -> (Y) { P[a, b, 0: A, B, 1] = *(X[a, b, c]); Y = X + P; }",
         {"X": (3, 4, 5)}),
        ("function (X[M, N]) -> (Y) { L[i, 0: M, 1] = <(X[i, j]); T = X - L; "
         "S[i, 0: M, 1] = +(T[i, j]); Y = T * S; }", {"X": (6, 3)}),
        # a reduction over two indexes per row
        ("function (X[M, N, K]) -> (Y) { S[i, 0, 0: M, 1, 1] = +(X[i, j, k]); Y = X - S; }",
         {"X": (4, 3, 2)}),
    ]
    for src, shapes in cases:
        program = run_pass("recompute", MAIN, lowered(src, shapes))
        out = run_pass("row_fusion", ANY_ROWS, program)
        assert len(rows(out)) == 1, src
        assert_same_meaning(program, out)


def test_what_it_leaves_alone():
    cases = [
        # the row max is an output: it is written anyway, and read outside the group
        "function (X[M, N]) -> (Y, Mx) { Mx[i, 0: M, 1] = >(X[i, j]); Y = X - Mx; }",
        # a row reads another row's sum
        "function (X[M, N]) -> (Y) { S[i: M] = +(X[i, j]); Y[i, j: M, N] = =(X[i, j] + S[M - 1 - i]); }",
        # a reduction alone has no reader in the group
        "function (X[M, N]) -> (S) { S[i: M] = +(X[i, j]); }",
        # the consumer reads every row's sum (a contraction, not elementwise over the rows)
        "function (X[M, N]) -> (Y) { S[i: M] = +(X[i, j]); Y[j: N] = +(X[i, j] * S[i]); }",
        # each row value read once, at its own row: a matrix product with a bias and relu, which
        # fusion and gemm_tile serve (a row program would be a work-group per element)
        "function (X[M, N]) -> (Y) { T[i, j: M, M] = +(X[i, k] * X[j, k]); Y = relu(T + 1); }",
        "function (X[M, N]) -> (Y) { S[i: M] = +(X[i, j]); Y = exp(S); }",
    ]
    for src in cases:
        program = run_pass("recompute", MAIN, lowered(src, {"X": (6, 6)}))
        assert not rows(run_pass("row_fusion", ANY_ROWS, program)), src


def test_a_matrix_product_with_an_epilogue_stays_a_tiled_gemm():
    src = "function (A[M, K], B[K, N], C[N]) -> (O) { T[m, n: M, N] = +(A[m, k] * B[k, n]); O = relu(T + C);}"
    shapes = {"A": (130, 17), "B": (17, 129), "C": (129,)}
    program = optimize(lowered(src, shapes), target_config("opencl_gpu"))
    assert not rows(program) and any(k.has_tags("gpu_group") for k in kernels(program))


def test_few_rows_or_long_rows_stay_apart():
    """At least ``rows_per_unit`` rows per compute unit (132 on opencl_gpu: 528 rows); at most
    ``max_row`` points per row."""
    program = run_pass("recompute", MAIN, lowered(SOFTMAX, {"X": (256, 64)}))
    assert not rows(run_pass("row_fusion", {"reqs": ["main"], "rows_per_unit": 4}, program, "opencl_gpu"))
    program = run_pass("recompute", MAIN, lowered(SOFTMAX, {"X": (600, 100)}))
    (k,) = rows(run_pass("row_fusion", {"reqs": ["main"], "rows_per_unit": 4}, program, "opencl_gpu"))
    assert dict(k.attrs)["group"] == 64  # work-items per row: a power of two, at most the row
    (k,) = rows(run_pass("row_fusion", {"reqs": ["main"], "group": 32}, program, "opencl_gpu"))
    assert dict(k.attrs)["group"] == 32
    assert not rows(run_pass("row_fusion", {**ANY_ROWS, "max_row": 99}, program))
    # the long-rows variant to measure for softmax 256 x 65536 (issue 24): 256 rows >= 1 per unit
    program = run_pass("recompute", MAIN, lowered(SOFTMAX, {"X": (256, 65536)}))
    params = {"reqs": ["main"], "rows_per_unit": 1, "max_row": 65536, "group": 1024}
    (k,) = kernels(run_pass("row_fusion", params, program, "opencl_gpu"))
    assert k.has_tags(ROW_TAG)
    assert k.plan.group == 256  # the config's work-group size without a device (the H100: 1024)


def test_pipelines_fuse_a_softmax_but_not_in_strict_mode():
    program = lowered(SOFTMAX, {"X": (1024, 512)})
    for target in ("opencl_gpu", "opencl_cpu"):
        config = target_config(target)
        assert len(rows(optimize(program, config, check=True))) == 1
        assert not rows(optimize(program, config, strict=True))
    # 256 rows of 65536 on the GPU: one row each per compute unit is enough (H100: 0.88 of PyTorch
    # in groups of 1024, against 0.74 as split reductions), but 100 rows are too few
    (k,) = rows(optimize(lowered(SOFTMAX, {"X": (256, 65536)}), target_config("opencl_gpu")))
    assert k.plan.group == 256  # the config's 1024, at most the default hardware's 256 work-items
    out = optimize(lowered(SOFTMAX, {"X": (100, 65536)}), target_config("opencl_gpu"))
    assert not rows(out) and any(k.has_tags("split_partial") for k in kernels(out))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_drawn_programs_keep_their_meaning(case):
    program, inputs = case
    out = run_pass("row_fusion", ANY_ROWS, program)
    assert_same_meaning(program, out, inputs)


def test_work_items_per_row_follow_the_row_length():
    """``groups``: (longest row, work-items) pairs, the shortest bound that holds the row first;
    longer rows take ``group`` (opencl_gpu: 256 up to 2048 points, 512 up to 16384, else 1024)."""
    # (sizes within the config's default hardware of 256 work-items, which caps every group)
    params = {"reqs": ["main"], "rows_per_unit": 0, "max_row": 65536, "group": 256,
              "groups": [[2048, 64], [16384, 128]]}
    for cols, want in ((1024, 64), (2048, 64), (4096, 128), (16384, 128), (32768, 256)):
        program = run_pass("recompute", MAIN, lowered(SOFTMAX, {"X": (4, cols)}))
        (k,) = rows(run_pass("row_fusion", params, program, "opencl_gpu"))
        assert k.plan.group == want, cols
    program = run_pass("recompute", MAIN, lowered(SOFTMAX, {"X": (4, 1024)}))
    wide = {**params, "group": 1024, "groups": [[2048, 512]]}
    (k,) = rows(run_pass("row_fusion", wide, program, "opencl_gpu"))
    assert k.plan.group == 256  # at most the hardware's work-items
