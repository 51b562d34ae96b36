"""The ``memory_placement`` pass and ``check_placement``: a Before/Expected pair in Stripe text (a
chain of temporaries where a dead one's space is reused), locals of sibling blocks sharing space,
the checker catching an overlap, placement checked on Hypothesis-drawn optimized programs, and a
placed program run on the LLVM CPU backend."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import stripe
from ref_interp.stripe_exec import run_stripe
from stripe.config import parse_config
from stripe.ir import Block, walk
from stripe.parser import parse_stripe
from stripe.passes.pipeline import optimize
from stripe.passes.placement import check_placement
from tests.llvm_runner import execute
from tests.pass_support import assert_same_meaning, check_rewrite, inputs_for, lowered, programs, run_pass
from tests.test_pass_cache import CACHE_IN_OUT, MATMUL, SETTINGS, tiled
from tests.test_pass_schedule import SCHEDULE

PLACE_DRAM = {"reqs": ["program"], "locs": [{"name": "DRAM"}], "alignment": 4}
PLACE_ALL = {"reqs": ["program"], "locs": [{"name": "DRAM"}, {"name": "SRAM"}], "alignment": 16}

CHAIN = """
    0: #program block [] ( // program
        #input #user none A[0] fp32(4:1)
        #tmp none T1[0] fp32(4:1)
        #tmp none T2[0] fp32(4:1)
        #tmp none T3[0] fp32(4:1)
        #output #user none O[0] fp32(4:1)
    ) {
      0: #main block [] ( // main
          in A[0] fp32(4:1)
          inout T1[0] fp32(4:1)
          inout T2[0] fp32(4:1)
          inout T3[0] fp32(4:1)
          out O[0] fp32(4:1)
      ) {
        0: #eltwise #eltwise_exp #kernel block [i0:4] ( // k0_T1
            in A[i0] fp32(1:1)
            out T1[i0]:assign fp32(1:1)
        ) {
          0: $A = load(A)
          1: $t1 = exp($A):fp32
          2: T1 = store($t1)
        }
        1: #eltwise #eltwise_exp #kernel block [i0:4] ( // k1_T2
            in T1[i0] fp32(1:1)
            out T2[i0]:assign fp32(1:1)
        ) {
          0: $T1 = load(T1)
          1: $t1 = exp($T1):fp32
          2: T2 = store($t1)
        }
        2: #eltwise #eltwise_exp #kernel block [i0:4] ( // k2_T3
            in T2[i0] fp32(1:1)
            out T3[i0]:assign fp32(1:1)
        ) {
          0: $T2 = load(T2)
          1: $t1 = exp($T2):fp32
          2: T3 = store($t1)
        }
        3: #eltwise #eltwise_exp #kernel block [i0:4] ( // k3_O
            in T3[i0] fp32(1:1)
            out O[i0]:assign fp32(1:1)
        ) {
          0: $T3 = load(T3)
          1: $t1 = exp($T3):fp32
          2: O = store($t1)
        }
      }
    }
"""

# Lifetimes (kernels): A k0 (an input: from the start), T1 k0-k1, T2 k1-k2, T3 k2-k3, O k3 (an
# output: to the end). Each kernel reads one buffer and writes another, so they get two slots:
# T2 and O reuse A's bytes, T3 reuses T1's once T1 is dead.
CHAIN_PLACED = """
    0: #program block [] ( // program
        #input #user none @0x0 A[0] fp32(4:1)
        #tmp none @0x10 T1[0] fp32(4:1)
        #tmp none @0x0 T2[0] fp32(4:1)
        #tmp none @0x10 T3[0] fp32(4:1)
        #output #user none @0x0 O[0] fp32(4:1)
    ) {
      0: #main block [] ( // main
          in A[0] fp32(4:1)
          inout T1[0] fp32(4:1)
          inout T2[0] fp32(4:1)
          inout T3[0] fp32(4:1)
          out O[0] fp32(4:1)
      ) {
        0: #eltwise #eltwise_exp #kernel block [i0:4] ( // k0_T1
            in A[i0] fp32(1:1)
            out T1[i0]:assign fp32(1:1)
        ) {
          0: $A = load(A)
          1: $t1 = exp($A):fp32
          2: T1 = store($t1)
        }
        1: #eltwise #eltwise_exp #kernel block [i0:4] ( // k1_T2
            in T1[i0] fp32(1:1)
            out T2[i0]:assign fp32(1:1)
        ) {
          0: $T1 = load(T1)
          1: $t1 = exp($T1):fp32
          2: T2 = store($t1)
        }
        2: #eltwise #eltwise_exp #kernel block [i0:4] ( // k2_T3
            in T2[i0] fp32(1:1)
            out T3[i0]:assign fp32(1:1)
        ) {
          0: $T2 = load(T2)
          1: $t1 = exp($T2):fp32
          2: T3 = store($t1)
        }
        3: #eltwise #eltwise_exp #kernel block [i0:4] ( // k3_O
            in T3[i0] fp32(1:1)
            out O[i0]:assign fp32(1:1)
        ) {
          0: $T3 = load(T3)
          1: $t1 = exp($T3):fp32
          2: O = store($t1)
        }
      }
    }
