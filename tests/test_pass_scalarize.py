"""The ``inline`` and ``scalarize`` passes: Before/Expected pairs in Stripe text (a fused
elementwise chain becoming one block of SSA scalars; an aggregating local), refusals, meaning by
the interpreter on Hypothesis-drawn programs (fused and localized first), and LLVM runs."""

from __future__ import annotations

from hypothesis import given

from ref_interp.stripe_exec import run_stripe
from stripe.parser import parse_stripe
from tests.pass_support import assert_same_meaning, check_rewrite, inputs_for, run_pass
from tests.test_pass_localize import HYP, prepared, run_passes

MAIN = {"reqs": ["main"]}

# A fused chain T = A * 3; U = T - B; C = max(U, index(A, 1)) after localize: T and U are one-element
# local allocations of the fused kernel, and each step is a one-point inner block.
CHAIN = """
0: #program block [] ( // program
    #input #user none A[0, 0] i32(2:3, 3:1)
    #input #user none B[0] i32(3:1)
    #output #user none C[0, 0] i32(2:3, 3:1)
) {
  0: #main block [] ( // main
      in A[0, 0] i32(2:3, 3:1)
      in B[0] i32(3:1)
      out C[0, 0] i32(2:3, 3:1)
  ) {
    0: #eltwise #kernel block [i0:2, i1:3] ( // chain
        in A[i0, i1] i32(1:3, 1:1)
        none T[0, 0]:assign i32(1:1, 1:1)
        in B[i1] i32(1:1)
        none U[0, 0]:assign i32(1:1, 1:1)
        out C[i0, i1]:assign i32(1:3, 1:1)
    ) {
      0: #eltwise block [i0:1 = i0, i1:1 = i1] ( // k0_T
          in A[0, 0] i32(1:3, 1:1)
          out T[0, 0]:assign i32(1:1, 1:1)
      ) {
        0: $A = load(A)
        1: $t1 = (i32)3
        2: $t2 = mul($A, $t1):i32
        3: T = store($t2)
      }
      1: #eltwise block [i0:1 = i0, i1:1 = i1] ( // k1_U
          in T[0, 0] i32(1:1, 1:1)
          in B[0] i32(1:1)
          out U[0, 0]:assign i32(1:1, 1:1)
      ) {
        0: $T = load(T)
        1: $B = load(B)
        2: $t2 = sub($T, $B):i32
        3: U = store($t2)
      }
      2: #eltwise block [i0:1 = i0, i1:1 = i1] ( // k2_C
          in U[0, 0] i32(1:1, 1:1)
          out C[0, 0]:assign i32(1:3, 1:1)
      ) {
        0: $U = load(U)
        1: $t1 = load_index(i1)
        2: $t2 = as_int($t1, 32):i32
        3: $t3 = max($U, $t2):i32
        4: C = store($t3)
      }
    }
  }
}
"""

# inline: the steps join the kernel, their views renamed to the kernel's (the same elements),
# the passthroughs replaced by the kernel's indexes, clashing scalars renamed.
CHAIN_INLINED = """
0: #program block [] ( // program
    #input #user none A[0, 0] i32(2:3, 3:1)
    #input #user none B[0] i32(3:1)
    #output #user none C[0, 0] i32(2:3, 3:1)
) {
  0: #main block [] ( // main
      in A[0, 0] i32(2:3, 3:1)
      in B[0] i32(3:1)
      out C[0, 0] i32(2:3, 3:1)
  ) {
    0: #eltwise #kernel block [i0:2, i1:3] ( // chain
        in A[i0, i1] i32(1:3, 1:1)
        none T[0, 0]:assign i32(1:1, 1:1)
        in B[i1] i32(1:1)
        none U[0, 0]:assign i32(1:1, 1:1)
        out C[i0, i1]:assign i32(1:3, 1:1)
    ) {
      0: $A = load(A)
      1: $t1 = (i32)3
      2: $t2 = mul($A, $t1):i32
      3: T = store($t2)
      4: $T = load(T)
      5: $B = load(B)
      6: $t2_1 = sub($T, $B):i32
      7: U = store($t2_1)
      8: $U = load(U)
      9: $t1_1 = load_index(i1)
      10: $t2_2 = as_int($t1_1, 32):i32
      11: $t3 = max($U, $t2_2):i32
      12: C = store($t3)
    }
  }
}
"""

