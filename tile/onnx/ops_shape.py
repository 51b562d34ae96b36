"""Shape and data-movement converters: Constant, Shape, Reshape, Flatten, (Un)Squeeze, Transpose,
Concat, Split, Slice, Expand, Tile, Pad, DepthToSpace/SpaceToDepth, Trilu, EyeLike, Range, ...

Every size is static, so these write contractions with literal sizes (or ``tile.ops`` sources
whose dims are bound to them). Arguments that decide a shape (Reshape's ``shape``, Slice's
``starts``) must be constants: ``ctx.const`` refuses them otherwise (the backend fixes them).
"""

from __future__ import annotations

import math

import numpy as np

import tile.ops
from tile.onnx.context import Context, Value
from tile.onnx.registry import converter
from tile.onnx.views import record_offset, record_permute, record_reshape


def idx(rank: int, name: str = "i") -> list[str]:
    return [f"{name}{a}" for a in range(rank)]


def sizes(shape) -> str:
    return ", ".join(str(int(d)) for d in shape)


def target(name: str, index: list[str], shape) -> str:
    """``Name[i, j: 2, 3]`` (``Name[]`` for rank 0)."""
    return f"{name}[{', '.join(index)}: {sizes(shape)}]" if index else f"{name}[]"


def axis_of(ctx: Context, a: int, rank: int) -> int:
    if not -rank <= a < max(rank, 1):
        raise ctx.error(f"axis {a} is out of range for rank {rank}")
    return a % max(rank, 1)


def axes_arg(ctx: Context, rank: int, attr: str = "axes", input_index: int = 1) -> list[int] | None:
    """The ``axes`` of a node, from its attribute (older opsets) or its input; None if absent."""
    value = ctx.attr(attr, None)
    if value is None and ctx.has(input_index):
        value = [int(a) for a in np.asarray(ctx.const(input_index)).ravel()]
    if value is None:
        return None
    return sorted(axis_of(ctx, int(a), rank) for a in value)


def reshape(ctx: Context, x: Value, shape) -> Value:
    shape = tuple(int(d) for d in shape)
    if shape == x.shape:
        return ctx.let(f"ident({x})")
    out = ctx.let(f"reshape({x}{''.join(f', {d}' for d in shape)})", "Reshape")
    record_reshape(ctx, out, x)
    return out


def permute(ctx: Context, x: Value, perm, hint: str = "Transpose") -> Value:
    """Axis ``perm[k]`` of x becomes axis k."""
    i = idx(x.rank)
    if list(perm) == list(range(x.rank)):
        return ctx.let(f"ident({x})")
    out = [i[p] for p in perm]
    y = ctx.emit(f"{target('$', out, [x.shape[p] for p in perm])} = =({x}[{', '.join(i)}])", hint)
    record_permute(ctx, y, x, list(perm))
    return y


def take(ctx: Context, x: Value, axis: int, positions) -> Value:
    """``np.take(x, positions, axis)`` for constant in-range ``positions`` (1-D)."""
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size and (positions == np.arange(positions[0], positions[0] + positions.size)).all():
        i = idx(x.rank)
        src = list(i)
        src[axis] = f"{i[axis]} + {int(positions[0])}"
        shape = list(x.shape)
        shape[axis] = positions.size
        out = ctx.emit(f"{target('$', i, shape)} = =({x}[{', '.join(src)}])", "Take")
        record_offset(ctx, out, x, axis, int(positions[0]))
        return out
    p = ctx.constant(positions.astype(np.int32))
    return gather_axis(ctx, x, p, axis)


def gather_axis(ctx: Context, x: Value, ind: Value, axis: int) -> Value:
    """``np.take(x, ind, axis)`` for in-range indices: the axis moves to the front for the
    ``gather`` builtin, and the result's axes move back."""
    front = x if axis == 0 else permute(ctx, x, [axis, *range(axis), *range(axis + 1, x.rank)])
    g = ctx.let(f"gather({front}, {ind})", "Gather")
    if axis == 0:
        return g
    r = ind.rank
    # g: ind dims, then x's dims before axis, then after
    perm = [*range(r, r + axis), *range(r), *range(r + axis, g.rank)]
    return permute(ctx, g, perm)


