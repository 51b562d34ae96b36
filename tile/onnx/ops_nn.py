"""Converters for ONNX's neural-network operators: convolutions, pooling and normalization.

Shapes are static at import, so every attribute ONNX derives from shapes (``auto_pad``'s pads,
``ceil_mode``'s output sizes, ConvTranspose's ``output_shape``, pooling counts) is worked out here
in Python and written into the Tile text as numbers. Conv and ConvTranspose are ``tile.ops``'
convolutions with per-side pads; BatchNormalization, InstanceNormalization and GroupNormalization
are ``tile.ops``' batch and group norms. Pooling is one window contraction per node (ONNX's pads
may differ per side and pools dilate, which ``tile.ops``' pools do not take), and an average
divides by a constant tensor of per-window counts. Padding never enters a max: a padded position
is not a valid index tuple (docs/semantics.md §6.1).

float16 and bfloat16 normalizations compute in float32 and round the result back once, as ONNX's
``stash_type=1`` asks (for BatchNormalization, InstanceNormalization and LRN too, which have no
such attribute but whose fp16 results are defined only to the case tolerances).
"""

from __future__ import annotations

import math

import numpy as np

import tile.ops
from tile.dtypes import DType
from tile.onnx.context import Context, Value
from tile.onnx.layout import from_last, last_of, to_last
from tile.onnx.moments import moment_lines, scaled, squares_sum
from tile.onnx.ops_shape import permute
from tile.onnx.registry import converter
from tile.ops._build import function
from tile.ops.reduce import contraction

# ---------------------------------------------------------------------------- windows and pads


def _spatial_attr(ctx: Context, name: str, nd: int, default: int) -> tuple[int, ...]:
    value = ctx.attr(name, None)
    if value is None or len(value) == 0:
        return (default,) * nd
    if len(value) != nd:
        raise ctx.error(f"'{name}' has {len(value)} entries; the input has {nd} spatial dims")
    return tuple(int(v) for v in value)


