"""Issue 25's end-to-end check: a small CNN (conv-batchnorm-relu-pool twice, linear,
cross-entropy) built from ``tile.ops`` through ``tile.torch`` trains 100 SGD steps on synthetic
data, and its loss matches the same model in pure PyTorch within 1e-4 relative at every step, in
float64, in eager mode and under ``torch.compile(fullgraph=True)``. The model is
``examples/torch_cnn.py``; tiny shapes (batch 4, 8x8 images) keep it to seconds."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from backends import registry

torch = pytest.importorskip("torch", reason="tile.torch needs PyTorch (pip install -e '.[torch]')")
pytestmark = pytest.mark.skipif("llvm_cpu.0" not in registry.devices(), reason="needs llvm_cpu.0")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "torch_cnn.py"


@pytest.fixture(scope="module")
def cnn():
    spec = importlib.util.spec_from_file_location("torch_cnn", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference(cnn):
    x, t, params = cnn.data()
    return cnn.train(cnn.torch_loss, params, x, t)


def test_cnn_trains_like_pytorch_eager(cnn, reference):
    x, t, params = cnn.data()
    losses = cnn.train(cnn.tile_loss, params, x, t, ops=cnn.tile_layers())
    assert losses[-1] < 0.1 * losses[0]  # it learns
    np.testing.assert_allclose(losses, reference, rtol=1e-4)


def test_cnn_trains_like_pytorch_under_torch_compile(cnn, reference):
    """The loss function compiled whole by Inductor (the default backend), without a graph break:
    AOTAutograd traces the Tile operators and their backward operators from their fake kernels
    (about 5 s of compiling on 2 cores)."""
    x, t, params = cnn.data()
    ops = cnn.tile_layers()
    loss = lambda p, x, t, _: cnn.tile_loss(p, x, t, ops)  # noqa: E731
    compiled = torch.compile(loss, fullgraph=True)
    losses = cnn.train(compiled, params, x, t)
    np.testing.assert_allclose(losses, reference, rtol=1e-4)
