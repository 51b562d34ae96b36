"""Autodiff, one rule per test: the seed's strided dilated convolution, each contraction rule,
broadcasting, ``default``, skipping, custom gradients, error cases, readability and the CLI.

Expected values are hand-computed (small integers, exact) or float64 central finite differences
through the interpreter, with a tolerance that grows with the reduction length. Every elementwise
builtin is covered in ``test_autodiff_builtins.py``; random programs in
``test_autodiff_properties.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import tile
from tests.gradcheck import assert_close, fd_grad
from tile import ast
from tile.bind import bind_symbolic
from tile.dtypes import DType
from tile.errors import TileNameError, TileShapeError, TileTypeError
from tile.printer import format_program

REPO = Path(__file__).resolve().parents[1]


def check_fd(program, inputs: dict, seed: dict | None = None, wrt=None, custom=None) -> dict:
    grads = tile.grad_values(program, inputs, wrt=wrt, cotangents=seed, precision="float64", custom=custom)
    length = sum(np.size(v) for v in inputs.values())
    for name, g in grads.items():
        assert_close(g, fd_grad(program, inputs, name, seed), length)
    return grads


def grads(program, seed=None, wrt=None, custom=None, **inputs) -> dict:
    return tile.grad_values(program, inputs, wrt=wrt, cotangents=seed, precision="float64", custom=custom)


def f64(*rows) -> np.ndarray:
    return np.array(rows, np.float64)


# ------------------------------------------------------------------------- the seed's example
CONV = ("function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {\n"
        "    O[n, y, x, co: N, H/3, W/3, CO] = +(I[n, 3*y + 2*j, 3*x + 2*i, ci] * K[j, i, ci, co]);\n}\n")


def test_strided_dilated_convolution_gradient_flips_input_and_output():
    g = tile.gradient(CONV)
    di = next(s for s in g.program.stmts if s.name == g.gradients["I"])
    expected = tile.parse(
        "function (DO[N, A, B, CO], K[KH, KW, CI, CO]) -> (DI) {"
        " DI[n, 3*y + 2*j, 3*x + 2*i, ci: N, H, W, CI] = +(DO[n, y, x, co] * K[j, i, ci, co]); }").stmts[0]
    assert isinstance(di, ast.Contraction)
    assert (di.agg, di.comb) == (ast.AggOp.SUM, ast.CombOp.MUL)
    assert di.output.indices == expected.output.indices  # n, 3*y + 2*j, 3*x + 2*i, ci
    assert di.sizes == expected.sizes  # I's own dims
    do = g.cotangents["O"]
    assert sorted(di.operands, key=lambda r: r.name != do) == [
        ast.TensorRef(do, expected.operands[0].indices), expected.operands[1]]
    assert di.constraints == () and di.default is None


def test_strided_dilated_convolution_gradient_values():
    rng = np.random.default_rng(0)
    inputs = {"I": rng.standard_normal((1, 8, 7, 2)), "K": rng.standard_normal((2, 2, 2, 2))}
    seed = {"O": rng.standard_normal((1, 2, 2, 2))}
    g = check_fd(CONV, inputs, seed)
    assert np.all(g["I"][:, 6:] == 0) and np.all(g["I"][:, :, 6:] == 0)  # rows/cols no tap reaches


# ------------------------------------------------------------------------ contraction rules
def test_sum_gradient_broadcasts_the_adjoint():
    d = f64(2, -3)
    g = grads("function (A[N, M]) -> (O) { O[i: N] = +(A[i, j]); }", {"O": d}, A=np.ones((2, 3)))
    np.testing.assert_array_equal(g["A"], np.repeat(d[:, None], 3, axis=1))


def test_assign_gradient_routes_each_element_back():
    d = f64([1, 2], [3, 4], [5, 6])
    g = grads("function (A[N, M]) -> (O) { O[j, i: M, N] = =(A[i, j]); }", {"O": d}, A=np.zeros((2, 3)))
    np.testing.assert_array_equal(g["A"], d.T)


def test_product_combination_uses_the_other_operand():
    a, b, d = f64([1, 2, 3], [4, 5, 6]), f64(1, -1, 2), f64(3, -2)
    g = grads("function (A[N, M], B[M]) -> (O) { O[i: N] = +(A[i, j] * B[j]); }", {"O": d}, A=a, B=b)
    np.testing.assert_array_equal(g["A"], np.outer(d, b))
    np.testing.assert_array_equal(g["B"], a.T @ d)


def test_same_tensor_twice_in_a_product():
    a = f64(1, 5, 2)
    g = grads("function (A[N]) -> (O) { O[i, j: N, N] = +(A[i] * A[j]); }", A=a)
    np.testing.assert_array_equal(g["A"], 2 * np.full(3, a.sum()))


def test_sum_combination_keeps_multiplicity():
    # Each O[i] adds A[i] once per j: dA = M, and B[j] once per i: dB = N.
    g = grads("function (A[N], B[M]) -> (O) { O[i: N] = +(A[i] + B[j]); }", A=f64(1, 5, 2), B=f64(2, 3, 4, 5))
    np.testing.assert_array_equal(g["A"], np.full(3, 4.0))
    np.testing.assert_array_equal(g["B"], np.full(4, 3.0))


def test_sum_combination_with_a_scalar_and_a_shifted_operand():
    g = grads("function (A[N], S[]) -> (O) { O[i: N] = +(A[i] + S[]); }", A=f64(1, 5, 2), S=np.float64(2))
    np.testing.assert_array_equal(g["A"], np.ones(3))
    np.testing.assert_array_equal(g["S"], np.float64(3))
    # B[i - 1] is out of range at i = 0: that tuple is skipped for A too.
    src = "function (A[N], B[N]) -> (O) { O[i: N] = +(A[i] + B[i - 1]); }"
    g = grads(src, A=f64(1, 5, 2), B=f64(1, 5, 2))
    np.testing.assert_array_equal(g["A"], f64(0, 1, 1))
    np.testing.assert_array_equal(g["B"], f64(1, 1, 0))


@pytest.mark.parametrize("int_compared", [False, True])
def test_conditional_combination_only_c_gets_gradient(int_compared):
    dt = np.int32 if int_compared else np.float64
    a, b = np.array([1, 2, 3, 2], dt), np.array([1, 0, 3, 5], dt)
    src = "function (A[N], B[N], C[N]) -> (O) { O[i: N] = +(A[i] == B[i] ? C[i]); }"
    g = grads(src, {"O": f64(2, 3, 4, 5)}, A=a, B=b, C=f64(7, 8, 9, 10))
    np.testing.assert_array_equal(g["C"], f64(2, 0, 4, 0))
    if int_compared:
        assert set(g) == {"C"}
    else:
        np.testing.assert_array_equal(g["A"], np.zeros(4))
        np.testing.assert_array_equal(g["B"], np.zeros(4))


def test_equality_combination_has_no_gradient():
    src = "function (A[N], B[N]) -> (O) { E[i: N] = +(A[i] == B[i]); O = as_float(E, 64) * A; }"
    g = grads(src, A=f64(1, 2, 3), B=f64(1, 0, 3))
    np.testing.assert_array_equal(g["A"], f64(1, 0, 1))
    np.testing.assert_array_equal(g["B"], np.zeros(3))


@pytest.mark.parametrize("agg, want", [(">", [[0, 2, 2], [5, 5, 0]]), ("<", [[2, 0, 0], [0, 0, 5]])])
def test_max_min_ties_each_get_the_full_gradient(agg, want):
    x = f64([1, 3, 3], [2, 2, 0])
    g = grads(f"function (X[N, M]) -> (O) {{ O[i: N] = {agg}(X[i, j]); }}", {"O": f64(2, 5)}, X=x)
    np.testing.assert_array_equal(g["X"], f64(*want))


def test_max_reading_one_element_twice_gives_it_the_gradient_once():
    # I[1] is the maximum, read by two index tuples (i, j) = (0, 1), (1, 0): d max / d I[1] is 1.
    src = "function (I[N]) -> (O) { O[] = >(I[i + j]), i < 2, j < 2; }"
    g = grads(src, I=f64(1, 5, 2))
    np.testing.assert_array_equal(fd_grad(src, {"I": f64(1, 5, 2)}, "I").round(6), f64(0, 1, 0))
    np.testing.assert_array_equal(g["I"], f64(0, 1, 0))


@pytest.mark.parametrize("x, want", [([2, 3, 4], [12, 8, 6]), ([2, 0, 4], [0, 8, 0]), ([0, 3, 0], [0, 0, 0]),
                                     ([0, 0, 0], [0, 0, 0])])
def test_product_aggregation_is_exact_with_zeros(x, want):
    g = grads("function (X[N]) -> (O) { O[] = *(X[i]); }", {"O": np.float64(3)}, X=f64(*x))
    np.testing.assert_array_equal(g["X"], 3 * f64(*want))


def test_product_aggregation_per_output_and_repeated_factor():
    g = grads("function (X[N, M]) -> (O) { O[i: N] = *(X[i, j]); }", X=f64([2, 3], [0, 5]))
    np.testing.assert_array_equal(g["X"], f64([3, 2], [5, 0]))
    # I[1] enters the product twice: d(I0 * I1^2 * I2)/dI1 = 2 * I0 * I1 * I2.
    g = grads("function (I[N]) -> (O) { O[] = *(I[i + j]), i < 2, j < 2; }", I=f64(1, 5, 2))
    np.testing.assert_array_equal(g["I"], f64(50, 20, 25))


@pytest.mark.parametrize("src, a, b, da, db", [
    ("function (A[N, One], B[N, M]) -> (O) { O = A * B; }", [[1], [2]], [[1, 2, 3], [4, 5, 6]],
     [[6], [15]], [[1, 1, 1], [2, 2, 2]]),
    ("function (A[M], B[N, M]) -> (O) { O = A * B; }", [1, 2, 3], [[1, 2, 3], [4, 5, 6]],
     [5, 7, 9], [[1, 2, 3], [1, 2, 3]]),
    ("function (A[One, M], B[N, One]) -> (O) { O = A * B + A; }", [[1, 2, 3]], [[2], [-1]],
     [[3, 3, 3]], [[6], [6]]),
    ("function (A, B) -> (O) { O = A - B; }", 5, [[1, 2], [3, 4]], 4, [[-1, -1], [-1, -1]]),
])
def test_broadcasting_is_undone_by_summing(src, a, b, da, db):
    g = grads(src, A=np.array(a, np.float64), B=np.array(b, np.float64))
    np.testing.assert_array_equal(g["A"], np.array(da, np.float64))
    np.testing.assert_array_equal(g["B"], np.array(db, np.float64))


def test_symbolic_gradient_of_unknown_rank_inputs_is_not_silently_wrong():
    # Without shapes, A and B may broadcast. The symbolic derivation must say what it assumed, and
    # derivation with the actual shapes (what grad_values does) must be exact.
    src = "function (A, B) -> (O) { O = A * B; }"
    g = tile.gradient(src)
    assert any("'A'" in n and "rank" in n for n in g.notes), g.notes
    assert not tile.gradient(src, shapes={"A": (1, 4), "B": (3, 1)}).notes
    out = tile.grad_values(src, {"A": np.ones((1, 4)), "B": f64([0], [1], [2])}, precision="float64")
    np.testing.assert_array_equal(out["A"], np.full((1, 4), 3.0))
    np.testing.assert_array_equal(out["B"], np.full((3, 1), 4.0))


def test_default_gets_the_gradient_only_where_nothing_writes():
    src = "function (I[N], D[M]) -> (O) { O[2*i: M] = +(I[i]) default D; }"
    d = f64(1, 2, 3, 4, 5, 6)
    g = grads(src, {"O": d}, I=f64(1, 2, 3), D=np.zeros(6))
    np.testing.assert_array_equal(g["I"], f64(1, 3, 5))
    np.testing.assert_array_equal(g["D"], f64(0, 2, 0, 4, 0, 6))
    # A tensor both read and used as default; and a `>` with a default.
    g = grads("function (A[N]) -> (O) { O[i: N] = *(A[i - 1]) default A; }", A=f64(1, 5, 2))
    np.testing.assert_array_equal(g["A"], f64(2, 1, 0))
    check_fd("function (A[N], D[N]) -> (O) { O[i: N] = >(A[i - 1]) default D; }", {"A": f64(1, 5, 2),
                                                                                  "D": f64(4, 6, 8)})


@pytest.mark.parametrize("src, n_in, d, want", [
    ("function (I[N]) -> (O) { O[2*i: 5] = +(I[i]); }", 4, [1, 2, 3, 4, 5], [1, 3, 5, 0]),  # I[3] -> O[6]
    ("function (I[N]) -> (O) { O[i: 3] = +(I[2*i]); }", 5, [1, 2, 3], [1, 0, 2, 0, 3]),  # strided read
    ("function (I[N]) -> (O) { O[i: N] = +(I[i + j]), j < 2; }", 4, [1, 2, 3, 4], [1, 3, 5, 7]),  # window
    ("function (I[N]) -> (O) { O[i: 4] = +(I[(i + 1) / 2]); }", 3, [1, 2, 3, 4], [0, 2, 4]),  # odd i only
    ("function (I[N]) -> (O) { O[i: 4] = +(I[i]), i + 2 < 4; }", 4, [1, 2, 3, 4], [1, 2, 0, 0]),
])
def test_constraints_and_skipped_tuples(src, n_in, d, want):
    g = grads(src, {"O": np.array(d, np.float64)}, I=np.ones(n_in))
    np.testing.assert_array_equal(g["I"], np.array(want, np.float64))


def test_padded_convolution_matches_finite_differences():
    src = ("function (I[N, C], K[KW, C, F]) -> (O) {"
           " O[n, f: N, F] = +(I[n + k - 1, c] * K[k, c, f]), n + k < N + 1; }")
    rng = np.random.default_rng(1)
    check_fd(src, {"I": rng.standard_normal((5, 2)), "K": rng.standard_normal((3, 2, 2))},
             {"O": rng.standard_normal((5, 2))})


# ---------------------------------------------------------------------------- wrt and seeds
def test_integer_inputs_are_excluded_from_default_wrt():
    src = "function (A[N], I[N]) -> (O) { O = A * I; }"
    g = tile.gradient(src, dtypes={"I": DType.INT32})
    assert g.gradients == {"A": "DA"} and g.cotangents == {"O": "DO"}
    assert [o.name for o in g.program.outputs] == ["DA"]
    got = tile.grad_values(src, {"A": f64(1, 1), "I": np.array([2, 3], np.int32)})
    assert set(got) == {"A"}
    np.testing.assert_array_equal(got["A"], f64(2, 3))
    with pytest.raises(TileTypeError, match="'I'"):
        tile.grad(src, wrt=["I"], dtypes={"I": DType.INT32})


def test_seed_selects_outputs_and_values():
    src = "function (X[N]) -> (O, P) { O = X; P = X * X; }"
    g = tile.gradient(src, outputs=["P"])
    assert list(g.cotangents) == ["P"] and [i.name for i in g.program.inputs] == ["X", g.cotangents["P"]]
    got = grads(src, {"P": f64(2, 3)}, X=f64(1, 2))
    np.testing.assert_array_equal(got["X"], f64(1 + 2 * 2 * 1, 1 + 2 * 3 * 2))  # O's seed is ones


def test_gradient_dtype_is_the_input_dtype():
    for dt in (np.float16, np.float32, np.float64):
        got = tile.grad_values("function (X[N]) -> (O) { O = X * 0.5; }", {"X": np.array([1, 2], dt)})
        assert got["X"].dtype == dt
        np.testing.assert_array_equal(got["X"], np.array([0.5, 0.5], dt))


def test_exact_precision_gives_fractions():
    got = tile.grad_values("function (X[N]) -> (O) { O[] = *(X[i]); }", {"X": np.array([0.5, 3, 0.25])},
                           precision="exact")
    assert list(got["X"]) == [Fraction(3, 4), Fraction(1, 8), Fraction(3, 2)]


def test_empty_input_gets_an_empty_gradient_and_the_default_all_of_it():
    got = grads("function (X[N], D[]) -> (O) { O[] = *(X[i]) default D; }", X=np.zeros(0), D=np.float64(2))
    assert got["X"].shape == (0,)
    np.testing.assert_array_equal(got["D"], np.float64(1))


def test_input_that_reaches_no_output_gets_zeros():
    got = grads("function (X[N], Y[M]) -> (O) { O = X; }", X=f64(1, 2), Y=f64(3, 4, 5))
    np.testing.assert_array_equal(got["Y"], np.zeros(3))


# ------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("agg", [">", "<", "*"])
def test_extreme_or_product_of_several_tensors_is_derived(agg):
    # Once refused; now through the term tensor of tile.autodiff.combined (test_autodiff_extremum.py).
    src = f"function (A[N, M], B[N, M]) -> (O) {{\n    T = A;\n    O[i: N] = {agg}(A[i, j] * B[i, j]);\n}}"
    rng = np.random.default_rng(2)
    check_fd(src, {"A": rng.uniform(0.5, 1.5, (2, 3)), "B": rng.uniform(-1.5, -0.5, (2, 3))})


@pytest.mark.parametrize("wrt", [["B"], ["T"], ["O"]])
def test_wrt_naming_a_non_input_is_a_name_error(wrt):
    with pytest.raises(TileNameError, match=f"'{wrt[0]}'"):
        tile.grad("function (A[N]) -> (O) { T = A * 2; O = T; }", wrt=wrt)


def test_seed_naming_a_non_output_is_a_name_error():
    with pytest.raises(TileNameError, match="'A'"):
        tile.grad("function (A[N]) -> (O) { O = A * 2; }", outputs=["A"])


# ------------------------------------------------------------------------- custom gradients
FLOOR = "function (X[N]) -> (Y) { T = floor(X); Y = T * T; }"
STE = "function (DT[N]) -> (DX) { DX = DT; }"


def test_straight_through_estimator_replaces_the_zero_gradient_of_floor():
    x = f64(1.5, -0.5, 2.25)
    np.testing.assert_array_equal(grads(FLOOR, X=x)["X"], np.zeros(3))
    np.testing.assert_array_equal(grads(FLOOR, custom={"T": STE}, X=x)["X"], 2 * np.floor(x))
    text = format_program(tile.grad(FLOOR, custom={"T": STE}))
    assert "floor" in text and tile.parse(text)


def test_custom_gradient_reading_program_tensors_and_dims():
    src = "function (X[N]) -> (T) { T = X * X; }"
    g = grads(src, custom={"T": "function (DT[N], X[N]) -> (DX) { DX = DT * 3 * X; }"}, X=f64(1, -2))
    np.testing.assert_array_equal(g["X"], f64(3, -6))
    src = "function (A[N, M]) -> (O) { O[i: N] = +(A[i, j]); }"
    custom = {"O": "function (DO[N], A[N, M]) -> (DA) { D2 = DO * 2; DA[i, j: N, M] = +(D2[i]); }"}
    np.testing.assert_array_equal(grads(src, custom=custom, A=np.ones((2, 3)))["A"], np.full((2, 3), 2.0))


def test_custom_gradient_composes_with_derived_and_second_order():
    src = "function (X[N]) -> (Y) { T = X * X; Y = exp(T); }"
    custom = {"T": "function (DT[N], X[N]) -> (DX) { DX = DT * X * 3; }"}  # deliberately 1.5x the truth
    x = f64(0.5, -0.25)
    np.testing.assert_allclose(grads(src, custom=custom, X=x)["X"], np.exp(x * x) * 3 * x, rtol=1e-15)
    first = tile.gradient(src, custom=custom)
    second = tile.grad_values(first.program, {"X": x, first.cotangents["Y"]: np.ones(2)}, wrt=["X"],
                              precision="float64")
    want = np.exp(x * x) * (2 * x) * 3 * x + np.exp(x * x) * 3  # d/dx (3x exp(x^2))
    np.testing.assert_allclose(second["X"], want, rtol=1e-14)


@pytest.mark.parametrize("fn, what", [
    ("function (DT[N], Q) -> (DX) { DX = DT; }", "'Q'"),  # neither a program tensor nor DT
    ("function (DT[N]) -> (DY) { DY = DT; }", "'DY'"),  # T does not read Y
    ("function (DT[N]) -> (DQ) { DQ = DT; }", "'DQ'"),  # no such tensor
    ("function (DT[N]) -> (X) { X = DT; }", "'X'"),  # not named D<X>
])
def test_bad_custom_gradient_signatures_are_name_errors(fn, what):
    with pytest.raises(TileNameError) as e:
        tile.grad(FLOOR, custom={"T": fn})
    assert what in str(e.value) and "'None'" not in str(e.value)


def test_custom_gradient_of_the_wrong_shape_is_an_error():
    with pytest.raises((TileShapeError, TileTypeError)):
        tile.grad_values(FLOOR, {"X": f64(1.5, 2.5)},
                         custom={"T": "function (DT[N]) -> (DX) { DX[i, j: N, 2] = +(DT[i]); }"})


def test_custom_gradient_for_a_tensor_the_program_does_not_compute_is_an_error():
    with pytest.raises(TileNameError, match="'Z'"):
        tile.grad(FLOOR, custom={"Z": "function (DZ[N]) -> (DX) { DX = DZ; }"})


# ------------------------------------------------------------------------------ readability
READABLE = [
    CONV,
    "function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }",
    "function (X[N, M], W[M, K], B[K]) -> (O) { H[i, k: N, K] = +(X[i, j] * W[j, k]); O = relu(H + B); }",
    "function (X[N, M]) -> (O) { O[i: N] = >(X[i, j]); }",
    "function (X[N]) -> (O) { O[] = *(X[i]); }",
    "function (I[N], D[M]) -> (O) { O[2*i: M] = +(I[i]) default D; }",
    "function (X[R, C]) -> (O) { S = builtin_softmax(X, R, C); O = -log(S) * 2; }",
    "function (X, Y) -> (O) { O = (X - Y) * (X - Y) / 2 + 1 - exp(-X) + max(X, Y); }",
    "function (A[N], B[N], C[N]) -> (O) { O[i: N] = +(A[i] == B[i] ? C[i]); }",
]

IDENTITY = re.compile(r"[*/]\s*1(\.0*)?(?![\w.])|(?<![\w.])1(\.0*)?\s*\*|[+-]\s*0(\.0*)?(?![\w.])")


def _no_identity(e: ast.Expr) -> None:
    """No ``x * 1``, ``1 * x``, ``x / 1``, ``x + 0``, ``0 + x``, ``x - 0`` or ``- -x`` anywhere."""
    def lit(x, v):
        return isinstance(x, (ast.IntLit, ast.FloatLit)) and float(x.value) == v
    if isinstance(e, ast.Binary):
        assert not (e.op == "*" and (lit(e.lhs, 1) or lit(e.rhs, 1))), e
        assert not (e.op == "/" and lit(e.rhs, 1)), e
        assert not (e.op == "+" and (lit(e.lhs, 0) or lit(e.rhs, 0))), e
        assert not (e.op == "-" and lit(e.rhs, 0)), e
        _no_identity(e.lhs)
        _no_identity(e.rhs)
    elif isinstance(e, ast.Unary):
        assert not (e.op == "-" and isinstance(e.operand, ast.Unary) and e.operand.op == "-"), e
        _no_identity(e.operand)
    elif isinstance(e, ast.Ternary):
        for x in (e.cond, e.then, e.other):
            _no_identity(x)
    elif isinstance(e, ast.Call):
        for x in e.args:
            _no_identity(x)


@pytest.mark.parametrize("src", READABLE)
def test_gradient_program_is_readable_and_round_trips(src):
    p = tile.grad(src)
    text = format_program(p)
    assert not IDENTITY.search(text), text
    for s in p.stmts:
        if isinstance(s, ast.Assignment):
            _no_identity(s.expr)
    again = tile.parse(text)
    assert again == p
    bind_symbolic(again)
    assert tile.grad(again)  # and it can be differentiated again


@pytest.mark.parametrize("src", READABLE)
def test_gradient_program_has_no_double_negation(src):
    text = format_program(tile.grad(src))
    assert not re.search(r"-\s*-|-\s*\(-", text), text


# -------------------------------------------------------------------------------------- CLI
def run_cli(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "tile", "grad", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


MATMUL = "function (A[M, L], B[L, N]) -> (C) {\n    C[i, j: M, N] = +(A[i, k] * B[k, j]);\n}\n"


def test_cli_emit_prints_a_program_that_parses(tmp_path):
    f = tmp_path / "mm.tile"
    f.write_text(MATMUL)
    r = run_cli(f, "--emit")
    assert r.returncode == 0, r.stderr
    p = tile.parse(r.stdout)
    assert p == tile.grad(MATMUL)
    assert [o.name for o in p.outputs] == ["DA", "DB"]
    r = run_cli(f, "--emit", "--wrt", "B")
    assert r.returncode == 0, r.stderr
    assert [o.name for o in tile.parse(r.stdout).outputs] == ["DB"]


def test_cli_writes_grad_arrays(tmp_path):
    f = tmp_path / "mm.tile"
    f.write_text(MATMUL)
    a, b = f64([1, 2, 3], [4, 5, 6]), f64([1, -1], [2, 0], [-3, 1])
    np.savez(tmp_path / "in.npz", A=a, B=b)
    r = run_cli(f, "--inputs", tmp_path / "in.npz", "--output", tmp_path / "g.npz")
    assert r.returncode == 0, r.stderr
    assert "grad_A" in r.stdout and "grad_B" in r.stdout
    with np.load(tmp_path / "g.npz") as data:
        got = {k: data[k] for k in data.files}
    assert set(got) == {"grad_A", "grad_B"}
    np.testing.assert_array_equal(got["grad_A"], np.ones((2, 2)) @ b.T)
    np.testing.assert_array_equal(got["grad_B"], a.T @ np.ones((2, 2)))
    r = run_cli(f, "--inputs", tmp_path / "in.npz", "--wrt", "A", "--output", tmp_path / "g2.npz")
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "g2.npz") as data:
        assert list(data.files) == ["grad_A"]


def test_cli_reports_errors(tmp_path):
    f = tmp_path / "mm.tile"
    f.write_text(MATMUL)
    r = run_cli(f, "--emit", "--wrt", "Q")
    assert r.returncode == 1 and "'Q'" in r.stderr and "Traceback" not in r.stderr
