"""``pointwise``: a contraction that sums no index, just after its fill, is one elementwise kernel
(the fill gone); the interpreter gives bit-identical outputs (``+`` on floats adds the identity
0, so ``-0`` still becomes ``+0``); reductions, partial writes, constraints and GEMMs are left
alone; and a long program alternating elementwise statements with such contractions fuses into a
few kernels on ``llvm_cpu`` instead of one per statement (issue: 5,000 statements took 107 s)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import tile
from backends import registry
from tests.pass_support import assert_same_meaning, check_rewrite, kernels, lowered, programs, run_pass

BEFORE = """0: #program block [] ( // program
    #input #user none A[0] fp32(4:1)
    #input #user none B[0] fp32(4:1)
    #output #user none O[0] fp32(4:1)
) {
  0: #main block [] ( // main
      in A[0] fp32(4:1)
      in B[0] fp32(4:1)
      out O[0] fp32(4:1)
  ) {
    0: #kernel #special #zero block [] ( // k0_O
        out O[0]:assign fp32(4:1)
    ) {
      0: O = zero()
    }
    1: #agg_op_add #comb_op_mul #contraction #kernel block [i:4] ( // k1_O
        in A[i] fp32(1:1)
        in B[i] fp32(1:1)
        out O[i]:add fp32(1:1)
    ) {
      0: $A = load(A)
      1: $B = load(B)
      2: $v = mul($A, $B):fp32
      3: O = store($v)
    }
  }
}
"""
EXPECTED = """0: #program block [] ( // program
    #input #user none A[0] fp32(4:1)
    #input #user none B[0] fp32(4:1)
    #output #user none O[0] fp32(4:1)
) {
  0: #main block [] ( // main
      in A[0] fp32(4:1)
      in B[0] fp32(4:1)
      out O[0] fp32(4:1)
  ) {
    0: #eltwise #kernel #pointwise block [i:4] ( // k1_O
        in A[i] fp32(1:1)
        in B[i] fp32(1:1)
        out O[i]:assign fp32(1:1)
    ) {
      0: $A = load(A)
      1: $B = load(B)
      2: $v = mul($A, $B):fp32
      3: $zero = (fp32)0.0
      4: $pointwise = add($zero, $v):fp32
      5: O = store($pointwise)
    }
  }
}
"""


def test_a_product_that_sums_nothing_is_elementwise():
    check_rewrite("pointwise", {}, BEFORE, EXPECTED)


def test_integers_and_other_aggregations_store_the_value_as_it_is():
    for agg, dtype in (("+", np.int32), (">", np.float32), ("<", np.float32), ("*", np.float32)):
        program = lowered(f"function (A[N, M]) -> (O) {{ O[j, i: M, N] = {agg}(A[i, j]); }}", {"A": (3, 5)},
                          dtype)
        out = run_pass("pointwise", {}, program)
        (k,) = kernels(out)
        assert "eltwise" in k.tags and "contraction" not in k.tags
        assert not any(getattr(s, "name", "") == "add" for s in k.stmts), agg  # no identity added
        x = np.arange(-7, 8).reshape(3, 5).astype(dtype)
        assert_same_meaning(program, out, {"A": x})


def test_negative_zero_becomes_positive_as_in_the_interpreter():
    program = lowered("function (A[N]) -> (O) { O[i: N] = +(A[i]); }", {"A": (3,)})
    out = run_pass("pointwise", {}, program)
    x = np.array([-0.0, np.nan, -np.inf], np.float32)
    assert_same_meaning(program, out, {"A": x})
    got = tile.compile("function (A[N]) -> (O) { O[i: N] = +(A[i]); }", "llvm_cpu.0", {"cache": False})(A=x)
    assert not np.signbit(got["O"][0])


@pytest.mark.parametrize(
    "src, shapes",
    [
        ("function (A[M, N]) -> (O) { O[i: M] = +(A[i, j]); }", {"A": (3, 4)}),  # sums j
        ("function (A[N]) -> (O) { O[2 * i: 2 * N] = +(A[i]); }", {"A": (5,)}),  # odd elements unwritten
        ("function (A[N]) -> (O) { O[i: N] = +(A[i + 1]), i + 1 < N; }", {"A": (6,)}),  # a constraint
        ("function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }",
         {"A": (2, 3), "B": (3, 4)}),  # a GEMM
    ],
)
def test_what_it_leaves_alone(src, shapes):
    program = lowered(src, shapes)
    assert run_pass("pointwise", {}, program) == program, src


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(families=("contractions", "mixed")))
def test_meaning_is_kept_on_drawn_programs(case):
    program, inputs = case
    assert_same_meaning(program, run_pass("pointwise", {}, program), inputs)


def alternating(n: int) -> str:
    """``n`` statements: elementwise ones and ``+`` contractions that sum nothing, in turn."""
    lines = ["function (A[N]) -> (O) {", "  T1 = A + 1;"]
    for k in range(2, n):
        lines.append(f"  T{k} = T{k - 1} + 1;" if k % 2 else f"  T{k}[i: N] = +(T{k - 1}[i]);")
    return "\n".join([*lines, f"  O = T{n - 1} - 2;", "}"])


@pytest.mark.skipif("llvm_cpu.0" not in registry.ids(), reason="llvm_cpu.0 unavailable")
def test_a_long_alternating_program_becomes_few_kernels_and_is_exact():
    exe = tile.compile(alternating(600), "llvm_cpu.0", {"cache": False})
    a = np.arange(-8, 9, dtype=np.float32)
    np.testing.assert_array_equal(exe(A=a)["O"], a + 600 // 2 - 2)
    (compiled,) = exe._compiled.values()
    assert len(compiled.infos) <= 10, len(compiled.infos)  # was 599: one per statement
