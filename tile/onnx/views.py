"""Reshapes and transposes read through, not copied, by the products that use them.

A Tile ``reshape`` or a permutation is a copy: a kernel of its own on a compiled target, each
call. When an exported attention block splits heads (``Reshape`` [B, T, D] -> [B, T, H, D/H], then
``Transpose``) and multiplies, the product can instead read the source directly with affine indices
(``Q[b, t, 32*h + d]``). So ``reshape`` (where it only splits axes) and ``permute`` record, beside the
copy they write, how the result's indices map to a source's (``Builder.views``), and a contraction
that reads an operand through ``read`` uses that map. A copy no one reads is then left out of the
program (``Builder.text``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tile.onnx.context import Context, Value

IndexMap = Callable[[list[str]], list[str]]


def read(ctx: Context, v: Value, names: list[str], bounds: list[str]) -> str:
    """Tile text reading ``v[names]``: through its view's source where one was recorded, adding
    to ``bounds`` the constraints that keep each index within ``v``'s size (a split axis's inner
    index is otherwise bounded only by the source's larger axis)."""
    view = ctx.b.views.get(v.name)
    if view is None:
        return f"{v}[{', '.join(names)}]"
    source, index = view
    for n, d in zip(names, v.shape):
        if n.isidentifier() and f"{n} < {d}" not in bounds:
            bounds.append(f"{n} < {d}")
    return f"{source}[{', '.join(index(list(names)))}]"


def _through(ctx: Context, x: Value, index: IndexMap) -> tuple[Value, IndexMap]:
    """A view of ``x`` by ``index``, composed with ``x``'s own view where it has one."""
    inner = ctx.b.views.get(x.name)
    if inner is None:
        return x, index
    source, first = inner
    return source, lambda names: first(index(names))


def record_permute(ctx: Context, out: Value, x: Value, perm: list[int]) -> None:
    """``out`` is ``x`` with axis ``k`` of ``out`` being axis ``perm[k]`` of ``x``."""

    def index(names: list[str]) -> list[str]:
        src = [""] * len(perm)
        for k, p in enumerate(perm):
            src[p] = names[k]
        return src

    ctx.b.views[out.name] = _through(ctx, x, index)


def record_reshape(ctx: Context, out: Value, x: Value) -> None:
    """``out`` is ``x`` reshaped; recorded only where each axis of ``x`` splits into consecutive
    axes of ``out`` (no size-1 axes), so every index of ``x`` is affine in ``out``'s."""
    if 1 in x.shape or 1 in out.shape:
        return
    groups, k = [], 0
    for n in x.shape:
        group = []
        while k < out.rank and math.prod(out.shape[j] for j in group) < n:
            group.append(k)
            k += 1
        if not group or math.prod(out.shape[j] for j in group) != n:
            return
        groups.append(group)
    if k != out.rank:
        return
    shape = out.shape

    def index(names: list[str]) -> list[str]:
        exprs = []
        for group in groups:
            terms = []
            for pos, j in enumerate(group):
                stride = math.prod(shape[m] for m in group[pos + 1:])
                terms.append(names[j] if stride == 1 else f"{stride}*{names[j]}")
            exprs.append(" + ".join(terms))
        return exprs

    ctx.b.views[out.name] = _through(ctx, x, index)
