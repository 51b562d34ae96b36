"""Every builtin of ``tile.builtins.BUILTINS`` on the LLVM backend, for every dtype it accepts.

One program per builtin (``tests/builtin_cases.py``) applies it to a batch of dtype combinations
(one output each) and is compared with both interpreters: exactly, except for the C library's
transcendental functions, which may differ from numpy's own SIMD versions by a few units in the
last place. Inputs are integer-valued with each type's extremes mixed in, and for floats 0, ±inf,
nan, halves and values that overflow narrower types, so conversions, wrap-around, division by zero,
nan propagation and rounding are all exercised.
"""

from __future__ import annotations

import numpy as np
import pytest

from ref_interp.stripe_exec import run_stripe
from tests.builtin_cases import (
    ELEMENTWISE,
    RNG,
    STRUCTURAL,
    check_structural,
    combos,
    float16_case,
    program,
    structural_inputs,
)
from tests.llvm_runner import assert_same, build, check, execute, lowered
from tile.builtins import BUILTINS

pytestmark = pytest.mark.usefixtures("private_cache")
LIBM = {"exp", "log", "sin", "cos", "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan"}
LIBM |= {"asinh", "acosh", "atanh", "sigmoid", "pow", "builtin_binary_crossentropy"}


def test_the_table_is_covered():
    structural = {"index", "shape", "reshape", "gather", "scatter", "builtin_softmax", "builtin_logsoftmax"}
    structural |= {"prng_step", "prng_value", "prng_state", "simple_reduce"}
    assert set(ELEMENTWISE) | structural == set(BUILTINS)
    assert {n for n, _, _ in STRUCTURAL} == structural


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_elementwise_builtin(name):
    cases = combos(name)
    src, ins = program(name, cases)
    try:
        if name not in LIBM:
            check(src, ins)
            return
        p = lowered(src, ins)
        got, _ = execute(p, ins)
        want = run_stripe(p, ins)
        for k in got:
            dt = want[k].dtype
            assert_same({k: got[k]}, {k: want[k]}, ulps=1 if dt == np.float16 else 4)
    except AssertionError as e:
        raise AssertionError(f"{name}: outputs O<k> are the cases {list(enumerate(cases))}\n{e}") from None


@pytest.mark.parametrize("name, src, spec", STRUCTURAL, ids=[n for n, _, _ in STRUCTURAL])
def test_structural_builtin(name, src, spec):
    ins = structural_inputs(name, spec, RNG)
    check_structural(name, ins, check(src, ins))


def test_float16_without_f16c():
    """The integer-only float16 conversions give exactly what F16C does (and the interpreter)."""
    src, ins = float16_case()
    lib, _ = build(lowered(src, ins), {"soft_half": True, "cache": False})
    assert "half" not in lib.source
    check(src, ins, {"soft_half": True})
    check(src, ins)
