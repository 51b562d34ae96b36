"""The ``round_tf32`` builtin (docs/semantics.md §5.2): float32, then TF32, ties away from zero.

The interpreter against hand-computed bit patterns (ties of both signs, carries into the exponent,
the largest values rounding to inf, subnormals, nan and inf), every input type (float32 first:
a float64 tie of float32 decides), the precision modes (a float32 value in every one; exact mode
rounds the exact value once), the type rule and its errors, the pass-through gradient, the
compiled targets bit for bit against the interpreter on random float32 bit patterns, and PlaidML
0.7's device refusing it (it has no such builtin; needs no PlaidML).
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import ref_interp
import tile
from backends import registry
from backends.plaidml import differences
from backends.plaidml.device import PlaidMLDevice
from ref_interp.numerics import Numerics
from tile.dtypes import DType
from tile.errors import TileBackendError, TileNameError, TileTypeError
from tile.inputs import input_types
from tile.precision import split_3xtf32
from tile.printer import format_program
from tile.typed import TensorType

pytestmark = pytest.mark.usefixtures("private_cache")

SRC = "function (A) -> (O) { O = round_tf32(A); }"
TARGETS = ["llvm_cpu.0", "opencl_cpu.0"]


def bits(*words: int) -> np.ndarray:
    return np.array(words, dtype=np.uint32).view(np.float32)


def same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal float32 arrays bit for bit: signs of zeros and nan payloads included."""
    assert got.dtype == np.float32 and got.shape == want.shape, (got.dtype, got.shape)
    g, w = got.view(np.uint32), np.asarray(want, np.float32).view(np.uint32)
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, [(f"{w[k]:#010x}", f"{g[k]:#010x}") for k in bad[:8]]


# (input bits, rounded bits): TF32 keeps the top 10 of float32's 23 mantissa bits
EDGES = [
    (0x3F800000, 0x3F800000),  # 1
    (0x3F801000, 0x3F802000),  # 1 + 2^-11, halfway: away from zero (to even would give 1)
    (0xBF801000, 0xBF802000),  # -(1 + 2^-11): away from zero, negative
    (0x3F800FFF, 0x3F800000),  # just below halfway: down
    (0x3F801001, 0x3F802000),  # just above: up
    (0x3F803000, 0x3F804000),  # 1 + 3 * 2^-11: halfway between odd and even, away (up)
    (0xBF803000, 0xBF804000),
    (0x3FFFF000, 0x40000000),  # 2 - 2^-11, halfway below 2: the carry moves the exponent
    (0x3FFFFFFF, 0x40000000),  # 2 - 2^-23
    (0x7F7FFFFF, 0x7F800000),  # the largest float32: inf
    (0xFF7FFFFF, 0xFF800000),  # and -inf
    (0x7F7FF000, 0x7F800000),  # halfway past the largest TF32 value: inf
    (0x7F7FEFFF, 0x7F7FE000),  # below that: the largest TF32 value
    (0x7F7FE000, 0x7F7FE000),  # which stays
    (0x00000001, 0x00000000),  # 2^-149: 0
    (0x80000001, 0x80000000),  # -2^-149: -0
    (0x00001000, 0x00002000),  # 2^-137, halfway between 0 and 2^-136: away
    (0x80001000, 0x80002000),
    (0x00000FFF, 0x00000000),
    (0x007FFFFF, 0x00800000),  # the largest subnormal: carries to the smallest normal
    (0x00403000, 0x00404000),  # a subnormal tie, away
    (0x00000000, 0x00000000),
    (0x80000000, 0x80000000),  # -0 stays -0
    (0x7F800000, 0x7F800000),  # inf
    (0xFF800000, 0xFF800000),  # -inf
    (0x7FC00000, 0x7FC00000),  # nan
    (0x7FC01FFF, 0x7FC01FFF),  # nan with a payload: kept as it is (adding 0x1000 would change it)
    (0xFFC00000, 0xFFC00000),  # negative nan
    (0x3DCCCCCD, 0x3DCCC000),  # float32 0.1: 0.0999755859375
]
EDGE_IN = bits(*(a for a, _ in EDGES))
EDGE_OUT = bits(*(b for _, b in EDGES))


