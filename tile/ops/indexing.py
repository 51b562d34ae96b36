"""Indexing and data movement: embedding, index_select, gather, scatter_add, concat, slice, pad,
permute/transpose, reshape and flatten.

Data input ``X`` (dims ``D0 ..``), index input ``I`` (any integer dtype), output ``Y``.
Data-dependent positions (``gather``, ``scatter_add``) compare each index with the coordinates
of the axis (``index(X, axis)``) in a conditional contraction, so out-of-range indices select
nothing (a 0 element) instead of failing; ``embedding``/``index_select`` use the ``gather``
builtin, which clamps them (§5.5).
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from tile.ops._build import axis, check_rank, decl, dims, function, lit, out, plus, product, ref

# The PyTorch function each op computes, as data for the op reference (python -m tile.ops.doc);
# tests/test_ops_doc.py checks that every name exists in torch (``{nd}``: 1, 2 and 3).
TORCH: dict[str, str] = {
    "embedding": "torch.nn.functional.embedding",
    "index_select": "torch.index_select",
    "gather": "torch.gather",
    "scatter_add": "torch.scatter_add",
    "concat": "torch.cat",
    "slice": "torch.Tensor.__getitem__",
    "pad": "torch.nn.functional.pad",
    "permute": "torch.permute",
    "transpose": "torch.transpose",
    "reshape": "torch.reshape",
    "flatten": "torch.flatten",
}


def embedding() -> str:
    """``torch.nn.functional.embedding``: inputs ``I`` (indices, any shape) and ``W[V, E]``;
    ``Y = W[I]`` of shape ``I.shape + (E,)``. Its gradient scatters into W's rows."""
    return function(["I", "W"], ["Y"], ["Y = gather(W, I)"])


def index_select(*, rank: int, axis: int = 0) -> str:
    """``torch.index_select(X, axis, I)`` with a 1-D ``I``: the axis moves to the front, ``gather``
    takes the rows, and the axis moves back."""
    check_rank(rank, 1)
    a = _axis(axis, rank)
    names = dims("D", rank)
    idx = [f"i{k}" for k in range(rank)]
    front = [idx[a], *idx[:a], *idx[a + 1:]]
    fsize = [names[a], *names[:a], *names[a + 1:]]
    back = [*idx[1:a + 1], idx[0], *idx[a + 1:]]
    gsize = ["M", *names[:a], *names[a + 1:]]
    body = [f"{out('Front', front, fsize)} = =({ref('X', idx)})",
            "Rows = gather(Front, I)"]
    body.append(f"{out('Y', back, [*gsize[1:a + 1], 'M', *gsize[a + 1:]])} = =({ref('Rows', idx)})")
    return function([decl("X", names), decl("I", ["M"])], ["Y"], body)


def _axis(a: int, rank: int) -> int:
    return axis(a, rank)


def gather(*, rank: int, axis: int) -> str:
    """``torch.gather(X, axis, I)``: ``Y[.., j, ..] = X[.., I[.., j, ..], ..]`` with ``I`` of the
    same rank and ``Y`` of I's shape (I's other sizes at most X's)."""
    check_rank(rank, 1)
    a = _axis(axis, rank)
    idx = [f"i{k}" for k in range(rank)]
    at = [*idx[:a], "k", *idx[a + 1:]]
    body = [f"Pos = index(X, {a})",
            f"{out('Y', idx, dims('E', rank))} = +({ref('I', idx)} == {ref('Pos', at)} ? {ref('X', at)})"]
    return function([decl("X", dims("D", rank)), decl("I", dims("E", rank))], ["Y"], body)


def scatter_add(*, rank: int, axis: int) -> str:
    """``torch.scatter_add(X, axis, I, S)``: ``Y = X`` plus each ``S[.., j, ..]`` added at
    ``Y[.., I[.., j, ..], ..]``; ``I`` and ``S`` share a shape."""
    check_rank(rank, 1)
    a = _axis(axis, rank)
    idx = [f"i{k}" for k in range(rank)]
    at = [*idx[:a], "k", *idx[a + 1:]]
    names = dims("D", rank)
    body = [f"Pos = index(X, {a})",
            f"{out('Added', at, names)} = +({ref('I', idx)} == {ref('Pos', at)} ? {ref('S', idx)})",
            "Y = X + Added"]
    e = dims("E", rank)
    return function([decl("X", names), decl("I", e), decl("S", e)], ["Y"], body)


def concat(n: int, *, rank: int, axis: int = 0) -> str:
    """``torch.cat`` of ``n`` tensors ``X0 .. X{n-1}`` along ``axis``; the other sizes must match
    (they share dimension names). Each piece is written at its offset, over the previous ones
    as the ``default`` (§6.5), so the values are copied exactly."""
    check_rank(rank, 1)
    if n < 1:
        raise ValueError(f"concat needs at least one input, not {n}")
    a = _axis(axis, rank)
    names = dims("D", rank)
    inputs, lens = [], [f"A{k}" for k in range(n)]
    for k in range(n):
        inputs.append(decl(f"X{k}", [*names[:a], lens[k], *names[a + 1:]]))
    sizes = [*names[:a], "Total", *names[a + 1:]]
    idx = [f"i{k}" for k in range(rank)]
    body = [f"Total = {' + '.join(lens)}"]
    prev = None
    for k in range(n):
        shifted = list(idx)
        shifted[a] = " + ".join([idx[a], *lens[:k]])
        dst = "Y" if k == n - 1 else f"Part{k}"
        default = f" default {prev}" if prev else ""
        body.append(f"{out(dst, shifted, sizes)} = =({ref(f'X{k}', idx)}){default}")
        prev = dst
    return function(inputs, ["Y"], body)


