"""``row_fusion``: per-row reductions and the elementwise kernels reading them become one row
program (a block over the rows); the interpreter gives the same outputs before and after (it runs
each row's points in their order, so integer-valued results agree exactly)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings

from bench.gpu_reductions import SOFTMAX
from stripe.config import target_config
from stripe.ir import Block, Special
from stripe.parser import parse_stripe
from stripe.passes import optimize
from stripe.passes.row_fusion import ROW_TAG
from stripe.printer import format_block
from tests.pass_support import assert_same_meaning, kernels, lowered, programs, run_pass

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


def test_pipelines_fuse_a_softmax_but_not_in_strict_mode():
    program = lowered(SOFTMAX, {"X": (1024, 512)})
    for target in ("opencl_gpu", "opencl_cpu"):
        config = target_config(target)
        assert len(rows(optimize(program, config, check=True))) == 1
        assert not rows(optimize(program, config, strict=True))
    # 256 rows of 65536 on the GPU: too few rows and too long; split_reduction splits them
    out = optimize(lowered(SOFTMAX, {"X": (256, 65536)}), target_config("opencl_gpu"))
    assert not rows(out) and any(k.has_tags("split_partial") for k in kernels(out))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_drawn_programs_keep_their_meaning(case):
    program, inputs = case
    out = run_pass("row_fusion", ANY_ROWS, program)
    assert_same_meaning(program, out, inputs)
