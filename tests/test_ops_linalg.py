"""tile.ops linear algebra and indexing against torch: integer data, exact forwards; gradients in
float64."""

from __future__ import annotations

import numpy as np
import pytest
from ops_support import check, check_grad, integers, torch

import tile.ops as ops

F = torch.nn.functional
T = torch.tensor
SHAPES_A = {1: (5,), 2: (4, 5), 3: (3, 4, 5), 4: (2, 3, 4, 5)}
SHAPES_B = {1: (5,), 2: (5, 6), 3: (3, 5, 6)}


@pytest.mark.parametrize("ra, rb", [(1, 1), (1, 2), (2, 1), (2, 2), (3, 3), (3, 2), (2, 3), (4, 2), (1, 3),
                                    (4, 3)])
def test_matmul(ra, rb):
    a, b = integers(SHAPES_A[ra]), integers(SHAPES_B[rb], seed=1)
    src = ops.matmul(rank_a=ra, rank_b=rb)
    check(src, {"A": a, "B": b}, torch.matmul(T(a), T(b)), exact=True)
    if ra >= 2 and rb >= 2:
        check_grad(src, {"A": a.astype(np.float64), "B": b.astype(np.float64)}, torch.matmul, ["A", "B"], K=5)


def test_bmm_and_linear():
    a, b = integers((3, 4, 5)), integers((3, 5, 2), seed=1)
    check(ops.bmm(), {"A": a, "B": b}, torch.bmm(T(a), T(b)), exact=True)
    x, w, bias = integers((2, 3, 4)), integers((5, 4), seed=1), integers((5,), seed=2)
    src = ops.linear(rank=3)
    check(src, {"X": x, "W": w, "B": bias}, F.linear(T(x), T(w), T(bias)), exact=True)
    check(ops.linear(bias=False), {"X": x[0], "W": w}, F.linear(T(x[0]), T(w)), exact=True)
    d = {"X": x.astype(np.float64), "W": w.astype(np.float64), "B": bias.astype(np.float64)}
    check_grad(src, d, F.linear, ["X", "W", "B"], K=4, llvm=True)


def test_embedding():
    w, i = integers((7, 3)), np.array([[1, 6, 0], [2, 2, 5]], np.int64)
    check(ops.embedding(), {"I": i, "W": w}, F.embedding(T(i), T(w)), exact=True)
    check_grad(ops.embedding(), {"I": i, "W": w.astype(np.float64)}, lambda ix, W: F.embedding(ix, W), ["W"])


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_index_select_gather_scatter_add(axis):
    x = integers((3, 4, 5))
    rng = np.random.default_rng(axis)
    rows = np.array([3, 0, 1, 1]) % x.shape[axis]
    check(ops.index_select(rank=3, axis=axis), {"X": x, "I": rows}, torch.index_select(T(x), axis, T(rows)),
          exact=True)
    check_grad(ops.index_select(rank=3, axis=axis), {"X": x.astype(np.float64), "I": rows},
               lambda X, ix: torch.index_select(X, axis, ix), ["X"])
    idx = rng.integers(0, x.shape[axis], size=(2, 3, 4))
    check(ops.gather(rank=3, axis=axis), {"X": x, "I": idx}, torch.gather(T(x), axis, T(idx)), exact=True)
    check_grad(ops.gather(rank=3, axis=axis), {"X": x.astype(np.float64), "I": idx},
               lambda X, ix: torch.gather(X, axis, ix), ["X"])
    s = integers((2, 3, 4), seed=5)
    src = ops.scatter_add(rank=3, axis=axis)
    check(src, {"X": x, "I": idx, "S": s}, torch.scatter_add(T(x), axis, T(idx), T(s)), exact=True)
    check_grad(src, {"X": x.astype(np.float64), "I": idx, "S": s.astype(np.float64)},
               lambda X, ix, S: torch.scatter_add(X, axis, ix, S), ["X", "S"])


@pytest.mark.parametrize("axis", [0, 2])
def test_concat(axis):
    shapes = [tuple(2 + k if d == axis else n for d, n in enumerate((3, 4, 5))) for k in range(3)]
    parts = [integers(shape, seed=k) for k, shape in enumerate(shapes)]
    src = ops.concat(3, rank=3, axis=axis)
    inputs = {f"X{k}": p for k, p in enumerate(parts)}
    check(src, inputs, torch.cat([T(p) for p in parts], axis), exact=True)
    check_grad(src, {n: p.astype(np.float64) for n, p in inputs.items()}, lambda *ps: torch.cat(ps, axis),
               ["X0", "X1", "X2"])
    check(ops.concat(1, rank=3, axis=axis), {"X0": parts[0]}, T(parts[0]), exact=True)


@pytest.mark.parametrize("key", [
    (slice(1, None), slice(None, -1, 2), 2),
    (1,),
    (slice(-2, 10), slice(None), slice(0, 5, 3)),
    (-1, slice(2, 2)),
])
def test_slice(key):
    x = integers((3, 4, 5))
    src = ops.slice(rank=3, key=key)
    check(src, {"X": x}, T(x)[key], exact=True)
    check_grad(src, {"X": x.astype(np.float64)}, lambda X: X[key], ["X"])


@pytest.mark.parametrize("pad, value", [((1, 2), 0.0), ((1, 0, -1, 2), 1.5), ((0, 1, 1, 1, 2, 0), -2.0)])
def test_pad(pad, value):
    x = integers((3, 4, 5))
    src = ops.pad(rank=3, pad=pad, value=value)
    check(src, {"X": x}, F.pad(T(x), pad, value=value), exact=True)
    check_grad(src, {"X": x.astype(np.float64)}, lambda X: F.pad(X, pad, value=value), ["X"])


def test_permute_transpose_reshape_flatten():
    x = integers((3, 4, 5))
    check(ops.permute((2, 0, 1)), {"X": x}, T(x).permute(2, 0, 1), exact=True)
    check_grad(ops.permute((2, 0, 1)), {"X": x.astype(np.float64)}, lambda X: X.permute(2, 0, 1), ["X"])
    check(ops.transpose(rank=3, dim0=0, dim1=2), {"X": x}, T(x).transpose(0, 2), exact=True)
    check(ops.reshape(rank=3, shape=(-1, "D2")), {"X": x}, T(x).reshape(-1, 5), exact=True)
    check(ops.reshape(rank=3, shape=(2, -1)), {"X": x}, T(x).reshape(2, -1), exact=True)
    check(ops.flatten(rank=3, start=1), {"X": x}, T(x).flatten(1), exact=True)
    check_grad(ops.flatten(rank=3), {"X": x.astype(np.float64)}, lambda X: X.flatten(), ["X"])
