"""The ``schedule`` pass: a Before/Expected pair in Stripe text (three kernels in a memory of three
regions, forcing an eviction with a swap-out), refusals, meaning by the interpreter on
Hypothesis-drawn programs (tiled or not, with small memories), and LLVM runs."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ref_interp.stripe_exec import run_stripe
from stripe.ir import walk
from stripe.parser import parse_stripe
from tests.llvm_runner import execute
from tests.pass_support import assert_same_meaning, check_rewrite, inputs_for, lowered, programs, run_pass
from tests.test_pass_cache import CACHE_IN_OUT, MATMUL, SETTINGS, tiled

CHAIN = "function (A[N], B[N]) -> (T, O) { T = A + 1; U = T * A; O = U + B; }"
# Three regions of 64 fp32 (256 bytes each) fit 0.75 KiB.
SCHEDULE = {
    "reqs": ["main"],
    "mem_loc": {"name": "SRAM"},
    "mem_KiB": 0.75,
    "xfer_loc": {"name": "DMA"},
    "alignment": 16,
}

THREE_KERNELS = """
    0: #program block [] ( // program
        #input #user none A[0] fp32(64:1)
        #input #user none B[0] fp32(64:1)
        #output #user none T[0] fp32(64:1)
        #tmp none U[0] fp32(64:1)
        #output #user none O[0] fp32(64:1)
    ) {
      0: #main block [] ( // main
          in A[0] fp32(64:1)
          in B[0] fp32(64:1)
          out T[0] fp32(64:1)
          inout U[0] fp32(64:1)
          out O[0] fp32(64:1)
      ) {
        0: #eltwise #eltwise_add #kernel block [i0:64] ( // k0_T
            in A[i0] fp32(1:1)
            out T[i0]:assign fp32(1:1)
        ) {
          0: $A = load(A)
          1: $t1 = (i32)1
          2: $t2 = add($A, $t1):fp32
          3: T = store($t2)
        }
        1: #eltwise #eltwise_mul #kernel block [i0:64] ( // k1_U
            in T[i0] fp32(1:1)
            in A[i0] fp32(1:1)
            out U[i0]:assign fp32(1:1)
        ) {
          0: $T = load(T)
          1: $A = load(A)
          2: $t2 = mul($T, $A):fp32
          3: U = store($t2)
        }
        2: #eltwise #eltwise_add #kernel block [i0:64] ( // k2_O
            in U[i0] fp32(1:1)
            in B[i0] fp32(1:1)
            out O[i0]:assign fp32(1:1)
        ) {
          0: $U = load(U)
          1: $B = load(B)
          2: $t2 = add($U, $B):fp32
          3: O = store($t2)
        }
      }
    }
