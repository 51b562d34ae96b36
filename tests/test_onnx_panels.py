"""A Gemm by a constant weight spanning whole panels is written panel by panel in the backend's
import (tile/onnx/panels.py): the weight stored ``[N / 64, K, 64]``, the product panel-major, a
unary activation computed on the panels and the next Gemm reading them, with no row-major copy
unless something else reads it. Exact on integer-valued data against numpy, on ``llvm_cpu.0``
and the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="tile.onnx needs the onnx package")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import tile.onnx  # noqa: E402
from tile.onnx.importer import import_model  # noqa: E402


def _ints(rng, *shape):
    return rng.integers(-3, 4, shape).astype(np.float32)


def _mlp(rng, sizes: list[int], extra_output: bool = False, trans_b: int = 1):
    """Gemm (+ bias) and Relu layers of ``sizes``; with ``extra_output`` the first Gemm's output
    is a model output too (a row-major reader of the panels)."""
    nodes, inits, weights = [], [], []
    x = "x"
    for n, (k, m) in enumerate(zip(sizes, sizes[1:])):
        w, b = _ints(rng, m, k), _ints(rng, m)
        weights.append((w, b))
        inits += [numpy_helper.from_array(w if trans_b else np.ascontiguousarray(w.T), f"w{n}"),
                  numpy_helper.from_array(b, f"b{n}")]
        nodes.append(helper.make_node("Gemm", [x, f"w{n}", f"b{n}"], [f"g{n}"], transB=trans_b))
        x = f"g{n}"
        if n < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [x], [f"r{n}"]))
            x = f"r{n}"
    outs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)]
    if extra_output:
        outs.append(helper.make_tensor_value_info("g0", TensorProto.FLOAT, None))
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, sizes[0]])
    graph = helper.make_graph(nodes, "mlp", [x_info], outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return model, weights


def _numpy(x, weights):
    outs = []
    for n, (w, b) in enumerate(weights):
        x = x @ w.T + b
        outs.append(x)
        if n < len(weights) - 1:
            x = np.maximum(x, 0)
    return x, outs[0]


def test_the_backend_import_writes_products_panel_by_panel_without_copies():
    model, _ = _mlp(np.random.default_rng(0), [96, 128, 192, 10])
    source = import_model(model, {"x": (8, 96)}, pack=True).source
    assert "[p, i, q: 2, 8, 64] = +(X[i, k] * W0_panels[p, k, q])" in source
    assert "[p, i, q: 3, 8, 64] = +(Relu[k0, i, k1] * W1_panels[p, 64*k0 + k1, q])" in source
    assert "[i, j: 8, 10] = +(Relu9[k0, i, k1] * W2_kmajor[64*k0 + k1, j])" in source
    assert "reshape(" not in source and "=(" not in source  # no row-major copy: nothing reads one
    plain = import_model(model, {"x": (8, 96)}).source  # gradients' import: unchanged
    assert "[p, i, q" not in plain


@pytest.mark.parametrize("target", ["llvm_cpu.0", "interp"])
@pytest.mark.parametrize("trans_b", [1, 0])
def test_panel_products_are_exact(target, trans_b):
    rng = np.random.default_rng(1 + trans_b)
    model, weights = _mlp(rng, [96, 128, 192, 10], trans_b=trans_b)
    x = _ints(rng, 8, 96)
    (got,) = tile.onnx.Backend.prepare(model.SerializeToString(), target).run([x])
    np.testing.assert_array_equal(got, _numpy(x, weights)[0])


def test_a_row_major_reader_gets_the_copy():
    rng = np.random.default_rng(2)
    model, weights = _mlp(rng, [64, 256, 128, 10], extra_output=True)
    source = import_model(model, {"x": (70, 64)}, pack=True).source
    assert "reshape(" in source  # g0 is an output: its row-major copy is written
    x = _ints(rng, 70, 64)
    y, g0 = tile.onnx.Backend.prepare(model.SerializeToString(), "llvm_cpu.0").run([x])
    want_y, want_g0 = _numpy(x, weights)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(g0, want_g0)