# scalarize: T and U become scalars; a store is an `assign` to the local's dtype, a load the
# current value.
CHAIN_SCALARIZED = """
0: #program block [] ( // program
    #input #user none A[0, 0] i32(2:3, 3:1)
    #input #user none B[0] i32(3:1)
    #output #user none C[0, 0] i32(2:3, 3:1)
) {
  0: #main block [] ( // main
      in A[0, 0] i32(2:3, 3:1)
      in B[0] i32(3:1)
      out C[0, 0] i32(2:3, 3:1)
  ) {
    0: #eltwise #kernel block [i0:2, i1:3] ( // chain
        in A[i0, i1] i32(1:3, 1:1)
        in B[i1] i32(1:1)
        out C[i0, i1]:assign i32(1:3, 1:1)
    ) {
      0: $A = load(A)
      1: $t1 = (i32)3
      2: $t2 = mul($A, $t1):i32
      3: $T_1 = assign($t2):i32
      4: $B = load(B)
      5: $t2_1 = sub($T_1, $B):i32
      6: $U_1 = assign($t2_1):i32
      7: $t1_1 = load_index(i1)
      8: $t2_2 = as_int($t1_1, 32):i32
      9: $t3 = max($U_1, $t2_2):i32
      10: C = store($t3)
    }
  }
}
"""


def test_chain_inlined():
    out = check_rewrite("inline", MAIN, CHAIN, CHAIN_INLINED)
    assert_same_meaning(parse_stripe(CHAIN), out)


def test_chain_scalarized():
    out = check_rewrite("scalarize", MAIN, CHAIN_INLINED, CHAIN_SCALARIZED)
    assert_same_meaning(parse_stripe(CHAIN), out)


# An aggregating i16 local read before any store (it holds 0) and after two stores: the loads
# become the running value, each store a conversion to i16 and an `add` to it.
ACCUMULATE = """
0: #program block [] ( // program
    #input #user none A[0] i32(4:1)
    #output #user none O[0] i32(4:1)
) {
  0: #main block [] ( // main
      in A[0] i32(4:1)
      out O[0] i32(4:1)
  ) {
    0: #kernel block [i:4] ( // k
        in A[i] i32(1:1)
        none S[0]:add i16(1:1)
        out O[i] i32(1:1)
    ) {
      0: $a = load(A)
      1: $z = load(S)
      2: S = store($a)
      3: S = store($a)
      4: $s = load(S)
      5: $r = add($s, $z):i32
      6: O = store($r)
    }
  }
}
"""

ACCUMULATE_SCALARIZED = """
0: #program block [] ( // program
    #input #user none A[0] i32(4:1)
    #output #user none O[0] i32(4:1)
) {
  0: #main block [] ( // main
      in A[0] i32(4:1)
      out O[0] i32(4:1)
  ) {
    0: #kernel block [i:4] ( // k
        in A[i] i32(1:1)
        out O[i] i32(1:1)
    ) {
      0: $a = load(A)
      1: $z = (i16)0
      2: $S = assign($a):i16
      3: $S_1 = add($z, $S):i16
      4: $S_2 = assign($a):i16
      5: $S_3 = add($S_1, $S_2):i16
      6: $r = add($S_3, $z):i32
      7: O = store($r)
    }
  }
}
"""


def test_aggregating_local_scalarized():
    out = check_rewrite("scalarize", MAIN, ACCUMULATE, ACCUMULATE_SCALARIZED)
    assert_same_meaning(parse_stripe(ACCUMULATE), out)