"""

# k0 needs A and T; k1 reuses both (resident) and adds U; k2 needs U, B and O: A (clean) and T
# (dirty, an output) are used farthest in the future (never), so T is swapped out and both
# evicted. No swap-in for regions a kernel overwrites whole (T, U, O); U is a temporary nobody
# reads later, so it is not written back.
THREE_KERNELS_SCHEDULED = """
    0: #program block [] ( // program
        #input #user none A[0] fp32(64:1)
        #input #user none B[0] fp32(64:1)
        #output #user none T[0] fp32(64:1)
        #tmp none U[0] fp32(64:1)
        #output #user none O[0] fp32(64:1)
        #tmp none<SRAM> A_s[0] fp32(64:1)
        #tmp none<SRAM> T_s[0] fp32(64:1)
        #tmp none<SRAM> U_s[0] fp32(64:1)
        #tmp none<SRAM> B_s[0] fp32(64:1)
        #tmp none<SRAM> O_s[0] fp32(64:1)
    ) {
      0: #main block [] ( // main
          in A[0] fp32(64:1)
          in B[0] fp32(64:1)
          out T[0] fp32(64:1)
          inout U[0] fp32(64:1)
          out O[0] fp32(64:1)
          inout<SRAM> A_s[0] fp32(64:1)
          inout<SRAM> T_s[0] fp32(64:1)
          inout<SRAM> U_s[0] fp32(64:1)
          inout<SRAM> B_s[0] fp32(64:1)
          inout<SRAM> O_s[0] fp32(64:1)
      ) {
        0: #kernel #swap_in #xfer block<DMA> [d0:64] ( // swap_in A_s
            in A[d0] fp32(1:1)
            out A_s[d0]:assign fp32(1:1)
        ) {
          0: $x = load(A)
          1: A_s = store($x)
        }
        1: #eltwise #eltwise_add #kernel block [i0:64] ( // k0_T
            in<SRAM> A = A_s[i0] fp32(1:1)
            out<SRAM> T = T_s[i0]:assign fp32(1:1)
        ) {
          0: $A = load(A)
          1: $t1 = (i32)1
          2: $t2 = add($A, $t1):fp32
          3: T = store($t2)
        }
        2: #eltwise #eltwise_mul #kernel block [i0:64] ( // k1_U
            in<SRAM> T = T_s[i0] fp32(1:1)
            in<SRAM> A = A_s[i0] fp32(1:1)
            out<SRAM> U = U_s[i0]:assign fp32(1:1)
        ) {
          0: $T = load(T)
          1: $A = load(A)
          2: $t2 = mul($T, $A):fp32
          3: U = store($t2)
        }
        3: #kernel #swap_out #xfer block<DMA> [d0:64] ( // swap_out T_s
            in T_s[d0] fp32(1:1)
            out T[d0]:assign fp32(1:1)
        ) {
          0: $x = load(T_s)
          1: T = store($x)
        }
        4: #kernel #swap_in #xfer block<DMA> [d0:64] ( // swap_in B_s
            in B[d0] fp32(1:1)
            out B_s[d0]:assign fp32(1:1)
        ) {
          0: $x = load(B)
          1: B_s = store($x)
        }
        5: #eltwise #eltwise_add #kernel block [i0:64] ( // k2_O
            in<SRAM> U = U_s[i0] fp32(1:1)
            in<SRAM> B = B_s[i0] fp32(1:1)
            out<SRAM> O = O_s[i0]:assign fp32(1:1)
        ) {
          0: $U = load(U)
          1: $B = load(B)
          2: $t2 = add($U, $B):fp32
          3: O = store($t2)
        }
        6: #kernel #swap_out #xfer block<DMA> [d0:64] ( // swap_out O_s
            in O_s[d0] fp32(1:1)
            out O[d0]:assign fp32(1:1)
        ) {
          0: $x = load(O_s)
          1: O = store($x)
        }
      }
    }
