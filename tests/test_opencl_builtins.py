"""The builtins of ``tile.builtins.BUILTINS`` on the OpenCL backend, against the Tile interpreter.

One program per builtin applies it to a batch of dtype combinations (one output each; the inputs,
cases and programs of ``tests/test_llvm_builtins.py``: integer-valued with each type's extremes
and, for floats, 0, ±inf, nan, halves and values that overflow narrower types). Results must be
equal bit for bit, except OpenCL's transcendental functions, which the OpenCL specification allows a
few units in the last place (exp/log 3, sin/cos/sinh/cosh/asin/acos/asinh/acosh 4, tan/tanh/atan/
atanh 5, pow 16; numpy is itself within an ulp) and, in float16, one. Cases with float16 run on the
device with float16 forced on (``opencl_support.half_device``); the others through ``tile.compile``.
The float functions and conversions are in ``test_opencl_float_builtins.py`` (two files keep each
under a minute with a cold compiler cache).
"""

from __future__ import annotations

import numpy as np
import pytest

import ref_interp
from tests.opencl_support import (
    assert_same,
    half_device,
    private_cache,  # noqa: F401  (autouse fixture)
    requires_opencl,
    run,
)
from tests.test_llvm_builtins import ELEMENTWISE, STRUCTURAL, combos, program, values
from tile.builtins import BUILTINS

pytestmark = requires_opencl

ULPS = {"exp": 3, "log": 3, "sin": 4, "cos": 4, "tan": 5, "sinh": 4, "cosh": 4, "tanh": 5, "asin": 4}
ULPS |= {"acos": 4, "atan": 5, "asinh": 4, "acosh": 4, "atanh": 5, "pow": 16, "sigmoid": 5}
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
    assert set(CONVERSIONS) <= set(ELEMENTWISE) and len(FLOAT_FUNCTIONS) == 20


def cases_of(name: str) -> list:
    cases = combos(name)
    if name in FLOAT_FUNCTIONS or name.startswith(("as_", "cmp_")):
        cases = [c for c in cases if all(d in SOME for d in c[0])]
    return cases


def check_builtin(name: str) -> None:
    cases = cases_of(name)

    def half(case) -> bool:
        return "float16" in case[0] or (name == "as_float" and case[1] == (16,))

    groups = [([c for c in cases if not half(c)], None), ([c for c in cases if half(c)], half_device())]
    for group, dev in groups:
        if not group:
            continue
        src, ins = program(name, group)
        got = run(src, ins, dev)
        want = ref_interp.run(src, ins)
        try:
            for k in want:
                ulps = 0 if name not in ULPS else 1 if want[k].dtype == np.float16 else ULPS[name] + 1
                assert_same({k: got[k]}, {k: want[k]}, ulps)
        except AssertionError as e:
            raise AssertionError(
                f"{name}: outputs O<k> are the cases {list(enumerate(group))}\n{e}"
            ) from None


@pytest.mark.parametrize("name", OTHERS)
def test_elementwise_builtin(name):
    check_builtin(name)


@pytest.mark.parametrize("name, src, spec", STRUCTURAL, ids=[n for n, _, _ in STRUCTURAL])
def test_structural_builtin(name, src, spec):
    rng = np.random.default_rng(3)
    ins = {k: values(dt, shape) for k, (dt, shape) in spec.items()}
    if name == "scatter":
        ins["V"] = rng.integers(-1000, 1000, (6, 2)).astype(np.int16)  # int16 sums wrap
    dev = half_device() if any(dt == "float16" for dt, _ in spec.values()) else None
    got = run(src, ins, dev)
    assert_same(got, ref_interp.run(src, ins))
    if name == "gather":
        np.testing.assert_array_equal(got["O"], ins["D"][np.clip(ins["I"], 0, 4)])
    if name == "scatter":
        want = np.zeros((5, 2), np.int16)
        np.add.at(want, np.clip(ins["I"].astype(np.int64), 0, 4), ins["V"])
        np.testing.assert_array_equal(got["O"], want)
    if name == "builtin_logsoftmax":  # one column: log(1) == 0 exactly, except inf - inf
        x = ins["X"]
        np.testing.assert_array_equal(got["O"], np.where(np.isfinite(x), 0.0, np.nan))


def test_float16_conversions_and_arithmetic():
    """float16 through vload_half/vstore_half_rte: single correct roundings from every type,
    subnormals, overflow to inf, and arithmetic rounded after every operation."""
    src = """function (H, G, I, U, D, F, B) -> (O1, O2, O3, O4, O5, O6, O7, O8, O9, O10) {
        O1 = as_float(I, 16); O2 = as_float(U, 16); O3 = as_float(D, 16); O4 = as_float(F, 16);
        O5 = as_float(B, 16); O6 = as_int(H, 8); O7 = as_uint(H, 64); O8 = as_float(H, 64);
        O9 = H / G + sqrt(H); O10 = round(H * 0.3);
    }"""
    tiny = [6.1e-5, 5.96e-8, 2.98e-8, 2.99e-8, 65504, 65519.9, 65520, -3e-6, 1.00048828125, 1.000732421875]
    ins = {
        "H": np.concatenate([values("float16", (24,)), np.float16([6.1e-5, 5.96e-8, 65504, -3e-6])]),
        "G": values("float16", (28,)),
        "I": values("int32", (28,)),
        "U": values("uint64", (28,)),
        "D": np.concatenate([values("float64", (18,)), tiny]),
        "F": np.concatenate([values("float32", (18,)), np.float32(tiny)]),
        "B": values("bool", (28,)),
    }
    got = run(src, ins, half_device())
    assert_same(got, ref_interp.run(src, ins))
    assert got["O3"][-5] == np.float16(65504) and np.isinf(got["O3"][-4])  # 65519.9 rounds down, 65520 up
