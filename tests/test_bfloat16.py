"""The bfloat16 dtype end to end: types and promotion, the interpreter's roundings, the text forms,
autodiff, and every compiled target (LLVM, OpenCL, the external protocol) against the interpreter.

Expected values are worked by hand from the format (8 significant bits, float32's exponent range):
near 1 the spacing is 2^-7, so 1 + 2^-8 is a tie (to even: 1) and 1 + 3*2^-8 rounds up to
1 + 2^-6.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import ref_interp
import tile
from backends import registry
from backends.external import ExternalDevice
from backends.program import ProgramRun
from stripe.lower import lower
from stripe.parser import parse_stripe
from stripe.printer import format_block
from tile import ast
from tile.bind import bind
from tile.dtypes import DType, promote
from tile.errors import TileDeviceError, TileTypeError
from tile.inputs import input_types, load_npz
from tile.precision import to_bfloat16

BF = ml_dtypes.bfloat16
ROGUE = Path(__file__).resolve().parent / "external_backends" / "rogue.py"


def bf(*xs) -> np.ndarray:
    return np.array(xs, dtype=BF)


def run(src: str, **ins):
    return ref_interp.run(src, ins)


def test_the_dtype_is_a_16_bit_float_with_ml_dtypes_arrays():
    assert DType.BFLOAT16.bits == 16 and DType.BFLOAT16.is_float and DType.BFLOAT16.is_signed
    assert DType.of(np.dtype(BF)) is DType.BFLOAT16 and DType.BFLOAT16.numpy == np.dtype(BF)


@pytest.mark.parametrize(
    "lhs, rhs, want",
    [
        ("bfloat16", "float16", "float32"),  # neither holds the other
        ("float16", "bfloat16", "float32"),
        ("bfloat16", "bfloat16", "bfloat16"),
        ("bfloat16", "float32", "float32"),
        ("float64", "bfloat16", "float64"),
        ("int64", "bfloat16", "bfloat16"),  # a float side wins, whatever its width
        ("bfloat16", "bool", "bfloat16"),
    ],
)
def test_promotion(lhs, rhs, want):
    assert promote(DType(lhs), DType(rhs)) is DType(want)


def test_each_operation_computes_in_float32_and_rounds_once_to_nearest_even():
    one = bf(1, 1, 1, 256)
    out = run("function (A, B) -> (O) { O = A + B; }", A=one, B=bf(2**-8, 3 * 2**-8, 2**-7, 1))["O"]
    assert out.dtype == BF
    # 1 + 2^-8: a tie, to even (1); 1 + 3*2^-8: up to 1 + 2^-6; 1 + 2^-7 exact; 257: a tie, to 256
    np.testing.assert_array_equal(out.astype(np.float64), [1, 1 + 2**-6, 1 + 2**-7, 256])
    # one rounding per operation: (1 + 2^-8) + 2^-8 is 1 + 0 + ..., never 1 + 2^-7
    two = run("function (A, B) -> (O) { O = A + B + B; }", A=bf(1), B=bf(2**-8))["O"]
    assert float(two[0]) == 1.0


def test_conversions_round_once_and_keep_nan_and_inf():
    # the double 1 + 2^-8 + 2^-30 lies above the tie: 1 + 2^-7 (ml_dtypes' double cast gives 1)
    x = np.array([1 + 2**-8 + 2**-30, np.nan, -np.inf, 1e39, 3.3895313892515355e38])
    out = run("function (D) -> (O) { O = as_bfloat(D, 16); }", D=x)["O"]
    assert out.dtype == BF
    got = out.astype(np.float64)
    assert got[0] == 1 + 2**-7 and np.isnan(got[1]) and got[2] == -np.inf and got[3] == np.inf
    assert got[4] == 3.3895313892515355e38  # the largest finite bfloat16 stays
    ints = run("function (I) -> (O) { O = as_bfloat(I, 16); }", I=np.array([257, 259, 16777217], np.int32))
    np.testing.assert_array_equal(ints["O"].astype(np.float64), [256, 260, 16777216])
    back = run("function (A) -> (O, P) { O = as_int(A, 32); P = as_float(A, 16); }", A=bf(-2.5, np.nan, 3))
    np.testing.assert_array_equal(back["O"], [-2, 0, 3])
    assert back["P"].dtype == np.float16


def test_as_bfloat_takes_only_the_width_16():
    with pytest.raises(TileTypeError, match="'as_bfloat' takes a width of 16, not 32"):
        run("function (A) -> (O) { O = as_bfloat(A, 32); }", A=np.ones(2, np.float32))


def test_bfloat16_and_float16_mix_in_float32():
    out = run("function (A, H) -> (O) { O = A + H; }", A=bf(1.5), H=np.array([2**-10], np.float16))["O"]
    assert out.dtype == np.float32 and out[0] == np.float32(1.5 + 2**-10)


def test_float64_and_exact_modes_do_not_round_to_bfloat16():
    src = "function (A) -> (O) { O = A / 3; }"
    assert ref_interp.run(src, {"A": bf(1)}, "float64")["O"][0] == 1 / 3
    assert ref_interp.run(src, {"A": bf(1)}, "exact")["O"][0] == __import__("fractions").Fraction(1, 3)
    assert float(ref_interp.run(src, {"A": bf(1)})["O"][0]) == 0.333984375  # 0x3eab


def test_softmax_of_bfloat16_sums_in_float32():
    x = np.zeros((1, 600), BF)
    out = run("function (X[R, C]) -> (O) { O = builtin_softmax(X, R, C); }", X=x)["O"]
    # a bfloat16 running sum of 600 ones stalls at 256; the float32 sum is 600
    assert out.dtype == BF and float(out[0, 0]) == float(to_bfloat16(np.float32(1 / 600)))


def test_text_forms_round_trip():
    src = "function (A[N]) -> (O) { O = as_bfloat(A * 2, 16); }"
    prog = tile.parse(src)
    assert tile.parse(ast.format_program(prog)) == prog
    bound = bind(prog, input_types(prog, {"A": bf(1, 2)}), {"A": bf(1, 2)})
    block = lower(bound)
    text = format_block(block)
    assert "bf16" in text and parse_stripe(text) == block


def test_gradient_keeps_bfloat16():
    src = "function (A[N], B[N]) -> (S) { S[] = +(A[i] * B[i]); }"
    g = tile.grad_values(src, {"A": bf(1, 2, 3), "B": bf(4, 5, 6)}, ["A", "B"])
    assert g["A"].dtype == BF and g["B"].dtype == BF
    np.testing.assert_array_equal(g["A"].astype(np.float64), [4, 5, 6])
    np.testing.assert_array_equal(g["B"].astype(np.float64), [1, 2, 3])


# ------------------------------------------------------------------------ compiled targets
PROGRAMS = [
    (
        "function (A, B) -> (O, P, Q, R, S, T) { O = A * B + A; P = as_float(A, 32) / 3; "
        "Q = as_bfloat(P, 16); R = as_int(A * 100, 32); S = sqrt(abs(A)); "
        "T = as_bfloat(as_float(B, 64) / 7, 16); }",
        {"A": bf(1.5, -2, 3.25, np.nan, np.inf, 257, 0.1), "B": bf(3, 0.5, -1, 2, 1, 1, 3)},
    ),
    (
        "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }",
        {"A": np.arange(-6, 6).reshape(3, 4).astype(BF), "B": np.arange(8).reshape(4, 2).astype(BF)},
    ),
    (
        "function (A, H) -> (O, P) { O = A + H; P = as_bfloat(H, 16) * 3; }",
        {"A": bf(1.5, 2, 300), "H": np.array([0.25, 1.0009765625, 65504], np.float16)},
    ),
    (
        "function (I, D) -> (O, P) { O = as_bfloat(I, 16); P = as_bfloat(D, 16); }",
        {
            "I": np.array([257, 259, 16777217, -33554435, 2**31 - 1], np.int32),
            "D": np.array([1 + 2**-8 + 2**-30, 1e39, -1e-40, 3.0e38, np.nan]),
        },
    ),
    ("function (A[N]) -> (O, M) { O[] = +(A[i]); M[] = >(A[i]); }", {"A": np.arange(10).astype(BF)}),
    (
        "function (X[R, C]) -> (O) { O = builtin_softmax(X, R, C); }",
        {"X": bf(1, 2, 3, 0, 0, 1).reshape(2, 3)},
    ),
]


def _device(dev_id: str):
    try:
        return registry.get(dev_id)
    except TileDeviceError as e:
        pytest.skip(f"{dev_id}: {e.message}")


def assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        g = np.asarray(got[k])
        assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, w.dtype)
        np.testing.assert_array_equal(g.astype(np.float64), w.astype(np.float64), err_msg=k)


@pytest.mark.parametrize("dev_id", ["llvm_cpu.0", "opencl_cpu.0"])
@pytest.mark.parametrize("strict", [False, True])
def test_compiled_targets_compute_bfloat16_as_the_interpreter(dev_id, strict):
    _device(dev_id)
    for src, ins in PROGRAMS:
        assert_same(tile.compile(src, dev_id, settings={"strict": strict})(**ins), ref_interp.run(src, ins))


def test_bfloat16_tensors_live_on_a_device():
    _device("llvm_cpu.0")
    t = tile.tensor(bf(1, 2.5, -3), device="llvm_cpu.0")
    out = tile.compile("function (A) -> (O) { O = A * A; }", "llvm_cpu.0")(A=t)["O"]
    assert out.dtype == BF
    np.testing.assert_array_equal(out.astype(np.float64), [1, 6.25, 9])


def test_the_external_protocol_carries_bfloat16():
    src, ins = PROGRAMS[1]
    target = f"external:{shlex.quote(sys.executable)} -m tile serve --target interp"
    try:
        assert_same(tile.compile(src, target)(**ins), ref_interp.run(src, ins))
    finally:  # its process stops here: tests/test_external.py counts the starts of this id
        registry.get(target).close()


def test_a_backend_that_does_not_announce_bfloat16_is_never_sent_it():
    # the rogue backend announces the twelve older dtypes (and would take 2 bytes for anything)
    dev = ExternalDevice(shlex.join([sys.executable, str(ROGUE), "tiny_limit"]), timeout=30, start_timeout=30)
    try:
        for src in ("function (A) -> (O) { O = A + 1; }", "function (F) -> (O) { O = as_bfloat(F, 16); }"):
            ins = {"A": bf(1, 2)} if "A" in src else {"F": np.ones(2, np.float32)}
            prog = tile.parse(src)
            with pytest.raises(TileDeviceError, match="do not include bfloat16"):
                ProgramRun(tile.bind(prog, input_types(prog, ins), ins), dev)(ins)
    finally:
        dev.close()


def test_npz_files_carry_bfloat16(tmp_path):
    """numpy saves bfloat16 as raw 2-byte records (|V2); the CLIs read them back as bfloat16."""
    src = tmp_path / "twice.tile"
    src.write_text("function (A) -> (O) { O = A * 2; }")
    np.savez(tmp_path / "in.npz", A=bf(1.5, -3))
    out = tmp_path / "out.npz"
    cmd = [sys.executable, "-m", "ref_interp", "run", str(src), "--inputs", str(tmp_path / "in.npz")]
    subprocess.run([*cmd, "--output", str(out)], check=True, capture_output=True)
    got = load_npz(str(out))["O"]
    assert got.dtype == BF
    np.testing.assert_array_equal(got.astype(np.float64), [3, -6])
