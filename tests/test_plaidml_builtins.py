"""The elementwise builtins PlaidML 0.7 has beyond the operators: ``mod``, ``recip``,
``builtin_binary_crossentropy`` and ``reverse_grad`` (``acosh``/``asinh``/``atanh`` are in the
float-function tables of ``test_semantics``, ``test_*_builtins`` and ``test_autodiff_builtins``).

Each is checked against numpy on the interpreter and on every compiled device (skipped with the
registry's reason where one is missing): exactly where the operation is exact (``mod`` is,
``recip`` is one correctly rounded division), within a few ulps where logarithms are involved.
Then the documented edge cases (sign rule, ``x mod 0``, ``INT_MIN mod -1``), the types, and the
gradients: finite differences for ``mod``, ``recip`` and the cross-entropy, the closed form
``-s * dY`` for ``reverse_grad`` (which is not the derivative of its value, on purpose).
"""

from __future__ import annotations

import numpy as np
import pytest

import ref_interp
import tile
from backends import registry
from tests.gradcheck import assert_close, fd_grad
from tests.llvm_runner import assert_same
from tile.errors import TileTypeError

pytestmark = pytest.mark.usefixtures("private_cache")

TARGETS = ["interp", "llvm_cpu.0", "opencl_cpu.0"]
INTS = [np.int8, np.uint8, np.int32, np.uint32, np.int64]
FLOATS = [np.float16, np.float32, np.float64]


def run_on(target: str, src: str, inputs: dict) -> dict:
    if target != "interp" and target not in registry.devices():
        pytest.skip(f"{target} is not available: {registry.unavailable().get(target, 'not registered')}")
    return tile.compile(src, target)(inputs)


