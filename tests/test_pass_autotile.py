"""autotile: Before/Expected pairs whose tiles are derived by hand from the cost model, the limits it
promises (memory, only_po2, max_sizes, min_outer), the blocks it must leave alone, the meaning
checked by the Stripe interpreter on drawn programs, and a tiled matmul run by the LLVM backend."""

from __future__ import annotations

import dataclasses
import itertools
import json
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends import registry
from ref_interp.stripe_exec import run_stripe
from stripe.config import ConfigError, format_config, parse_config, pass_params, target_config
from stripe.cost import TileModel, view_bytes
from stripe.hardware import ExecUnit, Hardware, MemUnit
from stripe.ir import Block, Location, walk
from stripe.parser import parse_stripe
from stripe.passes import PASSES, optimize
from stripe.passes.autotile import _tileable, candidates, search
from stripe.printer import format_block
from stripe.verify import verify
from tests.llvm_runner import execute
from tests.pass_support import assert_same_meaning, check_rewrite, hardware, lowered, programs, run_pass

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"
CONV = (
    "function (I[X, CI], K[KX, CI, CO]) -> (O) { O[x, co : X, CO] = +(I[x + kx - 1, ci] * K[kx, ci, co]); }"
)

# A 256-byte memory with 4-byte lines (one fp32 per line: no rounding) and one exec unit.
TINY = Hardware(1000, {"DRAM": MemUnit(1024), "SRAM": MemUnit(0.25, 1, 4)}, {"PE": ExecUnit(1, 1)})


def small_l1(kib: float) -> Hardware:
    hw = hardware("llvm_cpu")
    return dataclasses.replace(
        hw, mem_units={**hw.mem_units, "L1": dataclasses.replace(hw.mem_units["L1"], size_KiB=kib)}
    )


def autotile(program: Block, params: dict, hw: Hardware) -> Block:
    out = PASSES["autotile"].fn(program, pass_params("autotile", params), hw)
    verify(out)
    return out


def tiled_blocks(program: Block) -> list[Block]:
    """The outer blocks autotile made: kernels holding one nested block."""
    main = program.stmts[0]
    return [k for k in main.stmts if isinstance(k, Block) and any(isinstance(s, Block) for s in k.stmts)]


MATMUL_8 = """
0: #program block [] ( // program
    #input #user none A[0, 0] fp32(8:8, 8:1)
    #input #user none B[0, 0] fp32(8:8, 8:1)
    #output #user none C[0, 0] fp32(8:8, 8:1)
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(8:8, 8:1)
      in B[0, 0] fp32(8:8, 8:1)
      out C[0, 0] fp32(8:8, 8:1)
  ) {
    0: #kernel #special #zero block [] ( // k0_C
        out C[0, 0]:assign fp32(8:8, 8:1)
    ) {
      0: C = zero()
    }
    1: #agg_op_add #comb_op_mul #contraction #kernel block [k:8, m:8, n:8] ( // k1_C
        // C[m, n: 8, 8] = +(A[m, k] * B[k, n]);
        in A[m, k] fp32(1:8, 1:1)
        in B[k, n] fp32(1:8, 1:1)
        out C[m, n]:add fp32(1:8, 1:1)
    ) {
      0: $A = load(A)
      1: $B = load(B)
      2: $v = mul($A, $B):fp32
      3: C = store($v)
    }
  }
}
"""

