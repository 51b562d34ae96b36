"""A Reshape that merges axes (attention's heads joined back: Transpose, then Reshape
[B, T, H, D] -> [B, T, H*D]) is read through by the MatMul that sums over the merged axis: the
product reads the source at one index per merged axis (``k`` -> ``k_0, k_1``, the weight at
``32*k_0 + k_1``), and neither copy is written (tile/onnx/views.py, ``read_merged``)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="tile.onnx needs the onnx package (pip install -e '.[onnx]')")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import tile.onnx  # noqa: E402


def _model(weight_side: bool):
    """x [2, 3, 5, 4] -> Transpose (0, 2, 1, 3) -> [2, 5, 3, 4] -> Reshape [2, 5, 12] -> MatMul with
    w [12, 6] (``weight_side``: the merged tensor on the right, summed over its rows, as the
    left operand of a second product of it)."""
    rng = np.random.default_rng(11)
    w = rng.integers(-3, 4, (12, 6)).astype(np.float32)
    shape = numpy_helper.from_array(np.array([2, 5, 12], np.int64), "shape")
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t", "shape"], ["r"])]
    inits = [shape, numpy_helper.from_array(w, "w")]
    if weight_side:  # r^T-like use: the merged axis is an output axis of the product
        v = rng.integers(-3, 4, (2, 7, 5)).astype(np.float32)
        inits.append(numpy_helper.from_array(v, "v"))
        nodes.append(helper.make_node("MatMul", ["v", "r"], ["y"]))
        out = [2, 7, 12]
    else:
        nodes.append(helper.make_node("MatMul", ["r", "w"], ["y"]))
        out = [2, 5, 6]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, out)
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    consts = {i.name: numpy_helper.to_array(i) for i in inits}
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), consts


def _want(x, consts, weight_side: bool):
    r = x.transpose(0, 2, 1, 3).reshape(2, 5, 12)
    return consts["v"] @ r if weight_side else r @ consts["w"]


def test_a_product_summing_over_merged_axes_reads_their_source():
    m, consts = _model(False)
    source = tile.onnx.to_tile(m)
    assert "reshape(" not in source and "Transpose" not in source
    assert "k_0" in source and "12*k_0" not in source and "4*k_0 + k_1" in source
    x = np.random.default_rng(2).integers(-4, 5, (2, 3, 5, 4)).astype(np.float32)
    for target in ("interp", "llvm_cpu.0"):
        (y,) = tile.onnx.Backend.prepare(m, target).run([x])
        np.testing.assert_array_equal(y, _want(x, consts, False))  # integers: exact


def test_a_merged_axis_the_product_does_not_sum_keeps_the_copy():
    m, consts = _model(True)
    source = tile.onnx.to_tile(m)
    assert "reshape(" in source  # (the merged axis is the product's output axis j)
    x = np.random.default_rng(4).integers(-4, 5, (2, 3, 5, 4)).astype(np.float32)
    (y,) = tile.onnx.Backend.prepare(m, "llvm_cpu.0").run([x])
    np.testing.assert_array_equal(y, _want(x, consts, True))


def test_a_product_reads_a_split_piece_in_place():
    """A Split's pieces (a fused QKV projection split into Q, K, V) read by products are offsets
    into the one tensor (``record_offset``): no piece is copied."""
    rng = np.random.default_rng(12)
    w = numpy_helper.from_array(rng.integers(-3, 4, (4, 6)).astype(np.float32), "w")
    nodes = [helper.make_node("Split", ["x"], ["p", "q"], axis=-1, num_outputs=2),
             helper.make_node("MatMul", ["q", "w"], ["y"])]
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 8])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 6])
    m = helper.make_model(helper.make_graph(nodes, "g", [x_info], [y_info], [w]),
                          opset_imports=[helper.make_opsetid("", 18)])
    source = tile.onnx.to_tile(m)
    assert "Take" not in source and "k + 4]" in source
    x = rng.integers(-4, 5, (2, 5, 8)).astype(np.float32)
    for target in ("interp", "llvm_cpu.0"):
        (y,) = tile.onnx.Backend.prepare(m, target).run([x])
        np.testing.assert_array_equal(y, x[..., 4:] @ numpy_helper.to_array(w))
