"""The interpreter's precision modes for matrix products (docs/semantics.md §8.1): float16 and
bfloat16 products accumulate in float32; ``tf32`` and ``3xtf32`` round float32 operands as a
matrix unit does. Every expected value is worked by hand in the comments.
"""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import ref_interp
import tile
from backends import registry
from tile.errors import TileDeviceError
from tile.precision import PRECISIONS, round_tf32, split_3xtf32, to_bfloat16
from tile.settings import TileSettingsError

DOT = "function (A[N], B[N]) -> (C) { C[] = +(A[i] * B[i]); }"
MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"


def f32(*xs) -> np.ndarray:
    return np.array(xs, np.float32)


def dot(a, b, precision="native") -> float:
    return float(ref_interp.run(DOT, {"A": a, "B": b}, precision)["C"])


# ------------------------------------------------------------------------- the roundings
def test_round_tf32_keeps_ten_bits_with_ties_away_from_zero():
    x = f32(1 + 2**-11, -(1 + 2**-11), 1 + 2**-12, 1 + 3 * 2**-11, 3.0, 2**-137, 2**-149)
    # 1 + 2^-11 is halfway between 1 and 1 + 2^-10: away from zero (nearest-even would give 1)
    want = [1 + 2**-10, -(1 + 2**-10), 1, 1 + 2**-9, 3, 2**-136, 0]
    np.testing.assert_array_equal(round_tf32(x), f32(*want))
    special = round_tf32(f32(np.nan, np.inf, -np.inf, np.finfo(np.float32).max))
    assert np.isnan(special[0]) and special[1] == np.inf and special[2] == -np.inf
    assert special[3] == np.inf  # the largest float32 is above TF32's largest plus half an ulp


def test_split_3xtf32_keeps_22_bits():
    x = f32(1 + 2**-11 + 2**-20, 1 / 3, -7.1)
    hi, lo = split_3xtf32(x)
    assert hi[0] == np.float32(1 + 2**-10) and lo[0] == np.float32(-(2**-11) + 2**-20)
    assert np.array_equal(round_tf32(hi), hi) and np.array_equal(round_tf32(lo), lo)
    rel = np.abs((hi.astype(np.float64) + lo) - x) / np.abs(x)
    assert (rel <= 2.0**-22).all()


def test_to_bfloat16_rounds_a_double_once():
    assert float(to_bfloat16(np.float64(1 + 2**-8 + 2**-30))) == 1 + 2**-7  # just above the tie
    assert float(to_bfloat16(np.float64(1 + 2**-8))) == 1  # the tie: to even


def test_the_modes_are_the_settings_values():
    assert PRECISIONS == ("native", "float64", "exact", "tf32", "3xtf32")


# -------------------------------------------------------------- float16 / bfloat16 products
@pytest.mark.parametrize(
    "dtype, big",
    [(np.float16, 2048.0), (ml_dtypes.bfloat16, 256.0)],  # where +1 first rounds away
)
def test_narrow_products_accumulate_in_float32_and_round_once(dtype, big):
    a, b = np.array([big, 1, 1], dtype), np.ones(3, dtype)
    # a running sum in the narrow type stalls: big + 1 is a tie that rounds back to big, twice.
    # In float32 the sum is big + 2, which the narrow type holds exactly.
    out = ref_interp.run(DOT, {"A": a, "B": b})["C"]
    assert out.dtype == np.dtype(dtype) and float(out) == big + 2
    # a sum that is not a product keeps the narrow running sum (§6.4's rule for `+`)
    plain = ref_interp.run("function (A[N]) -> (S) { S[] = +(A[i]); }", {"A": a})["S"]
    assert float(plain) == big


def test_float16_products_are_exact_before_the_sum():
    # (1 + 2^-10)^2 = 1 + 2^-9 + 2^-20: float16 would round the product to 1 + 2^-9, float32 keeps it;
    # then - (1 + 2^-9) leaves 2^-20, which float16 holds (a normal number)
    a = np.array([1 + 2**-10, 1 + 2**-9], np.float16)
    b = np.array([1 + 2**-10, -1], np.float16)
    assert dot(a, b) == 2**-20
    assert dot(a, b, "float64") == 2**-20


