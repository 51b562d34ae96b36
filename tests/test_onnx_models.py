"""Real models through ``tile.onnx``: an MLP, a small CNN and a transformer block, exported from
PyTorch with ``torch.onnx.export`` (``bench.onnx_models`` builds them), imported and run on the
interpreter and the CPU targets, and compared with PyTorch's outputs and onnxruntime's where it is
installed; the imported MLP's gradients (``tile.grad_values``) are compared with PyTorch's autograd.

Tolerance: float32 results of two implementations that sum in different orders differ by at most
about ``u * L * scale`` (``u = 2^-24``, the unit roundoff; ``L`` the reduction lengths along the
model's longest path; ``scale`` the largest magnitude, at least 1), so we allow twice that
(``bench.onnx_models.tolerance``). The models' inputs are random normals: integer-valued inputs
would not stay exact through softmax, erf and the layer norms.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx", reason="tile.onnx needs the onnx package (pip install -e '.[onnx]')")
torch = pytest.importorskip("torch", reason="the models are exported from PyTorch (pip install torch)")

import tile  # noqa: E402
import tile.onnx  # noqa: E402
from bench import onnx_models as models  # noqa: E402

bound = models.tolerance


@pytest.fixture(scope="module")
def exported() -> dict:
    """name -> (module, input, ONNX bytes, PyTorch's output)."""
    out = {}
    for name in models.MODELS:
        module, x = models.build(name)
        out[name] = (module, x, models.export(module, x), models.torch_output(module, x))
    return out


def _available(target: str) -> None:
    from backends import registry

    if target != "interp" and target not in registry.devices():
        pytest.skip(f"{target} is not available here: {registry.unavailable().get(target, 'not registered')}")


# PoCL compiles each kernel for a minute or more on a loaded 2-core machine: the MLP alone there
CASES = [(t, m) for t in ("interp", "llvm_cpu.0") for m in models.MODELS] + [("opencl_cpu.0", "mlp")]


@pytest.mark.parametrize("target,name", CASES, ids=[f"{t}-{m}" for t, m in CASES])
def test_model_matches_pytorch(exported, target, name):
    _available(target)
    _, x, model, want = exported[name]
    got = tile.onnx.Backend.prepare(model, target).run([x])
    assert len(got) == 1 and got[0].dtype == want.dtype and got[0].shape == want.shape
    err, tol = float(np.max(np.abs(got[0] - want))), bound(name, x, want)
    assert err <= tol, f"{name} on {target}: max error {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("name", models.MODELS)
def test_model_matches_onnxruntime(exported, name):
    pytest.importorskip("onnxruntime", reason="onnxruntime is optional (pip install onnxruntime)")
    _, x, model, want = exported[name]
    ort = models.ort_session(model, threads=1).run(None, {"x": x})[0]
    got = tile.onnx.Backend.prepare(model, "llvm_cpu.0").run([x])[0]
    err, tol = float(np.max(np.abs(got - ort))), bound(name, x, ort)
    assert err <= tol, f"{name}: Tile and onnxruntime differ by {err:.3g} > {tol:.3g}"


def test_imported_mlp_gradients_match_autograd(exported):
    """d(sum y)/dx and d(sum y)/dW of the first layer from the imported program, by tile.grad_values,
    against PyTorch's autograd."""
    module, x, model, want = exported["mlp"]
    imp = tile.onnx.import_model(model)
    feeds = imp.feeds({"x": x})
    weight = next(t for t, onnx_name in imp.initializers.items() if onnx_name == "0.weight")
    x_name = dict(imp.inputs)["x"]
    grads = tile.grad_values(imp.source, feeds, wrt=[x_name, weight])
    xt = torch.from_numpy(x).requires_grad_(True)
    module.zero_grad()
    module(xt).sum().backward()
    for got, ref in ((grads[x_name], xt.grad.numpy()), (grads[weight], module[0].weight.grad.numpy())):
        if got.shape != ref.shape and got.T.shape == ref.shape:
            got = got.T  # an exporter may store the weight transposed for Gemm(transB=0)
        assert got.shape == ref.shape
        tol = bound("mlp", x, ref, extra=x.shape[0] + 10)  # the batch sum, and the 10 outputs summed
        assert float(np.max(np.abs(got - ref))) <= tol


@pytest.mark.parametrize("name", models.MODELS)
def test_grad_of_an_imported_model_needs_no_shapes(exported, name):
    """``tile.grad(imp.source)`` with no ``shapes=``/``dtypes=``: the imported function declares
    its inputs' dims, so the backward program is complete (it named undefined sizes, 'Relu_d0',
    before); run on the interpreter, d(sum y)/dx matches PyTorch's autograd."""
    module, x, model, want = exported[name]
    imp = tile.onnx.import_model(model)
    x_name = dict(imp.inputs)["x"]
    out = imp.outputs[0][1]
    backward = tile.grad(imp.source, wrt=[x_name])
    feeds = {**imp.feeds({"x": x}), f"D{out}": np.ones(want.shape, np.float32)}
    got = tile.compile(backward, "interp")(feeds)[f"D{x_name}"]
    xt = torch.from_numpy(x).requires_grad_(True)
    module(xt).sum().backward()
    ref = xt.grad.numpy()
    tol = bound(name, x, ref, extra=int(np.prod(want.shape)))  # and the cotangents' sum over outputs
    assert got.shape == ref.shape and float(np.max(np.abs(got - ref))) <= tol


@pytest.mark.parametrize("block", [1, 3])
def test_paired_timing_alternates_calls_or_blocks(block):
    """``bench.onnx_models.paired_seconds``: after the warm-up pairs, each side takes ``block``
    calls in a row (rounds rounded up to whole blocks), and every timed call is counted."""
    order = []
    mine, peer = models.paired_seconds(lambda: order.append("a"), lambda: order.append("b"), rounds=7,
                                       warmup=2, block=block)
    timed = order[4:]
    blocks = -(-7 // block)
    assert order[:4] == ["a", "b", "a", "b"]
    assert timed == (["a"] * block + ["b"] * block) * blocks
    assert all(0 <= t[1] <= t[0] for t in (mine, peer))