"""


def test_three_kernels_in_a_tiny_memory_evict_the_farthest_used():
    out = check_rewrite("schedule", SCHEDULE, THREE_KERNELS, THREE_KERNELS_SCHEDULED, "accel")
    assert_same_meaning(parse_stripe(THREE_KERNELS), out)
    main = out.stmts[0]
    assert all("kernel" in k.tags for k in main.stmts)


def test_a_kernel_whose_footprint_does_not_fit_is_left_unstaged_with_a_comment():
    program = parse_stripe(THREE_KERNELS)
    out = run_pass("schedule", {**SCHEDULE, "mem_KiB": 0.5}, program, "accel")
    k1 = next(k for k in out.stmts[0].stmts if k.name == "k1_U")
    assert any(c.startswith("schedule: not staged:") for c in k1.comments)
    assert all(r.from_ is None for r in k1.refs)
    assert_same_meaning(program, out)


def test_nothing_fits_leaves_the_program_alone():
    program = parse_stripe(THREE_KERNELS)
    assert run_pass("schedule", {**SCHEDULE, "mem_KiB": 0.1}, program, "accel") == program


def test_banks_give_each_region_a_unit():
    program = parse_stripe(THREE_KERNELS)
    out = run_pass("schedule", {**SCHEDULE, "mem_KiB": 0.25, "num_banks": 3}, program, "accel")
    units = {r.location.units[0].const for r in out.refs if r.location is not None}
    assert units == {0, 1, 2}
    assert_same_meaning(program, out)


def test_a_buffer_written_unstaged_is_written_back_first_and_dropped():
    # k0 (staged) writes T; a kernel too large to stage then reads T and writes O: T must be
    # swapped out before it, and O read afterwards from the buffer.
    src = "function (A[N], B[N, N]) -> (O, P) { T = A + 1; O[i : N] = +(T[j] * B[j, i]); P = O + T; }"
    program = lowered(src, {"A": (8,), "B": (8, 8)})
    out = run_pass("schedule", {**SCHEDULE, "mem_KiB": 0.1}, program, "accel")
    assert out != program
    assert_same_meaning(program, out)


def test_kernels_that_cache_their_own_tiles_are_left_to_it():
    program = run_pass("cache", CACHE_IN_OUT, tiled(lowered(MATMUL, {"A": (7, 5), "B": (5, 6)}), 3))
    out = run_pass("schedule", SCHEDULE, program, "accel")
    outer = next(k for k in out.stmts[0].stmts if "outer" in k.tags)
    assert outer.comments[-1] == "schedule: not staged: it stages its own data in SRAM"
    assert_same_meaning(program, out)


def test_in_a_tile_loop_only_what_is_read_is_staged():
    program = tiled(lowered(MATMUL, {"A": (5, 4), "B": (4, 3)}), {"i": 2, "j": 2, "k": 3})
    out = run_pass("schedule", {**SCHEDULE, "reqs": ["outer"], "mem_KiB": 0.1}, program, "accel")
    outer = out.stmts[0].stmts[1]
    assert [r.into for r in outer.refs if r.location is not None] == ["A_s", "B_s"]
    assert [sorted(b.tags) for b in outer.stmts] == [["swap_in", "xfer"], ["swap_in", "xfer"], ["inner"]]
    # the partial last tiles are copied only inside A and B
    assert len(outer.stmts[0].constraints) == 2 and len(outer.stmts[1].constraints) == 2
    assert_same_meaning(program, out)


# ------------------------------------------------------------------------------ meaning
def test_schedule_keeps_the_meaning_of_drawn_programs():
    changed = []

    @SETTINGS
    @given(
        programs(),
        # a tile loop ("outer") exists only in tiled programs
        st.sampled_from([(None, ["main"]), (2, ["main"]), (3, ["main"]), (2, ["outer"]), (3, ["outer"])]),
        st.sampled_from([0.01, 0.03, 0.1, 1.0]),
        st.sampled_from([1, 16]),
        st.sampled_from([None, 2]),
    )
    def prop(case, where, kib, alignment, banks):
        program, inputs = case
        tile, reqs = where
        before = program if tile is None else tiled(program, tile)
        params = {**SCHEDULE, "reqs": reqs, "mem_KiB": kib, "alignment": alignment, "num_banks": banks}
        after = run_pass("schedule", params, before, "accel")
        assert all("kernel" in k.tags for k in after.stmts[0].stmts)
        assert_same_meaning(program, after, inputs)
        changed.append(after != before)

    prop()
    assert sum(changed) >= len(changed) // 3, f"only {sum(changed)} of {len(changed)} programs changed"


# ------------------------------------------------------------------------------ LLVM
def test_scheduled_programs_run_on_llvm_like_the_interpreter():
    for program in (
        parse_stripe(THREE_KERNELS),
        tiled(lowered(MATMUL, {"A": (7, 5), "B": (5, 6)}), 3),
    ):
        out = run_pass("schedule", SCHEDULE, program, "accel")
        assert any("swap_in" in b.tags for b in walk(out)) and out != program
        inputs = inputs_for(out, seed=5)
        got, _ = execute(out, inputs)
        want = run_stripe(program, inputs)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
