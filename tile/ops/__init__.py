"""tile.ops: an op library written in Tile, like PlaidML's ``op.py``.

Every op is a Python function of the op's *attributes* (stride, padding, axis, rank, ...) that
returns the **Tile source text of one function**. Sizes are never attributes: each source declares
its inputs' dimensions and derives every other size from them, so one source serves inputs of any
shape (and is compiled once per shape by ``tile.compile``). Contractions fix ranks, so ops whose
inputs have no fixed rank take ``rank=`` (reductions, softmax, layer norm, slicing, ...); the
elementwise activations take any rank.

Naming, the same in every op:

* data input ``X``, output ``Y``; weights ``W``, bias ``B``;
* other inputs are named in each op's docstring: ``A``/``B`` (matmul), ``I`` (indices), ``S``
  (scatter source; dropout's PRNG state), ``T`` (cross-entropy targets), ``Q``/``K``/``V``/``M``
  (attention), ``X0``.. (concat), ``Mean``/``Var`` (batch norm statistics);
* inputs come in the order of the ``function (...)`` header, which follows the PyTorch
  function's argument order; optional inputs (``bias=True``, ``mask=...``) are appended.

Use one the way you would any Tile program::

    import tile, tile.ops
    conv = tile.compile(tile.ops.conv2d(stride=2, padding=1, bias=True), device="llvm_cpu.0")
    y = conv(X=x, W=w, B=b)["Y"]
    grads = tile.grad(tile.ops.conv2d(stride=2, padding=1))   # the derived backward program

or hand the source to a framework bridge, which takes inputs positionally in header order::

    layer = tile.torch.op(tile.ops.conv2d(stride=2, padding=1))   # layer(x, w) -> y
    act = tile.jax.op(tile.ops.gelu())

To build a bigger function from pieces, several modules expose their statement builders
(``norm.softmax_lines``, ``reduce.contraction``, ``activation.erf_lines``, ...), which write
statements over tensor names you choose.

Ops:

* conv: ``conv1d conv2d conv3d conv`` (stride, padding incl. ``'same'``, dilation, groups,
  layout); ``conv_transpose1d/2d/3d conv_transpose``.
* pool: ``max_pool1d/2d/3d avg_pool1d/2d/3d`` (``ceil_mode``, ``count_include_pad``),
  ``adaptive_avg_pool1d/2d/3d``.
* norm: ``softmax log_softmax layer_norm batch_norm group_norm``.
* linalg: ``linear matmul bmm``.
* indexing: ``embedding index_select gather scatter_add concat slice pad permute transpose
  reshape flatten``.
* reduce: ``sum mean var max min prod argmax``.
* activation: ``relu gelu silu sigmoid tanh elu leaky_relu hardswish erf``.
* loss: ``cross_entropy dropout``; attention: ``scaled_dot_product_attention``.

Tile has no ``erf`` builtin; ``erf`` and the exact ``gelu`` compose it from polynomial pieces
(``activation.erf_lines``), within about an ulp in float32 and float64. Each module's docstring
lists where an op departs from PyTorch.
"""

from tile.ops.activation import elu, erf, gelu, hardswish, leaky_relu, relu, sigmoid, silu, tanh
from tile.ops.attention import scaled_dot_product_attention
from tile.ops.conv import (
    conv,
    conv1d,
    conv2d,
    conv3d,
    conv_transpose,
    conv_transpose1d,
    conv_transpose2d,
    conv_transpose3d,
)
from tile.ops.indexing import (
    concat,
    embedding,
    flatten,
    gather,
    index_select,
    pad,
    permute,
    reshape,
    scatter_add,
    slice,
    transpose,
)
from tile.ops.linalg import bmm, linear, matmul
from tile.ops.loss import cross_entropy, dropout
from tile.ops.norm import batch_norm, group_norm, layer_norm, log_softmax, softmax
from tile.ops.pool import (
    adaptive_avg_pool,
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    adaptive_avg_pool3d,
    avg_pool,
    avg_pool1d,
    avg_pool2d,
    avg_pool3d,
    max_pool,
    max_pool1d,
    max_pool2d,
    max_pool3d,
)
from tile.ops.reduce import argmax, max, mean, min, prod, sum, var

__all__ = [
    "adaptive_avg_pool", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "argmax",
    "avg_pool", "avg_pool1d", "avg_pool2d", "avg_pool3d", "batch_norm", "bmm", "concat", "conv", "conv1d",
    "conv2d", "conv3d", "conv_transpose", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "cross_entropy", "dropout", "elu", "embedding", "erf", "flatten", "gather", "gelu", "group_norm",
    "hardswish", "index_select", "layer_norm", "leaky_relu", "linear", "log_softmax", "matmul", "max",
    "max_pool", "max_pool1d", "max_pool2d", "max_pool3d", "mean", "min", "pad", "permute", "prod", "relu",
    "reshape", "scaled_dot_product_attention", "scatter_add", "sigmoid", "silu", "slice", "softmax", "sum",
    "tanh", "transpose", "var",
]
