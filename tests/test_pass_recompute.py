"""``recompute``: elementwise temporaries recomputed in their readers (a softmax's ``exp(X - Mx)``),
where no reader moves more memory; the interpreter gives the same outputs before and after."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.gpu_reductions import SOFTMAX
from ref_interp.stripe_exec import run_stripe
from stripe.config import target_config
from stripe.ir import Block, Intrinsic, Load, RefDir, Special
from stripe.passes import optimize
from tests.pass_support import assert_same_meaning, kernels, lowered, programs, run_pass

MAIN = {"reqs": ["main"]}


def buffers(program: Block) -> set[str]:
    return {r.into for r in program.refs}


def test_a_softmax_recomputes_its_exponentials_in_the_sum_and_the_division():
    program = lowered(SOFTMAX, {"X": (3, 5)})
    out = run_pass("recompute", MAIN, program)
    assert "E" in buffers(program) and "E" not in buffers(out)
    assert len(kernels(out)) == len(kernels(program)) - 1
    readers = [k for k in kernels(out) if any(r.source == "X" for r in k.refs)]
    assert len(readers) == 3  # the max, the sum and the division read X; nothing reads E
    rng = np.random.default_rng(0)
    x = rng.integers(-3, 4, (3, 5)).astype(np.float32)
    assert_same_meaning(program, out, {"X": x})


def test_a_chain_recomputes_from_the_end():
    src = "function (X[N], B[N]) -> (S) { T = X * 2; U = T - B; S[] = +(U[i]); }"
    program = lowered(src, {"X": (6,), "B": (6,)})
    out = run_pass("recompute", MAIN, program)
    # U reads two full-rate inputs (T and B): it stays; T is recomputed in U
    assert "T" not in buffers(out) and "U" in buffers(out)
    assert_same_meaning(program, out)


def test_what_it_leaves_alone():
    cases = [
        # a matrix product reads each element of T many times: it would recompute each time
        ("function (A[M, K], B[K, N]) -> (C) { T = exp(A); C[i, j: M, N] = +(T[i, k] * B[k, j]); }",
         {"A": (4, 3), "B": (3, 5)}),
        # two full-rate inputs: a reader would read two elements for one
        ("function (A[N], B[N]) -> (S) { T = A + B; S[] = +(T[i]); }", {"A": (8,), "B": (8,)}),
        # T is an output: it is written anyway
        ("function (A[N]) -> (T, S) { T = exp(A); S[] = +(T[i]); }", {"A": (8,)}),
        # more intrinsics than max_ops
        ("function (A[N]) -> (S) { T = exp(exp(exp(exp(exp(A))))); S[] = +(T[i]); }", {"A": (8,)}),
    ]
    for src, shapes in cases:
        program = lowered(src, shapes)
        assert run_pass("recompute", MAIN, program) == program, src


def test_a_reader_reading_twice_gets_two_copies():
    src = "function (A[N]) -> (O) { T = A * A; O[i: N] = +(T[i] + T[N - 1 - i]); }"
    program = lowered(src, {"A": (5,)})
    out = run_pass("recompute", MAIN, program)
    assert "T" not in buffers(out)
    (reader,) = [k for k in kernels(out) if k.has_tags("contraction")]
    assert sum(isinstance(s, Load) for s in reader.stmts) == 2  # A, once for each copy
    assert sum(isinstance(s, Intrinsic) and s.name == "mul" for s in reader.stmts) == 2
    assert_same_meaning(program, out)


def test_the_gpu_and_cpu_pipelines_keep_the_softmax_meaning():
    program = lowered(SOFTMAX, {"X": (4, 4096)})
    x = np.random.default_rng(1).integers(-3, 4, (4, 4096)).astype(np.float32)
    for target in ("opencl_gpu", "opencl_cpu"):
        out = optimize(program, target_config(target))
        assert "E" not in buffers(out)
        got = run_stripe(out, {"X": x})["Y"]
        want = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
        want /= want.sum(axis=1, keepdims=True)
        # an exp and a division (a few ulps each) and a reordered sum of 4096 terms
        assert np.max(np.abs(got - want)) <= 4 * 2**-23 * 4096 * np.max(want)


@settings(deadline=None, max_examples=60, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.data())
def test_drawn_programs_keep_their_meaning(data):
    program, inputs = data.draw(programs())
    out = run_pass("recompute", MAIN, program)
    assert_same_meaning(program, out, inputs)


def test_a_producer_whose_input_is_rewritten_before_the_reader_stays():
    """``T = A * 2`` read by the sum after a kernel refills ``A``: recomputing ``T`` there would
    read the new ``A``; so it stays (and ``A``'s own producer, with a writer among its users)."""
    program = lowered("function (X[N]) -> (S) { A = X + 1; T = A * 2; S[] = +(T[i]); }", {"X": (6,)})
    main = program.stmts[0]
    k = next(j for j, s in enumerate(main.stmts) if any(r.into == "T" for r in s.refs if r.dir is RefDir.OUT))
    refill = Block("refill_A", refs=(replace(main.ref("A"), dir=RefDir.OUT, agg_op="assign"),),
                   stmts=(Special("zero", (), ("A",)),), tags=frozenset({"kernel", "special", "zero"}))
    program = replace(program, stmts=(replace(main, stmts=(*main.stmts[: k + 1], refill,
                                                          *main.stmts[k + 1 :])),))
    assert run_pass("recompute", MAIN, program) == program
