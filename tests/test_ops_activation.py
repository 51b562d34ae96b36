"""tile.ops activations against torch. Piecewise-linear ones are exact on integer data; the others
round their transcendental functions (within k·eps). erf, which Tile composes from polynomials,
is checked against math.erf on a dense grid in both float types."""

from __future__ import annotations

import math

import numpy as np
import pytest
from ops_support import check, check_grad, run_all, torch

import tile.ops as ops

F = torch.nn.functional
T = torch.tensor

CASES = [  # source, torch function, exact on integers
    (ops.relu(), F.relu, True),
    (ops.leaky_relu(0.25), lambda x: F.leaky_relu(x, 0.25), True),
    (ops.hardswish(), F.hardswish, False),
    (ops.sigmoid(), torch.sigmoid, False),
    (ops.tanh(), torch.tanh, False),
    (ops.silu(), F.silu, False),
    (ops.elu(1.5), lambda x: F.elu(x, 1.5), False),
    (ops.gelu(approximate="tanh"), lambda x: F.gelu(x, approximate="tanh"), False),
    (ops.gelu(), F.gelu, False),
]
INTEGERS = np.arange(-8, 9, dtype=np.float32).reshape(1, 17)
# the kinks (-3, 0, 3) and values far out, where an unused branch must not poison the gradient
POINTS = np.concatenate([np.linspace(-5, 5, 41), [-3.0, 3.0, 0.0, 100.0, -100.0, 800.0]])


@pytest.mark.parametrize("src, fn, exact", CASES, ids=[c[0].splitlines()[-2].strip() for c in CASES])
def test_activation(src, fn, exact):
    check(src, {"X": INTEGERS}, fn(T(INTEGERS)), exact=exact, K=2)
    x32 = POINTS.astype(np.float32)
    check(src, {"X": x32}, fn(T(x32)), K=2)
    check(src, {"X": POINTS}, fn(T(POINTS)), K=2)
    check_grad(src, {"X": POINTS}, fn, ["X"], K=2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_erf_is_within_an_ulp_or_two(dtype):
    x = np.concatenate([np.linspace(-8, 8, 4001), [0.0, -0.0, 1.0, -1.0, 3.0, 7.0, -7.0, 1e-30]])
    x = x.astype(dtype)
    want = np.array([math.erf(v) for v in x.astype(np.float64)])
    tiny = np.finfo(dtype).tiny
    for target, outs in run_all(ops.erf(), {"X": x}):
        got = outs["Y"]
        assert got.dtype == dtype
        rel = np.abs(got.astype(np.float64) - want) / np.maximum(np.abs(want), tiny)
        assert rel.max() <= 2 * np.finfo(dtype).eps, (target, rel.max())


def test_erf_edges():
    x = np.array([np.inf, -np.inf, np.nan, 6.5, -20.0])
    for target, outs in run_all(ops.erf(), {"X": x}):
        np.testing.assert_array_equal(outs["Y"], [1.0, -1.0, np.nan, math.erf(6.5), -1.0], err_msg=target)
    check_grad(ops.erf(), {"X": np.linspace(-8, 8, 161)}, torch.erf, ["X"], K=4, llvm=True)


def test_gelu_refuses_an_unknown_form():
    with pytest.raises(ValueError, match="approximate"):
        ops.gelu("sigmoid")