def test_edge_cases_bit_for_bit():
    same_bits(ref_interp.run(SRC, {"A": EDGE_IN})["O"], EDGE_OUT)


def test_values_in_words():
    got = ref_interp.run(SRC, {"A": np.float32([1 + 2**-11, -(1 + 2**-11), 2 - 2**-12, 3.4028235e38])})["O"]
    assert got.tolist() == [1 + 2**-10, -(1 + 2**-10), 2.0, math.inf]


def test_random_values_round_to_the_nearest_tf32_value_ties_away():
    """Against a closed form in float64: the nearest multiple of the TF32 ulp of |x|'s binade."""
    x = np.random.default_rng(5).standard_normal(4000).astype(np.float32) * np.float32(1e3)
    got = ref_interp.run(SRC, {"A": x})["O"].astype(np.float64)
    ulp = 2.0 ** (np.floor(np.log2(np.abs(x.astype(np.float64)))) - 10)
    want = np.sign(x) * np.floor(np.abs(x) / ulp + 0.5) * ulp  # (exact in float64)
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------ input types
@pytest.mark.parametrize(
    "values, want",
    [
        # 2^24 + 1 is 2^24 in float32 first
        (np.int32([2049, -2049, 2051, 16777217, 0]), [2050, -2050, 2052, 16777216, 0]),
        (np.uint64([2**64 - 1, 3]), [2.0**64, 3]),
        (np.array([True, False]), [1, 0]),
        (np.float16([1 + 2**-10, -65504, 6e-8]), [1 + 2**-10, -65504, np.float16(6e-8)]),  # exact
        (np.array([1 + 2**-7, 3], ml_dtypes.bfloat16), [1 + 2**-7, 3]),  # exact
        # float64 1 + 2^-11 - 2^-30 is a float32 tie (1 + 2^-11), which then rounds up; TF32 of the
        # float64 value directly would be 1
        (np.float64([1 + 2**-11 - 2**-30, 0.1, 1e39, -1e-50]), [1 + 2**-10, 0.0999755859375, math.inf, -0.0]),
    ],
    ids=["int32", "uint64", "bool", "float16", "bfloat16", "float64"],
)
def test_every_input_type_is_converted_to_float32_first(values, want):
    got = ref_interp.run(SRC, {"A": values})["O"]
    assert got.dtype == np.float32
    same_bits(got, np.float32(want))


# ---------------------------------------------------------------------- precision modes
def test_a_float32_value_in_every_precision_mode():
    ins = {"A": EDGE_IN}
    native = ref_interp.run(SRC, ins)["O"]
    for mode in ("float64", "tf32", "3xtf32"):
        same_bits(ref_interp.run(SRC, ins, mode)["O"].astype(np.float32), native)
    exact = ref_interp.run(SRC, ins, "exact")["O"]
    assert exact.dtype == object
    finite = np.isfinite(native)
    assert all(isinstance(v, Fraction) for v in exact[finite])
    np.testing.assert_array_equal(exact.astype(np.float64), native.astype(np.float64))
    # float64 mode stores float64, but the value is rounded: as_float(x, 32) there would not round
    wide = {"A": np.float64([1 + 2**-11 - 2**-30])}
    assert ref_interp.run(SRC, wide, "float64")["O"].tolist() == [1 + 2**-10]


