"""How tile.onnx lays tensors out for speed, checked for meaning: channels-last copies carried
between a convolution and its neighbours (``tile.onnx.layout``), constant Gemm weights stored K-major
and Conv weights permuted at import where the backend imports (``pack``), softmax as contractions.
Integer-valued inputs and weights keep every float32 sum exact, so results compare exactly with
numpy's."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="tile.onnx needs the onnx package (pip install -e '.[onnx]')")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import tile  # noqa: E402
import tile.onnx  # noqa: E402

TARGETS = ["interp", "llvm_cpu.0"]


def ints(shape, lo=-3, hi=4, seed=0):
    return np.random.default_rng(seed).integers(lo, hi, size=shape).astype(np.float32)


def conv2d(x, w, b):
    """Reference: a 3x3 convolution, stride 1, pad 1, NCHW, in float64 (exact for these ints)."""
    n, c, h, wd = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    return out + b[None, :, None, None]


def cnn_model(indices: bool):
    """Conv -> Relu -> MaxPool -> Conv -> Abs -> (GlobalAveragePool, and Add of the Abs to itself),
    weights as initializers; with ``indices`` the pool also gives its Indices output."""
    w1, b1 = ints((4, 3, 3, 3), seed=1), ints((4,), seed=2)
    w2, b2 = ints((5, 4, 3, 3), seed=3), ints((5,), seed=4)
    pool_out = ["p", "pi"] if indices else ["p"]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r"]),
             helper.make_node("MaxPool", ["r"], pool_out, kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Abs", ["c2"], ["a"]),
             helper.make_node("GlobalAveragePool", ["a"], ["g"]),
             helper.make_node("Add", ["a", "a"], ["s"])]
    outs = [helper.make_tensor_value_info("g", TensorProto.FLOAT, [2, 5, 1, 1]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 5, 4, 4]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 4, 8, 8])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])
    graph = helper.make_graph(nodes, "g", [x], outs, [numpy_helper.from_array(a, n) for n, a in
                                                      (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return model, (w1, b1, w2, b2)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("indices", [False, True])
def test_conv_neighbours_in_either_layout_match_numpy(target, indices):
    model, (w1, b1, w2, b2) = cnn_model(indices)
    x = ints((2, 3, 8, 8), seed=5)
    r = np.maximum(conv2d(x, w1, b1), 0)
    p = r.reshape(2, 4, 4, 2, 4, 2).max(axis=(3, 5))
    a = np.abs(conv2d(p, w2, b2))
    g, s, relu = tile.onnx.Backend.prepare(model, target).run([x])
    np.testing.assert_array_equal(relu, r.astype(np.float32))  # a channels-first output still read
    np.testing.assert_array_equal(s, (2 * a).astype(np.float32))
    np.testing.assert_allclose(g, a.mean(axis=(2, 3), keepdims=True).astype(np.float32), rtol=2**-22)


def test_the_chain_runs_without_a_permutation_between_convolutions():
    model, _ = cnn_model(indices=False)
    source = tile.onnx.to_tile(model)
    maxpool = next(line for line in source.splitlines() if "= >(" in line)
    conv2 = [line for line in source.splitlines() if "= +(" in line and "hwio" not in line][1]
    # the pool reads the activation channels-last ([n, h, w, c]) and the second convolution its result
    assert maxpool.strip().startswith("MaxPool[n, o0, o1, c:")
    assert "(Relu[n, 2*o0 + k0, 2*o1 + k1, c])" in maxpool
    assert conv2.split("+(")[1].startswith("MaxPool[n, ")


def gemm_model():
    w, b = ints((6, 5), seed=6), ints((6,), seed=7)
    node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), w, b


def test_pack_stores_a_transposed_gemm_weight_k_major():
    model, w, b = gemm_model()
    plain, packed = tile.onnx.import_model(model), tile.onnx.import_model(model, pack=True)
    assert "w" in plain.initializers.values() and "w" not in packed.initializers.values()
    kmajor = next(a for t, a in packed.constants.items() if t.endswith("kmajor"))
    np.testing.assert_array_equal(kmajor, w.T)
    x = ints((4, 5), seed=8)
    for imp in (plain, packed):
        y = tile.compile(imp.source, "interp")(imp.feeds({"x": x}))[imp.outputs[0][1]]
        np.testing.assert_array_equal(y, x @ w.T + b)
    (y,) = tile.onnx.Backend.prepare(model, "llvm_cpu.0").run([x])
    np.testing.assert_array_equal(y, x @ w.T + b)


def test_training_imports_keep_the_weights_as_given():
    model, w, _ = gemm_model()
    imp = tile.onnx.import_model(model, params=True, pack=True)  # params wins: gradients need them
    assert "w" in imp.initializers.values()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op,axis", [("Softmax", -1), ("Softmax", 1), ("LogSoftmax", -1)])
def test_softmax_as_contractions_matches_numpy(target, op, axis):
    x = np.random.default_rng(9).standard_normal((3, 7, 16)).astype(np.float32) * 4
    node = helper.make_node(op, ["x"], ["y"], axis=axis)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    assert "builtin_softmax" not in tile.onnx.to_tile(model)
    (y,) = tile.onnx.Backend.prepare(model, target).run([x])
    x64 = x.astype(np.float64)
    shift = x64 - x64.max(axis=axis, keepdims=True)
    total = np.exp(shift).sum(axis=axis, keepdims=True)
    want = shift - np.log(total) if op == "LogSoftmax" else np.exp(shift) / total
    # a row of n = 16 or 7: exp and log within a few ulps each, the sum within n units of roundoff
    tol = 2.0**-24 * (x.shape[axis] + 8)
    np.testing.assert_allclose(y, want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_erf_is_within_two_ulps_with_the_shorter_float32_fits(target, dtype):
    import math

    edges = [0.0, -0.0, 1e-30, 2.5, 4.0, np.inf, -np.inf]
    x = np.concatenate([np.linspace(-6, 6, 24001), edges]).astype(dtype)
    node = helper.make_node("Erf", ["x"], ["y"])
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, x.shape)],
                              [helper.make_tensor_value_info("y", elem, x.shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    source = tile.onnx.to_tile(model)
    assert ("2.5" in source) == (dtype == np.float32)  # the narrow fits' piece boundary
    (y,) = tile.onnx.Backend.prepare(model, target).run([x])
    want = np.array([math.erf(float(v)) for v in x])
    ulps = np.abs(y.astype(np.float64) - want) / np.spacing(np.abs(want).astype(dtype)).astype(np.float64)
    assert ulps.max() <= 2.0, x[np.argmax(ulps)]


def test_float16_softmax_rounds_as_the_builtin_does():
    """The exponentials rounded to float16, their sum in float32 rounded once, then the quotient
    (the builtin row kernel's roundings, docs/semantics.md §5): the contraction form gives the same
    bits as ``builtin_softmax`` on the interpreter."""
    x = (np.random.default_rng(10).standard_normal((5, 37)) * 3).astype(np.float16)
    node = helper.make_node("Softmax", ["x"], ["y"], axis=-1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, x.shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    (y,) = tile.onnx.Backend.prepare(model, "interp").run([x])
    rows = tile.compile("function (X[R, C]) -> (Y) { Y = builtin_softmax(X, 5, 37); }", "interp")
    builtin = rows({"X": x})["Y"]
    np.testing.assert_array_equal(y, builtin)


@pytest.mark.parametrize("indices", [False, True])
def test_every_statement_of_an_import_is_read(indices):
    """The channels-first copies nothing reads are left out of the program (so a ReLU fuses into
    its convolution's kernel on a compiled target); each statement feeds an output."""
    model, _ = cnn_model(indices)
    program = tile.parse(tile.onnx.to_tile(model))
    outputs = {o.name for o in program.outputs}
    read = {r.name for s in program.stmts for r in getattr(s, "operands", ())}
    read |= {e.name for s in program.stmts for e in tile.ast.expressions(s) if isinstance(e, tile.ast.Name)}
    unread = [s.name for s in program.stmts if s.name not in read | outputs]
    assert unread == []


def heads_model(b=2, t=6, h=3, d=4):
    """An attention block's head split: q, k of [b, t, h*d] reshaped to [b, t, h, d], transposed to
    [b, h, t, d] and [b, h, d, t], multiplied: [b, h, t, t]; then the same for v's [b, h, t, d]."""
    f = TensorProto.FLOAT
    shape = helper.make_tensor("split", TensorProto.INT64, [4], [b, t, h, d])
    nodes = [helper.make_node("Reshape", ["q", "split"], ["q4"]),
             helper.make_node("Reshape", ["k", "split"], ["k4"]),
             helper.make_node("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["k4"], ["kh"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["qh", "kh"], ["s"]),
             helper.make_node("MatMul", ["s", "qh"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, f, [b, t, h * d]) for n in "qk"],
                              [helper.make_tensor_value_info("s", f, [b, h, t, t]),
                               helper.make_tensor_value_info("y", f, [b, h, t, d])], [shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("target", TARGETS)
def test_products_read_split_heads_through_the_reshape_and_transpose(target):
    model = heads_model()
    program = tile.parse(tile.onnx.to_tile(model))
    assert [s.name for s in program.stmts if not isinstance(s, tile.ast.Contraction)] == []  # no copies
    q, k = ints((2, 6, 12), seed=11), ints((2, 6, 12), seed=12)
    qh = q.reshape(2, 6, 3, 4).transpose(0, 2, 1, 3)
    kh = k.reshape(2, 6, 3, 4).transpose(0, 2, 3, 1)
    s, y = tile.onnx.Backend.prepare(model, target).run([q, k])
    np.testing.assert_array_equal(s, qh @ kh)
    np.testing.assert_array_equal(y, (qh @ kh) @ qh)