Key = int | slice | None


def slice(*, rank: int, key: Sequence[Key]) -> str:  # noqa: A001
    """``X[key]`` as numpy/PyTorch index it: one entry per leading axis (missing ones are
    ``:``), each a ``slice`` with a positive step (negative starts and stops count from the end
    and clamp to the axis, as Python's do) or an int, which selects one position and drops the
    axis. Sizes stay symbolic."""
    check_rank(rank, 1)
    key = list(key) + [builtins.slice(None)] * (rank - len(key))
    if len(key) != rank:
        raise ValueError(f"{len(key)} indices for a rank-{rank} tensor")
    names = dims("D", rank)
    body, oi, os_, xi = [], [], [], []
    for a, k in enumerate(key):
        d = names[a]
        if isinstance(k, int):
            body.append(f"At{a} = {d} - {-k}" if k < 0 else f"At{a} = {k}")
            xi.append(f"At{a}")
            continue
        if k is None:
            k = builtins.slice(None)
        step = 1 if k.step is None else k.step
        if not isinstance(step, int) or step < 1:
            raise ValueError(f"slice steps must be positive ints, not {k.step!r}")
        start = "0" if k.start is None else _bound(k.start, d)
        stop = d if k.stop is None else _bound(k.stop, d)
        body.append(f"Start{a} = {start}")
        length = f"max({stop} - Start{a}, 0)"
        body.append(f"Len{a} = " + (length if step == 1 else f"({length} + {step - 1}) / {step}"))
        oi.append(f"i{a}")
        os_.append(f"Len{a}")
        xi.append(f"Start{a} + {step}*i{a}" if step != 1 else f"Start{a} + i{a}")
    body.append(f"{out('Y', oi, os_)} = =({ref('X', xi)})")
    return function([decl("X", names)], ["Y"], body)


def _bound(v: int, d: str) -> str:
    return f"max({d} - {-v}, 0)" if v < 0 else f"min({v}, {d})"


def pad(*, rank: int, pad: Sequence[int], value: float = 0.0) -> str:
    """``torch.nn.functional.pad`` in ``'constant'`` mode: ``pad`` lists (before, after) pairs
    from the last axis backwards, as PyTorch does; negative amounts crop."""
    check_rank(rank, 1)
    pads = list(pad)
    if len(pads) % 2 or len(pads) // 2 > rank:
        raise ValueError(f"pad needs (before, after) pairs for at most {rank} axes, not {pad!r}")
    before, after = [0] * rank, [0] * rank
    for k in range(len(pads) // 2):
        before[rank - 1 - k], after[rank - 1 - k] = pads[2 * k], pads[2 * k + 1]
    names = dims("D", rank)
    idx = [f"i{a}" for a in range(rank)]
    oi = [f"{idx[a]}{plus(before[a])}" for a in range(rank)]
    os_ = [f"{names[a]}{plus(before[a] + after[a])}" for a in range(rank)]
    dst = "Y" if value == 0 else "Inner"
    body = [f"{out(dst, oi, os_)} = =({ref('X', idx)})"]
    if value != 0:
        inside = [f"(index(Inner, {a}) >= {before[a]}) & (index(Inner, {a}) < {names[a]} + {before[a]})"
                  for a in range(rank) if before[a] > 0 or after[a] > 0]
        body.append(f"Inside = {' & '.join(inside)}")
        body.append(f"Y = Inside ? Inner : {lit(value)}")
    return function([decl("X", names)], ["Y"], body)


def permute(perm: Sequence[int]) -> str:
    """``torch.permute``: ``Y``'s axis ``k`` is X's axis ``perm[k]``."""
    perm = list(perm)
    rank = len(perm)
    if sorted(perm) != list(range(rank)):
        raise ValueError(f"{perm!r} is not a permutation of 0..{rank - 1}")
    names = dims("D", rank)
    idx = [f"i{a}" for a in range(rank)]
    body = [f"{out('Y', [idx[p] for p in perm], [names[p] for p in perm])} = =({ref('X', idx)})"]
    return function([decl("X", names)], ["Y"], body)


def transpose(*, rank: int, dim0: int = -2, dim1: int = -1) -> str:
    """``torch.transpose``: swap two axes."""
    check_rank(rank, 1)
    perm = list(range(rank))
    a, b = _axis(dim0, rank), _axis(dim1, rank)
    perm[a], perm[b] = perm[b], perm[a]
    return permute(perm)


def reshape(*, rank: int, shape: Sequence[int | str]) -> str:
    """``torch.reshape``: each new size is an int, ``-1`` (inferred, at most once) or a size
    expression of X's dims ``D0 ..`` (``"D0 * D1"``), so the source stays shape-generic."""
    check_rank(rank)
    names = dims("D", rank)
    total = product(names)
    sizes = [str(s) if isinstance(s, int) else s for s in shape]
    if sizes.count("-1") > 1:
        raise ValueError("at most one size may be -1")
    if "-1" in sizes:
        rest = [f"({s})" for s in sizes if s != "-1"]
        sizes = [f"({total}) / ({product(rest)})" if s == "-1" else s for s in sizes]
    return function([decl("X", names)], ["Y"], [f"Y = reshape(X{''.join(', ' + s for s in sizes)})"])


def flatten(*, rank: int, start: int = 0, end: int = -1) -> str:
    """``torch.flatten``: axes ``start..end`` (inclusive) become one."""
    check_rank(rank, 1)
    a, b = _axis(start, rank), _axis(end, rank)
    names = dims("D", rank)
    return reshape(rank=rank, shape=[*names[:a], product(names[a:b + 1]), *names[b + 1:]])