# --------------------------------------------------------------------------- tf32, 3xtf32
def test_tf32_rounds_the_operands_and_sums_in_float32():
    a, b = f32(1 + 2**-11, 2**-30), f32(1, 1)
    assert dot(a, b) == 1 + 2**-11  # native float32: 1 + 2^-11 + 2^-30 rounds to 1 + 2^-11
    assert dot(a, b, "tf32") == 1 + 2**-10  # the operand rounded first; 2^-30 lost in float32
    assert dot(a, b, "float64") == 1 + 2**-11 + 2**-30


def test_3xtf32_recovers_float32_but_drops_lo_times_lo():
    x = f32(1 + 2**-11)
    # (1 + 2^-11)^2 = 1 + 2^-10 + 2^-22, exact in float32; hi = 1 + 2^-10, lo = -2^-11: the three
    # terms give 1 + 2^-10, and the dropped lo*lo is the 2^-22
    assert dot(x, x) == 1 + 2**-10 + 2**-22
    assert dot(x, x, "tf32") == (1 + 2**-10) ** 2  # = 1 + 2^-9 + 2^-20, exact in float32
    assert dot(x, x, "3xtf32") == 1 + 2**-10
    y, one = f32(1 + 2**-11 + 2**-20), f32(1)
    assert dot(y, one, "3xtf32") == np.float32(1 + 2**-11 + 2**-20)  # hi + lo is y exactly


def test_tf32_leaves_other_contractions_and_types_alone():
    a = f32(1 + 2**-11, 3)
    assert ref_interp.run("function (A[N]) -> (S) { S[] = +(A[i]); }", {"A": a}, "tf32")["S"] == a.sum()
    m = ref_interp.run("function (A[N]) -> (S) { S[] = >(A[i] * A[i]); }", {"A": a}, "tf32")["S"]
    assert m == 9
    d = np.array([1 + 2**-40], np.float64)
    assert dot(d, np.ones(1), "tf32") == 1 + 2**-40  # float64 products are not rounded
    e = ref_interp.run("function (A) -> (O) { O = A * A; }", {"A": f32(1 + 2**-11)}, "tf32")["O"]
    assert e[0] == np.float32((1 + 2**-11) ** 2)  # elementwise stays native


def test_tf32_matmul_error_is_tf32_sized_and_3xtf32_float32_sized():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 128)).astype(np.float32)
    b = rng.standard_normal((128, 16)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    err = {
        p: (np.abs(ref_interp.run(MATMUL, {"A": a, "B": b}, p)["C"] - exact) / scale).max()
        for p in ("native", "tf32", "3xtf32")
    }
    assert 2.0**-14 < err["tf32"] < 2.0**-9  # operands to 11 bits: about 2^-11 per product
    assert err["native"] < 2.0**-20 and err["3xtf32"] < 2.0**-20


# ----------------------------------------------------------------------- settings and CLIs
def test_the_setting_reaches_the_interpreter_and_is_checked():
    x = {"A": f32(1 + 2**-11), "B": f32(1)}
    assert float(tile.compile(DOT, "interp", settings={"precision": "tf32"})(**x)["C"]) == 1 + 2**-10
    with pytest.raises(TileSettingsError, match="unknown precision 'tf33'") as e:
        tile.compile(DOT, "interp", settings={"precision": "tf33"})
    assert "did you mean 'tf32'?" in e.value.hint and "3xtf32" in e.value.hint


@pytest.mark.parametrize("mode", ["tf32", "3xtf32"])
def test_a_target_without_a_matrix_unit_computes_full_float32(mode):
    try:
        registry.get("llvm_cpu.0")
    except TileDeviceError as e:
        pytest.skip(e.message)
    x = {"A": f32(1 + 2**-11), "B": f32(1)}
    assert float(tile.compile(DOT, "llvm_cpu.0", settings={"precision": mode})(**x)["C"]) == 1 + 2**-11


def test_the_interpreter_cli_takes_the_modes(tmp_path):
    src = tmp_path / "dot.tile"
    src.write_text(DOT)
    np.savez(tmp_path / "in.npz", A=f32(1 + 2**-11), B=f32(1))
    out = tmp_path / "out.npz"
    cmd = [sys.executable, "-m", "ref_interp", "run", str(src), "--inputs", str(tmp_path / "in.npz")]
    subprocess.run([*cmd, "--precision", "tf32", "--output", str(out)], check=True, capture_output=True)
    assert float(np.load(out)["C"]) == 1 + 2**-10
    bad = subprocess.run([*cmd, "--precision", "tf33"], capture_output=True, text=True)
    assert bad.returncode == 2 and "3xtf32" in bad.stderr
