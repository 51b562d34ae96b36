"""DFT as matrix products: with a static length, the transform along an axis is a product with
constant cosine and sine matrices (O(N^2), exact to the float type's rounding of the sums).

The signal's last axis holds 1 (real) or 2 (real, imaginary) values; the result's holds 2, or 1
for the inverse of a one-sided spectrum (numpy's ``irfft``, ONNX's ``inverse`` + ``onesided``).
"""

from __future__ import annotations

import numpy as np

from tile.onnx.context import Context, Value
from tile.onnx.ops_shape import along_axis, axis_of, reshape, take
from tile.onnx.registry import converter


def _part(ctx: Context, x: Value, k: int) -> Value:
    return reshape(ctx, take(ctx, x, x.rank - 1, [k]), x.shape[:-1])


@converter("DFT")
def dft(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    inverse, onesided = ctx.attr("inverse", 0), ctx.attr("onesided", 0)
    if ctx.opset >= 20:
        a = int(np.asarray(ctx.const(2)).ravel()[0]) if ctx.has(2) else -2
    else:
        a = ctx.attr("axis", 1)
    a = axis_of(ctx, a, x.rank)
    if a == x.rank - 1:
        raise ctx.error("the axis must be a signal axis, not the last (real/imaginary) one")
    length = x.shape[a]
    n = int(np.asarray(ctx.const(1)).ravel()[0]) if ctx.has(1) and ctx.raw(1) is not None else None
    if n is None:
        n = 2 * (length - 1) if inverse and onesided else length
    re = _part(ctx, x, 0)
    im = _part(ctx, x, 1) if x.shape[-1] == 2 else None
    if inverse and onesided:  # a Hermitian half spectrum: a real signal of length n
        bins = min(length, n // 2 + 1)
        k = np.arange(bins)[None, :]
        t = np.arange(n)[:, None]
        w = np.where((k == 0) | (2 * k == n), 1.0, 2.0) / n
        theta = 2 * np.pi * k * t / n
        cos = ctx.constant((w * np.cos(theta)).astype(x.dtype.numpy), x.dtype)
        sin = ctx.constant((w * np.sin(theta)).astype(x.dtype.numpy), x.dtype)
        re, im = (take(ctx, v, a, np.arange(bins)) if bins != length else v for v in (re, im))
        y = ctx.let(f"{along_axis(ctx, re, a, cos)} - {along_axis(ctx, im, a, sin)}", "Irfft")
        return [reshape(ctx, y, (*y.shape, 1))]
    used = min(length, n)  # zero padding adds nothing; truncation drops the rest
    out = n // 2 + 1 if onesided else n
    k = np.arange(out)[:, None]
    t = np.arange(used)[None, :]
    theta = 2 * np.pi * k * t / n
    sign = 1.0 if inverse else -1.0
    scale = 1.0 / n if inverse else 1.0
    cos = ctx.constant((scale * np.cos(theta)).astype(x.dtype.numpy), x.dtype)
    sin = ctx.constant((scale * sign * np.sin(theta)).astype(x.dtype.numpy), x.dtype)
    if used != length:
        re = take(ctx, re, a, np.arange(used))
        im = take(ctx, im, a, np.arange(used)) if im is not None else None
    re_c, re_s = along_axis(ctx, re, a, cos), along_axis(ctx, re, a, sin)
    if im is not None:
        im_c, im_s = along_axis(ctx, im, a, cos), along_axis(ctx, im, a, sin)
        real = ctx.let(f"{re_c} - {im_s}", "Real")
        imag = ctx.let(f"{im_c} + {re_s}", "Imag")
    else:
        real, imag = re_c, re_s
    import tile.ops

    parts = [reshape(ctx, v, (*v.shape, 1)) for v in (real, imag)]
    return ctx.call(tile.ops.concat(2, rank=parts[0].rank, axis=parts[0].rank - 1), *parts)


@converter("STFT")
def stft(ctx: Context, node) -> list[Value]:
    """Frames ``step*f + n`` of the signal times the window, transformed: one contraction per
    part with constant window-times-cosine/sine matrices."""
    import tile.ops

    x = ctx.input(0)
    step = int(np.asarray(ctx.const(1)).ravel()[0])
    window = ctx.const(2) if ctx.has(2) else None
    if ctx.has(3):
        length = int(np.asarray(ctx.const(3)).ravel()[0])
    elif window is not None:
        length = int(np.asarray(window).size)
    else:
        raise ctx.error("STFT needs a window or a frame_length")
    w = np.ones(length) if window is None else np.asarray(window, dtype=np.float64).ravel()
    batch, total = x.shape[0], x.shape[1]
    frames = (total - length) // step + 1
    bins = length // 2 + 1 if ctx.attr("onesided", 1) else length
    theta = 2 * np.pi * np.arange(bins)[:, None] * np.arange(length)[None, :] / length
    cos = ctx.constant((w * np.cos(theta)).astype(x.dtype.numpy), x.dtype)
    sin = ctx.constant((w * np.sin(theta)).astype(x.dtype.numpy), x.dtype)
    re = _part(ctx, x, 0)
    im = _part(ctx, x, 1) if x.shape[-1] == 2 else None

    def frame(v: Value, m: Value) -> Value:
        return ctx.emit(f"$[b, f, k: {batch}, {frames}, {bins}] = +({v}[b, {step}*f + n] * {m}[k, n]), "
                        f"n < {length}", "Frames")

    real, imag = frame(re, cos), ctx.let(f"-{frame(re, sin)}", "Imag")
    if im is not None:
        real = ctx.let(f"{real} + {frame(im, sin)}", "Real")
        imag = ctx.let(f"{imag} + {frame(im, cos)}", "Imag")
    parts = [reshape(ctx, ctx.cast(v, x.dtype), (*v.shape, 1)) for v in (real, imag)]
    return ctx.call(tile.ops.concat(2, rank=4, axis=3), *parts)
