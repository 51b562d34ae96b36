"""A model's constants in one block of huge pages for the lane (tile/onnx/arena.py): the copies hold
the originals' dtypes, shapes and values, each at a 64-byte boundary of one 2 MiB-aligned block;
the lane reads them (and the imported model holds them instead of the originals), with the same
results as the general path."""

from __future__ import annotations

import numpy as np
import pytest

from tile.onnx.arena import ALIGN, HUGE, arena

onnx = pytest.importorskip("onnx", reason="tile.onnx needs the onnx package (pip install -e '.[onnx]')")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tile.onnx.backend import Backend  # noqa: E402


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_copies_keep_values_in_one_aligned_block(monkeypatch):
    monkeypatch.setattr("tile.onnx.arena.LEAST", 1)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((3, 5)).astype(np.float32), np.arange(7, dtype=np.int64),
              np.array([True, False, True]), rng.standard_normal((64, 33)), np.zeros((0, 4), np.float16)]
    out = arena(arrays)
    assert out is not None and len(out) == len(arrays)
    for a, c in zip(arrays, out):
        assert c.dtype == a.dtype and c.shape == a.shape and c.flags.c_contiguous
        np.testing.assert_array_equal(c, a)
        assert _address(c) % ALIGN == 0 and not np.shares_memory(a, c)
    start = _address(out[0])
    assert start % HUGE == 0  # the block starts a huge page
    ends = [_address(c) + c.nbytes for c in out]
    assert max(ends) - start <= sum(-(-a.nbytes // ALIGN) * ALIGN for a in arrays)  # packed in order
    assert arena([]) is None
    monkeypatch.setattr("tile.onnx.arena.MOST", 4096)
    assert arena([np.zeros(512)]) is not None and arena([np.zeros(513)]) is None  # past MOST: left as is
    monkeypatch.setattr("tile.onnx.arena.LEAST", 2048)
    assert arena([np.zeros(248)]) is None and arena([np.zeros(256)]) is not None  # below LEAST: too


def test_the_lane_reads_its_constants_from_the_arena(monkeypatch):
    monkeypatch.delenv("TILE_DEBUG", raising=False)
    rng = np.random.default_rng(1)
    w = rng.integers(-3, 4, (512, 128)).astype(np.float32)  # 256 KiB: enough for the arena
    b = rng.integers(-3, 4, (128,)).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 128])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    rep = Backend.prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "llvm_cpu.0")
    xs = [rng.integers(-4, 5, (8, 512)).astype(np.float32) for _ in range(3)]
    first = rep.run([xs[0]])  # the general path, which makes the lane
    (lane,) = rep._lanes.values()
    (imp, _), = rep._cache.values()
    assert lane.keep and _address(lane.keep[0]) % HUGE == 0
    held = {id(v) for v in imp.constants.values()}
    assert all(id(c) in held for c in lane.keep)  # the imported model holds the copies
    assert set(lane.fixed) == {_address(c) for c in lane.keep}
    np.testing.assert_array_equal(first.y, xs[0] @ w + b)
    for x in xs[1:]:
        np.testing.assert_array_equal(rep.run([x]).y, x @ w + b)