def c_remainder(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C's ``%`` in Python integers: truncating division's remainder, 0 for a zero divisor."""
    out = [0 if int(y) == 0 else int(x) - int(y) * int(abs(int(x)) // abs(int(y)) * (1 if (x < 0) == (y < 0)
           else -1)) for x, y in zip(a.ravel(), b.ravel(), strict=True)]
    return np.array(out, dtype=np.int64).reshape(a.shape)


def int_operands(dtype) -> tuple[np.ndarray, np.ndarray]:
    info = np.iinfo(dtype)
    a = [7, -7, 7, -7, 5, 0, 3, info.min, info.max, info.min, 6, -6]
    b = [3, 3, -3, -3, 0, 4, 1, -1, 7, 5, -1, 6]
    keep = [k for k, (x, y) in enumerate(zip(a, b, strict=True)) if info.min <= x and info.min <= y]
    return np.array([a[k] for k in keep]).astype(dtype), np.array([b[k] for k in keep]).astype(dtype)


# ------------------------------------------------------------------------------ mod
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", INTS, ids=lambda d: np.dtype(d).name)
def test_integer_mod_takes_the_sign_of_the_dividend(target, dtype):
    a, b = int_operands(dtype)
    got = run_on(target, "function (A, B) -> (O) { O = mod(A, B); }", {"A": a, "B": b})["O"]
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, c_remainder(a, b).astype(dtype))


def test_mod_examples():
    a, b = np.array([-7, 7, 5, -(2**31)], np.int32), np.array([3, -3, 0, -1], np.int32)
    got = ref_interp.run("function (A, B) -> (O) { O = mod(A, B); }", {"A": a, "B": b})
    np.testing.assert_array_equal(got["O"], [-1, 1, 0, 0])
    # a == b * (a / b) + mod(a, b) wherever b != 0
    a, b = int_operands(np.int32)
    out = ref_interp.run("function (A, B) -> (Q, R) { Q = A / B; R = mod(A, B); }", {"A": a, "B": b})
    nz = b != 0
    np.testing.assert_array_equal((b * out["Q"] + out["R"])[nz], a[nz])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_float_mod_is_c_fmod(target, dtype):
    a = np.array([-7.5, 7.5, 7.5, -4.0, 5.25, np.inf, 3.0, np.nan, 6e4, -0.0, 2.0, 0.1], dtype)
    b = np.array([2.0, -2.0, 2.0, 2.0, 0.0, 1.0, np.inf, 1.0, 3.0, 1.0, np.nan, 0.03], dtype)
    got = run_on(target, "function (A, B) -> (O) { O = mod(A, B); }", {"A": a, "B": b})["O"]
    with np.errstate(invalid="ignore"):
        want = np.fmod(a, b)
    assert_same({"O": got}, {"O": want})  # fmod is exact: equal bit for bit
    num = ~np.isnan(want)
    np.testing.assert_array_equal(np.signbit(got[num]), np.signbit(want[num]))  # -4 mod 2 is -0.0


def test_mod_types():
    types = {"A": np.array([5], np.int8), "B": np.array([3], np.uint8), "C": np.array([True]),
             "F": np.array([2.5], np.float16)}
    src = "function (A, B, C, F) -> (O1, O2, O3, O4) { O1 = mod(A, B); O2 = mod(C, C); O3 = mod(A, F); " \
          "O4 = mod(A, 2.0); }"
    out = ref_interp.run(src, types)
    assert [out[k].dtype for k in ("O1", "O2", "O3", "O4")] == [np.int8, np.int32, np.float16, np.float32]
    np.testing.assert_array_equal(out["O2"], [0])
    np.testing.assert_array_equal(out["O3"], [0.0])


# ---------------------------------------------------------------------------- recip
@pytest.mark.parametrize("target", TARGETS)
def test_recip_is_one_correctly_rounded_division(target):
    x = np.array([3.0, -7.0, 0.0, -0.0, np.inf, np.nan, 1e-40, 0.1, 65504.0], np.float64)
    ins = {"H": x.astype(np.float16), "F": x.astype(np.float32), "D": x, "I": np.array([4, -3, 0], np.int32)}
    src = "function (H, F, D, I) -> (OH, OF, OD, OI) { OH = recip(H); OF = recip(F); OD = recip(D); " \
          "OI = recip(I); }"
    got = run_on(target, src, ins)
    with np.errstate(divide="ignore", over="ignore"):
        want = {"OH": np.float16(1) / ins["H"], "OF": np.float32(1) / ins["F"], "OD": 1 / x,
                "OI": np.float32(1) / ins["I"].astype(np.float32)}
    assert_same(got, want)


# -------------------------------------------------------------- binary cross-entropy
def bce(p: np.ndarray, t: np.ndarray) -> np.ndarray:
    return -t * np.log(p) - (1 - t) * np.log(1 - p)


@pytest.mark.parametrize("target", TARGETS)
def test_binary_crossentropy(target):
    rng = np.random.default_rng(5)
    p = rng.uniform(0.02, 0.98, (4, 6))
    t = rng.integers(0, 2, (4, 6)).astype(np.float64)
    t[0] = rng.uniform(0, 1, 6)
    src = """function (P[N, M], T[N, M], P32[N, M], T8[N, M]) -> (O, O32) {
        O = builtin_binary_crossentropy(P, T, N * M);
        O32 = builtin_binary_crossentropy(P32, T8, 1);
    }"""
    t8 = t.round().astype(np.int8)
    got = run_on(target, src, {"P": p, "T": t, "P32": p.astype(np.float32), "T8": t8})
    assert got["O32"].dtype == np.float32  # float of the promoted type: float32 with int8
    # a difference of two terms of at most |log(0.02)| ~ 4 each: a few ulps of that, absolutely
    np.testing.assert_allclose(got["O"], bce(p, t), rtol=0, atol=8 * 4 * np.finfo(np.float64).eps)
    want32 = bce(p.astype(np.float32).astype(np.float64), t8.astype(np.float64))
    np.testing.assert_allclose(got["O32"], want32, rtol=0, atol=8 * 4 * np.finfo(np.float32).eps)


def test_binary_crossentropy_n_changes_nothing():
    p, t = np.array([0.25, 0.5, 0.875]), np.array([1.0, 0.0, 0.5])
    outs = [ref_interp.run(f"function (P, T) -> (O) {{ O = builtin_binary_crossentropy(P, T, {n}); }}",
                           {"P": p, "T": t})["O"] for n in (1, 3, 1000)]
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_binary_crossentropy_needs_its_n():
    with pytest.raises(TileTypeError, match="takes 3 argument") as e:
        ref_interp.run("function (P, T) -> (O) { O = builtin_binary_crossentropy(P, T); }",
                       {"P": np.ones(2), "T": np.ones(2)})
    assert "n is accepted and unused" in str(e.value) and ":1:30:" in str(e.value)


# ----------------------------------------------------------------------- reverse_grad
@pytest.mark.parametrize("target", TARGETS)
def test_reverse_grad_is_the_identity(target):
    x = np.array([[1.5, -2.0, 0.0], [np.inf, np.nan, 7.0]], np.float32)
    got = run_on(target, "function (X, S) -> (O, P) { O = reverse_grad(X, S); P = reverse_grad(X, 3); }",
                 {"X": x, "S": np.array(0.5)})
    assert_same(got, {"O": x, "P": x})


def test_reverse_grad_gradient_is_minus_s_times_the_adjoint():
    x, s, d = np.array([1.0, -2.0, 3.0]), np.array(0.25), np.array([2.0, 5.0, -1.0])
    got = tile.grad_values("function (X[N], S) -> (O) { O = reverse_grad(X, S); }", {"X": x, "S": s},
                           cotangents={"O": d}, precision="float64")
    np.testing.assert_array_equal(got["X"], -0.25 * d)
    np.testing.assert_array_equal(got["S"], 0.0)
    # through other operations: d/dX of reverse_grad(X, 2) * X is X - 2 X = -X
    got = tile.grad_values("function (X[N]) -> (O) { O = reverse_grad(X, 2) * X; }", {"X": x})
    np.testing.assert_array_equal(got["X"], -x)


# -------------------------------------------------------------------------- gradients
RNG = np.random.default_rng(17)
GRADIENTS = {
    "mod": ("function (X[N], Y[N]) -> (O) { O = mod(X, Y); }",
            {"X": np.array([2.3, -2.3, 5.1, -0.4, 7.7]), "Y": np.array([1.1, 0.7, -1.3, 2.0, -2.5])}),
    "recip": ("function (X[N]) -> (O) { O = recip(X); }", {"X": np.array([2.3, -2.3, 5.1, -0.4, 0.9])}),
    "builtin_binary_crossentropy": (
        "function (P[N], T[N]) -> (O) { O = builtin_binary_crossentropy(P, T, N); }",
        {"P": RNG.uniform(0.1, 0.9, 5), "T": RNG.uniform(0, 1, 5)},
    ),
}


@pytest.mark.parametrize("name", sorted(GRADIENTS))
def test_gradient_matches_finite_differences(name):
    src, inputs = GRADIENTS[name]
    seed = {"O": RNG.standard_normal(5)}
    grads = tile.grad_values(src, inputs, cotangents=seed, precision="float64")
    for k, g in grads.items():
        assert_close(g, fd_grad(src, inputs, k, seed), 5)


def test_mod_gradient_closed_form():
    x, y = GRADIENTS["mod"][1].values()
    got = tile.grad_values(GRADIENTS["mod"][0], {"X": x, "Y": y}, precision="float64")
    np.testing.assert_array_equal(got["X"], np.ones(5))
    np.testing.assert_allclose(got["Y"], -np.trunc(x / y), rtol=0, atol=1e-15)
