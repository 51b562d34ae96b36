"""A normalization's moments (tile/onnx/moments.py) in fewer kernels, with the textbook chain's
values bit for bit: the squares summed as the sum's own product (no ``Sq`` tensor), and for a power
of two elements ``Dev = X - Sum * (1/n)`` (no ``Mean`` kernel)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="tile.onnx needs the onnx package (pip install -e '.[onnx]')")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import tile  # noqa: E402
import tile.onnx  # noqa: E402
from tile.onnx.moments import moment_lines, scaled  # noqa: E402
from tile.ops._build import function  # noqa: E402
from tile.ops.reduce import variance_lines  # noqa: E402


def _layer_norm(shape):
    rng = np.random.default_rng(7)
    d = shape[-1]
    scale = numpy_helper.from_array(rng.standard_normal(d).astype(np.float32), "s")
    bias = numpy_helper.from_array(rng.standard_normal(d).astype(np.float32), "b")
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-5)
    graph = helper.make_graph([node], "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], [scale, bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("count", [128, 96])
def test_moments_equal_the_textbook_chain_bit_for_bit(count):
    x = np.random.default_rng(count).standard_normal((5, count)).astype(np.float32) * 3 + 1
    names = ["D0", "D1"]
    lit = repr
    mine = function(["X[D0, D1]"], ["Dev", "Var"], moment_lines("X", 2, [1], count, names, lit))
    book = function(["X[D0, D1]"], ["Dev", "Var"], variance_lines("X", 2, [1], True, 0, dim_names=names))
    got, want = tile.compile(mine, "interp")(X=x), tile.compile(book, "interp")(X=x)
    for k in ("Dev", "Var"):
        np.testing.assert_array_equal(got[k], want[k])
    fast = tile.compile(mine, "llvm_cpu.0")(X=x)
    u = 2.0**-24
    for k in ("Dev", "Var"):  # reassociated sums: within the sum's rounding
        tol = 4 * u * count * max(1.0, float(np.abs(want[k]).max()))
        assert np.abs(fast[k] - want[k]).max() <= tol


def test_a_layer_norm_writes_no_squares_and_no_mean_for_a_power_of_two():
    source = tile.onnx.to_tile(_layer_norm([4, 8, 64]))
    assert "_Sq =" not in source and "_Mean" not in source
    assert " * 0.015625" in source  # 1 / 64, exact
    source = tile.onnx.to_tile(_layer_norm([4, 8, 48]))
    assert "_Sq =" not in source and "_Mean = " in source


def test_scaled_multiplies_only_by_exact_reciprocals():
    assert scaled("S", 128, repr) == "S * 0.0078125"
    assert scaled("S", 96, repr) == "S / 96"


def test_layer_norm_through_the_backend_matches_numpy():
    shape = [4, 8, 64]
    m = _layer_norm(shape)
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    init = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    mean = x.astype(np.float64).mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    want = (x - mean) / np.sqrt(var + 1e-5) * init["s"] + init["b"]
    for target in ("interp", "llvm_cpu.0"):
        (y,) = tile.onnx.Backend.prepare(m, target).run([x])
        assert np.abs(y - want).max() <= 8 * 2.0**-24 * 64 * np.abs(want).max()
