"""tile.ops softmaxes and norms against torch.nn.functional. Exponentials, square roots and
divisions round, so forwards are compared within k·eps·K (K the reduction length) in float32;
gradients in float64."""

from __future__ import annotations

import numpy as np
import pytest
from ops_support import check, check_grad, torch, uniform

import tile.ops as ops

F = torch.nn.functional
T = torch.tensor


@pytest.mark.parametrize("shape, axis", [((2, 3, 4, 5), -1), ((2, 3, 4, 5), 1), ((3, 4), 0), ((7,), 0)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax(shape, axis, log):
    x = uniform(shape, np.float32, low=-4, high=4)
    src = (ops.log_softmax if log else ops.softmax)(rank=len(shape), axis=axis)
    fn = F.log_softmax if log else F.softmax
    check(src, {"X": x}, fn(T(x), axis), K=shape[axis])
    check_grad(src, {"X": x.astype(np.float64)}, lambda X: fn(X, axis), ["X"], K=shape[axis])


def test_layer_norm():
    x = uniform((2, 3, 4, 5), np.float32)
    w, b = uniform((4, 5), np.float32, 1), uniform((4, 5), np.float32, 2)
    src = ops.layer_norm(rank=4, normalized_ndim=2)
    check(src, {"X": x, "W": w, "B": b}, F.layer_norm(T(x), (4, 5), T(w), T(b)), K=20)
    d = {"X": x.astype(np.float64), "W": w.astype(np.float64), "B": b.astype(np.float64)}
    check_grad(src, d, lambda X, W, B: F.layer_norm(X, (4, 5), W, B), ["X", "W", "B"], K=20)
    plain = ops.layer_norm(rank=2, weight=False, bias=False, eps=1e-3)
    check(plain, {"X": x[0, 0]}, F.layer_norm(T(x[0, 0]), (5,), eps=1e-3), K=5)


def _stats(c, dtype=np.float32):
    return (uniform((c,), dtype, 3), uniform((c,), dtype, 4, 0.5, 2), uniform((c,), dtype, 5),
            uniform((c,), dtype, 6))


def test_batch_norm_inference():
    x = uniform((2, 3, 4, 5), np.float32)
    m, v, w, b = _stats(3)
    want = F.batch_norm(T(x), T(m), T(v), T(w), T(b))
    check(ops.batch_norm(), {"X": x, "Mean": m, "Var": v, "W": w, "B": b}, want, K=4)
    last = {"X": np.moveaxis(x, 1, -1).copy(), "Mean": m, "Var": v, "W": w, "B": b}
    check(ops.batch_norm(layout="NHWC"), last, want.permute(0, 2, 3, 1), K=4)
    x2 = x[:, :, 0, 0].copy()
    check(ops.batch_norm(rank=2, weight=False, bias=False), {"X": x2, "Mean": m, "Var": v},
          F.batch_norm(T(x2), T(m), T(v)), K=4)
    d = {n: a.astype(np.float64) for n, a in zip(["X", "Mean", "Var", "W", "B"], (x, m, v, w, b))}
    check_grad(ops.batch_norm(), d, lambda X, M, V, W, B: F.batch_norm(X, M, V, W, B), ["X", "W", "B"], K=4)


def test_batch_norm_training_and_its_statistics():
    x = uniform((2, 3, 4, 5), np.float32)
    _, _, w, b = _stats(3)
    src = ops.batch_norm(training=True, stats=True)
    check(src, {"X": x, "W": w, "B": b}, F.batch_norm(T(x), None, None, T(w), T(b), training=True), K=40)
    d = {"X": x.astype(np.float64), "W": w.astype(np.float64), "B": b.astype(np.float64)}
    mean, var = torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    F.batch_norm(T(d["X"]), mean, var, training=True, momentum=1.0)  # running stats := batch stats
    check(src, d, mean, output="BatchMean", K=40)
    check(src, d, var, output="BatchVar", K=40)
    check_grad(src, d, lambda X, W, B: F.batch_norm(X, None, None, W, B, training=True), ["X", "W", "B"],
               K=40, llvm=True)
    last = ops.batch_norm(training=True, layout="NHWC")
    check(last, {"X": np.moveaxis(x, 1, -1).copy(), "W": w, "B": b},
          F.batch_norm(T(x), None, None, T(w), T(b), training=True).permute(0, 2, 3, 1), K=40)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_group_norm(layout):
    x = uniform((2, 6, 3, 2), np.float32)
    w, b = uniform((6,), np.float32, 1), uniform((6,), np.float32, 2)
    src = ops.group_norm(3, layout=layout)
    want = F.group_norm(T(x), 3, T(w), T(b))
    if layout == "NHWC":
        x, want = np.moveaxis(x, 1, -1).copy(), want.permute(0, 2, 3, 1)

        def fn(X, W, B):
            return F.group_norm(X.permute(0, 3, 1, 2), 3, W, B).permute(0, 2, 3, 1)
    else:

        def fn(X, W, B):
            return F.group_norm(X, 3, W, B)
    check(src, {"X": x, "W": w, "B": b}, want, K=12)
    d = {"X": x.astype(np.float64), "W": w.astype(np.float64), "B": b.astype(np.float64)}
    check_grad(src, d, fn, ["X", "W", "B"], K=12)


def test_group_norm_without_spatial_axes():
    x = uniform((4, 6), np.float32)
    check(ops.group_norm(2, rank=2, weight=False, bias=False), {"X": x}, F.group_norm(T(x), 2), K=3)
