"""The ``split_reduction`` pass: Before/Expected pairs in Stripe text (contiguous chunks with a
moved mask, interleaved lanes last and first, vector lanes), the recursions, the blocks it must
leave alone, its config checks and strict mode. Meaning on drawn programs and the device runs are
in ``test_split_reduction_meaning.py``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stripe.config import target_config
from stripe.ir import Block, RefDir
from stripe.parser import parse_stripe
from stripe.passes import PASSES, optimize, steps
from stripe.printer import fmt_affine, format_block
from tests.pass_support import (
    assert_located_config_error,
    assert_same_meaning,
    check_rewrite,
    lowered,
    run_pass,
)

MAX_BEFORE = """
0: #program block [] ( // program
    #input #user none A[0, 0] fp32(4:6, 6:1)
    #output #user none O[] fp32()
    #tmp none O_acc[] fp32()
    #tmp none O_written[] bool()
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(4:6, 6:1)
      out O[] fp32()
      inout O_acc[] fp32()
      inout O_written[] bool()
  ) {
    0: #agg_init_max #kernel #special block [] ( // k0_O_acc
        out O_acc[]:assign fp32()
    ) {
      0: O_acc = agg_init_max()
    }
    1: #kernel #special #zero block [] ( // k1_O_written
        out O_written[]:assign bool()
    ) {
      0: O_written = zero()
    }
    2: #agg_op_max #comb_op_none #contraction #kernel block [i:4, j:6] ( // k2_O
        // O[] = >(A[i, j]);
        in A[i, j] fp32(1:6, 1:1)
        out O_acc[]:max fp32()
        out O_written[]:assign bool()
    ) {
      0: $A = load(A)
      1: $v = assign($A):fp32
      2: O_acc = store($v)
      3: $one = (bool)1
      4: O_written = store($one)
    }
    3: #eltwise #eltwise_cond #kernel block [] ( // k3_O
        in O_written[] bool()
        in O_acc[] fp32()
        out O[]:assign fp32()
    ) {
      0: $O_written = load(O_written)
      1: $O_acc = load(O_acc)
      2: $t2 = (fp64)0.0
      3: $t3 = cond($O_written, $O_acc, $t2):fp32
      4: O = store($t3)
    }
  }
}
"""

# Two lanes: i and j could give them, i has the larger stride (whole rows per lane): chunks of 2
# rows. P starts at max's identity; the mask store moves to the combine (a constant, no
# constraints), so the partial block writes P alone.
MAX_EXPECTED = """
0: #program block [] ( // program
    #input #user none A[0, 0] fp32(4:6, 6:1)
    #output #user none O[] fp32()
    #tmp none O_acc[] fp32()
    #tmp none O_written[] bool()
    #tmp none O_acc_part[0] fp32(2:1)
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(4:6, 6:1)
      out O[] fp32()
      inout O_acc[] fp32()
      inout O_written[] bool()
      inout O_acc_part[0] fp32(2:1)
  ) {
    0: #agg_init_max #kernel #special block [] ( // k0_O_acc
        out O_acc[]:assign fp32()
    ) {
      0: O_acc = agg_init_max()
    }
    1: #kernel #special #zero block [] ( // k1_O_written
        out O_written[]:assign bool()
    ) {
      0: O_written = zero()
    }
    2: #agg_init_max #kernel #special block [] ( // k2_O_init
        out O_acc_part[0]:assign fp32(2:1)
    ) {
      0: O_acc_part = agg_init_max()
    }
    3: #agg_op_max #comb_op_none #contraction #kernel block [i_l:2, i_t:2, j:6] ( // k2_O_partial
        // O[] = >(A[i, j]);
        in A[2*i_l + i_t, j] fp32(1:6, 1:1)
        out O_acc_part[i_l]:max fp32(1:1)
    ) {
      0: $A = load(A)
      1: $v = assign($A):fp32
      2: O_acc_part = store($v)
    }
    4: #agg_op_max #comb_op_none #contraction #kernel block [i_l:2] ( // k2_O_combine
        // O_acc combines the 2 partials of O_acc_part
        in O_acc_part[i_l] fp32(1:1)
        out O_acc[]:max fp32()
        out O_written[]:assign bool()
    ) {
      0: $partial = load(O_acc_part)
      1: O_acc = store($partial)
      2: $one = (bool)1
      3: O_written = store($one)
    }
    5: #eltwise #eltwise_cond #kernel block [] ( // k3_O
        in O_written[] bool()
        in O_acc[] fp32()
        out O[]:assign fp32()
    ) {
      0: $O_written = load(O_written)
      1: $O_acc = load(O_acc)
      2: $t2 = (fp64)0.0
      3: $t3 = cond($O_written, $O_acc, $t2):fp32
      4: O = store($t3)
    }
  }
}
"""

MAX_PARAMS = {"reqs": ["contraction"], "parallelism": 2, "min_reduction": 8, "min_chunk": 4}


def _sum(rows: int, cols: int, axis: str) -> str:
    """The lowered row (``O[i] = +(A[i, j])``) or column sum of a rows x cols matrix, as text."""
    out = "i: M" if axis == "row" else "j: N"
    src = f"function (A[M, N]) -> (O) {{ O[{out}] = +(A[i, j]); }}"
    return format_block(lowered(src, {"A": (rows, cols)}))


INTERLEAVED = {
    "reqs": ["contraction"],
    "interleave": True,
    "only_po2": True,
    "parallelism": 12,
    "min_reduction": 16,
    "min_chunk": 4,
}

# 12 points over 3 rows: 4 lanes per row, j = 4*j_t + j_l (adjacent lanes read adjacent elements),
# 10 steps cover 40 > 37 values: the last three lanes' last step is excluded by the constraint.
ROW_EXPECTED = """
0: #program block [] ( // program
    #input #user none A[0, 0] fp32(3:37, 37:1)
    #output #user none O[0] fp32(3:1)
    #tmp none O_part[0, 0] fp32(3:4, 4:1)
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(3:37, 37:1)
      out O[0] fp32(3:1)
      inout O_part[0, 0] fp32(3:4, 4:1)
  ) {
    0: #kernel #special #zero block [] ( // k0_O
        out O[0]:assign fp32(3:1)
    ) {
      0: O = zero()
    }
    1: #kernel #special #zero block [] ( // k1_O_init
        out O_part[0, 0]:assign fp32(3:4, 4:1)
    ) {
      0: O_part = zero()
    }
    2: #agg_op_add #comb_op_none #contraction #kernel block [i:3, j_l:4, j_t:10] ( // k1_O_partial
        // O[i: 3] = +(A[i, j]);
        -j_l - 4*j_t + 36 >= 0
        in A[i, j_l + 4*j_t] fp32(1:37, 1:1)
        out O_part[i, j_l]:add fp32(1:4, 1:1)
    ) {
      0: $A = load(A)
      1: $v = assign($A):fp32
      2: O_part = store($v)
    }
    3: #agg_op_add #comb_op_none #contraction #kernel block [i:3, j_l:4] ( // k1_O_combine
        // O combines the 4 partials of O_part
        in O_part[i, j_l] fp32(1:4, 1:1)
        out O[i]:add fp32(1:1)
    ) {
      0: $partial = load(O_part)
      1: O = store($partial)
    }
  }
}
"""

# A column sum: no input reads i contiguously, so the lane dim goes first in P and the output's
# own contiguous index j stays the fastest.
COLUMN_EXPECTED = """
0: #program block [] ( // program
    #input #user none A[0, 0] fp32(37:3, 3:1)
    #output #user none O[0] fp32(3:1)
    #tmp none O_part[0, 0] fp32(4:3, 3:1)
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(37:3, 3:1)
      out O[0] fp32(3:1)
      inout O_part[0, 0] fp32(4:3, 3:1)
  ) {
    0: #kernel #special #zero block [] ( // k0_O
        out O[0]:assign fp32(3:1)
    ) {
      0: O = zero()
    }
    1: #kernel #special #zero block [] ( // k1_O_init
        out O_part[0, 0]:assign fp32(4:3, 3:1)
    ) {
      0: O_part = zero()
    }
    2: #agg_op_add #comb_op_none #contraction #kernel block [j:3, i_l:4, i_t:10] ( // k1_O_partial
        // O[j: 3] = +(A[i, j]);
        -i_l - 4*i_t + 36 >= 0
        in A[i_l + 4*i_t, j] fp32(1:3, 1:1)
        out O_part[i_l, j]:add fp32(1:3, 1:1)
    ) {
      0: $A = load(A)
      1: $v = assign($A):fp32
      2: O_part = store($v)
    }
    3: #agg_op_add #comb_op_none #contraction #kernel block [j:3, i_l:4] ( // k1_O_combine
        // O combines the 4 partials of O_part
        in O_part[i_l, j] fp32(1:3, 1:1)
        out O[j]:add fp32(1:1)
    ) {
      0: $partial = load(O_part)
      1: O = store($partial)
    }
  }
}
"""

# Contiguous mode with 4 vector lanes and no thread lanes (3 rows already fill the target of 2):
# j = 4*j_t + j_v, so the innermost index walks A and P contiguously; 40 > 37 needs the constraint.
VECTOR_EXPECTED = """
0: #program block [] ( // program
    #input #user none A[0, 0] fp32(3:37, 37:1)
    #output #user none O[0] fp32(3:1)
    #tmp none O_part[0, 0] fp32(3:4, 4:1)
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(3:37, 37:1)
      out O[0] fp32(3:1)
      inout O_part[0, 0] fp32(3:4, 4:1)
  ) {
    0: #kernel #special #zero block [] ( // k0_O
        out O[0]:assign fp32(3:1)
    ) {
      0: O = zero()
    }
    1: #kernel #special #zero block [] ( // k1_O_init
        out O_part[0, 0]:assign fp32(3:4, 4:1)
    ) {
      0: O_part = zero()
    }
    2: #agg_op_add #comb_op_none #contraction #kernel block [i:3, j_t:10, j_v:4] ( // k1_O_partial
        // O[i: 3] = +(A[i, j]);
        -4*j_t - j_v + 36 >= 0
        in A[i, 4*j_t + j_v] fp32(1:37, 1:1)
        out O_part[i, j_v]:add fp32(1:4, 1:1)
    ) {
      0: $A = load(A)
      1: $v = assign($A):fp32
      2: O_part = store($v)
    }
    3: #agg_op_add #comb_op_none #contraction #kernel block [i:3, j_v:4] ( // k1_O_combine
        // O combines the 4 partials of O_part
        in O_part[i, j_v] fp32(1:4, 1:1)
        out O[i]:add fp32(1:1)
    ) {
      0: $partial = load(O_part)
      1: O = store($partial)
    }
  }
}
"""


def kernels(program: Block) -> list[Block]:
    return list(program.stmts[0].stmts)


def test_registered_as_reordering():
    assert PASSES["split_reduction"].reorders


def test_global_max_in_contiguous_chunks():
    out = check_rewrite("split_reduction", MAX_PARAMS, MAX_BEFORE, MAX_EXPECTED)
    assert_same_meaning(parse_stripe(MAX_BEFORE), out)


def test_row_sum_interleaved_lanes_last():
    before = _sum(3, 37, "row")
    out = check_rewrite("split_reduction", INTERLEAVED, before, ROW_EXPECTED)
    assert_same_meaning(parse_stripe(before), out)


def test_column_sum_interleaved_lanes_first():
    before = _sum(37, 3, "column")
    out = check_rewrite("split_reduction", INTERLEAVED, before, COLUMN_EXPECTED)
    assert_same_meaning(parse_stripe(before), out)


def test_row_sum_vector_lanes():
    before = _sum(3, 37, "row")
    params = {"reqs": ["contraction"], "parallelism": 2, "vector": 4}
    out = check_rewrite("split_reduction", params, before, VECTOR_EXPECTED)
    assert_same_meaning(parse_stripe(before), out)


def test_thread_and_vector_lanes_together():
    """r = 36*l + 4*t + v: 3 chunks of 9 vector steps, the last chunk cut at 100 values."""
    program = lowered("function (A[N]) -> (O) { O[] = +(A[i]); }", {"A": (100,)})
    params = {"reqs": ["contraction"], "parallelism": 3, "min_reduction": 16, "min_chunk": 8, "vector": 4}
    out = run_pass("split_reduction", params, program)
    partial = next(k for k in kernels(out) if k.name.endswith("_partial"))
    assert [(i.name, i.range) for i in partial.idxs] == [("i_l", 3), ("i_t", 9), ("i_v", 4)]
    assert [fmt_affine(c) for c in partial.constraints] == ["-36*i_l - 4*i_t - i_v + 99"]
    assert out.ref("O_part").shape.sizes == (3, 4)
    assert_same_meaning(program, out)


def test_a_long_combine_is_split_again():
    """64 values: 16 lanes of 4, whose combine (16 >= min_reduction) is 4 lanes of 4, then 1."""
    program = lowered("function (A[N]) -> (O) { O[] = +(A[i]); }", {"A": (64,)})
    params = {**INTERLEAVED, "parallelism": 16, "min_reduction": 8}
    out = run_pass("split_reduction", params, program)
    names = [k.name for k in kernels(out)]
    assert names == [
        "k0_O",
        "k1_O_init",
        "k1_O_partial",
        "k1_O_combine_init",
        "k1_O_combine_partial",
        "k1_O_combine_combine",
    ]
    assert [(r.into, r.shape.sizes) for r in out.refs if "tmp" in r.tags] == [
        ("O_part", (16,)),
        ("O_part_1", (4,)),
    ]
    assert_same_meaning(program, out)


def test_a_partial_short_of_lanes_splits_another_index():
    """A global sum of a 64x64 matrix aiming at 1024 lanes: j gives 64 (its range), so the partial
    splits i into 16 more (lanes first: i is not contiguous), into the same P, whose one combine
    reads all 1024 partials; a cap of 32 lanes stops at j."""
    program = lowered("function (A[M, N]) -> (O) { O[] = +(A[i, j]); }", {"A": (64, 64)})
    params = {**INTERLEAVED, "parallelism": 1024, "min_reduction": 64, "min_chunk": 2}
    out = run_pass("split_reduction", params, program)
    assert [r.shape.sizes for r in out.refs if "tmp" in r.tags][0] == (16, 64)
    readers = [k for k in kernels(out) if any(r.source == "O_part" and r.dir is RefDir.IN for r in k.refs)]
    assert len(readers) == 1 and "1024 partials" in readers[0].comments[0]
    assert_same_meaning(program, out)
    capped = run_pass("split_reduction", {**params, "lanes": 32}, program)
    assert [r.shape.sizes for r in capped.refs if "tmp" in r.tags] == [(32,)]
    assert_same_meaning(program, capped)


def test_a_mask_stays_with_constraints_on_the_reduction():
    """O[i: 5] = <(A[i + j]): the padding constraints mix i and j, so some i may have no point;
    the mask store stays in the partial block, which runs exactly the original points."""
    program = lowered("function (A[N]) -> (O) { O[i: 5] = <(A[i + j]); }", {"A": (40,)})
    out = run_pass("split_reduction", {"reqs": ["contraction"], **_SMALL}, program)
    partial = next(k for k in kernels(out) if k.name.endswith("_partial"))
    combine = next(k for k in kernels(out) if k.name.endswith("_combine"))
    assert "O_written" in {r.into for r in partial.refs}
    assert "O_written" not in {r.into for r in combine.refs}
    assert_same_meaning(program, out)


_SMALL = {"parallelism": 16, "min_reduction": 4, "min_chunk": 3}


def test_blocks_it_leaves_alone():
    row = parse_stripe(_sum(3, 37, "row"))
    params = {"reqs": ["contraction"], **_SMALL}
    assert run_pass("split_reduction", params, row) != row
    # Enough output points already; a short reduction; reqs the block lacks.
    assert run_pass("split_reduction", {**params, "max_outputs": 3}, row) == row
    assert run_pass("split_reduction", {**params, "min_reduction": 38}, row) == row
    assert run_pass("split_reduction", {**params, "reqs": ["agg_op_max"]}, row) == row
    # `=` keeps its single writer.
    main = row.stmts[0]
    k = main.stmts[1]
    assign = replace(k, refs=(k.refs[0], replace(k.refs[1], agg_op="assign")))
    program = replace(row, stmts=(replace(main, stmts=(main.stmts[0], assign)),))
    assert run_pass("split_reduction", params, program) == program
    # No vector lanes where P would be the output times the lanes: A times B transposed.
    abt = lowered("function (A[M, K], B[N, K]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[j, k]); }",
                  {"A": (64, 300), "B": (64, 300)})
    assert run_pass("split_reduction", {"reqs": ["contraction"], "vector": 4}, abt) == abt
    # Nothing to split: every index is an output index.
    copy = lowered("function (A[M, N]) -> (O) { O[i, j: M, N] = +(A[i, j]); }", {"A": (3, 37)})
    assert run_pass("split_reduction", params, copy) == copy



def test_only_leaves_are_split_and_temporaries_are_declared_at_every_level():
    """A contraction block around the kernel is not a leaf: the walk descends into it, splits the
    kernel, and declares P in the wrapper and main (inout) and the root (#tmp)."""
    row = parse_stripe(_sum(3, 37, "row"))
    main = row.stmts[0]
    k = main.stmts[1]
    views = tuple(replace(r, dir=k.ref(r.into).dir, agg_op=k.ref(r.into).agg_op) for r in main.refs)
    wrapper = Block("wrap", refs=views, stmts=(k,), tags=frozenset({"contraction"}))
    program = replace(row, stmts=(replace(main, stmts=(main.stmts[0], wrapper)),))
    out = run_pass("split_reduction", {"reqs": ["contraction"], **_SMALL, "min_reduction": 8}, program)
    wrap = kernels(out)[1]
    assert wrap.name == "wrap"
    assert [b.name for b in wrap.stmts] == ["k1_O_init", "k1_O_partial", "k1_O_combine"]
    assert wrap.ref("O_part").dir.value == "inout" and out.stmts[0].ref("O_part").dir.value == "inout"
    assert "tmp" in out.ref("O_part").tags
    assert_same_meaning(program, out)


def test_a_reduction_inside_an_indexed_block_is_not_split():
    """After contraction + elementwise fusion the row sum runs per point of the fused block's i0:
    an init of P there would race with another point's partials."""
    program = lowered("function (A[M, N]) -> (O) { S[i: M] = +(A[i, j]); O = exp(S); }", {"A": (3, 37)})
    fuse = {"a_reqs": ["contraction"], "b_reqs": ["eltwise"], "fused_set": ["fused"], "b_fully_fused": True}
    fused = run_pass("fusion", fuse, program)
    assert any(isinstance(s, Block) and "contraction" in s.tags for k in kernels(fused) for s in k.stmts)
    assert run_pass("split_reduction", {"reqs": ["contraction"], **_SMALL}, fused) == fused


def test_strict_mode_skips_it():
    cfg = target_config("llvm_cpu")
    program = lowered("function (A[N]) -> (O) { O[] = >(A[i]); }", {"A": (100_000,)})
    ran = [spec.pass_ for spec, _, _ in steps(program, cfg, strict=True)]
    assert "split_reduction" in [s.pass_ for s in cfg.passes] and "split_reduction" not in ran
    parts = [r.into for r in optimize(program, cfg, strict=True).refs if r.into.endswith("_part")]
    assert parts == []
    assert [r.into for r in optimize(program, cfg).refs if r.into.endswith("_part")] == ["O_part"]


@pytest.mark.parametrize(("agg", "parts"), [("+", ["i_l", "i_t"]), (">", ["i_l", "i_t"])])
def test_the_llvm_cpu_config_splits_long_reductions_over_threads(agg, parts):
    """Thread lanes (contiguous chunks) for every aggregation, no vector lanes: the code generator
    vectorizes each chunk itself (reassociating sums, llvm.maximum for max: not in strict mode)."""
    program = lowered(f"function (A[N]) -> (O) {{ O[] = {agg}(A[i]); }}", {"A": (100_003,)})
    out = optimize(program, target_config("llvm_cpu"), after="split_reductions", check=True)
    partial = next((k for k in kernels(out) if k.name.endswith("_partial")), None)
    assert (partial and [i.name for i in partial.idxs]) == parts
    assert_same_meaning(program, out)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("min_chunk", 1, "min_chunk must be at least 2"),
        ("oversubscribe", 0, "oversubscribe must be at least 1"),
        ("vector", -1, "vector must not be negative"),
        ("aggs", ["add", "assign"], "'assign' is not an aggregation this pass splits"),
    ],
)
def test_bad_values_are_located_config_errors(key, value, message):
    assert_located_config_error("split_reduction", key, value, message)


def test_float16_sums_keep_float32_partials():
    """Each partial of a float16 (or bfloat16) sum is a long sum of its own: in float16 a lane of
    3000 ones stalls at 2048 (11 bits), so two lanes gave 4096 for 6000. The partials are float32
    now and the combine rounds once more: 6000 (a float16 value). A max keeps its own type."""
    import numpy as np

    from tests.pass_support import run_stripe

    src = "function (A[N]) -> (O) { O[] = +(A[i]); }"
    params = {"reqs": ["contraction"], "parallelism": 2, "min_reduction": 16, "min_chunk": 8}
    for dtype, want in ((np.float16, 6000.0), (np.float32, 6000.0)):
        program = lowered(src, {"A": (6000,)}, dtype)
        out = run_pass("split_reduction", params, program)
        part = out.ref("O_part").shape.dtype.value
        assert part == "float32", part
        got = run_stripe(out, {"A": np.ones(6000, dtype)})["O"]
        assert float(np.asarray(got).reshape(-1)[0]) == want
    program = lowered("function (A[N]) -> (O) { O[] = >(A[i]); }", {"A": (6000,)}, np.float16)
    out = run_pass("split_reduction", params, program)
    assert out.ref("O_part").shape.dtype.value == "float16"
