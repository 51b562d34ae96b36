"""The clean-up passes (``dead_code``, ``prune_indexes``, ``prune_refs``, ``reduce_constraints``):
Before/Expected pairs in Stripe text, meaning by the interpreter on Hypothesis-drawn programs
(prepared as for localize, then given dead kernels, unused views and extra constraints to clean),
and a cleaned program run on the LLVM CPU backend."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from ref_interp.stripe_exec import run_stripe
from stripe.ir import Block, Dim, RefDir, Refinement, TensorShape
from stripe.parser import parse_stripe
from stripe.passes.rewrite import fresh, reads_writes
from stripe.verify import verify
from tests.pass_support import assert_same_meaning, check_rewrite, inputs_for, run_pass
from tests.test_pass_localize import HYP, prepared
from tile.affine import Affine
from tile.bounds import poly_interval

MAIN = {"reqs": ["main"]}

# k1 computes a temporary T that nobody reads: k0 (its zero fill) and k1 go, and so does T. In k2,
# $u is unused, and so is the local L, whose store goes too.
DEAD = """
0: #program block [] ( // program
    #input #user none A[0] fp32(4:1)
    #tmp none T[0] fp32(4:1)
    #output #user none O[0] fp32(4:1)
) {
  0: #main block [] ( // main
      in A[0] fp32(4:1)
      inout T[0] fp32(4:1)
      out O[0] fp32(4:1)
  ) {
    0: #kernel #special #zero block [] ( // k0
        out T[0]:assign fp32(4:1)
    ) {
      0: T = zero()
    }
    1: #kernel block [i:4] ( // k1
        in A[i] fp32(1:1)
        out T[i]:add fp32(1:1)
    ) {
      0: $a = load(A)
      1: T = store($a)
    }
    2: #kernel block [i:4] ( // k2
        in A[i] fp32(1:1)
        none L[0] fp32(1:1)
        out O[i] fp32(1:1)
    ) {
      0: $a = load(A)
      1: $u = exp($a):fp32
      2: L = store($u)
      3: $v = neg($a):fp32
      4: O = store($v)
    }
  }
}
"""

DEAD_CLEANED = """
0: #program block [] ( // program
    #input #user none A[0] fp32(4:1)
    #output #user none O[0] fp32(4:1)
) {
  0: #main block [] ( // main
      in A[0] fp32(4:1)
      out O[0] fp32(4:1)
  ) {
    0: #kernel block [i:4] ( // k2
        in A[i] fp32(1:1)
        none L[0] fp32(1:1)
        out O[i] fp32(1:1)
    ) {
      0: $a = load(A)
      1: $v = neg($a):fp32
      2: O = store($v)
    }
  }
}
"""

# prune_refs then drops L; prune_indexes drops the unused x:1 and j_o:1 = j, and replaces the
# range-1 index z (always 0) in the access that uses it.
PRUNED = """
0: #program block [] ( // program
    #input #user none A[0] fp32(4:1)
    #output #user none O[0] fp32(4:1)
) {
  0: #main block [] ( // main
      in A[0] fp32(4:1)
      out O[0] fp32(4:1)
  ) {
    0: #kernel block [j:4] ( // k2
        in A[j] fp32(1:1)
        out O[j] fp32(1:1)
    ) {
      0: block [x:1, j_o:1 = j, z:1] ( // inner
          in A[z] fp32(1:1)
          out O[0] fp32(1:1)
      ) {
        0: $a = load(A)
        1: O = store($a)
      }
    }
  }
}
"""

PRUNED_INDEXES = PRUNED.replace("[x:1, j_o:1 = j, z:1]", "[]").replace(
    "in A[z] fp32(1:1)", "in A[0] fp32(1:1)"
)


def test_dead_code():
    out = check_rewrite("dead_code", MAIN, DEAD, DEAD_CLEANED)
    assert_same_meaning(parse_stripe(DEAD), out)
    # selecting the root (or every block) cleans the same, and never touches inputs or outputs
    for reqs in (["program"], []):
        check_rewrite("dead_code", {"reqs": reqs}, DEAD, DEAD_CLEANED)


def test_prune_refs():
    want = DEAD_CLEANED.replace("        none L[0] fp32(1:1)\n", "")
    out = check_rewrite("prune_refs", MAIN, DEAD_CLEANED, want)
    assert_same_meaning(parse_stripe(DEAD_CLEANED), out)
    # a tmp buffer nobody uses leaves the root and main; inputs and outputs stay even unused
    unused = DEAD.replace("      0: $a = load(A)\n      1: T = store($a)\n", "").replace(
        "      0: T = zero()\n", ""
    )
    out = check_rewrite("prune_refs", MAIN, unused, None)
    assert [r.into for r in out.refs] == ["A", "O"]
    assert [r.into for r in out.stmts[0].refs] == ["A", "O"]


def test_prune_indexes():
    out = check_rewrite("prune_indexes", MAIN, PRUNED, PRUNED_INDEXES)
    assert_same_meaning(parse_stripe(PRUNED), out)


# i >= 0 and 3 - i >= 0 hold on the box; so does x + 2 >= 0 for x:1 = i (x in [0, 3]);
# i - j >= 0 and x - 1 >= 0 do not.
CONSTRAINED = """
0: #program block [] ( // program
    #input #user none A[0, 0] i32(4:3, 3:1)
    #output #user none O[0, 0] i32(4:3, 3:1)
) {
  0: #main block [] ( // main
      in A[0, 0] i32(4:3, 3:1)
      out O[0, 0] i32(4:3, 3:1)
  ) {
    0: #kernel block [i:4, j:3] ( // k
        i >= 0
        3 - i >= 0
        i - j >= 0
        in A[i, j] i32(1:3, 1:1)
        out O[i, j] i32(1:3, 1:1)
    ) {
      0: block [x:1 = i] ( // inner
          x + 2 >= 0
          x - 1 >= 0
          in A[0, 0] i32(1:3, 1:1)
          out O[0, 0] i32(1:3, 1:1)
      ) {
        0: $a = load(A)
        1: O = store($a)
      }
    }
  }
}
"""

REDUCED = CONSTRAINED.replace("        i >= 0\n        3 - i >= 0\n", "").replace(
    "          x + 2 >= 0\n", ""
)


def test_reduce_constraints():
    out = check_rewrite("reduce_constraints", MAIN, CONSTRAINED, REDUCED)
    assert_same_meaning(parse_stripe(CONSTRAINED), out)


# ------------------------------------------------------------------------------ meaning
def add_dead_kernel(program: Block, at: int) -> Block:
    """A copy of a kernel, its writes sent to a new ``tmp`` buffer nobody reads."""
    main = program.stmts[0]
    ks = list(main.stmts)
    k = ks[at % len(ks)]
    _, writes = reads_writes(k)
    if not writes:
        return program
    src = sorted(writes)[0]
    buf = next(r for r in program.refs if r.into == src)
    name = fresh(f"dead_{src}", {r.into for r in program.refs})
    k = replace(k, refs=tuple(replace(r, from_=name) if r.source == src else r for r in k.refs))
    main_ref = replace(main.ref(src), into=name, dir=RefDir.INOUT, agg_op="")
    root_ref = replace(buf, into=name, tags=frozenset({"tmp"}))
    ks.insert(at % (len(ks) + 1), k)
    main = replace(main, refs=(*main.refs, main_ref), stmts=tuple(ks))
    return replace(program, refs=(*program.refs, root_ref), stmts=(main,))


def add_unused_ref(program: Block, at: int) -> Block:
    """A one-element view (a fresh name) of ``#main``'s first buffer in a kernel that uses none."""
    main = program.stmts[0]
    ks = list(main.stmts)
    k = ks[at % len(ks)]
    buf = main.refs[0]
    dims = tuple(Dim(1, d.stride) for d in buf.shape.dims)
    name = fresh("unused", {r.into for r in k.refs})
    zeros = tuple(Affine() for _ in dims)
    ref = Refinement(RefDir.IN, name, zeros, TensorShape(buf.shape.dtype, dims), from_=buf.into)
    ks[at % len(ks)] = replace(k, refs=(*k.refs, ref))
    return replace(program, stmts=(replace(main, stmts=tuple(ks)),))


