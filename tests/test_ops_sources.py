"""Every tile.ops source is well-formed Tile without any input shape: it parses, prints back to
itself (parse(print(x)) == x), types with symbolic sizes, and has a symbolic gradient. This needs
no torch."""

from __future__ import annotations

import pytest

import tile
import tile.ops as ops
from tile.dtypes import DType

SOURCES = {
    "conv2d": ops.conv2d(stride=2, padding=1, dilation=2, groups=2, bias=True),
    "conv3d_same_last": ops.conv3d(padding="same", layout="NDHWC"),
    "conv_transpose2d": ops.conv_transpose2d(stride=2, padding=1, output_padding=1, groups=2, bias=True),
    "max_pool2d": ops.max_pool2d(3, stride=2, padding=1, ceil_mode=True),
    "avg_pool1d": ops.avg_pool1d(3, padding=1, count_include_pad=False),
    "adaptive_avg_pool2d": ops.adaptive_avg_pool2d((3, 2)),
    "softmax": ops.softmax(rank=3, axis=1),
    "log_softmax": ops.log_softmax(rank=2),
    "layer_norm": ops.layer_norm(rank=3, normalized_ndim=2),
    "batch_norm": ops.batch_norm(),
    "batch_norm_training": ops.batch_norm(training=True, stats=True),
    "group_norm": ops.group_norm(2),
    "linear": ops.linear(rank=3),
    "matmul": ops.matmul(rank_a=3, rank_b=1),
    "embedding": ops.embedding(),
    "index_select": ops.index_select(rank=2, axis=1),
    "gather": ops.gather(rank=2, axis=1),
    "scatter_add": ops.scatter_add(rank=2, axis=0),
    "concat": ops.concat(2, rank=2, axis=1),
    "slice": ops.slice(rank=2, key=(slice(1, -1, 2), 0)),
    "pad": ops.pad(rank=2, pad=(1, 2), value=-1.0),
    "permute": ops.permute((1, 0)),
    "reshape": ops.reshape(rank=2, shape=(-1,)),
    "var": ops.var(rank=2, axis=0),
    "argmax": ops.argmax(rank=2, axis=1),
    "gelu": ops.gelu(),
    "gelu_tanh": ops.gelu(approximate="tanh"),
    "hardswish": ops.hardswish(),
    "cross_entropy": ops.cross_entropy(),
    "dropout": ops.dropout(0.1, rank=2),
    "attention": ops.scaled_dot_product_attention(mask="bool", is_causal=True),
}
# inputs that are not float tensors
KINDS = {"I": DType.INT64, "T": DType.INT64, "M": DType.BOOL, "S": DType.UINT32}


@pytest.mark.parametrize("name", list(SOURCES))
def test_source_is_generic_tile(name):
    program = tile.parse(SOURCES[name])
    assert tile.parse(tile.format_program(program)) == program
    dtypes = {i.name: KINDS.get(i.name, DType.FLOAT32) for i in program.inputs}
    bound = tile.bind_symbolic(program, dtypes)
    assert set(bound.outputs) >= {"Y"}
    floats = [n for n, t in dtypes.items() if t == DType.FLOAT32]
    if floats and name != "argmax":
        # an input of any rank (attention's mask) needs a shape for the gradient's reshapes
        shapes = {"M": (4, 6)} if name == "attention" else None
        gradient = tile.grad(program, wrt=floats, outputs=["Y"], dtypes=dtypes, shapes=shapes)
        assert {o.name for o in gradient.outputs} == {f"D{n}" for n in floats}