# Tiles (k, m, n) = (8, 4, 1), by hand. Memory 256 B = 64 floats (lines of one float). Outer loop
# order k, m, n (n innermost). Footprint A m*k + B k*n + C m*n floats = 32 + 8 + 4 = 44 <= 64.
# Outer points 1*2*8 = 16. A does not depend on n (the innermost split index): loaded 16/8 = 2
# times * 128 B = 256; B: 16 * 32 B = 512; C (read and written): 2 * 16 * 16 B = 512; total 1280.
# The bigger tiles do not fit: (8, 8, 1) needs A alone = 64 floats; (8, 4, 2) fits (56 floats) and
# also costs 2*128 + 8*64 + 2*8*32 = 1280, but has 8 outer points instead of 16, and ties go to
# parallelism; (4, 8, 1) costs A 2*128 (reused over n) + B 16*16 + C 2*16*32 = 1536.
# tests/test_cost.py checks that no feasible candidate beats it.
MATMUL_8_TILED = """
0: #program block [] ( // program
    #input #user none A[0, 0] fp32(8:8, 8:1)
    #input #user none B[0, 0] fp32(8:8, 8:1)
    #output #user none C[0, 0] fp32(8:8, 8:1)
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(8:8, 8:1)
      in B[0, 0] fp32(8:8, 8:1)
      out C[0, 0] fp32(8:8, 8:1)
  ) {
    0: #kernel #special #zero block [] ( // k0_C
        out C[0, 0]:assign fp32(8:8, 8:1)
    ) {
      0: C = zero()
    }
    1: #agg_op_add #comb_op_mul #contraction #kernel #tiled block [k:1, m:2, n:8] ( // k1_C
        // C[m, n: 8, 8] = +(A[m, k] * B[k, n]);
        in A[4*m, 8*k] fp32(4:8, 8:1)
        in B[8*k, n] fp32(8:8, 1:1)
        out C[4*m, n]:add fp32(4:8, 1:1)
    ) {
      0: #tile block [k:8, m:4, n:1] ( // k1_C
          in A[m, k] fp32(1:8, 1:1)
          in B[k, n] fp32(1:8, 1:1)
          out C[m, n]:add fp32(1:8, 1:1)
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

TILED_PARAMS = {"reqs": ["contraction"], "memory": "SRAM", "outer_set": ["tiled"], "inner_set": ["tile"]}


def test_matmul_tiny_memory():
    out = autotile(parse_stripe(MATMUL_8), TILED_PARAMS, TINY)
    assert out == parse_stripe(MATMUL_8_TILED), format_block(out)
    assert_same_meaning(parse_stripe(MATMUL_8), out)


CONV_11 = """
0: #program block [] ( // program
    #input #user none I[0, 0] fp32(11:3, 3:1)
    #input #user none K[0, 0, 0] fp32(3:12, 3:4, 4:1)
    #output #user none O[0, 0] fp32(11:4, 4:1)
) {
  0: #main block [] ( // main
      in I[0, 0] fp32(11:3, 3:1)
      in K[0, 0, 0] fp32(3:12, 3:4, 4:1)
      out O[0, 0] fp32(11:4, 4:1)
  ) {
    0: #kernel #special #zero block [] ( // k0_O
        out O[0, 0]:assign fp32(11:4, 4:1)
    ) {
      0: O = zero()
    }
    1: #agg_op_add #comb_op_mul #contraction #kernel block [ci:3, co:4, kx:3, x:11] ( // k1_O
        // O[x, co: 11, 4] = +(I[kx + x - 1, ci] * K[kx, ci, co]);
        kx + x - 1 >= 0
        -kx - x + 11 >= 0
        in I[kx + x - 1, ci] fp32(1:3, 1:1)
        in K[kx, ci, co] fp32(1:12, 1:4, 1:1)
        out O[x, co]:add fp32(1:4, 1:1)
    ) {
      0: $I = load(I)
      1: $K = load(K)
      2: $v = mul($I, $K):fp32
      3: O = store($v)
    }
  }
}
"""


def conv_11_tiled(t: int) -> str:
    """CONV_11 with x in tiles of ``t`` (11 % t != 0) and every other index whole."""
    head, _ = CONV_11.split("    1: #agg_op_add")
    n = -(-11 // t)
    return (
        head
        + f"""    1: #agg_op_add #comb_op_mul #contraction #kernel block [ci:1, co:1, kx:1, x:{n}] ( // k1_O
        // O[x, co: 11, 4] = +(I[kx + x - 1, ci] * K[kx, ci, co]);
        in I[3*kx + {t}*x - 1, 3*ci] fp32({t + 2}:3, 3:1)
        in K[3*kx, 3*ci, 4*co] fp32(3:12, 3:4, 4:1)
        out O[{t}*x, 4*co]:add fp32({t}:4, 4:1)
    ) {{
      0: block [ci:3, co:4, kx:3, x:{t}, x_o:1 = x] ( // k1_O
          kx + x + {t}*x_o - 1 >= 0
          -kx - x - {t}*x_o + 11 >= 0
          -x - {t}*x_o + 10 >= 0
          in I[kx + x, ci] fp32(1:3, 1:1)
          in K[kx, ci, co] fp32(1:12, 1:4, 1:1)
          out O[x, co]:add fp32(1:4, 1:1)
      ) {{
        0: $I = load(I)
        1: $K = load(K)
        2: $v = mul($I, $K):fp32
        3: O = store($v)
      }}
    }}
  }}
}}
"""
    )


def test_conv_padding_and_remainder():
    # llvm_cpu L1: 32 KiB, 64-byte lines; min_outer 0 means the 2 CPU cores, so the whole block
    # (1 outer point) is out. Rows of I (3 floats) and of O, K (4 floats) are one line each. With
    # x tiles of t (ci, co, kx whole), per outer point: I t+2 lines, K 9 lines, O t lines; K does
    # not depend on x, the only split index, so it is loaded once.
    #   t=4: 3 points: I 3*6*64 + K 9*64 + O 2*3*4*64 = 1152 + 576 + 1536 = 3264
    #   t=8: 2 points: I 2*10*64 + 576 + O 2*2*8*64 = 1280 + 576 + 2048 = 3904
    #   t=2: 6 points: I 6*4*64 + 576 + O 2*6*2*64 = 1536 + 576 + 1536 = 3648
    #   t=1: 11 points: I 11*3*64 + 576 + O 2*11*64 = 2112 + 576 + 1408 = 4096
    # and shrinking ci, co or kx only reloads more. So x:4, the last tile holding 3 rows: the
    # remainder constraint -x - 4*x_o + 10 >= 0 joins the padding constraints.
    before = parse_stripe(CONV_11)
    out = check_rewrite("autotile", {"reqs": ["contraction"], "memory": "L1"}, CONV_11, conv_11_tiled(4))
    assert_same_meaning(before, out)


def test_max_sizes_caps_a_tile():
    # The cap itself is a candidate: x:3 (4 tiles, the last of 2 rows), the largest allowed.
    out = check_rewrite(
        "autotile",
        {"reqs": ["contraction"], "memory": "L1", "max_sizes": {"x": 3}},
        CONV_11,
        conv_11_tiled(3),
    )
    assert_same_meaning(parse_stripe(CONV_11), out)


def test_only_po2():
    # x of range 12: the divisor 6 makes 2 tiles without waste; with only_po2 it must be 4 or 8.
    program = lowered(CONV, {"I": (12, 3), "K": (3, 3, 4)})
    plain = run_pass("autotile", {"reqs": ["contraction"], "memory": "L1"}, program)
    po2 = run_pass("autotile", {"reqs": ["contraction"], "memory": "L1", "only_po2": True}, program)
    inner = {i.name: i.range for i in tiled_blocks(plain)[0].stmts[0].idxs}
    assert inner["x"] == 6
    inner = {i.name: i.range for i in tiled_blocks(po2)[0].stmts[0].idxs if i.affine is None}
    assert inner == {"ci": 3, "co": 4, "kx": 3, "x": 4}  # 3, 4: whole ranges (not split)
    assert_same_meaning(program, po2)


def test_candidates():
    assert candidates(12, False, None) == [1, 2, 3, 4, 6, 8, 12]
    assert candidates(12, True, None) == [1, 2, 4, 8, 12]
    assert candidates(12, False, 5) == [1, 2, 3, 4, 5]
    assert candidates(12, True, 5) == [1, 2, 4]
    assert candidates(1, True, None) == [1]


def test_min_outer():
    # 8x8x8 matmul on the tiny memory asking for 32 outer points over (m, n): (8, 4, 1) has 16.
    out = autotile(parse_stripe(MATMUL_8), {**TILED_PARAMS, "min_outer": 32}, TINY)
    outer = tiled_blocks(out)[0]
    counts = {i.name: i.range for i in outer.idxs}
    assert counts["m"] * counts["n"] >= 32
    # Asking for more than the output has (64 elements) is kept to what is possible.
    out = autotile(parse_stripe(MATMUL_8), {**TILED_PARAMS, "min_outer": 1000}, TINY)
    counts = {i.name: i.range for i in tiled_blocks(out)[0].idxs}
    assert counts["m"] * counts["n"] == 64


def test_min_outer_default_is_the_located_units_count():
    # accel has 4 DSP + 4 CONV units. An 8x8 transpose is cheapest whole, so the tiling is the
    # cheapest with enough outer points: 8 when the block runs anywhere, 4 when it is on CONV.
    program = lowered("function (A[M, N]) -> (O) { O[i, j : N, M] = =(A[j, i]); }", {"A": (8, 8)})
    main = program.stmts[0]
    for loc, points in ((None, 8), (Location("CONV"), 4)):
        kernel = dataclasses.replace(main.stmts[1], location=loc)
        located = dataclasses.replace(
            program, stmts=(dataclasses.replace(main, stmts=(main.stmts[0], kernel)),)
        )
        out = run_pass("autotile", {"reqs": ["contraction"], "memory": "SRAM"}, located, "accel")
        [outer] = tiled_blocks(out)
        assert outer.index_space == points and outer.stmts[0].location == loc


def test_split_reductions_off_keeps_reduction_whole():
    program = lowered(MATMUL, {"A": (33, 29), "B": (29, 17)})
    out = autotile(program, {"reqs": ["contraction"], "memory": "L1", "split_reductions": False}, small_l1(4))
    inner = {i.name: i.range for i in tiled_blocks(out)[0].stmts[0].idxs}
    assert inner["k"] == 29 and inner["m"] * inner["n"] < 33 * 17


def test_footprint_fits_memory():
    program = lowered(MATMUL, {"A": (33, 29), "B": (29, 17)})
    for kib in (0.25, 1, 4):
        out = autotile(program, {"reqs": ["contraction"], "memory": "L1"}, small_l1(kib))
        [outer] = tiled_blocks(out)
        assert footprint(outer, 64) <= kib * 1024


def footprint(outer: Block, line: int) -> int:
    """The bytes of the outer block's tile views, from the program text (not the model)."""
    used = {r.source for r in outer.stmts[0].refs}
    return sum(
        view_bytes(r.shape.sizes, tuple(d.stride for d in r.shape.dims), r.shape.dtype.numpy.itemsize, line)
        for r in outer.refs
        if r.into in used
    )


