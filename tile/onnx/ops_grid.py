"""GridSample: sampling at data-dependent positions, as ``gather`` on the flattened input.

Each output point's coordinates come from the grid (normalized to [-1, 1]); they are mapped to
input coordinates (``align_corners``), folded into range for ``border``/``reflection`` padding,
and the neighbouring taps (1 for nearest, 2 per axis for linear, 4 for cubic) are read with the
``gather`` builtin at their flat offsets; a tap outside the input reads 0. Computed in float64
and converted to the input's type at the end.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from tile.dtypes import DType
from tile.onnx.context import Context, Value
from tile.onnx.ops_shape import reshape, take
from tile.onnx.registry import converter

F64 = DType.FLOAT64


def _reflect(ctx: Context, x: Value, lo: float, hi: float) -> Value:
    """x reflected into [lo, hi] (the padding_mode 'reflection' rule)."""
    span = hi - lo
    if span <= 0:
        return ctx.let(f"{x} * {ctx.lit(0, F64)}")
    d = ctx.let(f"abs({x} - {ctx.lit(lo, F64)})", "Dist")
    flips = ctx.let(f"floor({d} / {ctx.lit(span, F64)})", "Flips")
    extra = ctx.let(f"{d} - {flips} * {ctx.lit(span, F64)}", "Extra")
    even = f"mod({flips}, {ctx.lit(2, F64)}) == {ctx.lit(0, F64)}"
    return ctx.let(f"{even} ? {ctx.lit(lo, F64)} + {extra} : {ctx.lit(hi, F64)} - {extra}", "Reflected")


def _clamp(ctx: Context, x: Value, lo: float, hi: float) -> Value:
    return ctx.let(f"min(max({x}, {ctx.lit(lo, F64)}), {ctx.lit(hi, F64)})", "Clamped")


def _cubic(ctx: Context, t: Value, a: float = -0.75) -> Value:
    """The cubic convolution kernel (A = -0.75) at distance |t| < 2."""
    u = ctx.let(f"abs({t})", "U")
    lit = lambda v: ctx.lit(v, F64)  # noqa: E731
    near = f"(({lit(a + 2)} * {u} - {lit(a + 3)}) * {u} * {u} + {lit(1)})"
    far = f"((({lit(a)} * {u} - {lit(5 * a)}) * {u} + {lit(8 * a)}) * {u} - {lit(4 * a)})"
    return ctx.let(f"{u} <= {lit(1)} ? {near} : {u} < {lit(2)} ? {far} : {lit(0)}", "Cubic")


@converter("GridSample")
def grid_sample(ctx: Context, node) -> list[Value]:
    x, grid = ctx.input(0), ctx.input(1)
    mode = ctx.attr("mode", "linear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    padding = ctx.attr("padding_mode", "zeros")
    corners = ctx.attr("align_corners", 0)
    if mode not in ("linear", "nearest", "cubic") or padding not in ("zeros", "border", "reflection"):
        raise ctx.unsupported(f"mode '{mode}' with padding_mode '{padding}'")
    n, c, *sizes = x.shape
    nd = len(sizes)
    out = grid.shape[1:-1]
    flat = reshape(ctx, ctx.cast(x, F64), (x.size,))
    g = ctx.cast(grid, F64)
    coords = []
    for j, size in enumerate(sizes):  # grid[..., 0] is the last (width) axis
        v = reshape(ctx, take(ctx, g, g.rank - 1, [nd - 1 - j]), (n, 1, *out))
        one = ctx.lit(1, F64)
        if corners:
            v = ctx.let(f"({v} + {one}) / {ctx.lit(2, F64)} * {ctx.lit(size - 1, F64)}", "Coord")
        else:
            v = ctx.let(f"(({v} + {one}) * {ctx.lit(size, F64)} - {one}) / {ctx.lit(2, F64)}", "Coord")
        if padding == "border":
            v = _clamp(ctx, v, 0, size - 1)
        elif padding == "reflection":
            v = _reflect(ctx, v, 0, size - 1) if corners else _clamp(
                ctx, _reflect(ctx, v, -0.5, size - 0.5), 0, size - 1)
        coords.append(v)
    taps = []  # per axis: [(index value, weight value or None)]
    for j, v in enumerate(coords):
        if mode == "nearest":
            half = ctx.lit(0.5, F64)
            frac = ctx.let(f"{v} - floor({v})")
            r = ctx.let(f"{frac} == {half} ? {ctx.lit(2, F64)} * round({v} * {half}) : round({v})", "Nearest")
            taps.append([(r, None)])
            continue
        base = ctx.let(f"floor({v})", "Floor")
        frac = ctx.let(f"{v} - {base}", "Frac")
        offsets = [0, 1] if mode == "linear" else [-1, 0, 1, 2]
        axis_taps = []
        for o in offsets:
            at = ctx.let(f"{base} + {ctx.lit(o, F64)}", "Tap")
            if mode == "linear":
                w = ctx.let(f"{ctx.lit(1, F64)} - {frac}" if o == 0 else f"ident({frac})", "W")
            else:
                w = _cubic(ctx, ctx.let(f"{frac} - {ctx.lit(o, F64)}", "Dist"))
                if padding == "border":
                    at = _clamp(ctx, at, 0, sizes[j] - 1)
                elif padding == "reflection":
                    at = _reflect(ctx, at, 0, sizes[j] - 1) if corners else _clamp(
                        ctx, _reflect(ctx, at, -0.5, sizes[j] - 0.5), 0, sizes[j] - 1)
            axis_taps.append((at, w))
        taps.append(axis_taps)
    strides = [math.prod(sizes[j + 1:]) for j in range(nd)]
    base = np.arange(n * c, dtype=np.float64).reshape(n, c, *([1] * nd)) * math.prod(sizes)
    base = ctx.constant(base, F64)
    acc = None
    for combo in itertools.product(*taps):
        offset = " + ".join([base.name] + [f"{at} * {ctx.lit(s, F64)}" for (at, _), s in zip(combo, strides)])
        inside = " & ".join(f"({at} >= {ctx.lit(0, F64)}) & ({at} <= {ctx.lit(sizes[j] - 1, F64)})"
                            for j, (at, _) in enumerate(combo))
        pos = ctx.let(f"as_int({offset}, 64)", "Offset")
        read = ctx.let(f"{inside} ? gather({flat}, {pos}) : {ctx.lit(0, F64)}", "Read")
        weights = [w.name for _, w in combo if w is not None]
        term = ctx.let(" * ".join([read.name, *weights]), "Term") if weights else read
        acc = term if acc is None else ctx.let(f"{acc} + {term}", "Sum")
    return [ctx.cast(acc, x.dtype)]


@converter("RoiAlign")
def roi_align(ctx: Context, node) -> list[Value]:
    """Each output bin samples a fixed ``sampling_ratio`` x ``sampling_ratio`` grid of points
    (bilinear, ONNX's edge rules) and averages them, or takes the largest weighted corner value
    (``max``, as ONNX defines it). Axes of the sample tensor: roi, channel, bin y, bin x, sample y,
    sample x."""
    x, rois, batch = ctx.input(0), ctx.input(1), ctx.input(2)
    n, c, height, width = x.shape
    r = rois.shape[0]
    oh, ow = ctx.attr("output_height", 1), ctx.attr("output_width", 1)
    g = ctx.attr("sampling_ratio", 0)
    if g <= 0:
        raise ctx.unsupported("an adaptive sampling_ratio (the sample count would depend on the rois)")
    scale = ctx.attr("spatial_scale", 1.0)
    half = ctx.attr("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    f = lambda v: ctx.lit(v, F64)  # noqa: E731
    box = ctx.cast(rois, F64)

    def corner(k: int, axis: int) -> Value:  # roi column k, placed on axis 2 (y) or 3 (x)
        shape = [r, 1, 1, 1, 1, 1]
        v = reshape(ctx, take(ctx, box, 1, [k]), shape)
        return ctx.let(f"{v} * {f(scale)} - {f(0.5 if half else 0.0)}", "Corner")

    def grid(count: int, axis: int) -> Value:
        shape = [1] * 6
        shape[axis] = count
        return ctx.constant(np.arange(count, dtype=np.float64).reshape(shape), F64)

    def points(start: Value, end: Value, bins: int, bin_axis: int, sample_axis: int) -> Value:
        size = ctx.let(f"{end} - {start}", "Size")
        if not half:
            size = ctx.let(f"max({size}, {f(1)})", "Size")
        step = ctx.let(f"{size} / {f(bins)}", "Bin")
        return ctx.let(f"{start} + {grid(bins, bin_axis)} * {step} + ({grid(g, sample_axis)} + {f(0.5)}) * "
                       f"{step} / {f(g)}", "Point")

    ys = points(corner(1, 2), corner(3, 2), oh, 2, 4)
    xs = points(corner(0, 3), corner(2, 3), ow, 3, 5)

    def axis_taps(v: Value, size: int):
        inside = ctx.let(f"({v} >= {f(-1)}) & ({v} <= {f(size)})", "Inside")
        v = ctx.let(f"max({v}, {f(0)})", "Clamped")
        low = ctx.let(f"floor({v})", "Low")
        edge = f"{low} >= {f(size - 1)}"
        low2 = ctx.let(f"{edge} ? {f(size - 1)} : {low}", "Low")
        high = ctx.let(f"{edge} ? {f(size - 1)} : {low} + {f(1)}", "High")
        at = ctx.let(f"{edge} ? {f(size - 1)} : {v}", "At")
        frac = ctx.let(f"{at} - {low2}", "Frac")
        keep = ctx.let(f"as_float({inside}, 64)", "Keep")
        return [(low2, ctx.let(f"({f(1)} - {frac}) * {keep}", "W")), (high, ctx.let(f"{frac} * {keep}", "W"))]

    base = ctx.let(f"({reshape(ctx, ctx.cast(batch, F64), (r, 1, 1, 1, 1, 1))} * {f(c)} + {grid(c, 1)}) * "
                   f"{f(height * width)}", "Base")
    flat = reshape(ctx, ctx.cast(x, F64), (x.size,))
    terms = []
    for (yi, wy), (xi, wx) in itertools.product(axis_taps(ys, height), axis_taps(xs, width)):
        pos = ctx.let(f"as_int({base} + {yi} * {f(width)} + {xi}, 64)", "Offset")
        terms.append(ctx.let(f"{wy} * {wx} * gather({flat}, {pos})", "Term"))
    if ctx.attr("mode", "avg") == "max":
        sample = terms[0]
        for t in terms[1:]:
            sample = ctx.let(f"max({sample}, {t})", "Largest")
        agg = ">"
    else:
        sample = ctx.let(" + ".join(t.name for t in terms), "Sample")
        agg = "+"
    dims = f"{r}, {c}, {oh}, {ow}"
    y = ctx.emit(f"$[q, k, i, j: {dims}] = {agg}({sample}[q, k, i, j, a, b])", "RoiAlign")
    if agg == "+":
        y = ctx.let(f"{y} / {f(g * g)}", "Average")
    return [ctx.cast(y, x.dtype)]
