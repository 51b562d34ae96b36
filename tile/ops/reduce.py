"""Reductions over axes: sum, mean, var, max, min, prod, argmax.

Input ``X`` of the given ``rank`` (dims ``D0 ..``), output ``Y``. ``axis`` is an int, a sequence of
ints or ``None`` (all axes); ``keepdim`` keeps each reduced axis with size 1, as PyTorch does.
"""

from __future__ import annotations

from collections.abc import Sequence

from tile.ops._build import axes, check_rank, decl, dims, function, out, product, ref

# The PyTorch function each op computes, as data for the op reference (python -m tile.ops.doc);
# tests/test_ops_doc.py checks that every name exists in torch (``{nd}``: 1, 2 and 3).
TORCH: dict[str, str] = {
    "sum": "torch.sum",
    "mean": "torch.mean",
    "var": "torch.var",
    "max": "torch.amax",
    "min": "torch.amin",
    "prod": "torch.prod",
    "argmax": "torch.argmax",
}

Axis = int | Sequence[int] | None


def contraction(dst: str, agg: str, src: str, rank: int, reduced: Sequence[int], keepdim: bool,
                dim_names: Sequence[str] | None = None) -> str:
    """``dst = agg(src)`` over ``reduced`` axes of a rank-``rank`` tensor with dims ``dim_names``
    (default ``D0 ..``); kept axes are written as index 0 of size 1."""
    names = list(dim_names) if dim_names is not None else dims("D", rank)
    idx = [f"i{a}" for a in range(rank)]
    oi, os = [], []
    for a in range(rank):
        if a in reduced:
            if keepdim:
                oi.append("0")
                os.append("1")
        else:
            oi.append(idx[a])
            os.append(names[a])
    return f"{out(dst, oi, os)} = {agg}({ref(src, idx)})"


def _reduction(agg: str, rank: int, axis: Axis, keepdim: bool) -> str:
    check_rank(rank)
    red = axes(axis, rank)
    body = [contraction("Y", agg, "X", rank, red, keepdim)]
    return function([decl("X", dims("D", rank))], ["Y"], body)


def sum(*, rank: int, axis: Axis = None, keepdim: bool = False) -> str:
    """``torch.sum``."""
    return _reduction("+", rank, axis, keepdim)


def prod(*, rank: int, axis: Axis = None, keepdim: bool = False) -> str:
    """``torch.prod``; its gradient is exact where elements are 0 (§11)."""
    return _reduction("*", rank, axis, keepdim)


def max(*, rank: int, axis: Axis = None, keepdim: bool = False) -> str:
    """``torch.amax``: the values only. Its gradient goes to every tied maximum in full (§11),
    where PyTorch's ``amax`` splits it evenly among the ties."""
    return _reduction(">", rank, axis, keepdim)


def min(*, rank: int, axis: Axis = None, keepdim: bool = False) -> str:
    """``torch.amin`` (see :func:`max` on ties)."""
    return _reduction("<", rank, axis, keepdim)


def mean(*, rank: int, axis: Axis = None, keepdim: bool = False) -> str:
    """``torch.mean``: the sum divided by the number of elements reduced."""
    check_rank(rank)
    red = axes(axis, rank)
    count = product([f"D{a}" for a in red])
    body = [contraction("S", "+", "X", rank, red, keepdim), f"Y = S / ({count})"]
    return function([decl("X", dims("D", rank))], ["Y"], body)


def variance_lines(src: str, rank: int, red: Sequence[int], keepdim: bool, correction: int,
                   prefix: str = "", dim_names: Sequence[str] | None = None) -> list[str]:
    """Statements for ``{prefix}Mean`` (kept dims) and ``{prefix}Var``: the two-pass variance
    ``sum((x - mean)^2) / (count - correction)``, as PyTorch computes it."""
    names = list(dim_names) if dim_names is not None else dims("D", rank)
    count = product([names[a] for a in red])
    p = prefix
    divisor = f"({count})" if correction == 0 else f"({count} - {correction})"
    return [
        contraction(f"{p}Sum", "+", src, rank, red, True, names),
        f"{p}Mean = {p}Sum / ({count})",
        f"{p}Dev = {src} - {p}Mean",
        f"{p}Sq = {p}Dev * {p}Dev",
        contraction(f"{p}SqSum", "+", f"{p}Sq", rank, red, keepdim, names),
        f"{p}Var = {p}SqSum / {divisor}",
    ]


def var(*, rank: int, axis: Axis = None, keepdim: bool = False, correction: int = 1) -> str:
    """``torch.var`` (``correction=1``, Bessel's, by default; 0 for the biased variance)."""
    check_rank(rank)
    red = axes(axis, rank)
    body = [*variance_lines("X", rank, red, keepdim, correction), "Y = Var"]
    return function([decl("X", dims("D", rank))], ["Y"], body)


def argmax(*, rank: int, axis: int | None = None, keepdim: bool = False) -> str:
    """``torch.argmax``: the first index of the maximum along ``axis`` (int32), or with
    ``axis=None`` the index into the flattened tensor. A NaN is not found as the maximum
    (PyTorch returns its index); the result is then the axis length."""
    check_rank(rank)
    names = dims("D", rank)
    inputs = [decl("X", names)]
    if axis is None:
        if keepdim:
            raise ValueError("argmax with axis=None flattens the input; keepdim needs an axis")
        body = [f"Flat = reshape(X, {product(names)})", "Total = " + product(names)]
        body += _argmax_lines("Flat", 1, 0, False, ["Total"])
        return function(inputs, ["Y"], body)
    a = axes(axis, rank)[0]
    return function(inputs, ["Y"], _argmax_lines("X", rank, a, keepdim, names))


def _argmax_lines(src: str, rank: int, a: int, keepdim: bool, names: Sequence[str]) -> list[str]:
    return [
        contraction("Top", ">", src, rank, [a], True, names),
        f"Where = {src} == Top ? index({src}, {a}) : {names[a]}",
        contraction("Y", "<", "Where", rank, [a], keepdim, names),
    ]