def test_blocks_not_matching_untouched():
    program = parse_stripe(MATMUL_8)
    assert autotile(program, {**TILED_PARAMS, "reqs": ["eltwise"]}, TINY) == program


def test_whole_block_best_untouched():
    # An 8x8 transpose, rows of 32 bytes: each row is one 64-byte line of L1 whole (8 + 8 lines).
    # Splitting i in halves reads all 8 lines of A for each half (A[j, i] rows are j); splitting
    # j does the same to O. So the whole block is strictly best, and min_outer 1 allows it.
    program = lowered("function (A[M, N]) -> (O) { O[i, j : N, M] = =(A[j, i]); }", {"A": (8, 8)})
    assert run_pass("autotile", {"reqs": ["contraction"], "memory": "L1", "min_outer": 1}, program) == program
    # With the default min_outer (2 cores) it must split: i in halves, 2048 bytes instead of 1536.
    out = run_pass("autotile", {"reqs": ["contraction"], "memory": "L1"}, program)
    assert [(i.name, i.range) for i in tiled_blocks(out)[0].idxs] == [("i", 2), ("j", 1)]
    # Ties go to parallelism: in an 8x8x8 matmul B is reused across m, so m tiles of 1 cost the
    # same bytes as the whole block and give 8 outer points.
    out = run_pass(
        "autotile", {"reqs": ["contraction"], "memory": "L1", "min_outer": 1}, parse_stripe(MATMUL_8)
    )
    assert [(i.name, i.range) for i in tiled_blocks(out)[0].idxs] == [("k", 1), ("m", 8), ("n", 1)]


