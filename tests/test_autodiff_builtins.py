"""Every elementwise builtin under autodiff: a derivative matching float64 central finite differences,
or a documented zero gradient (comparisons, bit operations, floor/ceil/round, integer and bool
casts, index, shape), or ``round_tf32``'s documented pass-through (the gradient of ``ident``).
Then the structural builtins (reshape, gather, scatter, the softmaxes) and the documented tie rules
of max/min/abs/relu.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import ref_interp
import tile
from tests.gradcheck import assert_close, fd_grad
from tile.autodiff.elementwise import has_rule
from tile.builtins import BUILTINS
from tile.dtypes import DType


def check_fd(program, inputs: dict, seed: dict | None = None) -> dict:
    grads = tile.grad_values(program, inputs, cotangents=seed, precision="float64")
    assert set(grads) == {n for n, v in inputs.items() if np.asarray(v).dtype.kind == "f"}
    length = sum(np.size(v) for v in inputs.values())
    for name, g in grads.items():
        assert g.shape == np.shape(inputs[name])
        assert_close(g, fd_grad(program, inputs, name, seed), length)
    return grads


RNG = np.random.default_rng(11)
S = (2, 3)


def uniform(lo, hi, shape=S):
    return RNG.uniform(lo, hi, shape)


def away_from_zero(shape=S):
    return RNG.uniform(0.3, 1.5, shape) * np.where(np.arange(math.prod(shape)).reshape(shape) % 2, 1, -1)


XY = "function (X[N, M], Y[N, M]) -> (O) { O = %s; }"
X_ = "function (X[N, M]) -> (O) { O = %s; }"
PAIR = {"X": uniform(-1.5, 1.5), "Y": uniform(-1.5, 1.5)}
SEPARATED = {"X": np.array([[0.1, 1.2, -0.7], [2.0, -1.1, 0.4]]),
             "Y": np.array([[0.9, 0.3, -1.5], [1.0, -0.2, 1.4]])}

# name -> (program, inputs, "derivative" | "zero")
CASES: dict[str, tuple[str, dict, str]] = {
    "add": (XY % "add(X, Y)", PAIR, "derivative"),
    "sub": (XY % "sub(X, Y)", PAIR, "derivative"),
    "mul": (XY % "mul(X, Y)", PAIR, "derivative"),
    "div": (XY % "div(X, Y)", {"X": uniform(-2, 2), "Y": away_from_zero()}, "derivative"),
    "neg": (X_ % "neg(X) * X", {"X": uniform(-1, 1)}, "derivative"),
    "max": (XY % "max(X, Y)", SEPARATED, "derivative"),
    "min": (XY % "min(X, Y)", SEPARATED, "derivative"),
    "abs": (X_ % "abs(X) * X", {"X": away_from_zero()}, "derivative"),
    "relu": (X_ % "relu(X) * X", {"X": away_from_zero()}, "derivative"),
    "ident": (X_ % "ident(X) * X", {"X": uniform(-1, 1)}, "derivative"),
    "pow": (XY % "pow(X, Y)", {"X": uniform(0.5, 2), "Y": uniform(-2, 2)}, "derivative"),
    "cond": (XY % "cond(X > Y, X * X, Y * 3)", SEPARATED, "derivative"),
    "exp": (X_ % "exp(X)", {"X": uniform(-2, 2)}, "derivative"),
    "log": (X_ % "log(X)", {"X": uniform(0.2, 3)}, "derivative"),
    "sqrt": (X_ % "sqrt(X)", {"X": uniform(0.2, 3)}, "derivative"),
    "sin": (X_ % "sin(X)", {"X": uniform(-3, 3)}, "derivative"),
    "cos": (X_ % "cos(X)", {"X": uniform(-3, 3)}, "derivative"),
    "tan": (X_ % "tan(X)", {"X": uniform(-1.2, 1.2)}, "derivative"),
    "sinh": (X_ % "sinh(X)", {"X": uniform(-2, 2)}, "derivative"),
    "cosh": (X_ % "cosh(X)", {"X": away_from_zero()}, "derivative"),
    "tanh": (X_ % "tanh(X)", {"X": uniform(-2, 2)}, "derivative"),
    "asin": (X_ % "asin(X)", {"X": uniform(-0.9, 0.9)}, "derivative"),
    "acos": (X_ % "acos(X)", {"X": uniform(-0.9, 0.9)}, "derivative"),
    "atan": (X_ % "atan(X)", {"X": uniform(-3, 3)}, "derivative"),
    "asinh": (X_ % "asinh(X)", {"X": uniform(-3, 3)}, "derivative"),
    "acosh": (X_ % "acosh(X)", {"X": uniform(1.2, 4)}, "derivative"),
    "atanh": (X_ % "atanh(X)", {"X": uniform(-0.9, 0.9)}, "derivative"),
    "sigmoid": (X_ % "sigmoid(X)", {"X": uniform(-3, 3)}, "derivative"),
    "as_float": (XY % "as_float(X * Y, 32)", PAIR, "derivative"),
    "as_bfloat": (XY % "as_bfloat(X * Y, 16)", PAIR, "derivative"),
    # a change of precision passes the gradient through: ident's (finite differences see its steps)
    "round_tf32": (XY % "round_tf32(X * Y)", PAIR, "pass-through"),
    "mod": (XY % "mod(X, Y)", {"X": uniform(-3, 3), "Y": away_from_zero() * 1.7}, "derivative"),
    "recip": (X_ % "recip(X)", {"X": away_from_zero()}, "derivative"),
    "builtin_binary_crossentropy": (XY % "builtin_binary_crossentropy(X, Y, N * M)",
                                    {"X": uniform(0.1, 0.9), "Y": uniform(0, 1)}, "derivative"),
    # with s = -1 the gradient -s * dY is the identity's; other s: tests/test_plaidml_builtins.py
    "reverse_grad": (X_ % "reverse_grad(X, -1) * X", {"X": uniform(-1, 1)}, "derivative"),
    # zero gradient (documented): piecewise constant, or not a float at all
    "floor": (X_ % "floor(X)", {"X": np.arange(6.0).reshape(S) - 2.7}, "zero"),
    "ceil": (X_ % "ceil(X)", {"X": np.arange(6.0).reshape(S) - 2.7}, "zero"),
    "round": (X_ % "round(X)", {"X": np.arange(6.0).reshape(S) - 2.2}, "zero"),
    "as_int": (X_ % "as_float(as_int(X * 3, 32), 64)", {"X": np.arange(6.0).reshape(S) - 2.5}, "zero"),
    "as_uint": (X_ % "as_float(as_uint(X * 3, 8), 64)", {"X": np.arange(6.0).reshape(S) + 0.1}, "zero"),
    "as_bool": (X_ % "as_float(as_bool(X), 64)", {"X": away_from_zero()}, "zero"),
    "index": (X_ % "as_float(index(X, 1), 64)", {"X": uniform(-1, 1)}, "zero"),
    "shape": ("function (X[N, M]) -> (O) { O = as_float(shape(X), 64); }", {"X": uniform(-1, 1)}, "zero"),
    "bit_not": (X_ % "as_float(bit_not(as_int(X, 32)), 64)", {"X": np.arange(6.0).reshape(S) + 0.5}, "zero"),
}
for _cmp in ("cmp_eq", "cmp_ne", "cmp_lt", "cmp_gt", "cmp_le", "cmp_ge"):
    CASES[_cmp] = (XY % f"as_float({_cmp}(X, Y), 64)", SEPARATED, "zero")
for _bit in ("bit_and", "bit_or", "bit_xor", "bit_left", "bit_right"):
    CASES[_bit] = (XY % f"as_float({_bit}(as_int(X, 32), as_int(Y, 32)), 64)",
                   {"X": np.arange(6.0).reshape(S) + 0.5, "Y": np.array([[1.5, 2.5, 0.5], [3.5, 1.5, 2.5]])},
                   "zero")

D_ = RNG.standard_normal((4, 3))
IDX = np.array([0, 2, 2, 7, -1], np.int32)  # repeated, and clamped at both ends
STRUCTURAL = {
    "reshape": ("function (X[N, M], W[A, B]) -> (O) { O = reshape(X, 3, 2) * W; }",
                {"X": uniform(-1, 1), "W": uniform(-1, 1, (3, 2))}),
    "gather": ("function (D[N, M], I[K], W[K, M]) -> (O) { G = gather(D, I); O = G * G * W; }",
               {"D": D_, "I": IDX, "W": uniform(-1, 1, (5, 3))}),
    "scatter": ("function (V[K, M], I[K], L[N], W[N, M]) -> (O) { S = scatter(V, I, L); O = S * S * W; }",
                {"V": uniform(-1, 1, (5, 3)), "I": IDX, "L": np.zeros(4), "W": uniform(-1, 1, (4, 3))}),
    "builtin_softmax": ("function (X[N, M], W[N, M]) -> (O) { O = builtin_softmax(X, N, M) * W; }",
                        {"X": uniform(-2, 2), "W": uniform(-1, 1)}),
    "builtin_logsoftmax": ("function (X[N, M], W[N, M]) -> (O) { O = builtin_logsoftmax(X, N, M) * W; }",
                           {"X": uniform(-2, 2), "W": uniform(-1, 1)}),
    "simple_reduce": ("function (X[N, M], W[M]) -> (O) { Y = X * X; R = simple_reduce(Y, 1, M); "
                      "O = R * R * W; }",
                      {"X": uniform(-1, 1), "W": uniform(-1, 1, (3,))}),
}
# dropout: the numbers depend only on the uint32 state, so the gradient flows through the mask only
_DROPOUT = ("function (X[N, M], S[A, B]) -> (O, T) { H = prng_step(S, N, M); V = prng_value(H); "
            "T = prng_state(H); O = V < 0.5 ? X * X * 2 : 0; }",
            {"X": uniform(-1, 1), "S": np.arange(3 * 2048, dtype=np.uint32).reshape(3, 2048) * 7919 + 17})
STRUCTURAL |= {"prng_step": _DROPOUT, "prng_value": _DROPOUT, "prng_state": _DROPOUT}


def test_every_builtin_has_a_case_and_a_rule():
    assert set(CASES) | set(STRUCTURAL) == set(BUILTINS)
    assert not set(CASES) & set(STRUCTURAL)
    assert all(has_rule(name) for name in BUILTINS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_elementwise_builtin_gradient(name):
    src, inputs, kind = CASES[name]
    if kind == "pass-through":
        want = check_fd(src.replace(f"{name}(", "ident("), inputs)
        got = tile.grad_values(src, inputs, precision="float64")
        assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
        return
    grads = check_fd(src, inputs)
    if kind == "zero":
        for g in grads.values():
            np.testing.assert_array_equal(g, np.zeros_like(g))
    else:
        assert any(np.any(g != 0) for g in grads.values()), "a derivative that is zero everywhere"


@pytest.mark.parametrize("name", sorted(STRUCTURAL))
def test_structural_builtin_gradient(name):
    src, inputs = STRUCTURAL[name]
    grads = check_fd(src, inputs, {"O": RNG.standard_normal(ref_interp.run(src, inputs)["O"].shape)})
    assert any(np.any(g != 0) for g in grads.values())


def test_gather_gradient_adds_repeated_and_clamped_indices():
    # Through the symbolic gradient program, run on concrete arrays; dD = scatter-add of DO.
    src = "function (D[N, M], I[K]) -> (O) { O = gather(D, I); }"
    g = tile.gradient(src, dtypes={"I": DType.INT32})
    do = np.arange(15.0).reshape(5, 3)
    out = ref_interp.run(g.program, {"D": D_, "I": IDX, g.cotangents["O"]: do}, "float64")
    want = np.zeros((4, 3))
    np.add.at(want, np.clip(IDX, 0, 3), do)
    np.testing.assert_array_equal(out[g.gradients["D"]], want)


def test_scatter_gradient_gathers():
    src = "function (V[K, M], I[K], L[N]) -> (O) { O = scatter(V, I, L); }"
    g = tile.gradient(src, dtypes={"I": DType.INT32})
    do = np.arange(12.0).reshape(4, 3)
    out = ref_interp.run(g.program, {"V": np.ones((5, 3)), "I": IDX, "L": np.zeros(4), g.cotangents["O"]: do},
                         "float64")
    np.testing.assert_array_equal(out[g.gradients["V"]], do[np.clip(IDX, 0, 3)])
    np.testing.assert_array_equal(out[g.gradients["L"]], np.zeros(4))


def test_reshape_gradient_reshapes_back():
    g = tile.gradient("function (X[N, M]) -> (O) { O = reshape(X, M, N); }")
    do = np.arange(6.0).reshape(3, 2)
    out = ref_interp.run(g.program, {"X": np.zeros((2, 3)), g.cotangents["O"]: do}, "float64")
    np.testing.assert_array_equal(out[g.gradients["X"]], do.reshape(2, 3))


def test_reshape_gradient_values():
    got = tile.grad_values("function (X[N, M]) -> (O) { O = reshape(X, 3, 2); }", {"X": np.zeros((2, 3))},
                           cotangents={"O": np.arange(6.0).reshape(3, 2)})
    np.testing.assert_array_equal(got["X"], np.arange(6.0).reshape(2, 3))


def test_softmax_gradient_closed_form():
    x, d = uniform(-2, 2), uniform(-1, 1)
    got = tile.grad_values("function (X[N, M]) -> (O) { O = builtin_softmax(X, N, M); }", {"X": x},
                           cotangents={"O": d}, precision="float64")
    s = np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)
    assert_close(got["X"], s * (d - (d * s).sum(axis=1, keepdims=True)), 3)
    got = tile.grad_values("function (X[N, M]) -> (O) { O = builtin_logsoftmax(X, N, M); }", {"X": x},
                           cotangents={"O": d}, precision="float64")
    assert_close(got["X"], d - s * d.sum(axis=1, keepdims=True), 3)


# ------------------------------------------------------------------------- documented ties
@pytest.mark.parametrize("fn", ["max", "min"])
def test_elementwise_max_min_tie_goes_to_the_first_argument(fn):
    got = tile.grad_values(f"function (X[N], Y[N]) -> (O) {{ O = {fn}(X, Y); }}",
                           {"X": np.array([1.0, 2.0, 3.0]), "Y": np.array([1.0, 5.0, 0.0])})
    first, second = (np.array([1.0, 0, 1]), np.array([0, 1.0, 0])) if fn == "max" else (
        np.array([1.0, 1, 0]), np.array([0, 0, 1.0]))
    np.testing.assert_array_equal(got["X"], first)
    np.testing.assert_array_equal(got["Y"], second)


def test_abs_and_relu_at_zero():
    x = np.array([-2.0, 0.0, 3.0])
    np.testing.assert_array_equal(tile.grad_values("function (X) -> (O) { O = abs(X); }", {"X": x})["X"],
                                  [-1.0, 1.0, 1.0])
    np.testing.assert_array_equal(tile.grad_values("function (X) -> (O) { O = relu(X); }", {"X": x})["X"],
                                  [0.0, 0.0, 1.0])
