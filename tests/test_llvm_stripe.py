"""The LLVM backend on hand-built Stripe (nested blocks, views, locals) and its threading rule.

Programs come from ``tests/stripe_builders.py``, shared with the Stripe interpreter's own tests;
each runs on the device and must equal ``run_stripe`` exactly, and numpy where it has a closed
form. The threading tests check the rule of ``backends/llvm/schedule.py`` on kernels where
splitting the first index would race, and that split kernels really use several threads.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from backends.llvm import LlvmCpuDevice
from backends.llvm.schedule import plan
from ref_interp.stripe_exec import run_stripe
from stripe.ir import Block
from tests.llvm_runner import assert_same, buffer_names, execute, lowered
from tests.stripe_builders import (
    F32,
    I32,
    STRUCTURAL,
    load_index_program,
    matmul_program,
    offsets_program,
    reduce_program,
)
from tile.dtypes import DType

pytestmark = pytest.mark.usefixtures("private_cache")
RNG = np.random.default_rng(5)
FOUR = LlvmCpuDevice(threads=4)


def ints(shape, dtype=np.float32, lo=-4, hi=5):
    return RNG.integers(lo, hi, size=shape).astype(dtype)


def same(program: Block, inputs: dict | None = None, settings: dict | None = None, device=None) -> dict:
    """The device's outputs, after checking they equal the Stripe interpreter's exactly."""
    inputs = inputs or {}
    got, kernels = execute(program, inputs, settings, **({"device": device} if device else {}))
    assert_same(got, run_stripe(program, inputs))
    return got


@pytest.mark.parametrize("name", STRUCTURAL)
def test_structural_case(name):
    """``stripe_builders.STRUCTURAL``: equal to the interpreter and the closed forms, reordered or not."""
    case = STRUCTURAL[name](RNG)
    for settings in ({}, {"reorder": False}):
        case.check(same(case.program, case.inputs, settings))


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("agg", ["add", "mul", "max", "min", "assign", ""])
@pytest.mark.parametrize("dt", [I32, F32, DType.BOOL, DType.UINT8])
def test_every_agg_op_with_and_without_init(agg, nested, dt):
    x = ints((3, 4), dt.numpy, -3 if dt.is_signed else 0, 4)
    for init in (True, False):
        same(reduce_program(agg, dt, x.shape, 2, nested, init), {"X": x})


def test_load_index_with_an_inexact_float_constant():
    same(load_index_program(0.1), {"A": ints(3)})


# -------------------------------------------------------------------------- threading rule
@pytest.mark.parametrize(
    "spec, access, owned",
    [
        ("i:64 k:2", "2*i + k", ("i", "k")),  # rows of 2: both owned, no two points share an element
        ("i:64 k:3", "2*i + k", ()),  # windows overlap: neither
        ("i:64 k:64", "i + k", ()),  # the classic race: O[i + k]
        ("k:64 i:64", "i", ("i",)),  # reduction index first: split over i, k stays in order inside
    ],
)
def test_owned_indexes(spec, access, owned):
    program = offsets_program(spec, access)
    k = program.stmts[0].stmts[0]
    s = plan(k, buffer_names(k), threads=4)
    assert s.owned == owned and s.split == bool(owned)
    if owned:
        assert s.split_index == [ix.name for ix in k.idxs].index(owned[0])
    # random floats: any change in the order of one element's additions would show
    a, b = RNG.standard_normal(64).astype(np.float32), RNG.standard_normal(64).astype(np.float32)
    # (strict: no fused multiply-add, so the order is all that could differ)
    got, kernels = execute(program, {"A": a, "B": b}, {"min_parallel_points": 1, "strict": True}, device=FOUR)
    assert_same(got, run_stripe(program, {"A": a, "B": b}))
    assert len(set(kernels[0].last_threads)) == (4 if owned else 1)


def test_lowered_reduction_first_kernel_splits_over_the_output_index():
    src = "function (A[N, M]) -> (O) { O[j : M] = +(A[i, j]); }"
    a = RNG.standard_normal((3000, 8)).astype(np.float32)
    program = lowered(src, {"A": a})
    main = program.stmts[0]
    k = main.stmts[-1]
    assert [ix.name for ix in k.idxs] == ["j", "i"]  # lowered in the interpreter's order
    k = replace(k, idxs=k.idxs[::-1])  # listed reduction first (as a pass may list them)
    program = replace(program, stmts=(replace(main, stmts=(*main.stmts[:-1], k)),))
    assert plan(k, buffer_names(k), 4).owned == ("j",)
    assert not plan(k, buffer_names(k), 4, reorder=False).split  # Stripe's order: i first, not owned
    want = run_stripe(program, {"A": a})
    for settings in ({}, {"reorder": False}):  # strict: float sums not reassociated
        got, kernels = execute(program, {"A": a}, {**settings, "strict": True}, device=FOUR)
        assert_same(got, want)
        assert len(set(kernels[-1].last_threads)) == (4 if not settings else 1)


def test_kernels_run_on_several_threads_with_the_same_answer():
    m, n, kk = 64, 48, 96
    program = matmul_program(m, n, kk)
    ins = {
        "A": RNG.standard_normal((m, kk)).astype(np.float32),
        "B": RNG.standard_normal((kk, n)).astype(np.float32),
    }
    parallel, kernels = execute(program, ins, device=FOUR)
    assert len(set(kernels[0].last_threads)) == 4
    assert kernels[0].ranges() == [(0, 16), (16, 32), (32, 48), (48, 64)]
    single, kernels = execute(program, ins, {"parallel": False}, device=FOUR)
    assert len(kernels[0].last_threads) == 1
    assert_same(parallel, single)
    strict, _ = execute(program, ins, {"strict": True}, device=FOUR)  # no fma: bit-exact
    assert_same(strict, run_stripe(program, ins))