def test_tiled_block_not_tiled_again():
    once = autotile(parse_stripe(MATMUL_8), TILED_PARAMS, TINY)
    assert autotile(once, TILED_PARAMS, TINY) == once  # the outer is no leaf; the inner lacks the tag


def test_read_and_written_ref_untouched():
    src = """
0: #program block [] ( // program
    #output #user none O[0] fp32(64:1)
) {
  0: #main block [] ( // main
      inout O[0] fp32(64:1)
  ) {
    0: #eltwise #kernel block [i:64] ( // k
        inout O[i] fp32(1:1)
    ) {
      0: $O = load(O)
      1: $v = exp($O):fp32
      2: O = store($v)
    }
  }
}
"""
    program = parse_stripe(src)
    assert autotile(program, {"reqs": ["eltwise"], "memory": "L1"}, small_l1(0.0625)) == program


def test_unknown_memory_is_a_config_error():
    with pytest.raises(ConfigError, match="no memory 'SRAM'"):
        run_pass("autotile", {"reqs": ["contraction"], "memory": "SRAM"}, parse_stripe(MATMUL_8))


def test_debug_table(monkeypatch, capsys):
    monkeypatch.setenv("TILE_DEBUG", "2")
    autotile(parse_stripe(MATMUL_8), TILED_PARAMS, TINY)
    err = capsys.readouterr().err.splitlines()
    i = err.index("k\tm\tn\tfootprint\ttraffic\tbytes/flop\tparallel")
    assert err[i + 1].split("\t") == ["8", "4", "1", "176", "1280", "1.25", "16"]
    assert err[i + 2].split("\t")[:3] == ["8", "4", "2"]


