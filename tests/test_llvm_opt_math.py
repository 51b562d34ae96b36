"""``backends.llvm.opt_level.opt_level`` counts a transcendental function for ``MATH_OPS`` operations:
a program whose exp/tanh loops would run scalar at ``-O1`` for more than a few microseconds is
built at ``-O3`` (vectorized), while small and plain programs stay ``-O1`` (cheap to build)."""

from __future__ import annotations

import numpy as np
import pytest

import tile
from backends.llvm.opt_level import MATH_OPS, SMALL_FLOPS, math_ops

pytestmark = pytest.mark.usefixtures("private_cache")

CHAIN = "function (X[N, M]) -> (Y) { Y = tanh(relu(X) * 0.5) + exp(X); }"
PLAIN = "function (X[N, M]) -> (Y) { Y = relu(X) * 0.5 + X; }"


def _opt(src, shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    f = tile.compile(src, device="llvm_cpu.0", settings={"threads": 1})
    y = f(X=x)["Y"]
    return f._last.library.extra["opt"], x, y


def test_math_kernels_past_a_few_microseconds_are_built_at_3():
    points = 333 * 17
    assert points * (1 + 2 * MATH_OPS) >= SMALL_FLOPS > points  # (small by its point count alone)
    opt, x, y = _opt(CHAIN, (333, 17))
    assert opt == 3
    want = np.tanh(np.maximum(x, 0) * 0.5) + np.exp(x)
    np.testing.assert_allclose(y, want, rtol=8 * np.finfo(np.float32).eps, atol=0)


def test_small_or_plain_programs_stay_at_1():
    assert _opt(CHAIN, (5, 17))[0] == 1  # 85 points of two functions
    opt, x, y = _opt(PLAIN, (333, 17))
    assert opt == 1 and np.array_equal(y, np.maximum(x, 0) * np.float32(0.5) + x)


def test_math_ops_counts_each_function_of_a_point():
    f = tile.compile(CHAIN, device="llvm_cpu.0")
    f(X=np.ones((4, 4), np.float32))
    (kernel,) = f._last.kernels
    assert math_ops(kernel.info.block) == 2
