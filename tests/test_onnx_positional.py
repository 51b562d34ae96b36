"""``BackendRep.run``'s shortcut (tile/onnx/lane.py, ``PositionalCall``): after a general call with
a list of arrays, later calls of the same signature go straight to the lane (no key built, no dicts)
with the general path's results, in the model's output order; any other call (another signature,
a mapping, a non-array, another dtype, TILE_DEBUG) takes the general path, and a new signature
becomes the shortcut's."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="tile.onnx needs the onnx package (pip install -e '.[onnx]')")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tile.onnx.backend import Backend, BackendRep  # noqa: E402
from tile.onnx.lane import PositionalCall  # noqa: E402


def model():
    """``x [N, 16]``, ``z [N, 8]`` -> ``m = max(x @ w)`` (first) and ``y = relu(x @ w + z)``: two
    inputs, two outputs, N symbolic."""
    rng = np.random.default_rng(5)
    w = rng.integers(-3, 4, (16, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "z"], ["hz"]),
             helper.make_node("Relu", ["hz"], ["y"]), helper.make_node("ReduceMax", ["h"], ["m"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("m", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w


def inputs(n: int, seed: int):
    rng = np.random.default_rng(seed)
    return [rng.integers(-4, 5, (n, 16)).astype(np.float32), rng.integers(-4, 5, (n, 8)).astype(np.float32)]


def check(out, x, z, w):
    h = x @ w
    np.testing.assert_array_equal(out.m, h.max())
    np.testing.assert_array_equal(out.y, np.maximum(h + z, 0))
    assert out._fields == ("m", "y")


def counted(monkeypatch):
    """How many calls took the general path (``BackendRep.imported``, which builds the key)."""
    general = []
    original = BackendRep.imported
    monkeypatch.setattr(BackendRep, "imported", lambda self, a: general.append(1) or original(self, a))
    return general


@pytest.fixture
def prepared(monkeypatch):
    """The model prepared on llvm_cpu.0 (``TILE_DEBUG`` unset), its weight, and the count of
    calls that take the general path from then on."""
    monkeypatch.delenv("TILE_DEBUG", raising=False)
    m, w = model()
    rep = Backend.prepare(m, "llvm_cpu.0")
    return rep, w, counted(monkeypatch)


def test_later_calls_of_one_signature_skip_the_general_path(prepared):
    rep, w, general = prepared
    first = inputs(4, 0)
    check(rep.run(first), *first, w)  # the general path: the lane, then the shortcut, are made
    assert isinstance(rep._positional, PositionalCall)
    assert len(general) == 1
    outs = []
    for seed in range(1, 4):
        xs = inputs(4, seed)
        out = rep.run(tuple(xs) if seed == 2 else xs)
        check(out, *xs, w)
        outs.append((out, xs))
    assert len(general) == 1  # every later call took the shortcut
    for out, xs in outs:  # each call's outputs are its own arrays
        check(out, *xs, w)


def test_other_calls_take_the_general_path(prepared, monkeypatch):
    rep, w, general = prepared
    xs = inputs(4, 0)
    rep.run(xs)
    x, z = xs
    others = [
        {"x": x, "z": z},  # a mapping
        [x.tolist(), z],  # not an array
        [x, z[:, ::-1]],  # not contiguous (the lane refuses it)
        [x.astype(np.float64), z],  # another dtype (the general path converts it: the import's)
        [x[:3], z[:3]],  # another signature
    ]
    for k, given in enumerate(others, start=2):
        out = rep.run(given)
        want = [np.asarray(v, np.float32) for v in (given.values() if isinstance(given, dict) else given)]
        check(out, *want, w)
        assert len(general) == k, given
    # the last general call's signature (3 rows) is now the shortcut's; 4 rows go the general way
    check(rep.run(inputs(3, 7)), *inputs(3, 7), w)
    assert len(general) == len(others) + 1
    check(rep.run(inputs(4, 8)), *inputs(4, 8), w)
    assert len(general) == len(others) + 2
    monkeypatch.setenv("TILE_DEBUG", "1")
    check(rep.run(inputs(4, 9)), *inputs(4, 9), w)
    assert len(general) == len(others) + 3


def test_no_shortcut_without_a_lane(monkeypatch):
    monkeypatch.delenv("TILE_DEBUG", raising=False)
    m, w = model()
    rep = Backend.prepare(m, "interp")
    xs = inputs(2, 0)
    check(rep.run(xs), *xs, w)
    check(rep.run(xs), *xs, w)
    assert rep._positional is None


def test_one_array_given_twice_takes_the_general_path(monkeypatch):
    """The lane's kernels read distinct buffers (noalias): the same array at two positions goes
    the general way, with the right answer."""
    monkeypatch.delenv("TILE_DEBUG", raising=False)
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["s", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 8])
                                           for n in ("a", "b")],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    rep = Backend.prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "llvm_cpu.0")
    rng = np.random.default_rng(2)
    a, b = (rng.integers(-4, 5, (4, 8)).astype(np.float32) for _ in range(2))
    np.testing.assert_array_equal(rep.run([a, b]).y, (a + b) * b)
    general = counted(monkeypatch)
    np.testing.assert_array_equal(rep.run([b, a]).y, (b + a) * a)
    assert not general
    np.testing.assert_array_equal(rep.run([a, a]).y, (a + a) * a)
    assert len(general) == 1


def test_no_shortcut_where_an_input_value_decides_a_shape(monkeypatch):
    """Reshape's shape given as an input: the key holds its value, so calls of one signature but
    another value must take the general path (a new program), never the last one's lane."""
    monkeypatch.delenv("TILE_DEBUG", raising=False)
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                                           helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    rep = Backend.prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "llvm_cpu.0")
    x = np.arange(-6, 6, dtype=np.float32).reshape(2, 6)
    for shape in ([3, 4], [4, 3], [3, 4], [12, 1]):
        y = rep.run([x, np.array(shape, np.int64)]).y
        np.testing.assert_array_equal(y, np.maximum(x.reshape(shape), 0))
    assert rep.fixed == {"s"} and rep._positional is None