def test_search_is_fast_on_a_big_convolution():
    kernel = """
0: #program block [] ( // program
    #input #user none I[0, 0, 0, 0] fp32(1:69337600, 1026:67600, 1026:64, 64:1)
    #input #user none K[0, 0, 0, 0] fp32(3:196608, 3:65536, 64:1024, 1024:1)
    #output #user none O[0, 0, 0, 0] fp32(1:1073741824, 1024:1048576, 1024:1024, 1024:1)
) {
  0: #main block [] ( // main
      in I[0, 0, 0, 0] fp32(1:69337600, 1026:67600, 1026:64, 64:1)
      in K[0, 0, 0, 0] fp32(3:196608, 3:65536, 64:1024, 1024:1)
      out O[0, 0, 0, 0] fp32(1:1073741824, 1024:1048576, 1024:1024, 1024:1)
  ) {
    0: #contraction #kernel block [ci:64, co:1024, kx:3, ky:3, x:1024, y:1024] ( // conv
        in I[0, kx + x, ky + y, ci] fp32(1:69337600, 1:67600, 1:64, 1:1)
        in K[kx, ky, ci, co] fp32(1:196608, 1:65536, 1:1024, 1:1)
        out O[0, x, y, co]:add fp32(1:1073741824, 1:1048576, 1:1024, 1:1)
    ) {
      0: $I = load(I)
      1: $K = load(K)
      2: $v = mul($I, $K):fp32
      3: O = store($v)
    }
  }
}
"""
    program = parse_stripe(kernel)
    for kib in (1, 32, 512):
        params, hw = pass_params("autotile", {"reqs": ["contraction"], "memory": "L1"}), small_l1(kib)
        start = time.perf_counter()
        out = PASSES["autotile"].fn(program, params, hw)
        assert time.perf_counter() - start < 0.5
        verify(out)
        [outer] = tiled_blocks(out)
        assert footprint(outer, 64) <= kib * 1024


