"""tile.ops cross-entropy, dropout and scaled dot-product attention against torch (forwards within
k·eps·K, gradients in float64); dropout's mask against an independent taus88 (tests/taus88.py)."""

from __future__ import annotations

import numpy as np
import pytest
from ops_support import check, check_grad, run_all, torch, uniform
from taus88 import reference, seed_state

import tile.ops as ops

F = torch.nn.functional
T = torch.tensor


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(reduction):
    x, t = uniform((5, 4), np.float32), np.array([0, 3, 1, 1, 2])
    src = ops.cross_entropy(reduction=reduction)
    check(src, {"X": x, "T": t}, F.cross_entropy(T(x), T(t), reduction=reduction), K=20)
    def fn(X, targets):
        return F.cross_entropy(X, targets, reduction=reduction)

    check_grad(src, {"X": x.astype(np.float64), "T": t}, fn, ["X"], K=20, llvm=reduction == "mean")


def test_cross_entropy_with_spatial_targets():
    x = uniform((2, 4, 3, 2), np.float32)
    t = np.random.default_rng(0).integers(0, 4, (2, 3, 2)).astype(np.int32)
    src = ops.cross_entropy(rank=4)
    check(src, {"X": x, "T": t}, F.cross_entropy(T(x), T(t).long()), K=48)
    xd = x.astype(np.float64)
    check_grad(src, {"X": xd, "T": t}, lambda X, ts: F.cross_entropy(X, ts.long()), ["X"], K=48)


def test_dropout_draws_tiles_generator():
    x = uniform((3, 700), np.float32, low=1, high=2)  # 2100 elements: some streams step twice
    state = seed_state(7)
    values, next_state = reference(state, x.shape)
    want = np.where(values < np.float32(0.75), x * np.float32(1 / 0.75), np.float32(0))
    src = ops.dropout(0.25, rank=2)
    for target, outs in run_all(src, {"X": x, "S": state}):
        np.testing.assert_array_equal(outs["Y"], want, err_msg=target)
        np.testing.assert_array_equal(outs["S2"], next_state, err_msg=target)
    kept = np.count_nonzero(want) / want.size
    assert abs(kept - 0.75) < 0.05
    # the gradient flows through the mask alone
    grads = ops.dropout(0.25, rank=2)
    check_grad(grads, {"X": x.astype(np.float64), "S": state},
               lambda X, S: X * T(np.where(values < np.float32(0.75), 1 / 0.75, 0.0)), ["X"])


def test_dropout_off():
    x = uniform((2, 3), np.float32)
    check(ops.dropout(0.5, rank=2, training=False), {"X": x}, x, exact=True)
    check(ops.dropout(0.0, rank=2), {"X": x}, x, exact=True)


Q, K_, V = uniform((2, 3, 4, 5), seed=1), uniform((2, 3, 6, 5), seed=2), uniform((2, 3, 6, 7), seed=3)
BOOL_MASK = np.random.default_rng(1).random((4, 6)) < 0.7
BOOL_MASK[:, 0] = True
FLOAT_MASK = uniform((3, 4, 6), seed=4)
ATTENTION = [  # op attributes, extra input, torch keywords
    ({}, None, {}),
    ({"mask": "bool"}, BOOL_MASK, {}),
    ({"mask": "float"}, FLOAT_MASK, {}),
    ({"is_causal": True}, None, {"is_causal": True}),
    ({"scale": 0.3}, None, {"scale": 0.3}),
]


@pytest.mark.parametrize("attrs, mask, kw", ATTENTION,
                         ids=["plain", "bool-mask", "float-mask", "causal", "scale"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention(attrs, mask, kw, dtype):
    src = ops.scaled_dot_product_attention(**attrs)
    ins = {"Q": Q.astype(dtype), "K": K_.astype(dtype), "V": V.astype(dtype)}
    if mask is not None:
        ins["M"] = mask if mask.dtype == bool else mask.astype(dtype)
        kw = {**kw, "attn_mask": T(ins["M"])}
    want = F.scaled_dot_product_attention(T(ins["Q"]), T(ins["K"]), T(ins["V"]), **kw)
    check(src, ins, want, K=12)
    if dtype == np.float64:

        def fn(q, k, v, *rest):
            return F.scaled_dot_product_attention(q, k, v, **kw)

        check_grad(src, ins, fn, ["Q", "K", "V"], K=12, llvm=not attrs)


def test_attention_fully_masked_row_is_nan():
    mask = np.ones((4, 6), bool)
    mask[2] = False
    src = ops.scaled_dot_product_attention(mask="bool")
    for target, outs in run_all(src, {"Q": Q, "K": K_, "V": V, "M": mask}):
        y = outs["Y"]
        assert np.isnan(y[:, :, 2]).all() and not np.isnan(np.delete(y, 2, axis=2)).any(), target
