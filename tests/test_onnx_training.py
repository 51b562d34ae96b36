"""Training an exported PyTorch MLP through tile.onnx: gradients from tile.grad of the imported
program, a few SGD steps, compared with PyTorch taking the same steps."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="tile.onnx needs the onnx package (pip install -e '.[onnx]')")
torch = pytest.importorskip("torch", reason="the model is exported from PyTorch (pip install -e '.[torch]')")

import tile.onnx  # noqa: E402
from tile.onnx.training import Trainable  # noqa: E402


def exported_mlp(seed: int = 0):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    buf = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript exporter (no onnxscript needed) is deprecated
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.zeros(6, 4, dtype=torch.float64),), buf, dynamo=False,
                          input_names=["x"], output_names=["y"])
    return net, onnx.load_from_string(buf.getvalue())


def test_gradients_of_the_initializers_match_pytorch():
    net, model = exported_mlp()
    t = Trainable(model, device="interp")
    assert sorted(t.params) == sorted(name for name, _ in net.named_parameters())
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 4))
    dy = rng.standard_normal((6, 3))
    y = net(torch.from_numpy(x))
    y.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(t.forward({"x": x})["y"], y.detach().numpy(), rtol=1e-12, atol=1e-12)
    grads = t.gradients({"x": x}, {"y": dy})
    for name, p in net.named_parameters():
        # float64, reductions of at most 8 terms: a few ulps of the largest term
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", ["interp", "llvm_cpu.0"])
def test_sgd_steps_match_pytorch(device):
    net, model = exported_mlp(seed=2)
    t = tile.onnx.trainable(model, device=device)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    rng = np.random.default_rng(3)
    x, target = rng.standard_normal((6, 4)), rng.standard_normal((6, 3))
    for _ in range(4):
        # the loss, mean((y - target)^2), enters through its derivative with respect to y
        y = t.forward({"x": x})["y"]
        grads = t.gradients({"x": x}, {"y": 2 * (y - target) / y.size})
        for name in t.params:
            t.params[name] = t.params[name] - 0.1 * grads[name]
        opt.zero_grad()
        torch.mean((net(torch.from_numpy(x)) - torch.from_numpy(target)) ** 2).backward()
        opt.step()
    for name, p in net.named_parameters():
        np.testing.assert_allclose(t.params[name], p.detach().numpy(), rtol=1e-10, atol=1e-12)
    loss = np.mean((t.forward({"x": x})["y"] - target) ** 2)
    first = np.mean((exported_mlp(seed=2)[0](torch.from_numpy(x)).detach().numpy() - target) ** 2)
    assert loss < first  # it trained
