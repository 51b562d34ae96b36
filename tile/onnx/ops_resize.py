"""Resize (and the deprecated Upsample): separable interpolation as one matrix product per axis.

With static sizes and scales, every mode is linear in the input along each axis: the output
coordinate maps back to an input coordinate (``coordinate_transformation_mode``) and a few input
elements are weighted (``nearest``: one tap, ``linear``: two, ``cubic``: four, more where
``antialias`` widens the filter). Those weights form a constant (out x in) matrix ``W`` built
here from the ONNX definitions, and the program contracts each resized axis with it. Out-of-range
taps read the edge (or are dropped and the rest renormalized, ``exclude_outside``);
``tf_crop_and_resize`` points outside the input take ``extrapolation_value``.
"""

from __future__ import annotations

import math

import numpy as np

from tile.dtypes import DType
from tile.onnx.context import Context, Value
from tile.onnx.ops_shape import along_axis
from tile.onnx.registry import converter


def source_coordinate(o: int, mode: str, n_in: int, n_out: int, scale: float, roi=(0.0, 1.0)) -> float:
    """The input coordinate of output coordinate ``o`` (the ONNX Resize formulas)."""
    if mode == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = n_out / (scale * n_in)
        center = n_in / 2
        return center * (1 - adjustment) + (o + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if n_out > 1 else 0.0
    if mode == "align_corners":  # the unrounded output length, as ONNX's reference takes it
        return 0.0 if n_out == 1 else o * (n_in - 1) / (n_in * scale - 1)
    if mode == "asymmetric":
        return o / scale
    if mode == "tf_crop_and_resize":
        start, end = roi
        if n_out > 1:
            return start * (n_in - 1) + o * (end - start) * (n_in - 1) / (n_out - 1)
        return 0.5 * (start + end) * (n_in - 1)
    raise ValueError(f"coordinate_transformation_mode '{mode}'")


def _cubic(t: float, a: float) -> float:
    t = abs(t)
    if t <= 1:
        return (a + 2) * t**3 - (a + 3) * t**2 + 1
    if t < 2:
        return a * t**3 - 5 * a * t**2 + 8 * a * t - 4 * a
    return 0.0


def _nearest(x: float, mode: str) -> int:
    frac = x - math.floor(x)
    if mode == "floor":
        return math.floor(x)
    if mode == "ceil":
        return math.ceil(x)
    if frac == 0.5:
        return math.floor(x) if mode == "round_prefer_floor" else math.ceil(x)
    return math.floor(x + 0.5)


def weights(n_in: int, n_out: int, scale: float, attrs: dict, roi=(0.0, 1.0)
            ) -> tuple[np.ndarray, np.ndarray]:
    """The (n_out x n_in) interpolation matrix of one axis, and which outputs are extrapolated."""
    mode = attrs["mode"]
    w = np.zeros((n_out, n_in))
    outside = np.zeros(n_out, dtype=bool)
    s = min(scale, 1.0) if attrs["antialias"] and mode != "nearest" else 1.0
    for o in range(n_out):
        x = source_coordinate(o, attrs["ctm"], n_in, n_out, scale, roi)
        if attrs["ctm"] == "tf_crop_and_resize" and not 0 <= x <= n_in - 1:
            outside[o] = True
            continue
        if mode == "nearest":
            w[o, min(max(_nearest(x, attrs["nearest_mode"]), 0), n_in - 1)] = 1.0
            continue
        x0 = math.floor(x)
        r = x - x0
        if mode == "linear":
            start = math.floor(-1 / s) + 1
            taps = range(start, 2 - start)
            coef = [max(0.0, 1 - abs((j - r) * s)) for j in taps]
        else:
            start = math.floor(-2 / s) + 1
            taps = range(start, 2 - start)
            coef = [_cubic((j - r) * s, attrs["cubic_coeff_a"]) for j in taps]
        pos = [x0 + j for j in taps]
        if attrs["exclude_outside"]:
            coef = [c if 0 <= p < n_in else 0.0 for c, p in zip(coef, pos)]
        if attrs["antialias"] or attrs["exclude_outside"]:
            total = sum(coef)
            coef = [c / total for c in coef] if total else coef
        for c, p in zip(coef, pos):
            w[o, min(max(p, 0), n_in - 1)] += c
    return w, outside


@converter("Resize", "Upsample")
def resize(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    new_style = node.op_type == "Resize" and ctx.opset >= 11
    attrs = {
        "mode": ctx.attr("mode", "nearest"),
        "ctm": ctx.attr("coordinate_transformation_mode", "half_pixel") if new_style else "asymmetric",
        "nearest_mode": ctx.attr("nearest_mode", "round_prefer_floor") if new_style else "floor",
        "cubic_coeff_a": ctx.attr("cubic_coeff_a", -0.75),
        "exclude_outside": ctx.attr("exclude_outside", 0),
        "antialias": ctx.attr("antialias", 0),
    }
    if attrs["mode"] not in ("nearest", "linear", "cubic"):
        if attrs["mode"] == "bilinear":
            attrs["mode"] = "linear"
        else:
            raise ctx.unsupported(f"mode '{attrs['mode']}'")
    axes = list(ctx.attr("axes", range(x.rank)))
    axes = [a % x.rank for a in axes]
    roi = scales = out_sizes = None
    if not new_style:
        scales = list(ctx.attr("scales", None) or ctx.const(1))
    else:
        roi = ctx.const(1) if ctx.has(1) else None
        if ctx.has(2) and np.size(ctx.const(2)):
            scales = [float(v) for v in ctx.const(2)]
        if ctx.has(3) and np.size(ctx.const(3)):
            out_sizes = [int(v) for v in ctx.const(3)]
    in_sizes = [x.shape[a] for a in axes]
    if out_sizes is not None:
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        ratios = [o / i for o, i in zip(out_sizes, in_sizes)]
        if policy != "stretch":
            r = min(ratios) if policy == "not_larger" else max(ratios)
            ratios = [r] * len(axes)
            out_sizes = [math.floor(r * i + 0.5) for i in in_sizes]
        scales = ratios
    elif scales is not None:
        if len(scales) == x.rank and len(axes) != x.rank:
            scales = [scales[a] for a in axes]
        out_sizes = [math.floor(i * s) for i, s in zip(in_sizes, scales)]
    else:
        raise ctx.error("neither scales nor sizes is given")
    compute = x.dtype if x.dtype in (DType.FLOAT32, DType.FLOAT64) else DType.FLOAT32
    y = ctx.cast(x, compute)
    extrapolated = None
    for k, a in enumerate(axes):
        n_in, n_out = in_sizes[k], out_sizes[k]
        bounds = (0.0, 1.0)
        if roi is not None and np.size(roi):
            r = np.asarray(roi, dtype=np.float64).ravel()
            m = len(r) // 2
            j = k if m == len(axes) else a
            bounds = (float(r[j]), float(r[m + j]))
        w, outside = weights(n_in, n_out, float(scales[k]), attrs, bounds)
        if n_in == n_out and np.array_equal(w, np.eye(n_in)) and not outside.any():
            continue
        y = along_axis(ctx, y, a, ctx.constant(w.astype(compute.numpy), compute))
        if outside.any():
            where = [1] * x.rank
            where[a] = n_out
            mask = outside.reshape(where)
            extrapolated = mask if extrapolated is None else (extrapolated | mask)
    if extrapolated is not None:
        mask = ctx.constant(extrapolated)
        fill = ctx.lit(ctx.attr("extrapolation_value", 0.0), compute)
        y = ctx.let(f"{mask} ? {fill} : {y}", "Extrapolated")
    if not x.dtype.is_float and attrs["mode"] != "nearest":
        y = ctx.let(f"round({y})", "Rounded")
    if y is x:
        y = ctx.let(f"ident({x})")
    return [ctx.cast(y, x.dtype)]