"""


def test_a_dead_temporarys_space_is_reused():
    out = check_rewrite("memory_placement", PLACE_DRAM, CHAIN, CHAIN_PLACED)
    check_placement(out)
    assert_same_meaning(parse_stripe(CHAIN), out)


def _with_offset(program: Block, name: str, offset: int) -> Block:
    return replace(
        program, refs=tuple(replace(r, offset=offset) if r.into == name else r for r in program.refs)
    )


def test_check_placement_names_two_live_allocations_that_overlap():
    placed = parse_stripe(CHAIN_PLACED)
    # T2 (k1-k2) moved onto T1 (k0-k1): both alive during k1.
    with pytest.raises(AssertionError, match=r"T1 at \[16, 32\) and T2 at \[16, 32\) overlap in DRAM"):
        check_placement(_with_offset(placed, "T2", 16))
    # T3 (k2-k3) onto T2 (k1-k2): both alive during k2.
    with pytest.raises(AssertionError, match=r"T2 at \[0, 16\) and T3 at \[0, 16\) overlap"):
        check_placement(_with_offset(placed, "T3", 0))
    check_placement(placed)


def test_locals_of_sibling_blocks_share_space_and_a_blocks_own_do_not():
    two = lowered(
        "function (A[M, K], B[K, N]) -> (C, D) { C[i, j : M, N] = +(A[i, k] * B[k, j]);"
        " D[i, j : M, N] = +(A[i, k] * B[k, j]); }",
        {"A": (4, 4), "B": (4, 4)},
    )
    out = run_pass("memory_placement", PLACE_ALL, run_pass("cache", CACHE_IN_OUT, tiled(two, 2)))
    check_placement(out)
    outer = [k for k in out.stmts[0].stmts if "outer" in k.tags]
    assert len(outer) == 2
    offsets = [{r.into: r.offset for r in k.refs if r.offset is not None} for k in outer]
    # each 2x2 fp32 tile is 16 bytes: three distinct slots in a block, the same three in its sibling
    assert sorted(offsets[0].values()) == [0, 16, 32]
    assert sorted(offsets[1].values()) == [0, 16, 32]
    # root buffers have no location: DRAM; the SRAM locals get their own arena
    assert all(r.offset is not None for r in out.refs)


def test_only_the_listed_memories_are_placed():
    program = run_pass("cache", CACHE_IN_OUT, tiled(lowered(MATMUL, {"A": (5, 4), "B": (4, 3)}), 2))
    out = run_pass("memory_placement", PLACE_DRAM, program)
    assert all(r.offset is not None for r in out.refs)
    assert all(r.offset is None for b in walk(out) if b is not out for r in b.refs)


# ------------------------------------------------------------------------------ meaning
def test_placement_of_drawn_optimized_programs_never_overlaps():
    changed = []

    @SETTINGS
    @given(programs(), st.sampled_from([None, 2, 3]), st.booleans(), st.sampled_from([1, 4, 16]))
    def prop(case, tile, scheduled, alignment):
        program, inputs = case
        before = program if tile is None else run_pass("cache", CACHE_IN_OUT, tiled(program, tile))
        if scheduled:
            before = run_pass("schedule", SCHEDULE, before, "accel")
        after = run_pass("memory_placement", {**PLACE_ALL, "alignment": alignment}, before)
        check_placement(after)
        for b in walk(after):
            assert all(r.offset is None or r.offset % alignment == 0 for r in b.refs)
        assert_same_meaning(program, after, inputs)
        changed.append(after != before)

    prop()
    assert sum(changed) >= len(changed) // 2, f"only {sum(changed)} of {len(changed)} programs changed"


# ------------------------------------------------------------------------------ LLVM
def test_placed_program_runs_on_llvm_like_the_interpreter():
    program = run_pass("schedule", SCHEDULE, parse_stripe(CHAIN.replace("(4:1)", "(64:1)")), "accel")
    out = run_pass("memory_placement", PLACE_ALL, program)
    check_placement(out)
    inputs = inputs_for(out, seed=7)
    got, _ = execute(out, inputs)
    np.testing.assert_array_equal(got["O"], run_stripe(program, inputs)["O"])


# ------------------------------------------------------------------------------ the accel picture
# The entries recommended for stripe/targets/accel.json (the seed's picture): convolutions tiled
# to fit one SRAM, their tiles staged by DMA, the other kernels scheduled through SRAM, and
# placement offsets in DRAM and SRAM.
ACCEL_PASSES = [
    {
        "name": "loc_conv",
        "pass": "locate_block",
        "params": {"reqs": ["contraction"], "loc": {"name": "CONV"}},
    },
    {"name": "loc_eltwise", "pass": "locate_block", "params": {"reqs": ["eltwise"], "loc": {"name": "DSP"}}},
    {
        "name": "tile_conv",
        "pass": "autotile",
        "params": {
            "reqs": ["contraction"],
            "memory": "SRAM",
            "outer_set": ["CONV"],
            "inner_set": ["CONV_inner"],
        },
    },
    {
        "name": "cache_conv",
        "pass": "cache",
        "params": {
            "reqs": ["CONV"],
            "dirs": ["in", "out"],
            "mem_loc": {"name": "SRAM"},
            "xfer_loc": {"name": "DMA"},
        },
    },
    {
        "name": "schedule_main",
        "pass": "schedule",
        "params": {
            "reqs": ["main"],
            "mem_loc": {"name": "SRAM"},
            "mem_KiB": 256,
            "alignment": 16,
            "xfer_loc": {"name": "DMA"},
            "allow_out_of_range_accesses": True,
            "num_banks": 4,
        },
    },
    {
        "name": "place_program",
        "pass": "memory_placement",
        "params": {"reqs": ["program"], "locs": [{"name": "DRAM"}], "alignment": 4},
    },
    {
        "name": "place_sram",
        "pass": "memory_placement",
        "params": {"reqs": ["program"], "locs": [{"name": "SRAM"}], "alignment": 16},
    },
]

CONV_RELU = """
function (I[X, Y, C], K[KX, KY, C, CO]) -> (R) {
    O[x, y, co : X, Y, CO] = +(I[x + kx - 1, y + ky - 1, ci] * K[kx, ky, ci, co]);
    R = relu(O);
}
"""


def test_recommended_accel_entries_stage_a_conv_through_dma_and_place_it():
    accel = json.loads((Path(stripe.__file__).parent / "targets" / "accel.json").read_text())
    config = parse_config(json.dumps({**accel, "passes": ACCEL_PASSES}), "accel+recommended")
    program = lowered(CONV_RELU, {"I": (6, 6, 3), "K": (3, 3, 3, 4)})
    out = optimize(program, config, check=True)
    check_placement(out)
    main = out.stmts[0]
    assert all("kernel" in k.tags for k in main.stmts)
    conv = next(k for k in main.stmts if "CONV" in k.tags)
    assert [sorted(b.tags) for b in conv.stmts] == [["xfer"], ["xfer"], ["CONV_inner"], ["xfer"]]
    assert all(b.location.name == "DMA" for b in conv.stmts if "xfer" in b.tags)
    assert any("swap_in" in k.tags for k in main.stmts)
    assert all(r.offset is not None for r in out.refs)
    assert all(r.offset is not None for r in conv.refs if r.location is not None)
    assert_same_meaning(program, out)
    inputs = inputs_for(out, seed=11)
    got, _ = execute(out, inputs)
    np.testing.assert_array_equal(got["R"], run_stripe(program, inputs)["R"])
