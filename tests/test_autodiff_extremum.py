"""Gradients of every aggregation over every combination (``tile.autodiff.combined`` for ``>``,
``<`` and ``*`` over several tensors): float64 central finite differences where the function is
smooth (random inputs, so no two max/min candidates tie), exact integer expectations for the tie
convention and for products with zeros, the compiled gradient on ``llvm_cpu.0`` against the
interpreter, and the warning about a large term tensor.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ref_interp
import tile
from backends import registry
from tests.gradcheck import assert_close, fd_grad
from tile.autodiff import TileGradientMemoryWarning
from tile.bind import bind
from tile.inputs import input_types

AGGS = ["+", "*", ">", "<", "="]
M, K, N = 2, 3, 2


def check_fd(src: str, inputs: dict, wrt: list[str], length: int) -> dict:
    got = tile.grad_values(src, inputs, precision="float64")
    for name in wrt:
        assert_close(got[name], fd_grad(src, inputs, name), length)
    return got


def _program(agg: str, comb: str) -> str:
    # `=` writes each output element once, so its output keeps k; the others reduce over k.
    out = "C[i, j, k: M, N, K]" if agg == "=" else "C[i, j: M, N]"
    body = {
        "": "A[i, k]",
        "+": "A[i, k] + B[k, j]",
        "*": "A[i, k] * B[k, j]",
        "?": "A[i, k] == B[k, j] ? X[i, j, k]",
    }[comb]
    return f"function (A[M, K], B[K, N], X[M, N, K]) -> (C) {{ {out} = {agg}({body}); }}"


@pytest.mark.parametrize("comb", ["", "+", "*"])
@pytest.mark.parametrize("agg", AGGS)
def test_every_aggregation_over_sums_and_products_matches_finite_differences(agg, comb):
    rng = np.random.default_rng(len(agg) * 7 + len(comb))
    # Away from 0 so products stay well conditioned; distinct random values, so no ties.
    a = rng.uniform(0.5, 1.5, (M, K)) * rng.choice([-1, 1], (M, K))
    b = rng.uniform(0.5, 1.5, (K, N)) * rng.choice([-1, 1], (K, N))
    x = rng.standard_normal((M, N, K))
    src = _program(agg, comb)
    got = check_fd(src, {"A": a, "B": b, "X": x}, ["A", "B", "X"], K)
    if comb == "":
        np.testing.assert_array_equal(got["B"], np.zeros((K, N)))


@pytest.mark.parametrize("agg", AGGS)
def test_every_aggregation_over_a_selection_sends_the_gradient_to_the_selected_tensor(agg):
    # A and B hold small integers so that some pairs are equal; a pair compared unequal gives 0,
    # a constant. A and B have no gradient (the comparison is piecewise constant), X has one.
    rng = np.random.default_rng(3)
    a = rng.integers(0, 2, (M, K)).astype(np.float64)
    b = rng.integers(0, 2, (K, N)).astype(np.float64)
    x = rng.uniform(0.5, 1.5, (M, N, K)) * rng.choice([-1, 1], (M, N, K))
    src = _program(agg, "?")
    got = check_fd(src, {"A": a, "B": b, "X": x}, ["X"], K)
    np.testing.assert_array_equal(got["A"], np.zeros((M, K)))
    np.testing.assert_array_equal(got["B"], np.zeros((K, N)))
    assert np.any(got["X"] != 0)


@pytest.mark.parametrize("agg", AGGS)
def test_every_aggregation_over_a_comparison_has_no_gradient(agg):
    out = "E[i, j, k: M, N, K]" if agg == "=" else "E[i, j: M, N]"
    shape = "i, j, k" if agg == "=" else "i, j"
    src = (f"function (A[M, K], B[K, N], W[M, N, K]) -> (C) {{ {out} = {agg}(A[i, k] == B[k, j]);"
           f" C[{shape}: {'M, N, K' if agg == '=' else 'M, N'}] = +(W[i, j, k] * E[{shape}]); }}")
    a = np.array([[0, 1, 1], [1, 0, 1]], np.float64)
    b = np.array([[1, 0], [0, 0], [1, 1]], np.float64)
    w = np.random.default_rng(4).standard_normal((M, N, K))
    got = check_fd(src, {"A": a, "B": b, "W": w}, ["W"], K)
    np.testing.assert_array_equal(got["A"], np.zeros((M, K)))
    np.testing.assert_array_equal(got["B"], np.zeros((K, N)))


def test_max_plus_product_has_the_argmax_indicator_as_gradient():
    # C = [[max(1 + 0, 5 + 1), max(1 + 2, 5 - 9)]] = [[6, 3]]: A[0, 1] and B[1, 0] win for j = 0,
    # A[0, 0] and B[0, 1] for j = 1.
    src = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = >(A[i, k] + B[k, j]); }"
    dc = np.array([[10.0, 100.0]])
    got = tile.grad_values(src, {"A": np.array([[1.0, 5.0]]), "B": np.array([[0.0, 2.0], [1.0, -9.0]])},
                           cotangents={"C": dc}, precision="float64")
    np.testing.assert_array_equal(got["A"], [[100, 10]])
    np.testing.assert_array_equal(got["B"], [[0, 100], [10, 0]])


@pytest.mark.parametrize("agg, comb", [(">", "+"), ("<", "+"), (">", "*"), ("<", "*")])
def test_every_tied_term_receives_the_full_gradient(agg, comb):
    # Integers with many ties; the expectation is the indicator of each term equal to its output.
    rng = np.random.default_rng(5)
    a = rng.integers(-1, 2, (3, 4)).astype(np.float64)
    b = rng.integers(-1, 2, (4, 3)).astype(np.float64)
    dc = rng.integers(-3, 4, (3, 3)).astype(np.float64)
    src = f"function (A[M, K], B[K, N]) -> (C) {{ C[i, j: M, N] = {agg}(A[i, k] {comb} B[k, j]); }}"
    terms = a[:, :, None] + b[None] if comb == "+" else a[:, :, None] * b[None]  # [i, k, j]
    best = terms.max(axis=1) if agg == ">" else terms.min(axis=1)
    hit = (terms == best[:, None, :]) * dc[:, None, :]
    assert (hit != 0).sum(axis=1).max() > 1, "the inputs must tie somewhere"
    da, db = (hit.sum(axis=2), hit.sum(axis=0)) if comb == "+" else (
        np.einsum("ikj,kj->ik", hit, b), np.einsum("ikj,ik->kj", hit, a))
    got = tile.grad_values(src, {"A": a, "B": b}, cotangents={"C": dc}, precision="float64")
    np.testing.assert_array_equal(got["A"], da)
    np.testing.assert_array_equal(got["B"], db)


@pytest.mark.parametrize("a, want", [
    ([[2, 3, 4]], [[10, 6, 15]]),  # terms 3, 5, 2: d/dA[k] = product of the other terms
    ([[-1, 3, 4]], [[10, 0, 0]]),  # one zero term: only it gets the product of the others
    ([[-1, -2, 4]], [[0, 0, 0]]),  # two zero terms: nothing
])
def test_product_over_a_sum_is_exact_with_zero_terms(a, want):
    src = "function (A[M, K], B[K]) -> (C) { C[i: M] = *(A[i, k] + B[k]); }"
    b = np.array([1.0, 2.0, -2.0])
    got = tile.grad_values(src, {"A": np.array(a, np.float64), "B": b}, precision="float64")
    np.testing.assert_array_equal(got["A"], np.array(want, np.float64))
    np.testing.assert_array_equal(got["B"], np.array(want, np.float64)[0])
    assert_close(got["A"], fd_grad(src, {"A": np.array(a, np.float64), "B": b}, "A"), 3)


@pytest.mark.parametrize("agg", [">", "<", "*"])
def test_a_term_read_by_several_tuples(agg):
    # (i, j) = (0, 1) and (1, 0) read the same pair A[1], B[1]: one candidate of the max (counted
    # once), but two factors of the product.
    src = f"function (A[N], B[N]) -> (C) {{ C[] = {agg}(A[i + j] * B[i + j + 1]), i < 2, j < 2; }}"
    rng = np.random.default_rng(6)
    inputs = {"A": rng.uniform(0.5, 1.5, 4), "B": rng.uniform(0.5, 1.5, 4) * [1, -1, 1, -1]}
    check_fd(src, inputs, ["A", "B"], 4)


@pytest.mark.parametrize("agg", [">", "<", "*"])
def test_padded_window_with_a_bias_matches_finite_differences(agg):
    # A pool over a padded window that adds a per-offset bias: out-of-range reads are not terms
    # (nor factors of the product), and the offset k appears in no output index.
    src = ("function (I[N, C], W[KW, C]) -> (O) {"
           f" O[n, c: N, C] = {agg}(I[n + k - 1, c] + W[k, c]), n + k < N + 1; }}")
    rng = np.random.default_rng(7)
    check_fd(src, {"I": rng.standard_normal((5, 2)), "W": rng.standard_normal((3, 2))}, ["I", "W"], 3)


@pytest.mark.parametrize("agg", [">", "<", "*"])
def test_padded_selection_matches_finite_differences(agg):
    # Three operands, one read out of range at the edges: X[i + k - 1] for i + k = 0 is no term.
    src = f"function (A[M, K], B[K], X[M]) -> (C) {{ C[i: M] = {agg}(A[i, k] == B[k] ? X[i + k - 1]); }}"
    a = np.array([[1, 0, 1], [0, 0, 1], [1, 1, 1], [0, 1, 0]], np.float64)
    x = np.random.default_rng(9).uniform(0.5, 1.5, 4) * [1, -1, -1, 1]
    got = check_fd(src, {"A": a, "B": np.array([1.0, 0.0, 1.0]), "X": x}, ["X"], 3)
    assert np.any(got["X"] != 0)


@pytest.mark.parametrize("agg, comb", [(">", "+"), ("<", "*"), ("*", "*"), ("*", "+")])
def test_second_derivative_matches_finite_differences_of_the_gradient(agg, comb):
    src = f"function (A[M, K], B[K, N]) -> (C) {{ C[i, j: M, N] = {agg}(A[i, k] {comb} B[k, j]); }}"
    g = tile.grad(src)
    rng = np.random.default_rng(10)
    inputs = {"A": rng.uniform(0.5, 1.5, (2, 3)), "B": rng.uniform(-1.5, -0.5, (3, 2)),
              "DC": rng.uniform(0.5, 1.5, (2, 2))}
    got = tile.grad_values(g, inputs, wrt=["A", "B"], precision="float64")
    for name in ("A", "B"):
        assert_close(got[name], fd_grad(g, inputs, name), 3 * 6)


@pytest.mark.parametrize("src", [
    "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = >(A[i, k] + B[k, j]); }",
    "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = *(A[i, k] * B[k, j]); }",
    "function (A[N], B[N]) -> (C) { C[] = <(A[N - 1 - i - j] * B[2*i + 2*j + 1]), i < 2, j < 2; }",
])
def test_symbolic_gradient_prints_and_parses_again(src):
    g = tile.grad(src)
    assert tile.parse(tile.format_program(g)) == g


def test_a_large_term_tensor_is_warned_about_with_its_size():
    src = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = >(A[i, k] + B[k, j]); }"
    with pytest.warns(TileGradientMemoryWarning, match=r"16777216 terms .*\(256, 256, 256\)"):
        tile.gradient(src, shapes={"A": (256, 256), "B": (256, 256)})
    with warnings.catch_warnings():
        warnings.simplefilter("error", TileGradientMemoryWarning)
        tile.gradient(src, shapes={"A": (255, 256), "B": (256, 256)})  # under 2^24 terms
        tile.gradient(src, shapes={"A": (65536, 256), "B": (256, 1)})  # 2^24, but so is A
        tile.gradient(src)  # sizes unknown


LLVM = "llvm_cpu.0"


@pytest.mark.skipif(LLVM not in registry.devices(), reason=f"{LLVM} unavailable: {registry.unavailable()}")
@pytest.mark.parametrize("src, b_shape", [
    ("function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = >(A[i, k] + B[k, j]); }", (4, 3)),
    ("function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = <(A[i, k] * B[k, j]); }", (4, 3)),
    ("function (A[M, K], B[K]) -> (C) { C[i: M] = *(A[i, k] + B[k]); }", (4,)),
    ("function (A[M, K], B[N]) -> (C) { C[] = >(A[i, j + k] + B[j + k + 1]), j < 2, k < 2; }", (5,)),
])
def test_gradient_program_compiles_and_matches_the_interpreter_on_llvm(src, b_shape):
    rng = np.random.default_rng(8)
    fwd = tile.parse(src)
    shapes = {"A": (3, 4), "B": b_shape}
    inputs = {n: rng.integers(-2, 3, s).astype(np.float32) for n, s in shapes.items()}
    g = tile.gradient(fwd, shapes=shapes)
    out_shape = ref_interp.run(bind(fwd, input_types(fwd, inputs)), inputs)["C"].shape
    inputs[g.cotangents["C"]] = rng.integers(-3, 4, out_shape).astype(np.float32)
    want = ref_interp.run(bind(g.program, input_types(g.program, inputs)), inputs)
    got = tile.compile(g.program, LLVM)(**inputs)
    assert any(np.any(want[n] != 0) for n in g.gradients.values())
    for name in g.gradients.values():
        np.testing.assert_array_equal(np.asarray(got[name]), want[name])
