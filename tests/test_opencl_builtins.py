"""The builtins of ``tile.builtins.BUILTINS`` on the OpenCL backend, against the Tile interpreter.

One program per builtin applies it to a batch of dtype combinations (one output each; the inputs,
cases and programs of ``tests/builtin_cases.py``, shared with ``test_llvm_builtins.py``:
integer-valued with each type's extremes and, for floats, 0, ±inf, nan, halves and values that
overflow narrower types). Results must be
equal bit for bit, except OpenCL's transcendental functions, which the OpenCL specification allows a
few units in the last place (exp/log 3, sin/cos/sinh/cosh/asin/acos/asinh/acosh 4, tan/tanh/atan/
atanh 5, pow 16; numpy is itself within an ulp) and, in float16, one. Every case runs through
``tile.compile`` (float16 needs no ``cl_khr_fp16``: it is computed in float and stored with
``vload_half``/``vstore_half_rte``).
The float functions and conversions are in ``test_opencl_float_builtins.py`` (two files keep each
under a minute with a cold compiler cache).
"""

from __future__ import annotations

import numpy as np
import pytest

import ref_interp
from tests import builtin_cases
from tests.builtin_cases import ELEMENTWISE, STRUCTURAL
from tests.opencl_support import assert_same, requires_opencl, run
from tile.builtins import BUILTINS

pytestmark = [requires_opencl, pytest.mark.usefixtures("private_cache")]

ULPS = {"exp": 3, "log": 3, "sin": 4, "cos": 4, "tan": 5, "sinh": 4, "cosh": 4, "tanh": 5, "asin": 4}
ULPS |= {"acos": 4, "atan": 5, "asinh": 4, "acosh": 4, "atanh": 5, "pow": 16, "sigmoid": 5}
ULPS |= {"builtin_binary_crossentropy": 8}  # two logs (3 each), then a product and a difference
# a representative set of operand types for the float functions, comparisons and conversions (the
# arithmetic and bit builtins get every type)
SOME = {"bool", "int8", "uint16", "int32", "uint64", "int64", "float16", "float32", "float64"}
FLOAT_FUNCTIONS = [n for n in ELEMENTWISE if BUILTINS[n].rule.__name__ == "_floaty"]
CONVERSIONS = ["as_float", "as_int", "as_uint", "as_bool"]
OTHERS = [n for n in ELEMENTWISE if n not in FLOAT_FUNCTIONS and n not in CONVERSIONS]


def test_the_table_is_covered():
    structural = {n for n, _, _ in STRUCTURAL}
    assert set(ELEMENTWISE) | structural == set(BUILTINS)
    assert not set(ELEMENTWISE) & structural
    assert set(CONVERSIONS) <= set(ELEMENTWISE) and len(FLOAT_FUNCTIONS) == 22


def cases_of(name: str) -> list:
    cases = builtin_cases.combos(name)
    if name in FLOAT_FUNCTIONS or name.startswith(("as_", "cmp_")):
        cases = [c for c in cases if all(d in SOME for d in c[0])]
    return cases


def check_builtin(name: str) -> None:
    cases = cases_of(name)
    src, ins = builtin_cases.program(name, cases)
    got = run(src, ins)
    want = ref_interp.run(src, ins)
    try:
        for k in want:
            ulps = 0 if name not in ULPS else 1 if want[k].dtype == np.float16 else ULPS[name] + 1
            assert_same({k: got[k]}, {k: want[k]}, ulps)
    except AssertionError as e:
        raise AssertionError(f"{name}: outputs O<k> are the cases {list(enumerate(cases))}\n{e}") from None


@pytest.mark.parametrize("name", OTHERS)
def test_elementwise_builtin(name):
    check_builtin(name)


@pytest.mark.parametrize("name, src, spec", STRUCTURAL, ids=[n for n, _, _ in STRUCTURAL])
def test_structural_builtin(name, src, spec):
    ins = builtin_cases.structural_inputs(name, spec, np.random.default_rng(3))
    got = run(src, ins)
    assert_same(got, ref_interp.run(src, ins))
    builtin_cases.check_structural(name, ins, got)


def test_float16_conversions_and_arithmetic():
    """float16 through vload_half/vstore_half_rte: single correct roundings from every type,
    subnormals, overflow to inf, and arithmetic rounded after every operation."""
    src, ins = builtin_cases.float16_case()
    got = run(src, ins)
    assert_same(got, ref_interp.run(src, ins))
    assert got["O3"][-5] == np.float16(65504) and np.isinf(got["O3"][-4])  # 65519.9 rounds down, 65520 up
