"""The ``stencil`` pass (the seed's "tensorize"): Before/Expected pairs in Stripe text, the cost
rule, the blocks it must leave alone, meaning on Hypothesis-drawn programs, and one LLVM run."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ref_interp.stripe_exec import run_stripe
from stripe.config import TARGETS, parse_config
from stripe.ir import Block, RefDir, Special
from stripe.parser import parse_stripe
from stripe.passes import PASSES, optimize
from stripe.passes.tiling import can_split
from stripe.verify import verify
from tests.llvm_runner import execute
from tests.pass_support import assert_same_meaning, check_rewrite, lowered, programs, run_pass

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
CONV = (
    "function (I[X, Y, CI], K[KX, KY, CI, CO]) -> (O) {"
    " O[x, y, co: X, Y, CO] = +(I[x + kx - 1, y + ky - 1, ci] * K[kx, ky, ci, co]); }"
)

# A 4x4 GEMM micro-kernel: m walks C's rows and A's, n is contiguous in C and B, k contiguous in A.
GEMM_4x4 = {
    "reqs": ["agg_op_add", "comb_op_mul"],
    "outer_set": ["gemm"],
    "inner_set": ["gemm_inner"],
    "stencils": [
        {
            "idxs": [
                {"name": "m", "size": 4, "outs": [-1], "ins": [-1, 0]},
                {"name": "n", "size": 4, "outs": [1], "ins": [0, 1]},
                {"name": "k", "size": -1, "outs": [0], "ins": [1, -1]},
            ]
        }
    ],
}

# The seed's two stencils, at sizes for an 8x8 image.
SEED = {
    "reqs": ["agg_op_add", "comb_op_mul"],
    "outer_set": ["CONV"],
    "inner_set": ["CONV_inner"],
    "startup_cost": 32,
    "stencils": [
        {
            "idxs": [
                {"name": "i1", "size": 4, "outs": [-1], "ins": [-1, 0]},
                {"name": "c", "size": -1, "outs": [0], "ins": [-1, -1]},
            ]
        },
        {
            "idxs": [
                {"name": "i1", "size": 4, "outs": [-1], "ins": [-1, 0]},
                {"name": "i2", "size": 4, "outs": [1], "ins": [0, 1]},
                {"name": "c", "size": -1, "outs": [0], "ins": [1, -1]},
            ]
        },
    ],
}

MATMUL_BEFORE = """
0: #program block [] ( // program
    #input #user none A[0, 0] fp32(8:6, 6:1)
    #input #user none B[0, 0] fp32(6:8, 8:1)
    #output #user none C[0, 0] fp32(8:8, 8:1)
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(8:6, 6:1)
      in B[0, 0] fp32(6:8, 8:1)
      out C[0, 0] fp32(8:8, 8:1)
  ) {
    0: #agg_op_add #comb_op_mul #contraction #kernel block [i:8, j:8, k:6] ( // k1_C
        in A[i, k] fp32(1:6, 1:1)
        in B[k, j] fp32(1:8, 1:1)
        out C[i, j]:add fp32(1:8, 1:1)
    ) {
      0: $A = load(A)
      1: $B = load(B)
      2: $v = mul($A, $B):fp32
      3: C = store($v)
    }
  }
}
"""

MATMUL_EXPECTED = """
0: #program block [] ( // program
    #input #user none A[0, 0] fp32(8:6, 6:1)
    #input #user none B[0, 0] fp32(6:8, 8:1)
    #output #user none C[0, 0] fp32(8:8, 8:1)
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(8:6, 6:1)
      in B[0, 0] fp32(6:8, 8:1)
      out C[0, 0] fp32(8:8, 8:1)
  ) {
    0: #agg_op_add #comb_op_mul #contraction #gemm #kernel block [i:2, j:2, k:1] ( // k1_C
        in A[4*i, 6*k] fp32(4:6, 6:1)
        in B[6*k, 4*j] fp32(6:8, 4:1)
        out C[4*i, 4*j]:add fp32(4:8, 4:1)
    ) {
      0: #gemm_inner #stencil_m="i" #stencil_n="j" #stencil_k="k" block [i:4, j:4, k:6] ( // k1_C
          in A[i, k] fp32(1:6, 1:1)
          in B[k, j] fp32(1:8, 1:1)
          out C[i, j]:add fp32(1:8, 1:1)
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

CONV_BEFORE = """
0: #program block [] ( // program
    #input #user none I[0, 0, 0] fp32(8:32, 8:4, 4:1)
    #input #user none K[0, 0, 0, 0] fp32(3:96, 3:32, 4:8, 8:1)
    #output #user none O[0, 0, 0] fp32(8:64, 8:8, 8:1)
) {
  0: #main block [] ( // main
      in I[0, 0, 0] fp32(8:32, 8:4, 4:1)
      in K[0, 0, 0, 0] fp32(3:96, 3:32, 4:8, 8:1)
      out O[0, 0, 0] fp32(8:64, 8:8, 8:1)
  ) {
    0: #agg_op_add #comb_op_mul #contraction #kernel block [ci:4, co:8, kx:3, ky:3, x:8, y:8] ( // k1_O
        // O[x, y, co: 8, 8, 8] = +(I[kx + x - 1, ky + y - 1, ci] * K[kx, ky, ci, co]);
        kx + x - 1 >= 0
        -kx - x + 8 >= 0
        ky + y - 1 >= 0
        -ky - y + 8 >= 0
        in I[kx + x - 1, ky + y - 1, ci] fp32(1:32, 1:4, 1:1)
        in K[kx, ky, ci, co] fp32(1:96, 1:32, 1:8, 1:1)
        out O[x, y, co]:add fp32(1:64, 1:8, 1:1)
    ) {
      0: $I = load(I)
      1: $K = load(K)
      2: $v = mul($I, $K):fp32
      3: O = store($v)
    }
  }
}
"""

# The second stencil wins: x by 4 (i1), co by 4 (i2), all of ci (c); kx, ky, y by 1. The outer I
# view overhangs the image by the halo; the moved padding constraints keep every load inside.
CONV_EXPECTED = """
0: #program block [] ( // program
    #input #user none I[0, 0, 0] fp32(8:32, 8:4, 4:1)
    #input #user none K[0, 0, 0, 0] fp32(3:96, 3:32, 4:8, 8:1)
    #output #user none O[0, 0, 0] fp32(8:64, 8:8, 8:1)
) {
  0: #main block [] ( // main
      in I[0, 0, 0] fp32(8:32, 8:4, 4:1)
      in K[0, 0, 0, 0] fp32(3:96, 3:32, 4:8, 8:1)
      out O[0, 0, 0] fp32(8:64, 8:8, 8:1)
  ) {
    0: #CONV #agg_op_add #comb_op_mul #contraction #kernel block [ci:1, co:2, kx:3, ky:3, x:2, y:8] ( // k1_O
        // O[x, y, co: 8, 8, 8] = +(I[kx + x - 1, ky + y - 1, ci] * K[kx, ky, ci, co]);
        in I[kx + 4*x - 1, ky + y - 1, 4*ci] fp32(4:32, 1:4, 4:1)
        in K[kx, ky, 4*ci, 4*co] fp32(1:96, 1:32, 4:8, 4:1)
        out O[4*x, y, 4*co]:add fp32(4:64, 1:8, 4:1)
    ) {
      0: #CONV_inner #stencil_i1="x" #stencil_i2="co" #stencil_c="ci"
         block [ci:4, co:4, kx:1, ky:1, x:4, y:1, kx_o:1 = kx, ky_o:1 = ky, x_o:1 = x, y_o:1 = y] ( // k1_O
          kx + kx_o + x + 4*x_o - 1 >= 0
          -kx - kx_o - x - 4*x_o + 8 >= 0
          ky + ky_o + y + y_o - 1 >= 0
          -ky - ky_o - y - y_o + 8 >= 0
          in I[kx + x, ky + y, ci] fp32(1:32, 1:4, 1:1)
          in K[kx, ky, ci, co] fp32(1:96, 1:32, 1:8, 1:1)
          out O[x, y, co]:add fp32(1:64, 1:8, 1:1)
      ) {
        0: $I = load(I)
        1: $K = load(K)
        2: $v = mul($I, $K):fp32
        3: O = store($v)
      }
    }
  }
}
"""


def kernel(program: Block, name: str) -> Block:
    return next(k for k in program.stmts[0].stmts if k.name == name)


def test_registered_as_reordering():
    assert PASSES["stencil"].reorders


def test_matmul_4x4_gemm_stencil():
    out = check_rewrite("stencil", GEMM_4x4, MATMUL_BEFORE, MATMUL_EXPECTED)
    assert_same_meaning(parse_stripe(MATMUL_BEFORE), out)


def test_seed_conv_in_small_sizes():
    out = check_rewrite("stencil", SEED, CONV_BEFORE, CONV_EXPECTED)
    assert_same_meaning(parse_stripe(CONV_BEFORE), out)


def test_cost_startup_decides_between_stencils():
    """Every tiling here divides its ranges, so without start-up cost all matches run the same
    points and the earlier stencil wins; with it, the stencil with fewer (bigger) tiles wins."""
    out = check_rewrite("stencil", {**SEED, "startup_cost": 0}, CONV_BEFORE, None)
    outer = kernel(out, "k1_O")
    inner = outer.stmts[0]
    assert dict(inner.attrs) == {"stencil_i1": "x", "stencil_c": "ci"}
    assert {i.name: i.range for i in outer.idxs} == {"ci": 1, "co": 8, "kx": 3, "ky": 3, "x": 2, "y": 8}
    # A stencil's own startup_cost overrides the pass's: make the second one expensive.
    expensive = {**SEED, "stencils": [SEED["stencils"][0], {**SEED["stencils"][1], "startup_cost": 10_000}]}
    out = check_rewrite("stencil", expensive, CONV_BEFORE, None)
    assert dict(kernel(out, "k1_O").stmts[0].attrs) == {"stencil_i1": "x", "stencil_c": "ci"}


def test_a_target_without_stencils_is_unaffected():
    for text in (MATMUL_BEFORE, CONV_BEFORE):
        program = parse_stripe(text)
        assert run_pass("stencil", {"reqs": []}, program) == program
        assert run_pass("stencil", {**SEED, "stencils": []}, program) == program


def test_blocks_that_do_not_fit_are_unchanged():
    program = parse_stripe(MATMUL_BEFORE)
    # n must be contiguous in B: in a transposed B it is not.
    transposed = lowered(
        "function (A[M, K], B[N, K]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[j, k]); }",
        {"A": (8, 6), "B": (8, 6)},
    )
    assert run_pass("stencil", GEMM_4x4, transposed) == transposed
    # A tile bigger than the index's range.
    big = {**GEMM_4x4, "stencils": [{"idxs": [{**GEMM_4x4["stencils"][0]["idxs"][0], "size": 16}]}]}
    assert run_pass("stencil", big, program) == program
    # The number of ins and outs must be the stencil's.
    two_outs = {
        **GEMM_4x4,
        "stencils": [{"idxs": [{"name": "m", "size": 4, "outs": [-1, -1], "ins": [-1, 0]}]}],
    }
    assert run_pass("stencil", two_outs, program) == program
    # reqs the kernel lacks.
    assert run_pass("stencil", {**GEMM_4x4, "reqs": ["agg_op_max"]}, program) == program
    # Only leaves: the pass's own output is not tiled again.
    once = run_pass("stencil", GEMM_4x4, program)
    assert run_pass("stencil", {**GEMM_4x4, "reqs": ["kernel"]}, once) == once


def test_remainders_are_excluded_by_constraints():
    program = lowered(MATMUL, {"A": (7, 5), "B": (5, 6)})
    out = run_pass("stencil", GEMM_4x4, program)
    inner = kernel(out, "k1_C").stmts[0]
    assert [(i.name, i.range) for i in inner.idxs if i.affine is None] == [("i", 4), ("j", 4), ("k", 5)]
    assert len(inner.constraints) == 2  # i and j each have a partial last tile
    assert_same_meaning(program, out)


# ------------------------------------------------------------------------------ meaning


def _leaves(program: Block) -> list[Block]:
    return [
        k
        for k in program.stmts[0].stmts
        if can_split(k)
        and not any(isinstance(s, (Block, Special)) for s in k.stmts)
        and all(r.dir is not RefDir.NONE for r in k.refs)
    ]


def _code(ref, name: str) -> int | None:
    coeffs = [int(a.coeff(name)) for a in ref.access]
    flat = sum(c * d.stride for c, d in zip(coeffs, ref.shape.dims))
    if not any(coeffs):
        return 0
    return 1 if flat == 1 else (-1 if flat else None)


@st.composite
def stencil_cases(draw):
    """A drawn program and a stencil config fitted to one of its kernels (so most draws match),
    with drawn sizes (a size past the range does not match) and start-up cost."""
    program, inputs = draw(programs())
    stencils = []
    leaves = _leaves(program)
    if leaves:
        k = draw(st.sampled_from(leaves))
        outs = [r for r in k.refs if r.dir in (RefDir.OUT, RefDir.INOUT)]
        ins = [r for r in k.refs if r.dir is RefDir.IN]
        by_name = sorted(k.idxs, key=lambda i: i.name)  # draws independent of the lowering's index order
        chosen = draw(st.lists(st.sampled_from(by_name), min_size=1, max_size=3, unique_by=lambda i: i.name))
        roles = []
        for n, ix in enumerate(chosen):
            outs_c = [_code(r, ix.name) for r in outs]
            ins_c = [_code(r, ix.name) for r in ins]
            if None in outs_c or None in ins_c:
                continue
            size = draw(st.sampled_from([-1, 1, 2, 3, 4]))
            roles.append({"name": f"r{n}", "size": size, "outs": outs_c, "ins": ins_c})
        if roles:
            stencils.append({"idxs": roles})
    params = {
        "reqs": ["kernel"],
        "outer_set": ["tensor"],
        "inner_set": ["tensor_inner"],
        "startup_cost": draw(st.integers(0, 50)),
        "stencils": stencils,
    }
    return program, inputs, params


def test_meaning_is_kept_on_drawn_programs():
    seen = {"all": 0, "changed": 0}

    @settings(
        derandomize=True,
        deadline=None,
        max_examples=40,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(stencil_cases())
    def check(case):
        program, inputs, params = case
        out = run_pass("stencil", params, program)  # verifies
        verify(out)
        seen["all"] += 1
        if out != program:
            seen["changed"] += 1
            assert all("kernel" in k.tags for k in out.stmts[0].stmts)
            assert [k.name for k in out.stmts[0].stmts] == [k.name for k in program.stmts[0].stmts]
        assert_same_meaning(program, out, inputs)

    check()
    assert seen["changed"] >= seen["all"] // 2, seen


# ------------------------------------------------------------------------------ pipeline
# Recommended for accel: the seed's stencils at its sizes (the second completed with the channel
# role); an index shorter than a stencil's size does not match it.
ACCEL_STEP = {
    "name": "tensorize",
    "pass": "stencil",
    "params": {
        "reqs": ["agg_op_add", "comb_op_mul"],
        "outer_set": ["CONV"],
        "inner_set": ["CONV_inner"],
        "startup_cost": 32,
        "stencils": [
            {
                "idxs": [
                    {"name": "i1", "size": 32, "outs": [-1], "ins": [-1, 0]},
                    {"name": "c", "size": -1, "outs": [0], "ins": [-1, -1]},
                ]
            },
            {
                "idxs": [
                    {"name": "i1", "size": 4, "outs": [-1], "ins": [-1, 0]},
                    {"name": "i2", "size": 4, "outs": [-1], "ins": [0, -1]},
                    {"name": "c", "size": -1, "outs": [0], "ins": [-1, -1]},
                ]
            },
        ],
    },
}


def test_in_the_accel_pipeline():
    """The entry recommended for accel, read from JSON and run before its locate passes: the
    convolution is tensorized for the CONV unit, verified after every pass, same meaning."""
    data = json.loads((TARGETS / "accel.json").read_text())
    cfg = parse_config(json.dumps({**data, "passes": [ACCEL_STEP, *data["passes"]]}))
    # 8x6 image: the 4x4 stencil (co has 8 channels); 40x5 with 2 output channels: only the 32-row
    # one fits (x in 2 tiles, the second partial).
    for shapes, roles in (
        ({"I": (8, 6, 4), "K": (3, 3, 4, 8)}, {"stencil_i1": "x", "stencil_i2": "co", "stencil_c": "ci"}),
        ({"I": (40, 5, 4), "K": (1, 1, 4, 2)}, {"stencil_i1": "x", "stencil_c": "ci"}),
    ):
        program = lowered(CONV, shapes)
        out = optimize(program, cfg, check=True)
        conv = kernel(out, "k1_O")
        (inner,) = [s for s in conv.stmts if isinstance(s, Block) and "CONV_inner" in s.tags]
        assert {"CONV", "contraction"} <= conv.tags  # later passes may add transfer blocks around it
        assert dict(inner.attrs) == roles
        assert_same_meaning(program, out)


# ------------------------------------------------------------------------------ LLVM
def test_llvm_runs_the_tensorized_conv():
    rng = np.random.default_rng(1)
    inputs = {
        "I": rng.integers(-3, 4, (9, 7, 4)).astype(np.float32),
        "K": rng.integers(-3, 4, (3, 3, 4, 6)).astype(np.float32),
    }
    program = lowered(CONV, {k: v.shape for k, v in inputs.items()})
    out = run_pass("stencil", SEED, program)
    assert "CONV" in kernel(out, "k1_O").tags
    got, _ = execute(out, inputs)
    want = run_stripe(program, inputs)
    np.testing.assert_array_equal(got["O"], want["O"])
