"""tile.ops convolutions against torch.nn.functional: integer-valued data gives exact sums, so the
forward is compared exactly on the interpreter and llvm_cpu.0; gradients in float64."""

from __future__ import annotations

import numpy as np
import pytest
from ops_support import check, check_grad, integers, torch

import tile.ops as ops

F = torch.nn.functional
T = torch.tensor
TORCH_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
TORCH_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def channels_last(a: np.ndarray) -> np.ndarray:
    return np.moveaxis(a, 1, -1).copy()


def weights_last(w: np.ndarray) -> np.ndarray:
    """PyTorch's [O, I, K..] as TensorFlow's [K.., I, O]."""
    return np.moveaxis(np.moveaxis(w, 0, -1), 0, -2).copy()


CASES = [  # nd, data spatial, kernel, attributes
    (1, (9,), (3,), dict(stride=2, padding=1)),
    (1, (8,), (3,), dict(padding="same", dilation=2)),
    (2, (6, 5), (3, 2), dict(stride=(2, 1), padding=1, dilation=(1, 2), groups=2)),
    (2, (5, 5), (2, 3), dict(padding="same")),  # an even kernel: the odd padding goes after
    (2, (5, 6), (2, 3), dict(padding="valid", stride=2)),
    (2, (5, 4), (3, 3), dict(padding=1, groups=4)),  # depthwise: groups = channels
    (3, (4, 3, 4), (2, 2, 3), dict(stride=(1, 2, 1), padding=(1, 0, 1))),
]


@pytest.mark.parametrize("nd, spatial, kernel, attrs", CASES)
@pytest.mark.parametrize("layout", ["first", "last"])
@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")  # torch's own note
def test_conv_forward(nd, spatial, kernel, attrs, layout):
    groups = attrs.get("groups", 1)
    ci, co = 4, 4 if groups == 4 else 6
    x = integers((2, ci, *spatial))
    w = integers((co, ci // groups, *kernel), seed=1)
    b = integers((co,), seed=2)
    want = TORCH_CONV[nd](T(x), T(w), T(b), **attrs)
    if layout == "first":
        src = ops.conv(nd, bias=True, **attrs)
        check(src, {"X": x, "W": w, "B": b}, want, exact=True)
    else:
        src = ops.conv(nd, bias=True, layout="channels_last", **attrs)
        check(src, {"X": channels_last(x), "W": weights_last(w), "B": b}, torch.movedim(want, 1, -1),
              exact=True)


def test_conv_same_strided_follows_tensorflow():
    """'same' with a stride: ceil(L / s) outputs, the odd padding element after (TensorFlow's rule;
    PyTorch refuses a strided 'same')."""
    x, w = integers((1, 2, 7, 6)), integers((3, 2, 3, 2), seed=1)
    src = ops.conv2d(stride=2, padding="same")
    # total padding: rows (4-1)*2 + 3 - 7 = 2 -> (1, 1); cols (3-1)*2 + 2 - 6 = 0
    want = F.conv2d(F.pad(T(x), (0, 0, 1, 1)), T(w), stride=2)
    check(src, {"X": x, "W": w}, want, exact=True)


@pytest.mark.parametrize("nd, spatial, kernel, attrs", [CASES[0], CASES[2], CASES[5], CASES[6]])
def test_conv_gradient(nd, spatial, kernel, attrs):
    groups = attrs.get("groups", 1)
    ci, co = 4, 4 if groups == 4 else 6
    x = integers((2, ci, *spatial), dtype=np.float64) / 2
    w = integers((co, ci // groups, *kernel), seed=1, dtype=np.float64) / 4
    b = integers((co,), seed=2, dtype=np.float64)
    src = ops.conv(nd, bias=True, **attrs)
    K = int(np.prod(kernel)) * ci * 2

    def fn(X, W, B):
        return TORCH_CONV[nd](X, W, B, **attrs)

    check_grad(src, {"X": x, "W": w, "B": b}, fn, ["X", "W", "B"], K=K, llvm=True)


TRANSPOSED = [
    (2, (3, 4), (3, 3), dict(stride=2, padding=1, output_padding=1)),
    (2, (4, 3), (2, 3), dict(stride=(1, 2), dilation=(2, 1), groups=2)),
    (1, (5,), (3,), dict(stride=3, padding=2)),
]


@pytest.mark.parametrize("nd, spatial, kernel, attrs", TRANSPOSED)
def test_conv_transpose(nd, spatial, kernel, attrs):
    groups = attrs.get("groups", 1)
    x = integers((2, 4, *spatial))
    w = integers((4, 6 // groups, *kernel), seed=1)
    want = TORCH_CONV_T[nd](T(x), T(w), **attrs)
    check(ops.conv_transpose(nd, **attrs), {"X": x, "W": w}, want, exact=True)
    b = integers((6,), seed=2)
    check(ops.conv_transpose(nd, bias=True, **attrs), {"X": x, "W": w, "B": b},
          TORCH_CONV_T[nd](T(x), T(w), T(b), **attrs), exact=True)
    if nd == 2:
        src = ops.conv_transpose2d(layout="NHWC", **attrs)
        wl = np.moveaxis(w, (0, 1), (-1, -2)).copy()  # [CI, COG, K..] -> [K.., COG, CI]
        check(src, {"X": channels_last(x), "W": wl}, torch.movedim(want, 1, -1), exact=True)

    def fn(X, W):
        return TORCH_CONV_T[nd](X, W, **attrs)

    xd, wd = x.astype(np.float64), w.astype(np.float64) / 2
    K = 4 * int(np.prod(kernel))
    check_grad(ops.conv_transpose(nd, **attrs), {"X": xd, "W": wd}, fn, ["X", "W"], K=K)


def test_conv_source_is_shape_generic():
    """One source, three input shapes: sizes come from the inputs."""
    src = ops.conv2d(stride=2, padding=1)
    for shape in [(1, 2, 5, 5), (2, 2, 8, 3), (1, 2, 2, 9)]:
        x, w = integers(shape), integers((3, 2, 3, 3), seed=1)
        check(src, {"X": x, "W": w}, F.conv2d(T(x), T(w), stride=2, padding=1), exact=True)


def test_conv_refuses_bad_attributes():
    with pytest.raises(ValueError, match="stride"):
        ops.conv2d(stride=0)
    with pytest.raises(ValueError, match="layout"):
        ops.conv2d(layout="NCW")
    with pytest.raises(ValueError, match="padding"):
        ops.conv2d(padding="full")
