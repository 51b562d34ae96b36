"""tile.ops reductions against torch: integer data makes sums, products and extrema exact; the
mean and variance divide once more (compared within k·eps·K)."""

from __future__ import annotations

import numpy as np
import pytest
from ops_support import check, check_grad, integers, torch, uniform

import tile.ops as ops

T = torch.tensor
AXES = [(None, False), (1, False), (-1, True), ((0, 2), False), ((0, 2), True)]


def _torch_axis(axis):
    return tuple(range(3)) if axis is None else (axis % 3,) if isinstance(axis, int) else axis


@pytest.mark.parametrize("axis, keepdim", AXES)
def test_sum_prod_max_min(axis, keepdim):
    x = integers((3, 4, 5), low=-2, high=3)
    dims = _torch_axis(axis)
    check(ops.sum(rank=3, axis=axis, keepdim=keepdim), {"X": x}, torch.sum(T(x), dims, keepdim), exact=True)
    check(ops.max(rank=3, axis=axis, keepdim=keepdim), {"X": x}, torch.amax(T(x), dims, keepdim), exact=True)
    check(ops.min(rank=3, axis=axis, keepdim=keepdim), {"X": x}, torch.amin(T(x), dims, keepdim), exact=True)
    small = integers((3, 4, 5), low=-1, high=2)  # products of at most 60 of {-1, 0, 1}
    want = T(small)
    for a in sorted(dims, reverse=True):
        want = torch.prod(want, a, keepdim)
    check(ops.prod(rank=3, axis=axis, keepdim=keepdim), {"X": small}, want, exact=True)


@pytest.mark.parametrize("axis, keepdim", AXES)
def test_mean_var(axis, keepdim):
    x = integers((3, 4, 5), low=-5, high=6)
    dims = _torch_axis(axis)
    K = int(np.prod([x.shape[a] for a in dims]))
    check(ops.mean(rank=3, axis=axis, keepdim=keepdim), {"X": x}, torch.mean(T(x), dims, keepdim), K=K)
    check(ops.var(rank=3, axis=axis, keepdim=keepdim), {"X": x}, torch.var(T(x), dims, keepdim=keepdim), K=K)
    check(ops.var(rank=3, axis=axis, keepdim=keepdim, correction=0), {"X": x},
          torch.var(T(x), dims, keepdim=keepdim, correction=0), K=K)


def test_reduction_gradients():
    x = uniform((3, 4, 5))
    check_grad(ops.sum(rank=3, axis=1), {"X": x}, lambda X: X.sum(1), ["X"])
    check_grad(ops.mean(rank=3, axis=(0, 2)), {"X": x}, lambda X: X.mean((0, 2)), ["X"], K=15)
    check_grad(ops.var(rank=3, axis=2, keepdim=True), {"X": x}, lambda X: X.var(2, keepdim=True), ["X"], K=5)
    check_grad(ops.max(rank=3, axis=0), {"X": x}, lambda X: X.amax(0), ["X"])  # no ties in uniform data
    check_grad(ops.prod(rank=3, axis=2), {"X": x}, lambda X: X.prod(2), ["X"], K=5)


def test_argmax_takes_the_first_maximum():
    x = integers((3, 4, 5), low=-2, high=3)  # many ties
    for axis in (0, 1, 2):
        check(ops.argmax(rank=3, axis=axis), {"X": x}, torch.argmax(T(x), axis).int(), exact=True)
    check(ops.argmax(rank=3, axis=1, keepdim=True), {"X": x}, torch.argmax(T(x), 1, keepdim=True).int(),
          exact=True)
    check(ops.argmax(rank=3), {"X": x}, torch.argmax(T(x)).int(), exact=True)
