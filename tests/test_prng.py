"""PlaidML's PRNG: prng_step / prng_value / prng_state.

The generator is checked against ``tests.taus88`` (plain Python ints, written from the published
taus88 algorithm) and a step worked by hand; then the interpreter, the Stripe interpreter,
llvm_cpu.0 and opencl_cpu.0 must give the same bits; then misuse is a located error, and
gradients flow through the dropout mask only.
"""

from __future__ import annotations

import numpy as np
import pytest

import ref_interp
import tile
from ref_interp import prng
from tests.gradcheck import assert_close, fd_grad
from tests.opencl_support import DEVICE_ID as OPENCL
from tests.taus88 import reference, seed_state, taus88
from tile.errors import TileNameError, TileShapeError, TileTypeError

DROPOUT = """function (X[N, M], S) -> (O, S2) {
    H = prng_step(S, N, M);
    V = prng_value(H);
    S2 = prng_state(H);
    O = V < 0.75 ? X / 0.75 : 0;
}"""
# Two steps: the second draws from the state the first returns.
TWO = """function (S) -> (V, W, S3) {
    H = prng_step(S, 2, 1500);  V = prng_value(H);  S2 = prng_state(H);
    G = prng_step(S2, 5);       W = prng_value(G);  S3 = prng_state(G);
}"""
TARGETS = ["llvm_cpu.0", pytest.param("opencl_cpu.0", marks=pytest.mark.skipif(
    OPENCL is None, reason="no usable OpenCL device (PoCL) on this machine"))]


# ------------------------------------------------------------------------- the generator
def test_one_step_by_hand():
    # s1 = 2: (2 & ~1) << 12 = 8192, ((2 << 13) ^ 2) >> 19 = 0; s2 = 8: 8 << 4 = 128; s3 = 16: 16 << 17
    assert taus88(2, 8, 16) == (8192, 128, 2097152)
    state = np.zeros((3, 2048), np.uint32) + np.array([[2], [8], [16]], np.uint32)
    raw, after = prng.draw(state, 1)
    assert raw[0] == 8192 ^ 128 ^ 2097152
    assert prng.value(raw)[0] == np.float32(2105472 / 2**32)
    # only stream 0 advanced
    assert tuple(after[:, 0]) == (8192, 128, 2097152) and (after[:, 1:] == state[:, 1:]).all()


@pytest.mark.parametrize("n", [0, 1, 7, 2047, 2048, 2049, 6000])
def test_draw_matches_the_taus88_reference(n):
    state = seed_state(n)
    want_values, want_state = reference(state, (n,))
    raw, after = prng.draw(state, n)
    np.testing.assert_array_equal(prng.value(raw), want_values)
    np.testing.assert_array_equal(after, want_state)


def test_streams_advance_once_per_element_they_give():
    state = seed_state(3)
    _, after = prng.draw(state, 2048 + 5)  # streams 0..4 twice, the others once
    once, _ = prng.draw(state, 2048)
    twice = prng.draw(prng.draw(state, 2048)[1], 5)[1]
    np.testing.assert_array_equal(after[:, :5], twice[:, :5])
    np.testing.assert_array_equal(after[:, 5:], prng.draw(state, 2048)[1][:, 5:])
    assert once.shape == (2048,)


def test_values_round_to_nearest_so_one_is_possible():
    raw = np.array([0, 1, 2**32 - 129, 2**32 - 128, 2**32 - 1], np.uint32)
    got = prng.value(raw)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.float32([0, 2.0**-32, 1 - 2.0**-24, 1, 1]))


# ------------------------------------------------------------------------- programs
def test_dropout_on_the_interpreter():
    state = seed_state(1)
    x = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
    out = ref_interp.run(DROPOUT, {"X": x, "S": state})
    v, after = reference(state, (3, 4))
    np.testing.assert_array_equal(out["O"], np.where(v < 0.75, x / np.float32(0.75), 0).astype(np.float32))
    np.testing.assert_array_equal(out["S2"], after)
    assert out["S2"].dtype == np.uint32


# PlaidML 0.7's Keras dropout with noise_shape (None, 1), its three operations composed as one.
KERAS = """function (I, X[S0, S1], L) -> (O, N) {
    T = prng_step(I, S0, 1);
    N = prng_state(T);
    R = 1.0 - L;
    M = 1.0 / R;
    O = (prng_value(T) < R ? X * M : 0.0);
}"""


@pytest.mark.parametrize("device", ["interp", *TARGETS])
def test_keras_dropout_program(device):
    state, x, level = seed_state(8), np.arange(1, 4001, dtype=np.float32).reshape(2000, 2), np.float32(0.3)
    ins = {"I": state, "X": x, "L": level}
    out = ref_interp.run(KERAS, ins) if device == "interp" else tile.compile(KERAS, device)(ins)
    v, after = reference(state, (2000, 1))
    r = np.float32(1) - level
    np.testing.assert_array_equal(out["O"], np.where(v < r, x * (np.float32(1) / r), np.float32(0)))
    np.testing.assert_array_equal(out["N"], after)


