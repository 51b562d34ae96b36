"""Reductions along a contiguous axis run as vector loops (backends/llvm/rowreduce.py): the plan
matches them (and only them), the code holds vector reductions, and the results equal the
interpreter's on integer-valued inputs, with NaN winning a max and every tail length covered."""

from __future__ import annotations

import numpy as np
import pytest

import ref_interp
import tile
from tests.llvm_runner import build, execute, lowered


def kernels_of(src: str, inputs: dict, settings: dict | None = None):
    library, _ = build(lowered(src, inputs), {"cache": False, **(settings or {})})
    return library


def ints(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).integers(-50, 50, shape).astype(dtype)


@pytest.mark.parametrize("agg, reduce", [(">", "fmaximum"), ("<", "fminimum"), ("+", "fadd")])
def test_row_reductions_are_vector_reductions(agg, reduce):
    x = ints(64, 64)
    src = f"function (X[R, L]) -> (O) {{ O[i : R] = {agg}(X[i, j]); }}"
    text = kernels_of(src, {"X": x}).source or ""
    if not text:
        pytest.skip("the library keeps no LLVM source to inspect")
    assert f"llvm.vector.reduce.{reduce}.v16f32" in text or f"llvm.vector.reduce.{reduce}.v8f32" in text


def test_strict_keeps_the_order():
    x = ints(64, 64)
    src = "function (X[R, L]) -> (O) { O[i : R] = +(X[i, j]); }"
    text = kernels_of(src, {"X": x}, {"strict": True}).source or ""
    if not text:
        pytest.skip("the library keeps no LLVM source to inspect")
    assert "llvm.vector.reduce" not in text


@pytest.mark.parametrize("length", [16, 17, 31, 33, 64, 65, 100, 130])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_tail_exact(length, dtype):
    x = ints(37, length, dtype=dtype, seed=length)
    for agg, want in ((">", x.max(1)), ("<", x.min(1)), ("+", x.sum(1))):
        src = f"function (X[R, L]) -> (O) {{ O[i : R] = {agg}(X[i, j]); }}"
        got, _ = execute(lowered(src, {"X": x}), {"X": x})
        np.testing.assert_array_equal(got["O"], want, err_msg=f"{agg} over {length}")


def test_products_offsets_and_broadcasts_against_the_interpreter():
    x, y, s = ints(5, 6, 40), ints(6, 40, seed=1), ints(5, seed=2)
    cases = {
        "dot": "O[a, b : A, B] = +(X[a, b, j] * Y[b, j])",
        "shifted": "O[a, b : A, B] = >(X[a, b, j] + S[a])",
        "window": "O[a, b : A, B] = +(X[a, b, j + 3] * Y[b, j]), j < 30",
    }
    for name, body in cases.items():
        src = f"function (X[A, B, L], Y[B, L], S[A]) -> (O) {{ {body}; }}"
        inputs = {"X": x, "Y": y, "S": s}
        got, _ = execute(lowered(src, inputs), inputs)
        want = ref_interp.run(src, inputs)
        np.testing.assert_array_equal(got["O"], want["O"], err_msg=name)


def test_nan_wins_a_row_max_anywhere_in_the_row():
    x = ints(40, 70)
    for row, col in enumerate(range(0, 70, 2)):
        x[row, col] = np.nan
    exe = tile.compile("function (X[R, L]) -> (O) { O[i : R] = >(X[i, j]); }", "llvm_cpu.0")
    got = np.asarray(exe(x)["O"] if isinstance(exe(x), dict) else exe(x))
    want = np.max(x, axis=1)
    np.testing.assert_array_equal(got, want)
