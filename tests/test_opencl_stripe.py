"""The OpenCL backend on hand-built Stripe (nested blocks, views, locals) and its work-item rule.

Programs come from ``tests/stripe_builders.py`` (as in ``test_llvm_stripe.py``); each runs through
the HAL (``tests/llvm_runner.py``'s ``build`` and ``execute``) on the OpenCL device and must equal
``run_stripe`` exactly, and numpy where it has a closed form. The work-item tests check that a
kernel is spread over exactly its owned indexes and that, on random floats, every element still receives
its writes in the interpreter's order.
"""

from __future__ import annotations

import numpy as np
import pytest

from ref_interp.stripe_exec import run_stripe
from stripe.ir import Block
from tests.llvm_runner import build, execute
from tests.opencl_support import assert_same, device, requires_opencl
from tests.stripe_builders import F32, I32, STRUCTURAL, offsets_program, reduce_program
from tile.dtypes import DType

pytestmark = [requires_opencl, pytest.mark.usefixtures("private_cache")]
RNG = np.random.default_rng(9)


def ints(shape, dtype=np.float32, lo=-4, hi=5):
    return RNG.integers(lo, hi, size=shape).astype(dtype)


def same(program: Block, inputs: dict | None = None) -> dict:
    got, _ = execute(program, inputs or {}, device=device())
    assert_same(got, run_stripe(program, inputs or {}))
    return got


@pytest.mark.parametrize("name", STRUCTURAL)
def test_structural_case(name):
    """``stripe_builders.STRUCTURAL``: equal to the interpreter and to the closed forms."""
    case = STRUCTURAL[name](RNG)
    case.check(same(case.program, case.inputs))


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("agg", ["add", "mul", "max", "min", "assign", ""])
def test_every_agg_op_in_a_kernel_and_a_nested_block(agg, nested):
    dt = [I32, F32, DType.BOOL, DType.UINT8][len(agg) % 4]
    x = ints((3, 4), dt.numpy, -3 if dt.is_signed else 0, 4)
    same(reduce_program(agg, dt, x.shape, 2, nested, init=True), {"X": x})


@pytest.mark.parametrize(
    "spec, access, owned, work",
    [
        ("i:64 k:2", "2*i + k", ("i", "k"), 128),  # rows of 2: both owned
        ("i:64 k:3", "2*i + k", (), 1),  # windows overlap: neither, one work-item
        ("i:64 k:64", "i + k", (), 1),  # the classic race: O[i + k]
        ("k:64 i:64", "i", ("i",), 64),  # reduction index first: k stays in order inside
    ],
)
def test_work_items_are_the_owned_indexes(spec, access, owned, work):
    program = offsets_program(spec, access)
    # random floats: any change in the order of one element's additions would show
    ins = {"A": RNG.standard_normal(64).astype(np.float32), "B": RNG.standard_normal(64).astype(np.float32)}
    library, _ = build(program, {"local_size": 16, "tiled": False}, device())  # the general kernel
    got, _ = execute(program, ins, device=device(), library=library)
    assert library.extra["owned"] == [owned] and library.extra["work_items"] == [work]
    assert_same(got, run_stripe(program, ins))