def test_exact_mode_rounds_the_exact_value_once():
    """A - B is 1 + 2^-11 - 2^-24 - 2^-80 exactly: below the float32 tie 1 + 2^-11 - 2^-24, so float32
    1 + 2^-11 - 2^-23, then TF32 1. Through float64 (where A - B is A, a float32 tie that goes to
    even, 1 + 2^-11, then a TF32 tie going up) it would be 1 + 2^-10, as native and float64 give."""
    src = "function (A, B) -> (O) { O = round_tf32(A - B); }"
    ins = {"A": np.float64([1 + 2**-11 - 2**-24]), "B": np.float64([2.0**-80])}
    assert ref_interp.run(src, ins, "exact")["O"].tolist() == [Fraction(1)]
    assert ref_interp.run(src, ins)["O"].tolist() == [1 + 2**-10]
    assert ref_interp.run(src, ins, "float64")["O"].tolist() == [1 + 2**-10]


def test_fractions_to_float32_round_once_ties_to_even():
    to32 = Numerics("exact").float32_values
    x = np.random.default_rng(2).standard_normal(500) * 10.0 ** np.arange(-22, 28, 0.1)
    exact = np.array([Fraction(v) for v in x], dtype=object)
    np.testing.assert_array_equal(to32(exact), x.astype(np.float32))  # float64 to float32: one rounding
    tiny = Fraction(1, 2**150)  # half of the smallest subnormal
    halfway = Fraction(2**128 - 2**103)  # between the largest float32 (odd) and 2^128: to even, inf
    special = [tiny, 3 * tiny, -tiny, Fraction(10**400), -Fraction(10**400), halfway, halfway - tiny]
    special = np.array([*special, math.inf, math.nan], dtype=object)
    got = to32(special)
    same_bits(got[:7], np.float32([0, 2.0**-148, -0.0, math.inf, -math.inf, math.inf, 3.4028235e38]))
    assert math.isinf(got[7]) and math.isnan(got[8])


# ------------------------------------------------------------------------ types, errors
@pytest.mark.parametrize("dtype", ["bool", "int8", "uint64", "float16", "bfloat16", "float32", "float64"])
def test_the_result_is_float32_of_the_input_shape(dtype):
    prog = tile.parse("function (A[N, M]) -> (O) { O = round_tf32(A); }")
    bound = tile.bind(prog, {"A": TensorType(DType(dtype), (2, 3))})
    t = bound.types["O"]
    assert t.dtype is DType.FLOAT32 and t.shape == (2, 3)


@pytest.mark.parametrize(
    "call, error, text",
    [
        ("round_tf32(A, 32)", TileTypeError, "'round_tf32' takes 1 argument(s), got 2"),
        ("round_tf32()", TileTypeError, "'round_tf32' takes 1 argument(s), got 0"),
        ("round_tf3(A)", TileNameError, "round_tf32"),  # a close name is suggested
    ],
)
def test_wrong_calls_are_located_errors(call, error, text):
    with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)")) as info:
        ref_interp.run(f"function (A) -> (O) {{ O = {call}; }}", {"A": np.ones(2, np.float32)})
    assert info.value.span is not None


# ---------------------------------------------------------------------------- gradient
def test_the_gradient_passes_through():
    """d(round_tf32(X) * Y)/dX is Y: the adjoint passes through, as as_float's (docs §11)."""
    x = np.float32([1 + 2**-11, -0.3, 7.123, 1e-3])
    y = np.float32([2.0, -1.5, 0.25, 3.0])
    src = "function (X, Y) -> (O) { O = round_tf32(X) * Y; }"
    got = tile.grad_values(src, {"X": x, "Y": y})
    same_bits(got["X"], y)
    same_bits(got["Y"], ref_interp.run(SRC, {"A": x})["O"])
    wide = tile.grad_values(src, {"X": x.astype(np.float64), "Y": y})
    assert wide["X"].dtype == np.float64 and wide["X"].tolist() == y.tolist()  # in X's type
    chained = tile.grad_values("function (X) -> (O) { O = round_tf32(round_tf32(X * 3) * 2); }", {"X": x})
    same_bits(chained["X"], np.full(4, 6, np.float32))


# ---------------------------------------------------------------------- compiled targets
def compiled(target: str, src: str, inputs: dict) -> dict:
    if target not in registry.devices():
        pytest.skip(f"{target} is not available: {registry.unavailable().get(target, 'not registered')}")
    return tile.compile(src, target)(inputs)


