"""Builtins that declare LLVM intrinsics, mixed in one module (issue 37, item 1).

Several code paths of the LLVM backend declare the same intrinsic (``llvm.fabs.f64`` is used by
``abs`` of float64, by the float-to-integer helper of ``as_int``/``as_uint``, by ``round``, by the
inline ``tanh`` and by the double to float16 rounding); ``llvm.trunc.f64`` by ``round`` and the
float-to-integer helper. Each must find the declaration another made first, in whichever order
the program uses them: ``as_int(A, 32) + tanh(A)`` used to die in llvmlite with
``DuplicatedNameError: llvm.fabs.f64``.

Every ordered pair of builtins is covered by two programs per dtype: the list of builtins in one
order, then reversed (for any two, one of the programs uses the first before the second). Each
builtin writes its own output, so each is compared with the interpreter on its own: integer
results exactly, float ones within a few units in the last place of the dtype (outside strict
mode the transcendental functions are not the interpreter's, §8.3).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import ref_interp
import tile

DEVICE = "llvm_cpu.0"

# builtins whose LLVM code declares intrinsics (or the C library), as expressions of A
BUILTINS = {
    "abs": "abs(A)",
    "sqrt": "sqrt(A)",
    "floor": "floor(A)",
    "ceil": "ceil(A)",
    "round": "round(A)",
    "exp": "exp(A)",
    "log": "log(A)",
    "tanh": "tanh(A)",
    "sigmoid": "sigmoid(A)",
    "sin": "sin(A)",
    "pow": "pow(A, A)",
    "as_int32": "as_int(A, 32)",
    "as_int64": "as_int(A, 64)",
    "as_uint16": "as_uint(A, 16)",
    "as_float16": "as_float(A, 16)",
    "as_bfloat16": "as_bfloat(A, 16)",
    "as_float32": "as_float(A, 32)",
}
DTYPES = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}


def _program(names: list[str]) -> str:
    outs = ", ".join(f"O_{n}" for n in names)
    body = " ".join(f"O_{n} = {BUILTINS[n]};" for n in names)
    return f"function (A[N]) -> ({outs}) {{ {body} }}"


def _inputs(dtype: np.dtype) -> np.ndarray:
    # positive (log, sqrt, pow), fractions both sides of .5 (round), values past 2^15 for the casts
    vals = [0.25, 0.5, 1.5, 2.5, 3.75, 7.0, 10.5, 40000.0, 1e-3]
    return np.asarray(vals, dtype=np.float64).astype(dtype)


def _ulps(dtype: np.dtype) -> float:
    """The spacing of dtype's values at 1 (2u)."""
    return float(ml_dtypes.finfo(dtype).eps)


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.parametrize("dt", list(DTYPES))
def test_every_pair_of_intrinsic_builtins_in_one_module(dt, order, strict):
    names = list(BUILTINS) if order == "forward" else list(reversed(BUILTINS))
    src = _program(names)
    a = _inputs(DTYPES[dt])
    want = ref_interp.run(src, {"A": a})
    got = tile.compile(src, device=DEVICE, settings={"strict": strict})(A=a)
    for n in names:
        w, g = np.asarray(want[f"O_{n}"]), np.asarray(got[f"O_{n}"])
        assert g.dtype == w.dtype, n
        if w.dtype.kind in "iu":
            np.testing.assert_array_equal(g, w, err_msg=n)
            continue
        w64, g64 = w.astype(np.float64), g.astype(np.float64)
        finite = np.isfinite(w64)
        np.testing.assert_array_equal(np.isfinite(g64), finite, err_msg=n)
        np.testing.assert_array_equal(g64[~finite], w64[~finite], err_msg=n)
        # a function rounded in float or double, then to dt: within 2 of dt's ulps
        tol = 2 * _ulps(w.dtype) * np.abs(w64[finite])
        assert np.all(np.abs(g64[finite] - w64[finite]) <= tol), (n, g64, w64)


def test_as_int_then_tanh_regression():
    """The report's program: the float-to-int helper declared ``llvm.fabs.f64`` first."""
    src = "function (A[N]) -> (O) { O = as_int(A, 32) + tanh(A); }"
    a = np.array([1.5, -2.5], np.float32)
    got = tile.compile(src, device=DEVICE)(A=a)["O"]
    want = ref_interp.run(src, {"A": a})["O"]
    np.testing.assert_allclose(got, want, rtol=4 * float(np.finfo(np.float32).eps))
