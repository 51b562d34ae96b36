"""tile.onnx.Backend (onnx.backend.base): devices, prepare/run/run_node, the value-dependent inputs
fixed per call, the CLI, and a few of ONNX's own node tests through the standard runner."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="tile.onnx needs the onnx package (pip install -e '.[onnx]')")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.backend.test import BackendTest  # noqa: E402

import tile  # noqa: E402
from tile.onnx.backend import Backend, target  # noqa: E402


def small_model():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Softmax", ["h"], ["y"], axis=-1)]
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 8, "w")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def reference(x):
    h = x.astype(np.float64) @ (np.arange(12).reshape(4, 3) / 8)
    e = np.exp(h - h.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_devices_map_to_targets(monkeypatch):
    monkeypatch.delenv("TILE_ONNX_TARGET", raising=False)
    assert target("CPU") == "llvm_cpu.0" and target("CUDA") == "opencl_gpu.0"
    assert target("interp") == "interp" and target("external:python x.py") == "external:python x.py"
    monkeypatch.setenv("TILE_ONNX_TARGET", "interp")
    assert target("CPU") == "interp" and target("opencl_cpu.0") == "opencl_cpu.0"
    assert Backend.supports_device("interp")
    assert not Backend.supports_device("no_such_target.0")


@pytest.mark.parametrize("device", ["interp", "CPU"])
def test_prepare_and_run_match_numpy(device):
    x = np.array([[1, 0, -1, 2], [3, 1, 0, -2]], dtype=np.float32)
    rep = Backend.prepare(small_model(), device)
    (y,) = rep.run([x])
    # a softmax of a K=4 product: a few float32 roundings per element
    np.testing.assert_allclose(y, reference(x), rtol=16 * np.finfo(np.float32).eps, atol=0)
    assert rep.run({"x": x})["y"].shape == (2, 3)


def test_run_builds_the_outputs_class_once():
    # onnx's namedtupledict makes a new class through eval on every call: 0.1 ms, a third of a
    # small model's whole call on llvm_cpu.0
    x = np.array([[1, 0, -1, 2], [3, 1, 0, -2]], dtype=np.float32)
    rep = Backend.prepare(small_model(), "interp")
    first, second = rep.run([x]), rep.run([2 * x])
    assert type(first) is type(second) and first._fields == ("y",)
    np.testing.assert_allclose(second.y, reference(2 * x), rtol=16 * np.finfo(np.float32).eps, atol=0)


def test_run_node_runs_one_node():
    node = helper.make_node("Transpose", ["a"], ["b"], perm=[1, 0, 2])
    a = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    (b,) = Backend.run_node(node, [a], device="interp")
    np.testing.assert_array_equal(b, a.transpose(1, 0, 2))


def test_a_shape_input_is_fixed_to_each_calls_value():
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                                            helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    rep = Backend.prepare(helper.make_model(graph), "interp")
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    for shape in ([3, 4], [4, -1]):
        (y,) = rep.run([x, np.array(shape, dtype=np.int64)])
        np.testing.assert_array_equal(y, x.reshape(shape))
    assert rep.fixed == {"shape"} and len(rep._cache) == 2


def test_cli_emits_and_runs(tmp_path, capsys):
    from tile.cli import main

    path = tmp_path / "m.onnx"
    onnx.save(small_model(), str(path))
    assert main(["onnx", str(path), "--emit"]) == 0
    source = capsys.readouterr().out
    assert source.startswith("function (X[N2, N4], W[N4, N3])") and len(tile.parse(source).outputs) == 1
    x = np.array([[1, 0, -1, 2], [3, 1, 0, -2]], dtype=np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    out = tmp_path / "out.npz"
    assert main(["onnx", str(path), "--target", "interp", "--inputs", str(tmp_path / "in.npz"),
                 "--output", str(out)]) == 0
    assert "y: float32[2, 3]" in capsys.readouterr().out
    np.testing.assert_allclose(np.load(out)["y"], reference(x), rtol=16 * np.finfo(np.float32).eps)


def test_cli_names_missing_inputs(tmp_path, capsys):
    from tile.cli import main

    path = tmp_path / "m.onnx"
    onnx.save(small_model(), str(path))
    assert main(["onnx", str(path), "--target", "interp"]) == 1
    assert "inputs x are not given" in capsys.readouterr().err


# A few of ONNX's node tests through the standard runner (each operator family once, on the
# interpreter via TILE_ONNX_TARGET); python -m tile.onnx.node_tests runs all of them.
_NODE_TESTS = (r"^test_(relu|add_bcast|matmul_3d|gemm_all_attributes|reshape_negative_dim|"
               r"transpose_all_permutations_0|softmax_axis_1|reduce_sum_keepdims_example|slice_neg_steps|"
               r"gather_1|concat_3d_axis_1|where_example|cast_FLOAT_to_FLOAT16|einsum_batch_matmul|"
               r"resize_upsample_scales_linear|cumsum_2d_axis_1|argmax_keepdims_example|pad|"
               r"expand_dim_changed|split_equal_parts_1d_opset18|"
               # control flow unrolled, functions expanded, and the bigger converters
               r"if|scan9_sum|loop11|range_float_type_positive_delta_expanded|layer_normalization_2d_axis0|"
               r"dft|gridsample|roialign_aligned_true|lstm_defaults|gru_defaults|rnn_seq_length|"
               r"tfidfvectorizer_tf_only_bigrams_skip0|bitcast_int32_to_float32|col2im|adam|"
               r"scatternd_max|topk|qlinearmatmul_2D_uint8_float32|attention_4d)_cpu$")


@pytest.fixture(scope="module", autouse=True)
def _interp_target():
    mp = pytest.MonkeyPatch()
    mp.setenv("TILE_ONNX_TARGET", "interp")
    yield
    mp.undo()


_runner = BackendTest(Backend, __name__)
_runner.include(_NODE_TESTS)
globals().update(_runner.test_cases)


def test_prepare_refuses_an_unsupported_model_before_any_run():
    node = helper.make_node("ImageDecoder", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [30])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [2, 2, 3])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    with pytest.raises(tile.onnx.TileOnnxUnsupported, match="ImageDecoder"):
        Backend.prepare(m, "interp")
    assert not Backend.is_compatible(m, "interp") and Backend.is_compatible(small_model(), "interp")
