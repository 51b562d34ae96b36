"""Pooling: max and average pools (1-, 2-, 3-D) with PyTorch's padding, ``ceil_mode`` and
``count_include_pad``; adaptive average pools.

Input ``X``, output ``Y``; channels-first ``X[N, C, L0, ..]`` or channels-last ``X[N, L0, .., C]``.
Padding never enters a max: padded positions are simply not valid index tuples (§6.1), which is
PyTorch's implicit -inf padding. Averages divide by a count computed from the output coordinates
(``index``), so no padded tensor is ever built.
"""

from __future__ import annotations

from collections.abc import Sequence

from tile.ops._build import decl, function, ints, layout_of, out, plus, poly, positive, ref, term

# The PyTorch function each op computes, as data for the op reference (python -m tile.ops.doc);
# tests/test_ops_doc.py checks that every name exists in torch (``{nd}``: 1, 2 and 3).
TORCH: dict[str, str] = {
    "max_pool1d": "torch.nn.functional.max_pool1d",
    "max_pool2d": "torch.nn.functional.max_pool2d",
    "max_pool3d": "torch.nn.functional.max_pool3d",
    "avg_pool1d": "torch.nn.functional.avg_pool1d",
    "avg_pool2d": "torch.nn.functional.avg_pool2d",
    "avg_pool3d": "torch.nn.functional.avg_pool3d",
    "adaptive_avg_pool1d": "torch.nn.functional.adaptive_avg_pool1d",
    "adaptive_avg_pool2d": "torch.nn.functional.adaptive_avg_pool2d",
    "adaptive_avg_pool3d": "torch.nn.functional.adaptive_avg_pool3d",
    "max_pool": "torch.nn.functional.max_pool{nd}d",
    "avg_pool": "torch.nn.functional.avg_pool{nd}d",
    "adaptive_avg_pool": "torch.nn.functional.adaptive_avg_pool{nd}d",
}


def _spatial(nd: int, last: bool, inner: Sequence[str]) -> list[str]:
    return ["n", *inner, "c"] if last else ["n", "c", *inner]


def _sizes(nd: int, last: bool, inner: Sequence[str]) -> list[str]:
    return ["N", *inner, "C"] if last else ["N", "C", *inner]


def _window(nd, kernel_size, stride, padding, dilation, ceil_mode):
    ks = ints(kernel_size, nd, "kernel_size")
    ss = ks if stride is None else ints(stride, nd, "stride")
    ps, ds = ints(padding, nd, "padding"), ints(dilation, nd, "dilation")
    positive(ks, "kernel_size")
    positive(ss, "stride")
    positive(ds, "dilation")
    if any(2 * p > k for p, k in zip(ps, ks)):
        raise ValueError(f"padding {ps} must be at most half the kernel size {ks}")
    body = []
    for d in range(nd):
        k, s, p, dl = ks[d], ss[d], ps[d], ds[d]
        span = 2 * p - dl * (k - 1) - 1
        if ceil_mode:
            # PyTorch drops a last window that would start in the padding after the input
            body.append(f"O{d} = min((L{d}{plus(span + s - 1)}) / {s} + 1, (L{d}{plus(p - 1)}) / {s} + 1)")
        else:
            body.append(f"O{d} = (L{d}{plus(span)}) / {s} + 1")
    return ks, ss, ps, ds, body


def max_pool(nd: int, kernel_size: int | Sequence[int], *, stride: int | Sequence[int] | None = None,
             padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, ceil_mode: bool = False,
             layout: str = "channels_first") -> str:
    """``torch.nn.functional.max_pool{nd}d``; ``stride`` defaults to the kernel size."""
    last = layout_of(layout, nd)
    ks, ss, ps, ds, body = _window(nd, kernel_size, stride, padding, dilation, ceil_mode)
    o, k = [f"o{d}" for d in range(nd)], [f"k{d}" for d in range(nd)]
    xs = [poly(term(ss[d], o[d]), term(ds[d], k[d]), f"-{ps[d]}" if ps[d] else "") for d in range(nd)]
    cons = "".join(f", {k[d]} < {ks[d]}" for d in range(nd))
    body.append(f"{out('Y', _spatial(nd, last, o), _sizes(nd, last, [f'O{d}' for d in range(nd)]))}"
                f" = >({ref('X', _spatial(nd, last, xs))}){cons}")
    return function([decl("X", _sizes(nd, last, [f"L{d}" for d in range(nd)]))], ["Y"], body)