def _pads(ctx: Context, lengths, kernel, strides, dilations) -> list[tuple[int, int]]:
    """(begin, end) pads per spatial dim: ``pads`` as given, or as ``auto_pad`` derives them (SAME:
    ``ceil(L / stride)`` outputs, the odd one of the total after with SAME_UPPER, before with
    SAME_LOWER)."""
    nd = len(lengths)
    auto = ctx.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = ctx.attr("pads", None) or (0,) * (2 * nd)
        if len(pads) != 2 * nd:
            raise ctx.error(f"'pads' has {len(pads)} entries; {2 * nd} are needed (begins, then ends)")
        if any(p < 0 for p in pads):
            raise ctx.unsupported(f"negative pads {tuple(pads)}")
        return [(int(pads[d]), int(pads[d + nd])) for d in range(nd)]
    if auto == "VALID":
        return [(0, 0)] * nd
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise ctx.error(f"auto_pad '{auto}' is not NOTSET, SAME_UPPER, SAME_LOWER or VALID")
    out = []
    for L, k, s, d in zip(lengths, kernel, strides, dilations):
        total = max((-(-L // s) - 1) * s + (k - 1) * d + 1 - L, 0)
        small, big = total // 2, total - total // 2
        out.append((small, big) if auto == "SAME_UPPER" else (big, small))
    return out


def _out_size(L: int, k: int, s: int, d: int, pad: tuple[int, int], ceil_mode: bool) -> int:
    """Windows along one dim; with ``ceil_mode`` a last partial window counts if it starts inside
    the input or its leading pad (ONNX's rule, as PyTorch's)."""
    span = L + pad[0] + pad[1] - (k - 1) * d - 1
    if span < 0:
        return 0
    if not ceil_mode:
        return span // s + 1
    n = -(-span // s) + 1
    return n - 1 if (n - 1) * s >= L + pad[0] else n


class Window:
    """A pooling node's window: kernel, strides, dilations, (begin, end) pads and output sizes."""

    def __init__(self, ctx: Context, x: Value, kernel=None):
        if x.rank < 3:
            raise ctx.error(f"the input has rank {x.rank}; pooling needs [N, C, spatial..]")
        self.nd = nd = x.rank - 2
        self.lengths = x.shape[2:]
        self.kernel = tuple(kernel) if kernel is not None else _spatial_attr(ctx, "kernel_shape", nd, 0)
        if len(self.kernel) != nd or any(k < 1 for k in self.kernel):
            raise ctx.error(f"kernel_shape {self.kernel} is not {nd} positive sizes")
        self.strides = _spatial_attr(ctx, "strides", nd, 1)
        self.dilations = _spatial_attr(ctx, "dilations", nd, 1)
        if any(v < 1 for v in self.strides + self.dilations):
            raise ctx.error(f"strides {self.strides} and dilations {self.dilations} must be positive")
        self.pads = _pads(ctx, self.lengths, self.kernel, self.strides, self.dilations)
        ceil_mode = bool(ctx.attr("ceil_mode", 0))
        self.sizes = tuple(_out_size(*a, ceil_mode) for a in
                           zip(self.lengths, self.kernel, self.strides, self.dilations, self.pads))

    def positions(self, d: int) -> np.ndarray:
        """The input coordinates each window covers along dim ``d``: [outputs, kernel]."""
        o, k = np.arange(self.sizes[d])[:, None], np.arange(self.kernel[d])[None, :]
        return o * self.strides[d] + k * self.dilations[d] - self.pads[d][0]

    def contraction(self, ctx: Context, agg: str, x: Value, hint: str, combine=None,
                    last: bool = False) -> Value:
        """``agg`` over each window of ``x`` (``+`` or ``>``), [N, C, O..] ([N, O.., C] where ``x``
        is channels-last, ``last``); ``combine(at, out)`` writes another combination from the
        window's and the output's index lists."""
        o, k = [f"o{d}" for d in range(self.nd)], [f"k{d}" for d in range(self.nd)]
        at = []
        for d in range(self.nd):
            s, dl, p = self.strides[d], self.dilations[d], self.pads[d][0]
            term = f"{s}*{o[d]}" if s != 1 else o[d]
            term += f" + {dl}*{k[d]}" if dl != 1 else f" + {k[d]}"
            at.append(term + (f" - {p}" if p else ""))
        n, c = (x.shape[0], x.shape[-1]) if last else x.shape[:2]
        sizes = ", ".join(map(str, (n, *self.sizes, c) if last else (n, c, *self.sizes)))
        cons = "".join(f", {k[d]} < {self.kernel[d]}" for d in range(self.nd))
        at, out = (f"n, {', '.join(at)}, c", f"n, {', '.join(o)}, c") if last else \
            (f"n, c, {', '.join(at)}", f"n, c, {', '.join(o)}")
        body = combine(at, out) if combine is not None else f"{x}[{at}]"
        return ctx.emit(f"$[{out}: {sizes}] = {agg}({body}){cons}", hint)

    def counts(self, include_pad: bool) -> np.ndarray:
        """Elements per window: those inside the input, or with ``include_pad`` inside the padded
        extent (not a ``ceil_mode`` window's overhang past it), as [1, 1, O..]."""
        total = np.ones((), np.int64)
        for d in range(self.nd):
            p = self.positions(d)
            lo, hi = (0, self.lengths[d])
            if include_pad:
                lo, hi = -self.pads[d][0], self.lengths[d] + self.pads[d][1]
            per = ((p >= lo) & (p < hi)).sum(axis=1)
            total = np.multiply.outer(total, per)
        return total.reshape((1, 1, *self.sizes))


def _in_float32(ctx: Context, *values: Value | None) -> list[Value | None]:
    """``values`` with float16 and bfloat16 ones converted to float32 (None stays None)."""
    return [v if v is None or not v.dtype.is_narrow_float else ctx.cast(v, DType.FLOAT32) for v in values]


# ---------------------------------------------------------------------------- pooling


@converter("MaxPool")
def max_pool(ctx: Context, node) -> list[Value | None]:
    """The maximum of each window; ``Indices``, where asked for, is the first position of it in
    the flattened input (spatial dims row-major, or column-major with ``storage_order=1``): the
    largest of ``total - position`` over the window's elements equal to the maximum."""
    x = ctx.input(0)
    w = Window(ctx, x)
    indices = len(node.output) >= 2 and bool(node.output[1])
    last = last_of(ctx, x)
    if last is not None and not indices:  # a convolution's output: pooled channels-last (layout)
        return [from_last(ctx, w.contraction(ctx, ">", last, "MaxPool", last=True), "MaxPool")]
    y = w.contraction(ctx, ">", x, "MaxPool")
    if not indices:
        return [y]
    total = x.size
    flat = [int(d) for d in x.shape]
    order = list(range(x.rank)) if not ctx.attr("storage_order", 0) else [0, 1, *range(x.rank - 1, 1, -1)]
    stride, terms = 1, []
    for a in reversed(order):  # the position's terms, innermost axis first
        terms.append(f"as_int(index({x}, {a}), 64) * {ctx.lit(stride, DType.INT64)}")
        stride *= flat[a]
    rest = ctx.let(f"{ctx.lit(total, DType.INT64)} - ({' + '.join(terms)})", "PoolPosition")
    best = w.contraction(ctx, ">", x, "PoolArg", lambda at, out: f"{x}[{at}] == {y}[{out}] ? {rest}[{at}]")
    return [y, ctx.let(f"{ctx.lit(total, DType.INT64)} - {best}", "Indices")]


@converter("MaxUnpool")
def max_unpool(ctx: Context, node) -> list[Value]:
    """Zeros of the unpooled shape (``output_shape``, else ``(L - 1) * stride + kernel - pads``)
    with each value of ``X`` at its flattened position in ``I`` (``scatter``)."""
    x, idx = ctx.input(0), ctx.input(1)
    nd = x.rank - 2
    kernel = _spatial_attr(ctx, "kernel_shape", nd, 0)
    strides = _spatial_attr(ctx, "strides", nd, 1)
    pads = ctx.attr("pads", None) or (0,) * (2 * nd)
    shape = (*x.shape[:2], *((L - 1) * s + k - pads[d] - pads[d + nd]
                              for d, (L, s, k) in enumerate(zip(x.shape[2:], strides, kernel))))
    room = ctx.constant(np.zeros(math.prod(shape), np.int8))
    flat = ctx.let(f"scatter(reshape({x}, {x.size}), reshape({idx}, {idx.size}), {room})", "Unpooled")
    y = ctx.let(f"reshape({flat}, {', '.join(map(str, shape))})", "MaxUnpool")
    wanted = ctx.const(2, None)
    if wanted is None or tuple(int(v) for v in wanted) == shape:
        return [y]
    # a given output_shape: the positions keep their coordinates (in the default shape) and the
    # rest of the larger output is 0
    idx = ", ".join(f"i{a}" for a in range(x.rank))
    return [ctx.emit(f"$[{idx}: {', '.join(str(int(v)) for v in wanted)}] = =({y}[{idx}])", "MaxUnpool")]


@converter("AveragePool")
def average_pool(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    if not x.dtype.is_float:
        raise ctx.unsupported(f"AveragePool of {x.dtype.value}")
    w = Window(ctx, x)
    total = w.contraction(ctx, "+", x, "PoolSum")
    count = ctx.constant(w.counts(bool(ctx.attr("count_include_pad", 0))).astype(x.dtype.numpy), x.dtype)
    return [ctx.let(f"{total} / {count}", "AveragePool")]


@converter("LpPool")
def lp_pool(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    p = ctx.attr("p", 2)
    w = Window(ctx, x)
    powered = ctx.let(f"{x} * {x}" if p == 2 else f"pow(abs({x}), {ctx.lit(p, x.dtype)})", "LpPow")
    total = w.contraction(ctx, "+", powered, "LpSum")
    root = f"sqrt({total})" if p == 2 else f"pow({total}, {ctx.lit(1.0 / p, x.dtype)})"
    return [ctx.cast(ctx.let(root, "LpPool"), x.dtype)]


@converter("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def global_pool(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    if x.rank < 3:
        raise ctx.error(f"the input has rank {x.rank}; global pooling needs [N, C, spatial..]")
    nd = x.rank - 2
    idx = [f"i{d}" for d in range(nd)]
    sizes = ", ".join(map(str, (*x.shape[:2], *[1] * nd)))
    head = f"$[n, c{', 0' * nd}: {sizes}]"
    last = last_of(ctx, x)  # a convolution's output: read channels-last (layout)
    src, at = (last, f"n, {', '.join(idx)}, c") if last is not None else (x, f"n, c, {', '.join(idx)}")
    if node.op_type == "GlobalMaxPool":
        return [ctx.emit(f"{head} = >({src}[{at}])", "GlobalMaxPool")]
    if node.op_type == "GlobalLpPool":
        p = ctx.attr("p", 2)
        src = ctx.let(f"{src} * {src}" if p == 2 else f"pow(abs({src}), {ctx.lit(p, x.dtype)})", "LpPow")
    total = ctx.emit(f"{head} = +({src}[{at}])", "GlobalSum")
    if node.op_type == "GlobalLpPool":
        root = f"sqrt({total})" if p == 2 else f"pow({total}, {ctx.lit(1.0 / p, x.dtype)})"
        return [ctx.cast(ctx.let(root, "GlobalLpPool"), x.dtype)]
    count = math.prod(x.shape[2:])
    return [ctx.let(f"{total} / {ctx.lit(count, x.dtype)}", "GlobalAveragePool")]


# ---------------------------------------------------------------------------- convolutions


def _conv_shapes(ctx: Context, x: Value, w: Value) -> tuple[int, tuple, tuple, tuple]:
    if x.rank < 3 or w.rank != x.rank:
        raise ctx.error(f"X has rank {x.rank} and W rank {w.rank}; both need [N, C, spatial..] of one rank")
    nd = x.rank - 2
    kernel = _spatial_attr(ctx, "kernel_shape", nd, 0)
    if kernel != (0,) * nd and kernel != tuple(w.shape[2:]):
        raise ctx.error(f"kernel_shape {kernel} differs from W's spatial shape {tuple(w.shape[2:])}")
    strides, dilations = _spatial_attr(ctx, "strides", nd, 1), _spatial_attr(ctx, "dilations", nd, 1)
    return nd, tuple(w.shape[2:]), strides, dilations


@converter("Conv")
def conv(ctx: Context, node) -> list[Value]:
    """``tile.ops``' channels-last convolution between two permutations: ``llvm_cpu``'s kernels
    for it ran 3 to 10 times faster than the channels-first ones on the CNN of bench/onnx_models.py
    (the permutations cost a copy each). The weights are permuted in the program, not at import,
    so they stay the model's initializers (which ``tile.grad`` differentiates)."""
    x, w, b = ctx.input(0), ctx.raw(1), ctx.input(2)
    if not x.dtype.is_float:
        raise ctx.unsupported(f"Conv of {x.dtype.value} (ConvInteger is the integer convolution)")
    nd, kernel, strides, dilations = _conv_shapes(ctx, x, w)
    pads = _pads(ctx, x.shape[2:], kernel, strides, dilations)
    source = tile.ops.conv(nd, stride=strides, padding=pads, dilation=dilations,
                           groups=int(ctx.attr("group", 1)), bias=b is not None, layout="channels_last")
    spatial = list(range(2, x.rank))
    if ctx.b.pack and w.const is not None:  # the backend's import: the weights permuted now
        wl = ctx.b.materialize(ctx.folded(w.const.transpose([*spatial, 1, 0]).copy(), w.dtype),
                               f"{node.input[1]}_hwio")
    else:
        wl = permute(ctx, ctx.input(1), [*spatial, 1, 0], "ConvW")
    (y,) = ctx.call(source, to_last(ctx, x, "ConvX"), wl, *([b] if b is not None else []))
    return [from_last(ctx, y, "Conv")]


@converter("ConvTranspose")
def conv_transpose(ctx: Context, node) -> list[Value]:
    """The output has ``stride * (L - 1) + output_padding + (K - 1) * dilation + 1 - pads`` positions;
    ``output_shape`` (or SAME ``auto_pad``: ``L * stride``) fixes it and derives the pads, the odd
    one at the end for SAME_UPPER and at the start otherwise, as ONNX's spec says. ``tile.ops``'
    transposed convolution takes the begin pad as ``padding`` and the rest of the size as
    ``output_padding``."""
    x, w, b = ctx.input(0), ctx.input(1), ctx.input(2)
    if not x.dtype.is_float:
        raise ctx.unsupported(f"ConvTranspose of {x.dtype.value}")
    nd, kernel, strides, dilations = _conv_shapes(ctx, x, w)
    outpad = _spatial_attr(ctx, "output_padding", nd, 0)
    lengths = x.shape[2:]
    full = [s * (L - 1) + op + (k - 1) * d + 1
            for L, s, op, k, d in zip(lengths, strides, outpad, kernel, dilations)]
    auto = ctx.attr("auto_pad", "NOTSET")
    shape = ctx.attr("output_shape", None)
    if shape is not None and len(shape) == nd + 2:
        shape = shape[2:]
    if shape is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        shape = [L * s for L, s in zip(lengths, strides)]
    if shape is not None:
        if len(shape) != nd:
            raise ctx.error(f"output_shape {tuple(shape)} does not have {nd} spatial sizes")
        totals = [f - int(o) for f, o in zip(full, shape)]  # negative: zeros appended at the end
        upper = auto == "SAME_UPPER"
        pads = [(t // 2, t - t // 2) if upper else (t - t // 2, t // 2) for t in totals]
    else:
        pads = [(0, 0)] * nd if auto == "VALID" else _pads(ctx, lengths, kernel, strides, dilations)
    sizes = [f - p0 - p1 for f, (p0, p1) in zip(full, pads)]
    if any(n < 1 for n in sizes):
        raise ctx.error(f"the pads {pads} leave an empty output {tuple(sizes)}")
    # tile.ops: O = (L - 1) * s - 2 * padding + (K - 1) * d + output_padding + 1, offset by padding
    extra = [n - ((L - 1) * s - 2 * p0 + (k - 1) * d + 1)
             for n, L, s, (p0, _), k, d in zip(sizes, lengths, strides, pads, kernel, dilations)]
    if any(p0 < 0 for p0, _ in pads):
        raise ctx.unsupported(f"a negative begin pad ({pads})")
    source = tile.ops.conv_transpose(nd, stride=strides, padding=[p0 for p0, _ in pads], output_padding=extra,
                                     dilation=dilations, groups=int(ctx.attr("group", 1)), bias=b is not None)
    args = (x, w) if b is None else (x, w, b)
    return ctx.call(source, *args)


# ---------------------------------------------------------------------------- normalization


def _back(ctx: Context, values: list[Value], dtype: DType) -> list[Value]:
    return [ctx.cast(v, dtype) for v in values]


@converter("BatchNormalization")
def batch_norm(ctx: Context, node) -> list[Value | None]:
    """Inference, or (``training_mode=1``) the batch's statistics, returning the running mean and
    variance updated with ``momentum``: ``running * momentum + batch * (1 - momentum)``, the batch
    variance biased, as ONNX's reference computes it."""
    x0, scale, bias, mean, var = ctx.inputs()[:5]
    eps = float(ctx.attr("epsilon", 1e-5))
    training = bool(ctx.attr("training_mode", 0)) if ctx.opset >= 14 else False
    x, scale, bias, mean, var = _in_float32(ctx, x0, scale, bias, mean, var)
    if x.rank < 2:
        raise ctx.error(f"the input has rank {x.rank}; BatchNormalization needs [N, C, ..]")
    if not training:
        y = ctx.call(tile.ops.batch_norm(rank=x.rank, eps=eps), x, mean, var, scale, bias)
        return _back(ctx, y, x0.dtype) + [None] * (len(node.output) - 1)
    y, batch_mean, unbiased = ctx.call(tile.ops.batch_norm(rank=x.rank, training=True, eps=eps, stats=True),
                                       x, scale, bias)
    count = math.prod(x.shape) // x.shape[1]
    momentum = float(ctx.attr("momentum", 0.9))
    f = x.dtype
    biased = ctx.let(f"{unbiased} * {ctx.lit((count - 1) / count, f)}", "BatchVar")
    keep, take = ctx.lit(momentum, f), ctx.lit(1.0 - momentum, f)
    run_mean = ctx.let(f"{mean} * {keep} + {batch_mean} * {take}", "RunningMean")
    run_var = ctx.let(f"{var} * {keep} + {biased} * {take}", "RunningVar")
    return _back(ctx, [y, run_mean, run_var], x0.dtype)[: len(node.output)]


@converter("InstanceNormalization")
def instance_norm(ctx: Context, node) -> list[Value]:
    x0, scale, bias = ctx.inputs()[:3]
    x, scale, bias = _in_float32(ctx, x0, scale, bias)
    if x.rank < 3:
        raise ctx.error(f"the input has rank {x.rank}; InstanceNormalization needs [N, C, spatial..]")
    eps = float(ctx.attr("epsilon", 1e-5))
    y = ctx.call(tile.ops.group_norm(x.shape[1], rank=x.rank, eps=eps), x, scale, bias)
    return _back(ctx, y, x0.dtype)


@converter("GroupNormalization")
def group_norm(ctx: Context, node) -> list[Value]:
    """Scale and bias per channel (opset 21), or per group (opset 18, expanded to its channels)."""
    x0, scale, bias = ctx.inputs()[:3]
    groups = int(ctx.attr("num_groups"))
    eps = float(ctx.attr("epsilon", 1e-5))
    stash = int(ctx.attr("stash_type", 1))
    x, scale, bias = _in_float32(ctx, x0, scale, bias) if stash == 1 else (x0, scale, bias)
    if x.rank < 2:
        raise ctx.error(f"the input has rank {x.rank}; GroupNormalization needs [N, C, ..]")
    channels = x.shape[1]
    if groups < 1 or channels % groups:
        raise ctx.error(f"num_groups {groups} does not divide the {channels} channels")
    per = channels // groups
    expanded = []
    for v in (scale, bias):
        if v.shape == (channels,):
            expanded.append(v)
        elif v.shape == (groups,):
            expanded.append(ctx.emit(f"$[{per}*g + j: {channels}] = =({v}[g]), j < {per}", "PerChannel"))
        else:
            raise ctx.error(f"scale and bias must have {channels} (channels) or {groups} (groups) entries, "
                            f"not {v.shape}")
    y = ctx.call(tile.ops.group_norm(groups, rank=x.rank, eps=eps), x, *expanded)
    return _back(ctx, y, x0.dtype)


@converter("LayerNormalization")
def layer_norm(ctx: Context, node) -> list[Value | None]:
    """Over the axes from ``axis`` on; ``Scale`` and ``B`` broadcast against them (Tile's
    broadcasting is ONNX's). ``Mean`` and ``InvStdDev`` keep the reduced axes as size 1."""
    x0, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    stash = int(ctx.attr("stash_type", 1))
    x, scale, bias = _in_float32(ctx, x0, scale, bias) if stash == 1 else (x0, scale, bias)
    rank = x.rank
    a = int(ctx.attr("axis", -1))
    if not -rank <= a < rank:
        raise ctx.error(f"axis {a} is out of range for rank {rank}")
    a %= rank
    eps = ctx.lit(float(ctx.attr("epsilon", 1e-5)), x.dtype)
    names = [f"D{i}" for i in range(rank)]
    body = moment_lines("X", rank, list(range(a, rank)), math.prod(x.shape[a:]), names,
                        lambda v: ctx.lit(v, x.dtype))
    body += [f"Rstd = {ctx.lit(1, x.dtype)} / sqrt(Var + {eps})", "Norm = Dev * Rstd"]
    source = function([f"X[{', '.join(names)}]"], ["Norm", "Mean", "Rstd"], body)
    norm, mean, rstd = ctx.call(source, x)
    y = ctx.let(f"{norm} * {scale}" if bias is None else f"{norm} * {scale} + {bias}", "LayerNorm")
    outs = [ctx.cast(y, x0.dtype), mean, rstd]
    wanted = [i < len(node.output) and node.output[i] != "" for i in range(3)]
    return [v if w else None for v, w in zip(outs, wanted)][: len(node.output)]


@converter("LRN")
def lrn(ctx: Context, node) -> list[Value]:
    """``x / (bias + alpha / size * sum(x^2 over the channels c - (size-1)//2 .. c + size//2))^beta``."""
    x0 = ctx.input(0)
    (x,) = _in_float32(ctx, x0)
    size = int(ctx.attr("size"))
    alpha, beta, bias = (float(ctx.attr(k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    f = x.dtype
    sq = ctx.let(f"{x} * {x}", "LrnSq")
    rest = [f"i{d}" for d in range(x.rank - 2)]
    idx = ", ".join(["n", "c", *rest])
    sizes = ", ".join(map(str, x.shape))
    lo = (size - 1) // 2
    shifted = ", ".join(["n", f"c + j - {lo}" if lo else "c + j", *rest])
    total = ctx.emit(f"$[{idx}: {sizes}] = +({sq}[{shifted}]), j < {size}", "LrnSum")
    scale = ctx.let(f"{ctx.lit(bias, f)} + {ctx.lit(alpha / size, f)} * {total}", "LrnScale")
    return [ctx.cast(ctx.let(f"{x} / pow({scale}, {ctx.lit(beta, f)})", "LRN"), x0.dtype)]


def _stat_axes(ctx: Context, rank: int, axes) -> list[int]:
    out = sorted({int(a) % rank for a in axes if -rank <= int(a) < rank})
    if len(out) != len(tuple(axes)):
        raise ctx.error(f"axes {tuple(axes)} are repeated or out of range for rank {rank}")
    return out


@converter("RMSNormalization")
def rms_norm(ctx: Context, node) -> list[Value]:
    """``X / sqrt(mean(X^2 over the axes from axis on) + epsilon) * Scale``."""
    x0, scale = ctx.input(0), ctx.input(1)
    x, scale = _in_float32(ctx, x0, scale) if int(ctx.attr("stash_type", 1)) == 1 else (x0, scale)
    red = _stat_axes(ctx, x.rank, range(int(ctx.attr("axis", -1)) % max(x.rank, 1), x.rank))
    names = [f"D{i}" for i in range(x.rank)]
    count = math.prod(x.shape[a] for a in red)
    eps = ctx.lit(float(ctx.attr("epsilon", 1e-5)), x.dtype)
    body = [squares_sum("SqSum", "X", x.rank, red, names),
            f"Rms = sqrt({scaled('SqSum', count, lambda v: ctx.lit(v, x.dtype))} + {eps})", "Y = X / Rms"]
    (y,) = ctx.call(function([f"X[{', '.join(names)}]"], ["Y"], body), x)
    return [ctx.cast(ctx.let(f"{y} * {scale}", "RMSNorm"), x0.dtype)]


@converter("MeanVarianceNormalization")
def mean_variance_norm(ctx: Context, node) -> list[Value]:
    """``(X - mean) / (sqrt(biased variance) + 1e-9)`` over ``axes`` (default N, H, W), as ONNX's
    function body computes it."""
    x0 = ctx.input(0)
    (x,) = _in_float32(ctx, x0)
    red = _stat_axes(ctx, x.rank, ctx.attr("axes", (0, 2, 3)))
    names = [f"D{i}" for i in range(x.rank)]
    count = math.prod(x.shape[a] for a in red)
    body = moment_lines("X", x.rank, red, count, names, lambda v: ctx.lit(v, x.dtype))
    body.append(f"Y = Dev / (sqrt(Var) + {ctx.lit(1e-9, x.dtype)})")
    (y,) = ctx.call(function([f"X[{', '.join(names)}]"], ["Y"], body), x)
    return [ctx.cast(y, x0.dtype)]


@converter("LpNormalization")
def lp_norm(ctx: Context, node) -> list[Value]:
    """``X / ||X||_p`` along ``axis`` (p 1 or 2), 0 where the norm is 0 (ONNX's reference)."""
    x = ctx.input(0)
    p = int(ctx.attr("p", 2))
    if p not in (1, 2):
        raise ctx.unsupported(f"p = {p} (ONNX defines 1 and 2)")
    a = int(ctx.attr("axis", -1))
    red = _stat_axes(ctx, x.rank, (a,))
    names = [f"D{i}" for i in range(x.rank)]
    zero = ctx.lit(0, x.dtype)
    body = ["Mag = abs(X)" if p == 1 else "Mag = X * X",
            contraction("Total", "+", "Mag", x.rank, red, True, names),
            "Norm = Total" if p == 1 else "Norm = sqrt(Total)", f"Y = Norm == {zero} ? {zero} : X / Norm"]
    (y,) = ctx.call(function([f"X[{', '.join(names)}]"], ["Y"], body), x)
    return [ctx.cast(y, x.dtype)]


@converter("ConvInteger")
def conv_integer(ctx: Context, node) -> list[Value]:
    """``Conv`` of ``x - x_zero_point`` and ``w - w_zero_point`` (per output channel or one), in
    int32. Padding adds zeros after the zero point is taken off, as ONNX's reference pads."""
    x, w, xz, wz = (ctx.input(i) for i in range(4))
    nd, kernel, strides, dilations = _conv_shapes(ctx, x, w)
    pads = _pads(ctx, x.shape[2:], kernel, strides, dilations)
    x = ctx.cast(x, DType.INT32)
    w = ctx.cast(w, DType.INT32)
    if xz is not None:
        x = ctx.let(f"{x} - {ctx.cast(xz, DType.INT32)}", "XShifted")
    if wz is not None:
        wz = ctx.cast(wz, DType.INT32)
        per = wz if wz.rank == 0 else ctx.let(f"reshape({wz}, {wz.size}{', 1' * (w.rank - 1)})", "WZero")
        w = ctx.let(f"{w} - {per}", "WShifted")
    groups = int(ctx.attr("group", 1))
    return ctx.call(tile.ops.conv(nd, stride=strides, padding=pads, dilation=dilations, groups=groups), x, w)


@converter("CausalConvWithState")
def causal_conv_with_state(ctx: Context, node) -> list[Value | None]:
    """A depthwise 1-D convolution over ``past_state`` (zeros if absent) followed by the input,
    with an optional SiLU; ``present_state`` is the last ``K - 1`` positions of that sequence.
    Each sum is over valid index tuples only, so the two sources are two contractions."""
    x, w, b, past = (ctx.input(i) for i in range(4))
    if x.rank != 3 or w.rank != 3 or w.shape[1] != 1:
        raise ctx.error(f"input {x.shape} must be [N, C, L] and weight {w.shape} [C, 1, K]")
    act = ctx.attr("activation", "none")
    if act not in ("none", "silu", "swish"):
        raise ctx.error(f"activation '{act}' is not none, silu or swish")
    (n, c, length), k = x.shape, w.shape[2]
    head = f"[n, c, o: {n}, {c}, {length}]"
    terms = [ctx.emit(f"${head} = +({x}[n, c, o + j - {k - 1}] * {w}[c, 0, j]), j < {k}", "CausalIn")]
    if past is not None and k > 1:
        terms.append(ctx.emit(f"${head} = +({past}[n, c, o + j] * {w}[c, 0, j]), j < {k}", "CausalPast"))
    if b is not None:
        terms.append(ctx.let(f"reshape({b}, {c}, 1)", "CausalBias"))
    y = ctx.let(" + ".join(str(t) for t in terms), "CausalConv")
    if act != "none":  # in float32, rounded once, as ONNX's reference
        y = ctx.cast(ctx.cast(y, x.dtype), DType.FLOAT32) if x.dtype.is_narrow_float else y
        y = ctx.cast(ctx.let(f"{y} * sigmoid({y})", "CausalSilu"), x.dtype)
    outputs: list[Value | None] = [ctx.cast(y, x.dtype)]
    if len(node.output) > 1 and node.output[1]:
        state = f"[n, c, j: {n}, {c}, {k - 1}]"
        parts = [ctx.emit(f"${state} = +({x}[n, c, j + {length - (k - 1)}])", "StateIn")]
        if past is not None and length < k - 1:  # (an empty index space is an error)
            parts.append(ctx.emit(f"${state} = +({past}[n, c, j + {length}])", "StatePast"))
        outputs.append(ctx.let(" + ".join(str(t) for t in parts), "PresentState"))
    return outputs


def _round_even(ctx: Context, v: Value) -> Value:
    """``v`` (float32) rounded to the nearest integer, ties to even (ONNX's saturating casts)."""
    half = ctx.lit(0.5, v.dtype)
    return ctx.let(f"{v} - floor({v}) == {half} ? {ctx.lit(2, v.dtype)} * round({v} * {half}) : round({v})",
                   "RoundEven")


@converter("QLinearConv")
def qlinear_conv(ctx: Context, node) -> list[Value]:
    """``ConvInteger``'s int32 sum (plus the int32 bias) times ``x_scale * w_scale / y_scale``,
    rounded half to even, plus ``y_zero_point``, saturated to the output type."""
    x, xs, xz, w, ws, wz, ys, yz, b = (ctx.input(i) for i in range(9))
    nd, kernel, strides, dilations = _conv_shapes(ctx, x, w)
    pads = _pads(ctx, x.shape[2:], kernel, strides, dilations)
    xi = ctx.let(f"{ctx.cast(x, DType.INT32)} - {ctx.cast(xz, DType.INT32)}", "QX")
    per = ctx.cast(wz, DType.INT32)
    if wz.rank:
        per = ctx.let(f"reshape({per}, {wz.size}{', 1' * (w.rank - 1)})", "QWZero")
    wi = ctx.let(f"{ctx.cast(w, DType.INT32)} - {per}", "QW")
    groups = int(ctx.attr("group", 1))
    (acc,) = ctx.call(tile.ops.conv(nd, stride=strides, padding=pads, dilation=dilations, groups=groups),
                      xi, wi)
    if b is not None:
        acc = ctx.let(f"{acc} + reshape({b}, {b.size}{', 1' * nd})", "QBias")
    scale = ctx.cast(ws, DType.FLOAT32)
    if ws.rank:
        scale = ctx.let(f"reshape({scale}, {ws.size}{', 1' * nd})", "QScale")
    real = ctx.let(f"{ctx.cast(acc, DType.FLOAT32)} * ({ctx.cast(xs, DType.FLOAT32)} * {scale} "
                   f"/ {ctx.cast(ys, DType.FLOAT32)})", "QReal")
    q = ctx.let(f"{_round_even(ctx, real)} + {ctx.cast(yz, DType.FLOAT32)}", "QShifted")
    info = np.iinfo(yz.dtype.numpy)
    lo, hi = ctx.lit(float(info.min), DType.FLOAT32), ctx.lit(float(info.max), DType.FLOAT32)
    return [ctx.cast(ctx.let(f"min(max({q}, {lo}), {hi})", "QSaturated"), yz.dtype)]
