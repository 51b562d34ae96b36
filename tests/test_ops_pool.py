"""tile.ops pools against torch.nn.functional. Max pools and sums of integers are exact; an
average pool is one correctly rounded division of an exact sum by an exact count, as PyTorch's, so
it is compared exactly too. PyTorch's adaptive pool rounds differently (by an ulp), so it is
compared within k·eps·K for a window of K elements."""

from __future__ import annotations

import numpy as np
import pytest
from ops_support import check, check_grad, integers, torch, uniform

import tile.ops as ops

F = torch.nn.functional
T = torch.tensor

WINDOWS = [  # kernel, stride, padding, ceil_mode
    (3, 2, 1, True),
    (2, 2, 0, False),
    (3, 3, 1, True),
    ((3, 2), (2, 1), (1, 0), False),
    (2, 3, 1, True),
]


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode", WINDOWS)
def test_max_pool2d(kernel, stride, padding, ceil_mode):
    x = integers((2, 3, 7, 6), low=-9, high=10)
    src = ops.max_pool2d(kernel, stride=stride, padding=padding, ceil_mode=ceil_mode)
    check(src, {"X": x}, F.max_pool2d(T(x), kernel, stride, padding, 1, ceil_mode), exact=True)


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode", WINDOWS)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool2d(kernel, stride, padding, ceil_mode, count_include_pad):
    x = integers((2, 3, 7, 6), low=-9, high=10)
    src = ops.avg_pool2d(kernel, stride=stride, padding=padding, ceil_mode=ceil_mode,
                         count_include_pad=count_include_pad)
    want = F.avg_pool2d(T(x), kernel, stride, padding, ceil_mode, count_include_pad)
    check(src, {"X": x}, want, exact=True)


def test_pools_1d_3d_dilation_and_channels_last():
    x1 = integers((2, 3, 9), low=-9, high=10)
    check(ops.max_pool1d(3, stride=2, padding=1, dilation=2), {"X": x1},
          F.max_pool1d(T(x1), 3, 2, 1, 2), exact=True)
    check(ops.avg_pool1d(4, stride=3, padding=2, ceil_mode=True, count_include_pad=False), {"X": x1},
          F.avg_pool1d(T(x1), 4, 3, 2, True, False), exact=True)
    x3 = integers((1, 2, 5, 4, 5), low=-9, high=10)
    check(ops.max_pool3d(2, stride=(2, 1, 2), padding=1), {"X": x3},
          F.max_pool3d(T(x3), 2, (2, 1, 2), 1), exact=True)
    check(ops.avg_pool3d(3, stride=2, padding=1, ceil_mode=True), {"X": x3},
          F.avg_pool3d(T(x3), 3, 2, 1, True), exact=True)
    x = integers((2, 3, 7, 6), low=-9, high=10)
    check(ops.max_pool2d(2, stride=1, padding=1, dilation=2, layout="NHWC"),
          {"X": np.moveaxis(x, 1, -1).copy()}, F.max_pool2d(T(x), 2, 1, 1, 2).permute(0, 2, 3, 1), exact=True)


@pytest.mark.parametrize("size", [(3, 2), (4, 4), (7, 6), (1, 1), (5, 4)])
def test_adaptive_avg_pool2d(size):
    x = integers((2, 3, 7, 6), low=-9, high=10)
    K = (-(-7 // size[0]) + 1) * (-(-6 // size[1]) + 1)  # at least a window's most elements
    check(ops.adaptive_avg_pool2d(size), {"X": x}, F.adaptive_avg_pool2d(T(x), size), K=K)


def test_adaptive_avg_pool_1d_and_channels_last():
    x = integers((2, 3, 10), low=-9, high=10)
    check(ops.adaptive_avg_pool1d(4), {"X": x}, F.adaptive_avg_pool1d(T(x), 4), K=4)
    x = integers((1, 5, 4, 2), low=-9, high=10)
    want = F.adaptive_avg_pool2d(T(x).permute(0, 3, 1, 2), (3, 3)).permute(0, 2, 3, 1)
    check(ops.adaptive_avg_pool2d((3, 3), layout="NHWC"), {"X": x}, want, K=4)


def test_pool_gradients():
    x = uniform((2, 3, 7, 6))
    check_grad(ops.max_pool2d(3, stride=2, padding=1, ceil_mode=True), {"X": x},
               lambda X: F.max_pool2d(X, 3, 2, 1, ceil_mode=True), ["X"], llvm=True)
    check_grad(ops.avg_pool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False), {"X": x},
               lambda X: F.avg_pool2d(X, 3, 2, 1, True, False), ["X"], K=9, llvm=True)
    check_grad(ops.avg_pool2d(2, padding=1), {"X": x}, lambda X: F.avg_pool2d(X, 2, padding=1), ["X"], K=4)
    check_grad(ops.adaptive_avg_pool2d((3, 4)), {"X": x}, lambda X: F.adaptive_avg_pool2d(X, (3, 4)), ["X"],
               K=9)


def test_pool_refuses_padding_over_half_the_kernel():
    with pytest.raises(ValueError, match="half the kernel"):
        ops.max_pool2d(2, padding=2)