def avg_pool(nd: int, kernel_size: int | Sequence[int], *, stride: int | Sequence[int] | None = None,
             padding: int | Sequence[int] = 0, ceil_mode: bool = False, count_include_pad: bool = True,
             layout: str = "channels_first") -> str:
    """``torch.nn.functional.avg_pool{nd}d``: the window sum over a count that includes the
    padding (but not a ``ceil_mode`` window's overhang past it) or, with
    ``count_include_pad=False``, only the input elements in the window."""
    last = layout_of(layout, nd)
    ks, ss, ps, _, body = _window(nd, kernel_size, stride, padding, 1, ceil_mode)
    o, k = [f"o{d}" for d in range(nd)], [f"k{d}" for d in range(nd)]
    xs = [poly(term(ss[d], o[d]), k[d], f"-{ps[d]}" if ps[d] else "") for d in range(nd)]
    cons = "".join(f", {k[d]} < {ks[d]}" for d in range(nd))
    body.append(f"{out('S', _spatial(nd, last, o), _sizes(nd, last, [f'O{d}' for d in range(nd)]))}"
                f" = +({ref('X', _spatial(nd, last, xs))}){cons}")
    counts = []
    for d in range(nd):
        a = (1 + d) if last else (2 + d)
        s, p, kk = ss[d], ps[d], ks[d]
        body.append(f"Start{d} = index(S, {a}){' * ' + str(s) if s != 1 else ''}{plus(-p)}")
        body.append(f"End{d} = min(Start{d} + {kk}, L{d}{plus(p)})")
        if count_include_pad:
            body.append(f"Count{d} = End{d} - Start{d}")
        else:
            body.append(f"Count{d} = min(End{d}, L{d}) - max(Start{d}, 0)")
        counts.append(f"Count{d}")
    body.append(f"Y = S / ({' * '.join(counts)})")
    return function([decl("X", _sizes(nd, last, [f"L{d}" for d in range(nd)]))], ["Y"], body)


def adaptive_avg_pool(nd: int, output_size: int | Sequence[int], *, layout: str = "channels_first") -> str:
    """``torch.nn.functional.adaptive_avg_pool{nd}d``: output element i of a dim of length L
    averages the inputs ``floor(i * L / S) <= h < ceil((i + 1) * L / S)`` for output size S."""
    last = layout_of(layout, nd)
    sizes = ints(output_size, nd, "output_size")
    positive(sizes, "output_size")
    o, h = [f"o{d}" for d in range(nd)], [f"h{d}" for d in range(nd)]
    cons = ""
    for d in range(nd):
        S, L = sizes[d], f"L{d}"
        bound = f"{L} * {S} + {S}"
        # S*h >= L*o - (S - 1)  and  S*h < L*(o + 1), both written as 0 <= poly < bound
        cons += f", {poly(term(S, h[d]), f'-{L}*{o[d]}', str(S - 1) if S > 1 else '')} < {bound}"
        cons += f", {poly(f'{L}*{o[d]}', L, f'-{term(S, h[d])}', '-1')} < {bound}"
    body = [f"{out('S', _spatial(nd, last, o), _sizes(nd, last, [str(s) for s in sizes]))}"
            f" = +({ref('X', _spatial(nd, last, h))}){cons}"]
    counts = []
    for d in range(nd):
        a, S = ((1 + d) if last else (2 + d)), sizes[d]
        body.append(f"I{d} = index(S, {a})")
        body.append(f"Count{d} = ((I{d} + 1) * L{d} + {S - 1}) / {S} - I{d} * L{d} / {S}")
        counts.append(f"Count{d}")
    body.append(f"Y = S / ({' * '.join(counts)})")
    return function([decl("X", _sizes(nd, last, [f"L{d}" for d in range(nd)]))], ["Y"], body)


def max_pool1d(kernel_size, **kw) -> str:
    return max_pool(1, kernel_size, **kw)


def max_pool2d(kernel_size, **kw) -> str:
    return max_pool(2, kernel_size, **kw)


def max_pool3d(kernel_size, **kw) -> str:
    return max_pool(3, kernel_size, **kw)


def avg_pool1d(kernel_size, **kw) -> str:
    return avg_pool(1, kernel_size, **kw)


def avg_pool2d(kernel_size, **kw) -> str:
    return avg_pool(2, kernel_size, **kw)


def avg_pool3d(kernel_size, **kw) -> str:
    return avg_pool(3, kernel_size, **kw)


def adaptive_avg_pool1d(output_size, **kw) -> str:
    return adaptive_avg_pool(1, output_size, **kw)


def adaptive_avg_pool2d(output_size, **kw) -> str:
    return adaptive_avg_pool(2, output_size, **kw)


def adaptive_avg_pool3d(output_size, **kw) -> str:
    return adaptive_avg_pool(3, output_size, **kw)
