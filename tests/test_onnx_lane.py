"""The fast lane of an imported model's calls on llvm_cpu.0 (tile/onnx/lane.py): after a general
call, later calls at the same signature run the kernels on the arrays' addresses, with the general
path's results; what the lane cannot take goes the general way."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="tile.onnx needs the onnx package (pip install -e '.[onnx]')")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from backends.lane import Lane  # noqa: E402
from tile.onnx.backend import Backend  # noqa: E402
from tile.onnx.lane import OnnxLane  # noqa: E402


def model(k: int = 64, n: int = 48):
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.integers(-3, 4, (k, n)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.integers(-3, 4, (n,)).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["y"]),
             helper.make_node("ReduceMax", ["hb"], ["m"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, n]),
                               helper.make_tensor_value_info("m", TensorProto.FLOAT, [])], [w, b])
    w_np, b_np = numpy_helper.to_array(w), numpy_helper.to_array(b)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w_np, b_np


def expected(x, w, b):
    hb = x @ w + b
    return np.maximum(hb, 0), hb.max()


def test_later_calls_take_the_lane_with_the_general_paths_results(monkeypatch):
    monkeypatch.delenv("TILE_DEBUG", raising=False)
    m, w, b = model()
    rep = Backend.prepare(m, "llvm_cpu.0")
    rng = np.random.default_rng(0)
    xs = [rng.integers(-4, 5, (8, 64)).astype(np.float32) for _ in range(4)]
    first = rep.run([xs[0]])  # the general path, which leaves the lane
    (lane,) = rep._lanes.values()
    assert isinstance(lane, OnnxLane)
    taken = []
    original = Lane.run  # (``OnnxLane.__call__`` and ``PositionalCall`` both run the lane so)
    monkeypatch.setattr(Lane, "run", lambda self, a: taken.append(1) or original(self, a))
    for x in [xs[0], *xs[1:]]:
        y, mx = rep.run([x])
        want_y, want_m = expected(x, w, b)
        np.testing.assert_array_equal(y, want_y)
        np.testing.assert_array_equal(mx, want_m)
    assert len(taken) == 4
    np.testing.assert_array_equal(first.y, expected(xs[0], w, b)[0])
    # each call's outputs are new arrays: an earlier result is not overwritten
    a, c = rep.run([xs[1]]).y, rep.run([xs[2]]).y
    np.testing.assert_array_equal(a, expected(xs[1], w, b)[0])
    np.testing.assert_array_equal(c, expected(xs[2], w, b)[0])


def test_what_the_lane_cannot_take_goes_the_general_way(monkeypatch):
    monkeypatch.delenv("TILE_DEBUG", raising=False)
    m, w, b = model()
    rep = Backend.prepare(m, "llvm_cpu.0")
    x = np.random.default_rng(1).integers(-4, 5, (8, 128)).astype(np.float32)
    rep.run([x[:, :64].copy()])
    (lane,) = rep._lanes.values()
    strided = x[:, ::2]  # not C-contiguous
    assert lane({"x": strided}) is None
    assert lane({"x": strided.astype(np.float64)}) is None
    y, mx = rep.run([strided])  # the general path
    np.testing.assert_array_equal(y, expected(strided, w, b)[0])


def test_no_lane_on_the_interpreter_nor_under_tile_debug(monkeypatch):
    m, _, _ = model()
    x = np.zeros((8, 64), np.float32)
    rep = Backend.prepare(m, "interp")
    rep.run([x])
    assert list(rep._lanes.values()) in ([], [None])
    monkeypatch.setenv("TILE_DEBUG", "1")
    rep = Backend.prepare(m, "llvm_cpu.0")
    rep.run([x]), rep.run([x])
    assert not rep._lanes