def along_axis(ctx: Context, x: Value, axis: int, m: Value) -> Value:
    """``m`` (out x in) applied along ``axis`` of x: ``y[.., o, ..] = sum_k m[o, k] x[.., k, ..]``."""
    i = idx(x.rank)
    src = list(i)
    src[axis] = "k"
    shape = list(x.shape)
    shape[axis] = m.shape[0]
    return ctx.emit(f"{target('$', i, shape)} = +({x}[{', '.join(src)}] * {m}[{i[axis]}, k])", "Along")


def wrap_negative(ctx: Context, ind: Value, size: int) -> Value:
    """ONNX indices may count from the end."""
    if not ind.dtype.is_signed:
        return ind
    zero, n = ctx.lit(0, ind.dtype), ctx.lit(size, ind.dtype)
    return ctx.let(f"{ind} < {zero} ? {ind} + {n} : {ind}", "Index")


@converter("Constant")
def constant(ctx: Context, node) -> list[Value]:
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        v = ctx.attr(key, None)
        if v is not None:
            array = np.asarray(v)
            if key.startswith("value_float"):
                array = array.astype(np.float32)
            elif key.startswith("value_int"):
                array = array.astype(np.int64)
            return [ctx.folded(array)]
    raise ctx.unsupported("only tensor, float(s) and int(s) constants are supported")


@converter("Shape")
def shape(ctx: Context, node) -> list[Value]:
    dims = list(ctx.raw(0).shape)
    start, end = ctx.attr("start", 0), ctx.attr("end", None)
    return [ctx.folded(np.array(dims[slice(start, end)], dtype=np.int64))]


@converter("Size")
def size(ctx: Context, node) -> list[Value]:
    return [ctx.folded(np.array(ctx.raw(0).size, dtype=np.int64))]


@converter("ConstantOfShape")
def constant_of_shape(ctx: Context, node) -> list[Value]:
    dims = [int(d) for d in ctx.const(0)]
    value = ctx.attr("value", np.zeros(1, np.float32))
    return [ctx.folded(np.full(dims, value.ravel()[0], dtype=value.dtype))]


@converter("EyeLike")
def eye_like(ctx: Context, node) -> list[Value]:
    x = ctx.raw(0)
    from tile.onnx.importer import onnx_dtype

    dtype = onnx_dtype(ctx.attr("dtype"), "dtype") if ctx.attr("dtype", None) else x.dtype
    return [ctx.folded(np.eye(*x.shape, k=ctx.attr("k", 0)), dtype)]


@converter("Range")
def range_(ctx: Context, node) -> list[Value]:
    start, limit, delta = (np.asarray(ctx.const(k)) for k in range(3))
    values = np.arange(start.ravel()[0], limit.ravel()[0], delta.ravel()[0])
    return [ctx.folded(values.astype(start.dtype))]


