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


def record_offset(ctx: Context, out: Value, x: Value, axis: int, start: int) -> None:
    """``out`` is ``x`` from ``start`` on along ``axis`` (a Slice, a Split's piece)."""
    if not start:
        ctx.b.views[out.name] = _through(ctx, x, lambda names: list(names))
        return

    def index(names: list[str]) -> list[str]:
        return [f"{n} + {start}" if a == axis else n for a, n in enumerate(names)]

    ctx.b.views[out.name] = _through(ctx, x, index)


def record_reshape(ctx: Context, out: Value, x: Value) -> None:
    """``out`` is ``x`` reshaped; recorded only where each axis of ``x`` splits into consecutive
    axes of ``out`` (no size-1 axes), so every index of ``x`` is affine in ``out``'s; or, where
    consecutive axes of ``x`` merge into axes of ``out``, as a merge (``read_merged``)."""
    if 1 in x.shape or 1 in out.shape:
        return
    if out.rank < x.rank:
        _record_merge(ctx, out, x)
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


def _record_merge(ctx: Context, out: Value, x: Value) -> None:
    """Where each axis of ``out`` is consecutive axes of ``x`` merged (row-major), record per axis
    of ``out`` the sizes of the axes of ``x`` it merges (``Builder.merges``)."""
    groups, k = [], 0
    for n in out.shape:
        group = []
        while k < x.rank and math.prod(group) < n:
            group.append(x.shape[k])
            k += 1
        if math.prod(group) != n:
            return
        groups.append(tuple(group))
    if k == x.rank:
        ctx.b.merges[out.name] = (x, tuple(groups))


def read_merged(ctx: Context, v: Value, names: list[str], bounds: list[str],
                free: set[str]) -> tuple[str, dict[str, str]]:
    """``read(ctx, v, names, bounds)``, or, where ``v`` merges axes of a tensor (a ``Reshape`` of a
    ``Transpose``: attention's heads joined back) and every merged axis is read at an index of
    ``free`` (summed, read nowhere else as a whole), the source read at one index per merged axis
    (``k`` becomes ``k_0, k_1``): then the returned map gives each such ``k`` as its affine
    expression (``32*k_0 + k_1``) for the other operands, and the merge's copy is not needed."""
    found = ctx.b.merges.get(v.name)
    if found is None:
        return read(ctx, v, names, bounds), {}
    source, groups = found
    if any(len(g) > 1 and n not in free for n, g in zip(names, groups)):
        return read(ctx, v, names, bounds), {}
    src_names, subst = [], {}
    for n, group in zip(names, groups):
        if len(group) == 1:
            src_names.append(n)
            continue
        parts = [f"{n}_{j}" for j in range(len(group))]
        src_names += parts
        terms = [p if math.prod(group[j + 1:]) == 1 else f"{math.prod(group[j + 1:])}*{p}"
                 for j, p in enumerate(parts)]
        subst[n] = " + ".join(terms)
    return read(ctx, source, src_names, bounds), subst