def test_two_steps_and_a_scalar_draw():
    state = seed_state(2)
    out = ref_interp.run(TWO, {"S": state})
    v, s2 = reference(state, (2, 1500))
    w, s3 = reference(s2, (5,))
    np.testing.assert_array_equal(out["V"], v)
    np.testing.assert_array_equal(out["W"], w)
    np.testing.assert_array_equal(out["S3"], s3)
    one = ref_interp.run("function (S) -> (V, T) { H = prng_step(S); V = prng_value(H); T = prng_state(H); }",
                         {"S": state})
    assert one["V"].shape == () and one["V"] == reference(state, ())[0]


@pytest.mark.parametrize("precision", ["float64", "exact"])
def test_every_precision_draws_the_same_values(precision):
    src = "function (S) -> (V, T) { H = prng_step(S, 5000); V = prng_value(H); T = prng_state(H); }"
    state = seed_state(7)
    out = ref_interp.run(src, {"S": state}, precision)
    v, after = reference(state, (5000,))
    np.testing.assert_array_equal(np.asarray(out["V"], np.float64), v.astype(np.float64))
    np.testing.assert_array_equal(out["T"], after)


@pytest.mark.parametrize("device", TARGETS)
@pytest.mark.parametrize("src, shape", [(DROPOUT, (3, 1500)), (DROPOUT, (1, 0)), (TWO, None)])
def test_targets_give_the_interpreters_bits(device, src, shape):
    state = seed_state(4)
    ins = {"S": state} if shape is None else {"S": state, "X": np.ones(shape, np.float32)}
    want = ref_interp.run(src, ins)
    got = tile.compile(src, device)(ins)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_symbolic_check_types_the_triple():
    bound = tile.bind_symbolic(tile.parse(DROPOUT))  # a state input defaults to uint32 there
    assert str(bound.types["V"]) == "float32[N, M]"
    assert str(bound.types["S2"]) == "uint32[3, 2048]"


# ------------------------------------------------------------------------- misuse
STATE = {"S": seed_state(0)}
MISUSE = [
    ("function (S) -> (V) { V = prng_value(S); }", TileNameError, "needs the handle a prng_step returns"),
    ("function (S) -> (T) { T = prng_state(S); }", TileNameError, "needs the handle a prng_step returns"),
    ("function (S) -> (V) { H = prng_step(S, 4); V = prng_value(H); }", TileNameError,
     "has no prng_state(H)"),
    ("function (S) -> (T) { H = prng_step(S, 4); T = prng_state(H); }", TileNameError,
     "has no prng_value(H)"),
    ("function (S) -> (V, T, X) { H = prng_step(S, 4); V = prng_value(H); T = prng_state(H); X = H + 1; }",
     TileNameError, "can only be passed to prng_value and prng_state"),
    ("function (S) -> (V, T, O) { H = prng_step(S, 4); V = prng_value(H); T = prng_state(H); "
     "O[i: 4] = +(H[i]); }", TileNameError, "can only be passed to prng_value and prng_state"),
    ("function (S) -> (V, T, H) { H = prng_step(S, 4); V = prng_value(H); T = prng_state(H); }",
     TileNameError, "cannot be an output"),
    ("function (S) -> (V) { V = prng_value(prng_step(S, 4)); }", TileNameError, "whole right-hand side"),
    ("function (S) -> (V, T) { H = prng_step(S, 0 - 4); V = prng_value(H); T = prng_state(H); }",
     TileShapeError, "must not be negative"),
]


@pytest.mark.parametrize("src, cls, text", MISUSE)
def test_misuse_is_a_located_error(src, cls, text):
    with pytest.raises(cls) as e:
        ref_interp.run(src, STATE)
    assert text in str(e.value) and e.value.span is not None and e.value.hint
    assert "^" in str(e.value)


@pytest.mark.parametrize(
    "state, cls, text",
    [
        (np.zeros((3, 2048), np.float32), TileTypeError, "must be uint32, not float32"),
        (np.zeros((3, 1024), np.uint32), TileShapeError, "has shape (3, 1024), not (3, 2048)"),
        (np.zeros((6144,), np.uint32), TileShapeError, "has shape (6144,), not (3, 2048)"),
    ],
)
def test_a_wrong_state_is_a_located_error(state, cls, text):
    with pytest.raises(cls) as e:
        ref_interp.run(DROPOUT, {"S": state, "X": np.ones((2, 2), np.float32)})
    assert text in str(e.value) and "[3, 2048]" in e.value.hint


# ------------------------------------------------------------------------- gradients
def test_gradient_flows_through_the_mask_only():
    state, x = seed_state(5), np.linspace(-1, 1, 12).reshape(3, 4)
    grads = tile.grad_values(DROPOUT, {"X": x, "S": state}, precision="float64")
    assert set(grads) == {"X"}  # the uint32 state has no gradient
    v, _ = reference(state, (3, 4))
    np.testing.assert_allclose(grads["X"], np.where(v < 0.75, 1 / 0.75, 0.0), rtol=1e-15)
    assert_close(grads["X"], fd_grad(DROPOUT, {"X": x, "S": state}, "X"), x.size)


def test_gradient_program_keeps_the_triple_together():
    # The gradient needs V, so it recomputes H and V; prng_state(H) must come along (tile.prng's rule).
    g = tile.grad(DROPOUT)
    names = {s.name for s in g.stmts}
    assert {"H", "V", "S2"} <= names
    tile.bind_symbolic(g)  # a valid program