def add_constraints(program: Block, coeffs: list[int], slack: int) -> Block:
    """An extra constraint on every kernel with indexes, whose least value over the box is
    ``slack``: it holds everywhere when ``slack >= 0``, and cuts the box otherwise."""
    main = program.stmts[0]
    ks = []
    for k in main.stmts:
        if k.idxs and all(i.range > 0 for i in k.idxs):
            c = Affine.build({i.name: coeffs[n % len(coeffs)] for n, i in enumerate(k.idxs)})
            least = poly_interval(c, {i.name: (0, i.range - 1) for i in k.idxs})[0]
            k = replace(k, constraints=(*k.constraints, c + (slack - least)))
        ks.append(k)
    return replace(program, stmts=(replace(main, stmts=tuple(ks)),))


@st.composite
def messy(draw):
    program, inputs = draw(prepared())
    if draw(st.booleans()):
        program = add_dead_kernel(program, draw(st.integers(0, 8)))
    if draw(st.booleans()):
        program = add_unused_ref(program, draw(st.integers(0, 8)))
    coeffs = draw(st.lists(st.integers(-1, 1), min_size=1, max_size=3))
    program = add_constraints(program, coeffs, draw(st.integers(-1, 2)))
    verify(program)
    return program, inputs


PASSES = ("dead_code", "prune_indexes", "prune_refs", "reduce_constraints")
SEEN: dict[str, int] = {}


@HYP
@given(messy())
def _cleanups_keep_meaning(drawn):
    program, inputs = drawn
    SEEN["examples"] += 1
    for name in PASSES:
        out = run_pass(name, MAIN, program)
        assert_same_meaning(program, out, inputs)
        SEEN[name] += out != program


def test_cleanups_keep_meaning_on_drawn_programs():
    """Counted over the run, so that the test cannot pass with a pass never acting."""
    SEEN.update({"examples": 0, **{p: 0 for p in PASSES}})
    _cleanups_keep_meaning()
    assert SEEN["examples"] >= 30, SEEN
    for name in PASSES:
        assert SEEN[name] >= SEEN["examples"] // 5, SEEN


# ------------------------------------------------------------------------------ LLVM
def test_cleaned_program_runs_on_llvm():
    from tests.llvm_runner import assert_same, execute

    before = parse_stripe(DEAD)
    out = before
    for name in PASSES:
        out = run_pass(name, MAIN, out)
    inputs = inputs_for(before)
    got, kernels = execute(out, inputs)
    assert len(kernels) == 1
    assert_same(got, run_stripe(before, inputs))
    constrained = parse_stripe(CONSTRAINED)
    got, _ = execute(run_pass("reduce_constraints", MAIN, constrained), inputs_for(constrained))
    assert_same(got, run_stripe(constrained, inputs_for(constrained)))