@converter("Reshape")
def reshape_node(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    want = [int(d) for d in (ctx.const(1) if ctx.opset >= 5 else ctx.attr("shape"))]
    allowzero = ctx.attr("allowzero", 0)
    out = [x.shape[k] if d == 0 and not allowzero else d for k, d in enumerate(want)]
    if out.count(-1) > 1:
        raise ctx.error(f"shape {want} has more than one -1")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        out[out.index(-1)] = x.size // known if known else 0
    if math.prod(out) != x.size:
        raise ctx.error(f"cannot reshape {x.shape} to {want}")
    return [reshape(ctx, x, out)]


@converter("Flatten")
def flatten(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    a = ctx.attr("axis", 1)
    a = a + x.rank if a < 0 else a
    return [reshape(ctx, x, (math.prod(x.shape[:a]), math.prod(x.shape[a:])))]


@converter("Squeeze")
def squeeze(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    axes = axes_arg(ctx, x.rank)
    if axes is None:
        axes = [a for a, d in enumerate(x.shape) if d == 1]
    if any(x.shape[a] != 1 for a in axes):
        raise ctx.error(f"squeezes an axis of size other than 1 in shape {x.shape}")
    return [reshape(ctx, x, [d for a, d in enumerate(x.shape) if a not in axes])]


@converter("Unsqueeze")
def unsqueeze(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    given = ctx.attr("axes", None) or (np.asarray(ctx.const(1)).ravel() if ctx.has(1) else [])
    n = x.rank + len(given)
    axes = axes_arg(ctx, n)
    dims = list(x.shape)
    for a in axes:
        dims.insert(a, 1)
    return [reshape(ctx, x, dims)]


@converter("Transpose")
def transpose(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    perm = ctx.attr("perm", tuple(reversed(range(x.rank))))
    return [permute(ctx, x, [axis_of(ctx, p, x.rank) for p in perm])]


@converter("Concat")
def concat(ctx: Context, node) -> list[Value]:
    xs = ctx.inputs()
    a = axis_of(ctx, ctx.attr("axis"), xs[0].rank)
    parts = [x for x in xs if x.shape[a] != 0] or xs[:1]
    if len(parts) == 1:
        return [ctx.let(f"ident({parts[0]})")]
    dtype = parts[0].dtype
    parts = [ctx.cast(p, dtype) for p in parts]
    return ctx.call(tile.ops.concat(len(parts), rank=parts[0].rank, axis=a), *parts)


@converter("Split")
def split(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    a = axis_of(ctx, ctx.attr("axis", 0), x.rank)
    pieces = ctx.attr("split", None)
    if pieces is None and ctx.has(1):
        pieces = [int(s) for s in ctx.const(1)]
    n = len([o for o in node.output])
    if pieces is None:
        count = ctx.attr("num_outputs", n)
        each = -(-x.shape[a] // count)
        pieces = [min(each, x.shape[a] - k * each) for k in range(count)]
    outs, start = [], 0
    for p in pieces:
        outs.append(take(ctx, x, a, np.arange(start, start + p)) if p else _empty(ctx, x, a))
        start += p
    return outs


def _empty(ctx: Context, x: Value, a: int) -> Value:
    shape = list(x.shape)
    shape[a] = 0
    return ctx.folded(np.zeros(shape, x.dtype.numpy), x.dtype)


@converter("Slice")
def slice_(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    if ctx.opset < 10:
        starts, ends = ctx.attr("starts"), ctx.attr("ends")
        axes, steps = ctx.attr("axes", None), None
    else:
        starts, ends = ctx.const(1), ctx.const(2)
        axes, steps = ctx.const(3), ctx.const(4)
    axes = list(range(len(starts))) if axes is None else [axis_of(ctx, int(a), x.rank) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    key = [slice(None)] * x.rank
    for a, s, e, st in zip(axes, starts, ends, steps):
        if st == 0:
            raise ctx.error("a slice step of 0")
        key[a] = slice(int(s), int(e), st)
    i = idx(x.rank)
    src, shape = [], []
    for a, k in enumerate(key):
        start, stop, step = k.indices(x.shape[a])
        shape.append(len(range(start, stop, step)))
        src.append(f"{start} + {step}*{i[a]}" if step != 1 else f"{i[a]} + {start}")
    if 0 in shape:
        return [ctx.folded(np.zeros(shape, x.dtype.numpy), x.dtype)]
    return [ctx.emit(f"{target('$', i, shape)} = =({x}[{', '.join(src)}])", "Slice")]


def broadcast_to(ctx: Context, x: Value, shape) -> Value:
    """x broadcast (numpy's rule) to ``shape``, which must contain it."""
    shape = tuple(shape)
    if shape == x.shape:
        return ctx.let(f"ident({x})")
    i = idx(len(shape))
    lead = len(shape) - x.rank
    src = [("0" if d == 1 and shape[lead + k] != 1 else i[lead + k]) for k, d in enumerate(x.shape)]
    return ctx.emit(f"{target('$', i, shape)} = =({x}[{', '.join(src)}])", "Expand")


@converter("Expand")
def expand(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    want = [int(d) for d in ctx.const(1)]
    try:
        shape = np.broadcast_shapes(x.shape, tuple(want))
    except ValueError:
        raise ctx.error(f"shape {x.shape} does not broadcast to {want}") from None
    return [broadcast_to(ctx, x, shape)]


@converter("Tile")
def tile_(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    reps = [int(r) for r in ctx.const(1)]
    i, k = idx(x.rank), idx(x.rank, "k")
    out = [f"{x.shape[a]}*{k[a]} + {i[a]}" for a in range(x.rank)]
    shape = [d * r for d, r in zip(x.shape, reps)]
    if 0 in shape:
        return [ctx.folded(np.zeros(shape, x.dtype.numpy), x.dtype)]
    cons = "".join(f", {k[a]} < {reps[a]}" for a in range(x.rank))
    return [ctx.emit(f"{target('$', out, shape)} = =({x}[{', '.join(i)}]){cons}", "Tile")]


@converter("Pad")
def pad(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    if ctx.opset < 11:
        pads = list(ctx.attr("pads"))
        axes = list(range(x.rank))
    else:
        pads = [int(p) for p in ctx.const(1)]
        axes = list(range(x.rank))
        if ctx.has(3):
            axes = [axis_of(ctx, int(a), x.rank) for a in ctx.const(3)]
    n = len(axes)
    before, after = [0] * x.rank, [0] * x.rank
    for j, a in enumerate(axes):
        before[a], after[a] = pads[j], pads[n + j]
    mode = ctx.attr("mode", "constant")
    if not any(before) and not any(after):
        return [ctx.let(f"ident({x})")]
    if mode == "constant":
        torch_pads = [p for a in reversed(range(x.rank)) for p in (before[a], after[a])]
        y = ctx.call(tile.ops.pad(rank=x.rank, pad=torch_pads, value=0.0), x)[0]
        fill = ctx.lit(ctx.attr("value", 0.0), x.dtype) if ctx.opset < 11 else None
        if ctx.opset >= 11 and ctx.has(2):
            v = ctx.input(2)
            fill = reshape(ctx, v, ()).name if v.rank else v.name
        if fill is not None:
            inside = [f"(index({y}, {a}) >= {before[a]}) & (index({y}, {a}) < {x.shape[a] + before[a]})"
                      for a in range(x.rank) if before[a] > 0 or after[a] > 0]
            if inside:
                y = ctx.let(f"{' & '.join(inside)} ? {y} : {fill}", "Pad")
        return [ctx.cast(y, x.dtype)]
    if mode not in ("edge", "reflect", "wrap"):
        raise ctx.unsupported(f"mode '{mode}'")
    y = x
    for a in range(x.rank):
        if before[a] or after[a]:
            d = x.shape[a]
            pos = np.arange(-before[a], d + after[a])
            if mode == "edge":
                pos = np.clip(pos, 0, d - 1)
            elif mode == "wrap":
                pos = pos % d
            else:
                period = 2 * (d - 1) if d > 1 else 1
                pos = np.abs(pos) % period
                pos = np.where(pos >= d, period - pos, pos)
            y = take(ctx, y, a, pos)
    return [y]


@converter("DepthToSpace")
def depth_to_space(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    n, c, h, w = x.shape
    b = ctx.attr("blocksize")
    if ctx.attr("mode", "DCR") == "DCR":
        t = reshape(ctx, x, (n, b, b, c // (b * b), h, w))
        t = permute(ctx, t, [0, 3, 4, 1, 5, 2])
    else:
        t = reshape(ctx, x, (n, c // (b * b), b, b, h, w))
        t = permute(ctx, t, [0, 1, 4, 2, 5, 3])
    return [reshape(ctx, t, (n, c // (b * b), h * b, w * b))]


@converter("SpaceToDepth")
def space_to_depth(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    n, c, h, w = x.shape
    b = ctx.attr("blocksize")
    t = reshape(ctx, x, (n, c, h // b, b, w // b, b))
    order = [0, 3, 5, 1, 2, 4] if ctx.attr("mode", "DCR") == "DCR" else [0, 1, 3, 5, 2, 4]
    t = permute(ctx, t, order)
    return [reshape(ctx, t, (n, c * b * b, h // b, w // b))]


@converter("Trilu")
def trilu(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    k = int(np.asarray(ctx.const(1, 0)).ravel()[0]) if ctx.has(1) else 0
    r = x.rank
    diff = f"index({x}, {r - 1}) - index({x}, {r - 2})"
    keep = f"{diff} >= {k}" if ctx.attr("upper", 1) else f"{diff} <= {k}"
    return [ctx.let(f"{keep} ? {x} : {ctx.lit(0, x.dtype)}", "Trilu")]


@converter("Gather")
def gather(ctx: Context, node) -> list[Value]:
    x, ind = ctx.input(0), ctx.input(1)
    a = axis_of(ctx, ctx.attr("axis", 0), x.rank)
    return [gather_axis(ctx, x, wrap_negative(ctx, ind, x.shape[a]), a)]


@converter("GatherElements")
def gather_elements(ctx: Context, node) -> list[Value]:
    x, ind = ctx.input(0), ctx.input(1)
    a = axis_of(ctx, ctx.attr("axis", 0), x.rank)
    ind = wrap_negative(ctx, ind, x.shape[a])
    return ctx.call(tile.ops.gather(rank=x.rank, axis=a), x, ind)


@converter("OneHot")
def one_hot(ctx: Context, node) -> list[Value]:
    ind, values = ctx.input(0), ctx.input(2)
    depth = int(np.asarray(ctx.const(1)).ravel()[0])
    a = axis_of(ctx, ctx.attr("axis", -1), ind.rank + 1)
    ind = wrap_negative(ctx, ind, depth)
    shape = list(ind.shape)
    shape.insert(a, 1)
    col = reshape(ctx, ind, shape)
    where = [1] * (ind.rank + 1)
    where[a] = depth
    positions = ctx.constant(np.arange(depth).reshape(where).astype(ind.dtype.numpy), ind.dtype)
    off = take(ctx, values, 0, [0])
    on = take(ctx, values, 0, [1])
    off, on = reshape(ctx, off, ()), reshape(ctx, on, ())
    return [ctx.let(f"{col} == {positions} ? {on} : {off}", "OneHot")]


@converter("OptionalHasElement")
def optional_has_element(ctx: Context, node) -> list[Value]:
    """A tensor (a given optional) has its element; an absent input has none."""
    return [ctx.folded(np.array(ctx.has(0)))]


@converter("OptionalGetElement")
def optional_get_element(ctx: Context, node) -> list[Value]:
    if not ctx.has(0):
        raise ctx.error("the optional input is empty")
    return [ctx.let(f"ident({ctx.input(0)})")]


@converter("Dropout")
def dropout(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    training = ctx.attr("is_test", 1) == 0 if ctx.opset < 7 else False
    if ctx.has(2):
        training = bool(np.asarray(ctx.const(2)).ravel()[0])
    ratio = float(np.asarray(ctx.const(1)).ravel()[0]) if ctx.has(1) else ctx.attr("ratio", 0.5)
    if training and ratio != 0:
        raise ctx.unsupported("Dropout in training mode (random) is not supported")
    mask = ctx.folded(np.ones(x.shape, dtype=bool))
    return [ctx.let(f"ident({x})"), mask]


@converter("Compress")
def compress(ctx: Context, node) -> list[Value]:
    """The condition decides the output's size, so it must be a constant (the backend fixes it to
    the value it is given); the data is gathered at its true positions."""
    x = ctx.input(0)
    keep = np.flatnonzero(np.asarray(ctx.const(1)).astype(bool))
    a = ctx.attr("axis", None)
    if a is None:
        x, a = reshape(ctx, x, (x.size,)), 0
    a = axis_of(ctx, a, x.rank)
    keep = keep[keep < x.shape[a]]
    if not keep.size:
        shape = list(x.shape)
        shape[a] = 0
        return [ctx.folded(np.zeros(shape, x.dtype.numpy), x.dtype)]
    return [take(ctx, x, a, keep)]


@converter("NonZero", "Unique", "NonMaxSuppression")
def value_dependent(ctx: Context, node) -> list[Value]:
    v = ctx.raw(0)
    if v.const is None:
        raise ctx.unsupported("its output shape depends on the input's values, which a Tile program "
                              "cannot have (only an initializer or Constant input would do)")
    raise ctx.unsupported("not converted")