HYP = settings(
    derandomize=True,
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def check_drawn(program: Block, inputs: dict, params: dict, hw: Hardware) -> Block:
    out = autotile(program, params, hw)
    assert_same_meaning(program, out, inputs)
    for outer in tiled_blocks(out):
        assert footprint(outer, hw.memory(params["memory"]).line_bytes) <= hw.mem_bytes(params["memory"])
        inner = outer.stmts[0]
        tiles = {i.name: i.range for i in outer.idxs}
        for i in inner.idxs:
            if i.affine is not None:
                continue
            assert i.range <= params.get("max_sizes", {}).get(i.name, i.range)
            if params.get("only_po2"):
                assert i.range & (i.range - 1) == 0 or tiles[i.name] == 1  # a power of two, or whole
    return out




@HYP
@given(st.data())
def test_meaning_llvm_cpu_l1(data):
    program, inputs = data.draw(programs())
    check_drawn(program, inputs, {"reqs": ["contraction"], "memory": "L1"}, hardware("llvm_cpu"))


@HYP
@given(st.data())
def test_meaning_1kib(data):
    program, inputs = data.draw(programs())
    check_drawn(program, inputs, {"reqs": ["contraction"], "memory": "L1"}, small_l1(1))


@HYP
@given(st.data())
def test_meaning_every_kernel_64b_po2_capped(data):
    program, inputs = data.draw(programs())
    params = {"reqs": ["kernel"], "memory": "L1", "only_po2": True, "max_sizes": {"i": 2, "j": 3}}
    check_drawn(program, inputs, params, small_l1(0.0625))


def test_drawn_programs_do_get_split():
    # The meaning tests are only worth something if real splits happen on the drawn programs.
    seen = []

    @HYP
    @given(st.data())
    def count(data):
        program, _ = data.draw(programs())
        out = autotile(program, {"reqs": ["contraction"], "memory": "L1"}, small_l1(1))
        seen.append(bool(tiled_blocks(out)))

    count()
    assert sum(seen) >= 5, seen


def test_hill_climb_is_near_the_exhaustive_optimum():
    ratios = []

    @HYP
    @given(st.data())
    def compare(data):
        program, _ = data.draw(programs())
        main = program.stmts[0]
        for kib in (0.25, 1):
            hw = small_l1(kib)
            cfg = pass_params("autotile", {"reqs": ["contraction"], "memory": "L1"})
            for k in main.stmts:
                if "contraction" not in k.tags or not _tileable(k, main):
                    continue
                model = TileModel(k, hw, "L1", {r.into: main.ref(r.source).shape.sizes for r in k.refs})
                sizes = [candidates(r, False, None) for r in model.ranges]
                if np.prod([len(c) for c in sizes]) > 1000:
                    continue
                best, _ = search(model, cfg, hw)
                want = min(2, model.max_parallel())
                every = [model.evaluate(t) for t in itertools.product(*sizes)]
                every = [c for c in every if c.footprint <= model.capacity and c.parallel >= want]
                if not every:
                    assert best is None
                    continue
                ratios.append(best.traffic / min(c.traffic for c in every))

    compare()
    assert len(ratios) >= 20
    # a hill climb, not an exhaustive search: near the optimum (one drawn kernel is at 1.31x)
    assert max(ratios) <= 1.35, sorted(ratios)[-5:]
    assert sum(r == 1 for r in ratios) >= 0.9 * len(ratios), sorted(ratios)[-5:]


def test_search_escapes_the_greedy_trap():
    # 512^3 matmul in L1 (32 KiB): the steepest first step takes n whole (one 2 KiB row of C
    # per point), which leaves k and m tiny; traffic per footprint byte grows all three instead.
    # The exhaustive optimum over the power-of-two tiles, with the indexes in lowering's order
    # (m, n, k), costs 18874368 bytes, at (64, 64, 16) (26214400 at (128, 32, 16) in the former
    # alphabetical order k, m, n: the loop order changes which tile is reused).
    program = lowered(MATMUL, {"A": (512, 512), "B": (512, 512)})
    main = program.stmts[0]
    kernel = main.stmts[1]
    model = TileModel(kernel, hardware(), "L1", {r.into: (512, 512) for r in kernel.refs})
    every = [model.evaluate(t) for t in itertools.product(candidates(512, True, None), repeat=3)]
    best = min((c for c in every if c.footprint <= 32 * 1024 and c.parallel >= 2), key=lambda c: c.key())
    assert (best.tiles, best.traffic) == ((64, 64, 16), 18874368)
    out = run_pass("autotile", {"reqs": ["contraction"], "memory": "L1", "only_po2": True}, program)
    assert [i.range for i in tiled_blocks(out)[0].stmts[0].idxs] == [64, 64, 16]


def test_llvm_runs_tiled_matmul():
    program = lowered(MATMUL, {"A": (33, 29), "B": (29, 17)})
    out = autotile(program, {"reqs": ["contraction"], "memory": "L1"}, small_l1(1))
    [outer] = tiled_blocks(out)
    assert any(i.range > 1 for i in outer.idxs) and outer.has_tags("kernel", "contraction")
    rng = np.random.default_rng(1)
    inputs = {
        "A": rng.integers(-3, 4, (33, 29)).astype(np.float32),
        "B": rng.integers(-3, 4, (29, 17)).astype(np.float32),
    }
    got, _ = execute(out, inputs)
    want = run_stripe(out, inputs)
    np.testing.assert_array_equal(got["C"], want["C"])
    np.testing.assert_array_equal(want["C"], inputs["A"] @ inputs["B"])


def test_every_block_keeps_kernel_tag_at_main_level():
    program = lowered(MATMUL, {"A": (33, 29), "B": (29, 17)})
    out = autotile(program, {"reqs": ["kernel"], "memory": "L1"}, small_l1(0.25))
    assert all(k.has_tags("kernel") for k in out.stmts[0].stmts)
    assert [k.name for k in out.stmts[0].stmts] == [k.name for k in program.stmts[0].stmts]
    assert sum(1 for b in walk(out) if "kernel" in b.tags) == len(program.stmts[0].stmts)


# The entries recommended for the built-in configs (appended to each config's pass list).
TILED = {"outer_set": ["tiled"], "inner_set": ["tile"]}
RECOMMENDED = {
    "llvm_cpu": {"name": "tile_contractions", "pass": "autotile", "params": {
        "reqs": ["contraction"], "memory": "L2", **TILED, "only_po2": True, "split_reductions": False}},
    "opencl_gpu": {"name": "tile_contractions", "pass": "autotile", "params": {
        "reqs": ["contraction"], "memory": "LOCAL", **TILED, "only_po2": True}},
    "accel": {"name": "tile_conv", "pass": "autotile", "params": {
        "reqs": ["contraction"], "memory": "SRAM", "outer_set": ["tiled"], "inner_set": ["conv_inner"]}},
}  # fmt: skip


def recommended_config(target: str, kib: float | None = None):
    config = json.loads(format_config(target_config(target)))  # resolved: every step written out
    config["passes"] = [*config["passes"], RECOMMENDED[target]]
    if kib is not None:  # every memory that small: splits on small programs
        for m in config["hardware"]["mem_units"].values():
            m["size_KiB"] = min(m["size_KiB"], kib)
    return parse_config(json.dumps(config))


@pytest.mark.parametrize("target", sorted(RECOMMENDED))
def test_recommended_entries(target):
    conv = lowered(CONV, {"I": (11, 3), "K": (3, 3, 4)})
    matmul = lowered(MATMUL, {"A": (33, 29), "B": (29, 17)})
    for kib in (None, 2):
        config = recommended_config(target, kib)
        for program in (conv, matmul):
            out = optimize(program, config, check=True)
            assert_same_meaning(program, out)
            if kib is not None:
                assert tiled_blocks(out), format_block(out)


def test_recommended_llvm_and_opencl_run_tiled_programs():
    matmul = lowered(MATMUL, {"A": (33, 29), "B": (29, 17)})
    conv = lowered(CONV, {"I": (11, 3), "K": (3, 3, 4)})
    rng = np.random.default_rng(2)
    devices = [("llvm_cpu", None)]
    if "opencl_cpu.0" in registry.devices():
        devices.append(("opencl_gpu", registry.get("opencl_cpu.0")))
    for target, dev in devices:
        for program in (matmul, conv):
            out = optimize(program, recommended_config(target, 2), check=True)
            assert tiled_blocks(out)
            inputs = {
                r.into: rng.integers(-3, 4, r.shape.sizes).astype(np.float32)
                for r in program.refs
                if "input" in r.tags
            }
            got, _ = execute(out, inputs) if dev is None else execute(out, inputs, device=dev)
            want = run_stripe(program, inputs)
            for name in want:
                np.testing.assert_array_equal(got[name], want[name], err_msg=f"{target}: {name}")