def random_bits(n: int, seed: int) -> np.ndarray:
    """Random float32 bit patterns (every exponent, subnormals, nans and infs among them) with
    the edge cases, and values on and next to the rounding ties."""
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    near_ties = (words & np.uint32(0xFFFFE000)) | np.uint32(0x1000)
    near_ties = near_ties + rng.integers(-1, 2, n).astype(np.uint32)  # (wraps in uint32)
    return np.concatenate([EDGE_IN, words.view(np.float32), near_ties.view(np.float32)])


@pytest.mark.parametrize("target", TARGETS)
def test_targets_equal_the_interpreter_bit_for_bit(target):
    ins = {"A": random_bits(1 << 15, 7)}
    got = compiled(target, SRC, ins)["O"]
    same_bits(got, ref_interp.run(SRC, ins)["O"])
    same_bits(got[: len(EDGES)], EDGE_OUT)


@pytest.mark.parametrize("target", TARGETS)
def test_targets_convert_every_input_type_first(target):
    rng = np.random.default_rng(3)
    ins = {
        "D": np.concatenate([[1 + 2**-11 - 2**-30, 1e39, -1e-50, np.nan], rng.standard_normal(60)]),
        "H": rng.standard_normal(64).astype(np.float16),
        "I": np.concatenate([np.int32([2049, -2049, 16777217, 2**31 - 1]), rng.integers(-2**31, 2**31, 60)]),
        "U": rng.integers(0, 2**63, 64, dtype=np.uint64) * np.uint64(2),
        "B": rng.integers(0, 2, 64).astype(bool),
    }
    src = """function (D, H, I, U, B) -> (OD, OH, OI, OU, OB, OC) {
        OD = round_tf32(D); OH = round_tf32(H); OI = round_tf32(I); OU = round_tf32(U); OB = round_tf32(B);
        OC = round_tf32(0.1) + round_tf32(I * 2);
    }"""
    got, want = compiled(target, src, ins), ref_interp.run(src, ins)
    for name, w in want.items():
        same_bits(got[name], w)


@pytest.mark.parametrize("target", [*TARGETS, "interp"])
def test_the_3xtf32_split_it_is_written_for(target):
    """hi = round_tf32(x), lo = round_tf32(x - hi): tile.precision.split_3xtf32, on finite values."""
    x = random_bits(1 << 12, 11)
    x = x[np.isfinite(x)]
    src = "function (X) -> (HI, LO) { HI = round_tf32(X); LO = round_tf32(X - HI); }"
    got = ref_interp.run(src, {"X": x}) if target == "interp" else compiled(target, src, {"X": x})
    hi, lo = split_3xtf32(x)
    same_bits(got["HI"], hi)
    same_bits(got["LO"], lo)


# ------------------------------------------------------------------------------ PlaidML
def test_the_plaidml_device_refuses_it_before_plaidml_sees_it(monkeypatch):
    dev = PlaidMLDevice()
    monkeypatch.setattr(dev._worker, "run", lambda *a, **k: pytest.fail("the program reached PlaidML"))
    src = format_program(tile.parse("function (A) -> (O) { T = A * 2; O = exp(round_tf32(T)); }"))
    ins = {"A": np.ones(2, np.float32)}
    with pytest.raises(TileBackendError, match="PlaidML 0.7 has no builtin 'round_tf32'") as info:
        dev.execute(src, ins, {"O": (DType.FLOAT32, (2,))})
    assert info.value.span is not None and "round_tf32(T)" in str(info.value)  # located at the call
    problem = f"{dev.id} raised TileBackendError: {info.value}"
    assert dev.known_difference(src, problem).startswith("semantics §10.45:")
    # the differential peer (PlaidML itself) aborts on it: documented for that outcome too
    prog = tile.parse(src)
    shown = differences.program_differences(tile.bind(prog, input_types(prog, ins)))
    assert any(d.section == "10.45" and differences.ABORT in d.shows for d in shown)
