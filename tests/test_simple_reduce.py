"""``simple_reduce`` (a `+` contraction in disguise) and ``reshape`` to and from 0-D.

Values against numpy with integer-valued inputs (exact on every target), on the interpreter,
llvm_cpu.0 and opencl_cpu.0; gradients against float64 central differences; misuse as located
errors.
"""

from __future__ import annotations

import numpy as np
import pytest

import ref_interp
import tile
from tests.gradcheck import assert_close, fd_grad
from tests.opencl_support import DEVICE_ID as OPENCL
from tile.errors import TileShapeError, TileTypeError

TARGETS = ["interp", "llvm_cpu.0", pytest.param("opencl_cpu.0", marks=pytest.mark.skipif(
    OPENCL is None, reason="no usable OpenCL device (PoCL) on this machine"))]
RNG = np.random.default_rng(15)


def ints(shape, dtype=np.float32) -> np.ndarray:
    return RNG.integers(-4, 5, shape).astype(dtype)


def run(src: str, inputs: dict, device: str) -> dict:
    return ref_interp.run(src, inputs) if device == "interp" else tile.compile(src, device)(inputs)


# (operand shape, target sizes, the numpy axes summed)
REDUCTIONS = [
    ((2, 3, 4), (1, 4), (0, 1)),
    ((2, 3, 4), (3, 1), (0, 2)),
    ((2, 3, 4), (2, 3, 4), ()),  # nothing to sum: PlaidML made it `ident`
    ((2, 3, 4), (1, 1, 1), (0, 1, 2)),
    ((2, 3, 4), (), (0, 1, 2)),  # no sizes: the total, 0-D
    ((5, 1), (1,), (0, 1)),  # a size-1 operand dim under a size-1 target
    ((7,), (7,), ()),
]


@pytest.mark.parametrize("device", TARGETS)
@pytest.mark.parametrize("shape, target, axes", REDUCTIONS)
def test_sums_like_numpy(device, shape, target, axes):
    sizes = "".join(f", {d}" for d in target)
    src = f"function (A) -> (R) {{ R = simple_reduce(A{sizes}); }}"
    for dtype in (np.float32, np.int32):
        a = ints(shape, dtype)
        got = run(src, {"A": a}, device)["R"]
        want = a.sum(axis=axes, dtype=dtype).reshape(target)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_is_bound_as_a_contraction_with_symbolic_sizes():
    bound = tile.bind_symbolic(tile.parse("function (X[N, M, K]) -> (R) { R = simple_reduce(X, 1, K); }"))
    assert str(bound.types["R"]) == "float32[1, K]"
    from tile.transforms.emit import format_contraction

    assert format_contraction(bound.stmts[0]) == "R[0, i2: 1, K] = +(X[i0, i1, i2]);"


MISUSE = [
    ("function (A[N, M]) -> (R) { R = simple_reduce(A, 2); }", TileShapeError, "size 2 is neither 1 nor 3"),
    ("function (A[N, M]) -> (R) { R = simple_reduce(A, 1, 1, 3); }", TileShapeError, "cannot add dimensions"),
    ("function (A[N, M]) -> (R) { R = simple_reduce(A, M) * 2; }", TileTypeError, "whole right-hand side"),
    ("function (A[N, M]) -> (R) { R = simple_reduce(A * 2, M); }", TileTypeError, "named by its first"),
]


@pytest.mark.parametrize("src, cls, text", MISUSE)
def test_misuse_is_a_located_error(src, cls, text):
    with pytest.raises(cls) as e:
        ref_interp.run(src, {"A": np.zeros((2, 3), np.float32)})
    assert text in str(e.value) and e.value.span is not None and e.value.hint and "^" in str(e.value)


def test_gradient_broadcasts_back_and_differentiates_again():
    src = "function (X[N, M], W[M]) -> (O) { R = simple_reduce(X, 1, M); O = R * R * W; }"
    x, w = RNG.uniform(-1, 1, (4, 3)), RNG.uniform(-1, 1, (3,))
    g = tile.grad_values(src, {"X": x, "W": w}, precision="float64")
    r = x.sum(axis=0)
    np.testing.assert_allclose(g["X"], np.broadcast_to(2 * r * w, x.shape), rtol=1e-14)
    assert_close(g["X"], fd_grad(src, {"X": x, "W": w}, "X"), x.size)
    # second order (PlaidML's had no rule for simple_reduce itself, its issue #223)
    first = tile.grad(src, wrt=["X"], shapes={"X": (4, 3), "W": (3,)})
    second = tile.grad(first, wrt=["X"], shapes={"X": (4, 3), "W": (3,), "DO": (1, 3)})
    ins = {"X": x, "W": w, "DO": np.ones((1, 3))}
    names = [i.name for i in second.inputs]
    ins.update({n: np.ones((4, 3)) for n in names if n not in ins})
    out = ref_interp.run(second, ins, "float64")
    np.testing.assert_allclose(out[second.outputs[0].name], np.broadcast_to(2 * 4 * w, x.shape), rtol=1e-14)


# ------------------------------------------------------------------------- reshape and 0-D
@pytest.mark.parametrize("device", TARGETS)
def test_reshape_to_and_from_0d(device):
    src = """function (A, B) -> (S, T, U, V) {
        S = reshape(A);          // (1, 1, 1) -> ()
        T = reshape(B, 1, 1);    // () -> (1, 1)
        U = reshape(S, 1);
        V = reshape(B) * 2;
    }"""
    a, b = np.array([[[7]]], np.int16), np.float32(-3)
    out = run(src, {"A": a, "B": b}, device)
    np.testing.assert_array_equal(out["S"], np.int16(7))
    assert out["S"].shape == () and out["S"].dtype == np.int16
    np.testing.assert_array_equal(out["T"], np.float32([[-3]]))
    np.testing.assert_array_equal(out["U"], np.int16([7]))
    np.testing.assert_array_equal(out["V"], np.float32(-6))


def test_reshape_to_0d_needs_one_element():
    with pytest.raises(TileShapeError) as e:
        ref_interp.run("function (A) -> (S) { S = reshape(A); }", {"A": np.zeros(2)})
    assert "changes the element count" in str(e.value) and "^" in str(e.value)


def test_reshape_0d_gradients():
    src = "function (X[N], Y) -> (O) { S = reshape(X); T = reshape(Y, 1, 1); O = S * T * T; }"
    x, y = np.array([0.7]), np.array(-1.3)
    g = tile.grad_values(src, {"X": x, "Y": y}, precision="float64")
    np.testing.assert_allclose(g["X"], [y * y], rtol=1e-15)
    np.testing.assert_allclose(g["Y"], 2 * x[0] * y, rtol=1e-15)
    for name in ("X", "Y"):
        assert_close(g[name], fd_grad(src, {"X": x, "Y": y}, name), 1)