def _variant(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


def test_scalarize_refusals():
    cases = [
        _variant(ACCUMULATE, "none S[0]:add i16(1:1)", "none S[0]:add i16(2:1)"),  # two elements
        _variant(ACCUMULATE, "none S[0]:add i16(1:1)", "none S[0]:add bool(1:1)"),  # bool add
        CHAIN,  # used by nested blocks
        _variant(ACCUMULATE, "none S[0]:add i16(1:1)", "out S = O[0]:add i16(1:1)"),  # a view of O
    ]
    for text in cases:
        check_rewrite("scalarize", MAIN, text, text)


def test_inline_refusals():
    cases = [
        _variant(CHAIN, "[i0:1 = i0, i1:1 = i1] ( // k1_U", "[i0:1 = i0, i1:1 = i1] ( // k1_U\n i1 - 1 >= 0"),
        _variant(
            _variant(CHAIN, "in B[0] i32(1:1)\n          out U", "in B[i1] i32(1:1)\n          out U"),
            "in B[i1] i32(1:1)\n        none U",
            "in B[0] i32(3:1)\n        none U",
        ),
        _variant(
            CHAIN, "out U[0, 0]:assign i32(1:1, 1:1)\n      ) {", "out U[0, 0]:add i32(1:1, 1:1)\n      ) {"
        ),
    ]
    for text in cases:
        out = check_rewrite("inline", MAIN, text, None)
        assert sum(isinstance(s, type(out)) for s in out.stmts[0].stmts[0].stmts) == 1  # k1_U stays
        assert_same_meaning(parse_stripe(text), out)


# ------------------------------------------------------------------------------ meaning
SEEN = {"examples": 0, "inlined": 0, "scalarized": 0}


@HYP
@given(prepared(("mixed", "elementwise"), ("fuse", "fuse+wrap", "fuse+tile", "tile+wrap")))
def _inline_scalarize_keep_meaning(drawn):
    program, inputs = drawn
    local = run_pass("localize", MAIN, program)
    inlined = run_pass("inline", MAIN, local)
    assert_same_meaning(program, inlined, inputs)
    out = run_pass("scalarize", MAIN, inlined)
    assert_same_meaning(program, out, inputs)
    SEEN["examples"] += 1
    SEEN["inlined"] += inlined != local
    SEEN["scalarized"] += out != inlined


def test_inline_scalarize_keep_meaning_on_drawn_programs():
    """Counted over the run, so that the test cannot pass with the passes never acting."""
    SEEN.update(examples=0, inlined=0, scalarized=0)
    _inline_scalarize_keep_meaning()
    assert SEEN["examples"] >= 30, SEEN
    assert SEEN["inlined"] >= SEEN["examples"] // 4, SEEN
    assert SEEN["scalarized"] >= SEEN["examples"] // 4, SEEN


# ------------------------------------------------------------------------------ LLVM
def test_scalarized_chain_runs_on_llvm():
    from tests.llvm_runner import assert_same, execute

    for text in (CHAIN_SCALARIZED, ACCUMULATE_SCALARIZED):
        program = parse_stripe(text)
        inputs = inputs_for(program)
        got, kernels = execute(program, inputs)
        assert len(kernels) == 1
        assert_same(got, run_stripe(program, inputs))
    got, _ = execute(parse_stripe(CHAIN_SCALARIZED), inputs_for(parse_stripe(CHAIN)))
    assert_same(got, run_stripe(parse_stripe(CHAIN), inputs_for(parse_stripe(CHAIN))))


LLVM_SEEN = {"examples": 0, "scalarized": 0}


@HYP
@given(prepared(("elementwise",), ("fuse",)))
def _drawn_pipelines_run_on_llvm(drawn):
    from tests.llvm_runner import assert_same, execute

    program, inputs = drawn
    local = run_passes(program, ["localize", "inline"])
    out = run_passes(local, ["scalarize", "dead_code", "prune_refs", "prune_indexes"])
    got, _ = execute(out, inputs)
    assert_same(got, run_stripe(program, inputs), ulps=4)  # libm functions (exp, acos) may differ
    LLVM_SEEN["examples"] += 1
    LLVM_SEEN["scalarized"] += run_pass("scalarize", MAIN, local) != local


def test_drawn_pipelines_run_on_llvm():
    LLVM_SEEN.update(examples=0, scalarized=0)
    _drawn_pipelines_run_on_llvm()
    assert LLVM_SEEN["scalarized"] >= LLVM_SEEN["examples"] // 4, LLVM_SEEN
