"""Convolutions: 1-, 2- and 3-D, strided, padded, dilated and grouped; and transposed convolutions.

Inputs ``X`` (data) and ``W`` (weights), and ``B`` (bias, one per output channel) when
``bias=True``; output ``Y``. Channels-first data is ``X[N, CI, L0, ..]`` with PyTorch's weights
``W[CO, CI / groups, K0, ..]``; channels-last data is ``X[N, L0, .., CI]`` with TensorFlow's
weights ``W[K0, .., CI / groups, CO]``. Every size is bound from the inputs, so one source serves
every shape; the attributes (stride, padding, dilation, groups) are fixed in the text.
"""

from __future__ import annotations

from collections.abc import Sequence

from tile.ops._build import decl, function, ints, layout_of, out, poly, positive, ref, term

# The PyTorch function each op computes, as data for the op reference (python -m tile.ops.doc);
# tests/test_ops_doc.py checks that every name exists in torch (``{nd}``: 1, 2 and 3).
TORCH: dict[str, str] = {
    "conv1d": "torch.nn.functional.conv1d",
    "conv2d": "torch.nn.functional.conv2d",
    "conv3d": "torch.nn.functional.conv3d",
    "conv": "torch.nn.functional.conv{nd}d",
    "conv_transpose1d": "torch.nn.functional.conv_transpose1d",
    "conv_transpose2d": "torch.nn.functional.conv_transpose2d",
    "conv_transpose3d": "torch.nn.functional.conv_transpose3d",
    "conv_transpose": "torch.nn.functional.conv_transpose{nd}d",
}

Padding = int | str | Sequence[int] | Sequence[tuple[int, int]]


def times(coef: int, expr: str = "") -> str:
    """``coef * expr`` without a factor of 1; with no ``expr``, the suffix `` * coef`` (or "")."""
    if not expr:
        return "" if coef == 1 else f" * {coef}"
    return expr if coef == 1 else f"{coef} * {expr}"


def conv1d(*, stride: int | Sequence[int] = 1, padding: Padding = 0, dilation: int | Sequence[int] = 1,
           groups: int = 1, layout: str = "NCL", bias: bool = False) -> str:
    """``torch.nn.functional.conv1d`` (see :func:`conv`)."""
    return conv(1, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout, bias=bias)


def conv2d(*, stride: int | Sequence[int] = 1, padding: Padding = 0, dilation: int | Sequence[int] = 1,
           groups: int = 1, layout: str = "NCHW", bias: bool = False) -> str:
    """``torch.nn.functional.conv2d`` (see :func:`conv`)."""
    return conv(2, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout, bias=bias)


def conv3d(*, stride: int | Sequence[int] = 1, padding: Padding = 0, dilation: int | Sequence[int] = 1,
           groups: int = 1, layout: str = "NCDHW", bias: bool = False) -> str:
    """``torch.nn.functional.conv3d`` (see :func:`conv`)."""
    return conv(3, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout, bias=bias)


def pads(padding: Padding, nd: int) -> list[tuple[int, int]] | str:
    """Padding as (before, after) per spatial dim, or ``'same'`` / ``'valid'``."""
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise ValueError(f"padding must be a number, numbers, 'same' or 'valid', not {padding!r}")
        return padding if padding == "same" else [(0, 0)] * nd
    if isinstance(padding, int):
        return [(padding, padding)] * nd
    items = list(padding)
    if len(items) != nd:
        raise ValueError(f"padding needs {nd} entries, not {padding!r}")
    result = []
    for p in items:
        if isinstance(p, int):
            result.append((p, p))
        else:
            lo, hi = p
            result.append((int(lo), int(hi)))
    return result


def conv(nd: int, *, stride: int | Sequence[int] = 1, padding: Padding = 0,
         dilation: int | Sequence[int] = 1, groups: int = 1, layout: str = "channels_first",
         bias: bool = False) -> str:
    """An ``nd``-d convolution (cross-correlation, as in every framework).

    ``padding`` is an int, one int per spatial dim, one ``(before, after)`` pair per dim,
    ``'valid'`` (none) or ``'same'``: the output has ``ceil(L / stride)`` positions and the
    padding is split with the odd element after, as TensorFlow does (with stride 1 this is
    PyTorch's ``'same'``). ``groups`` splits the channels as PyTorch does; ``groups = CI`` is a
    depthwise convolution. A bad channel count is refused when the program is bound.
    """
    strides, dils = ints(stride, nd, "stride"), ints(dilation, nd, "dilation")
    positive(strides, "stride")
    positive(dils, "dilation")
    if groups < 1:
        raise ValueError(f"groups must be at least 1, not {groups}")
    last = layout_of(layout, nd)
    padded = pads(padding, nd)
    L, K, Os, o, k = ([f"{p}{d}" for d in range(nd)] for p in ("L", "K", "O", "o", "k"))
    body = []
    for d in range(nd):
        s, dl = strides[d], dils[d]
        if padded == "same":
            body.append(f"{Os[d]} = " + (L[d] if s == 1 else f"({L[d]} + {s - 1}) / {s}"))
            span = f"({Os[d]} - 1){times(s)} + {times(dl, f'({K[d]} - 1)')} + 1 - {L[d]}"
            body.append(f"P{d} = max({span}, 0) / 2")
        else:
            lo, hi = padded[d]
            body.append(f"P{d} = {lo}")
            grow = f" + {lo + hi}" if lo + hi else ""
            size = f"{L[d]}{grow} - {times(dl, f'({K[d]} - 1)')} - 1"
            body.append(f"{Os[d]} = " + (f"{size} + 1" if s == 1 else f"({size}) / {s} + 1"))
    xs = [poly(term(strides[d], o[d]), term(dils[d], k[d]), f"-P{d}") for d in range(nd)]
    if groups == 1:
        ci, co, cons = "ci", "co", ""
        wci = "ci"
    else:
        body.append(f"COG = CO / {groups}")
        body.append(f"GroupsIn = assert_groups_divide_in_channels(CI == {groups} * CIG)")
        body.append(f"GroupsOut = assert_groups_divide_out_channels(CO == {groups} * COG)")
        ci, co, cons, wci = "CIG*g + c", "COG*g + m", ", m < COG", "c"
    cig = "CI" if groups == 1 else "CIG"
    if last:
        xdecl = decl("X", ["N", *L, "CI"])
        wdecl = decl("W", [*K, cig, "CO"])
        yo = out("Yc" if bias else "Y", ["n", *o, co], ["N", *Os, "CO"])
        xr, wr = ref("X", ["n", *xs, ci]), ref("W", [*k, wci, co])
    else:
        xdecl = decl("X", ["N", "CI", *L])
        wdecl = decl("W", ["CO", cig, *K])
        yo = out("Yc" if bias else "Y", ["n", co, *o], ["N", "CO", *Os])
        xr, wr = ref("X", ["n", ci, *xs]), ref("W", [co, wci, *k])
    body.append(f"{yo} = +({xr} * {wr}){cons}")
    return _with_bias([xdecl, wdecl], body, bias, last, nd)


