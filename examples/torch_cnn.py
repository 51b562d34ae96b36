"""A small CNN built from ``tile.ops`` through ``tile.torch``, and the same model in PyTorch.

conv 3x3 - batch norm (batch statistics) - relu - max pool 2x2, twice; linear; cross-entropy.
``tests/test_frameworks_cnn.py`` trains both on the same synthetic data and compares the losses;
``bench/test_frameworks.py`` times a training step of each.

    python examples/torch_cnn.py          # 100 SGD steps of each, float64, and the two final losses
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import tile.ops
import tile.torch


def tile_layers() -> dict:
    """The model's ops: Tile functions as PyTorch operators (compiled per shape at first use)."""
    return {
        "conv": tile.torch.op(tile.ops.conv2d(padding=1, bias=True), name="cnn_conv3x3"),
        "bn": tile.torch.op(tile.ops.batch_norm(rank=4, training=True), name="cnn_batch_norm"),
        "relu": tile.torch.op(tile.ops.relu(), name="cnn_relu"),
        "pool": tile.torch.op(tile.ops.max_pool2d(2), name="cnn_max_pool"),
        "linear": tile.torch.op(tile.ops.linear(), name="cnn_linear"),
        "loss": tile.torch.op(tile.ops.cross_entropy(), name="cnn_cross_entropy"),
    }


def tile_loss(params: list[torch.Tensor], x: torch.Tensor, t: torch.Tensor, ops: dict) -> torch.Tensor:
    w1, b1, g1, h1, w2, b2, g2, h2, wl, bl = params
    y = ops["pool"](ops["relu"](ops["bn"](ops["conv"](x, w1, b1), g1, h1)))
    y = ops["pool"](ops["relu"](ops["bn"](ops["conv"](y, w2, b2), g2, h2)))
    return ops["loss"](ops["linear"](y.reshape(y.shape[0], -1), wl, bl), t)


def torch_loss(params: list[torch.Tensor], x: torch.Tensor, t: torch.Tensor, ops=None) -> torch.Tensor:
    w1, b1, g1, h1, w2, b2, g2, h2, wl, bl = params

    def block(y, w, b, g, h):
        y = F.batch_norm(F.conv2d(y, w, b, padding=1), None, None, g, h, training=True)
        return F.max_pool2d(F.relu(y), 2)

    y = block(block(x, w1, b1, g1, h1), w2, b2, g2, h2)
    return F.cross_entropy(F.linear(y.reshape(y.shape[0], -1), wl, bl), t)


def data(batch: int = 4, size: int = 8, classes: int = 3, dtype=torch.float64, seed: int = 0):
    """Synthetic images whose class is which third of the image is brightest, the parameters."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 1, size, size, generator=g, dtype=dtype)
    t = torch.arange(batch) % classes
    for n in range(batch):
        x[n, 0, :, (size * int(t[n])) // classes:(size * (int(t[n]) + 1)) // classes] += 1.0
    c1, c2, feat = 4, 8, 8 * (size // 4) ** 2

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype) * 0.3

    # conv weight and bias, batch norm scale (about 1) and shift; twice; then the linear layer
    params = [rnd(c1, 1, 3, 3), rnd(c1), 1 + rnd(c1), rnd(c1),
              rnd(c2, c1, 3, 3), rnd(c2), 1 + rnd(c2), rnd(c2),
              rnd(classes, feat), rnd(classes)]
    return x, t, params


def train(loss_fn, params, x, t, steps: int = 100, lr: float = 0.1, ops=None) -> list[float]:
    """Plain SGD; the loss of every step."""
    params = [p.detach().clone().requires_grad_() for p in params]
    losses = []
    for _ in range(steps):
        loss = loss_fn(params, x, t, ops)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= lr * g
        losses.append(float(loss.detach()))
    return losses


if __name__ == "__main__":
    x, t, params = data()
    ours = train(tile_loss, params, x, t, ops=tile_layers())
    theirs = train(torch_loss, params, x, t)
    print(f"tile.torch: {ours[0]:.6f} -> {ours[-1]:.6f}; PyTorch: {theirs[0]:.6f} -> {theirs[-1]:.6f}")