def _with_bias(inputs: list[str], body: list[str], bias: bool, last: bool, nd: int) -> str:
    """The function of ``inputs`` and ``body``, whose sum ``Yc`` gets ``B`` per output channel when
    ``bias`` (its ``Y`` otherwise)."""
    if bias:
        inputs.append(decl("B", ["CO"]))
        shaped = "B" if last else f"reshape(B, CO{', 1' * nd})"
        body.append(f"Y = Yc + {shaped}")
    return function(inputs, ["Y"], body)


def conv_transpose1d(**kw) -> str:
    """``torch.nn.functional.conv_transpose1d`` (see :func:`conv_transpose`)."""
    return conv_transpose(1, **{"layout": "NCL", **kw})


def conv_transpose2d(**kw) -> str:
    """``torch.nn.functional.conv_transpose2d`` (see :func:`conv_transpose`)."""
    return conv_transpose(2, **{"layout": "NCHW", **kw})


def conv_transpose3d(**kw) -> str:
    """``torch.nn.functional.conv_transpose3d`` (see :func:`conv_transpose`)."""
    return conv_transpose(3, **{"layout": "NCDHW", **kw})


def conv_transpose(nd: int, *, stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                   output_padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1,
                   groups: int = 1, layout: str = "channels_first", bias: bool = False) -> str:
    """The gradient of :func:`conv` with respect to its data, as PyTorch's ``conv_transpose``.

    Weights are PyTorch's ``W[CI, CO / groups, K0, ..]`` channels-first and TensorFlow's
    ``W[K0, .., CO / groups, CI]`` channels-last. The output has
    ``(L - 1) * stride - 2 * padding + dilation * (K - 1) + output_padding + 1`` positions.
    """
    strides, dils = ints(stride, nd, "stride"), ints(dilation, nd, "dilation")
    padding_, outpad = ints(padding, nd, "padding"), ints(output_padding, nd, "output_padding")
    positive(strides, "stride")
    positive(dils, "dilation")
    if groups < 1:
        raise ValueError(f"groups must be at least 1, not {groups}")
    last = layout_of(layout, nd)
    L, K, Os, o, k = ([f"{p}{d}" for d in range(nd)] for p in ("L", "K", "O", "o", "k"))
    body = []
    for d in range(nd):
        s, dl, p = strides[d], dils[d], padding_[d]
        shrink = f" - {2 * p}" if p else ""
        reach = times(dl, f"({K[d]} - 1)")
        body.append(f"{Os[d]} = ({L[d]} - 1){times(s)}{shrink} + {reach} + {outpad[d] + 1}")
    ys = [poly(term(strides[d], o[d]), term(dils[d], k[d]), f"-{padding_[d]}" * (padding_[d] > 0))
          for d in range(nd)]
    if groups == 1:
        ci, co, cons, cog = "ci", "co", "", "CO"
        body_co = []
    else:
        ci, co, cons, cog = "CIG*g + c", "COG*g + m", ", c < CIG, m < COG", "COG"
        body_co = [f"CIG = CI / {groups}",
                   f"GroupsIn = assert_groups_divide_in_channels(CI == {groups} * CIG)"]
        # with a bias, B[CO] binds CO: check it; otherwise CO is defined here
        body_co.append(f"GroupsOut = assert_bias_per_out_channel(CO == COG * {groups})" if bias
                       else f"CO = COG * {groups}")
    wco = "co" if groups == 1 else "m"
    if last:
        xdecl, wdecl = decl("X", ["N", *L, "CI"]), decl("W", [*K, cog, "CI"])
        yo = out("Yc" if bias else "Y", ["n", *ys, co], ["N", *Os, "CO"])
        xr, wr = ref("X", ["n", *o, ci]), ref("W", [*k, wco, ci])
    else:
        xdecl, wdecl = decl("X", ["N", "CI", *L]), decl("W", ["CI", cog, *K])
        yo = out("Yc" if bias else "Y", ["n", co, *ys], ["N", "CO", *Os])
        xr, wr = ref("X", ["n", ci, *o]), ref("W", [ci, wco, *k])
    body += body_co
    body.append(f"{yo} = +({xr} * {wr}){cons}")
    return _with_bias([xdecl, wdecl], body, bias, last, nd)
