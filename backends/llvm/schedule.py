"""Which kernel indexes may be split over threads, and the loop order the kernel runs in.

Stripe lets a block's points run in any order, but the interpreter (the oracle) runs them in
row-major order, and an element that several points write (``+=`` of a reduction, ``=`` written
twice) gets their writes in that order; float sums depend on it. So the backend only changes
what keeps, for every written element, the order of the writes it receives:

**The rule.** An index ``v`` of the kernel block is *owned* when, for every buffer the kernel
writes (stores at any depth, specials' outputs), every write's element offset — an affine of the
kernel's and nested blocks' indexes — has the same non-zero coefficient ``c`` for ``v`` and the
same coefficients for the indexes owned before it, and ``|c|`` exceeds the spread of the rest
(the other indexes over their ranges, the constants, a special's view extent). Owned indexes are
found greedily (the output's row index first, then columns, ...). Two points writing the same
element then agree on every owned index (``|c| * |Δv|`` would have to equal a smaller spread).

Consequences: (1) splitting an owned index over threads never races, and (2) owned indexes can
move anywhere in the loop nest as long as the others keep their relative order, because the
points writing one element differ only in the others. The kernel loops over the *split* index
outermost (the owned index of largest stride with range >= 2 x threads, else the owned one with
the largest range), then the not-owned indexes in Stripe order, then the other owned ones by
decreasing stride (so the innermost loop walks the output contiguously and vectorizes); when the
split index is itself the output's stride-1 index, the kernel's inputs read it contiguously and
there are not-owned indexes, it stays the innermost loop instead and the threads divide its
range there (``split_at``): each thread streams every row of ``O[j] = >(X[i, j])`` over its
chunk of ``j`` rather than walking columns. A reduction index is never owned (it has no
coefficient in the output), so ``O[j] = +(I[i, j])`` (``i`` first) is split over ``j``, and
``O[i + k]`` owns nothing: it runs on one thread, in Stripe's order.
Reads of an element another point writes are races in Stripe and are not considered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stripe.ir import Block, Dim, RefDir, Special, Store
from tile.affine import Affine


@dataclass(frozen=True)
class Schedule:
    order: tuple[int, ...]  # kernel index positions, outermost first
    split: bool  # order[0] may be divided among threads
    owned: tuple[str, ...] = ()
    reason: str = ""
    ranges: tuple[int, ...] = field(default=())  # kernel index ranges, in Stripe order
    split_at: int = 0  # the position in ``order`` of the loop that ``[lo, hi)`` bounds
    grain: int = 1  # chunks of the split index start at multiples of it (the micro-kernel's panels)

    @property
    def split_index(self) -> int:
        """The kernel index (position in Stripe order) whose range the threads divide."""
        return self.order[self.split_at]

    @property
    def split_range(self) -> int:
        return self.ranges[self.split_index] if self.order else 1


@dataclass(frozen=True)
class _Write:
    buffer: str
    offset: Affine
    lo: int  # extent of a special's view, relative to offset
    hi: int


class _NotAffine(Exception):
    pass


def _sub(aff: Affine, env: dict[str, Affine]) -> Affine:
    if not aff.is_integral or any(v not in env for v in aff.vars):
        raise _NotAffine(str(aff))
    return aff.substitute(env)


def _writes(kernel: Block, buffers: frozenset[str]) -> tuple[list[_Write], dict[str, int]]:
    """Every write of the kernel with its offset over unique index names, and those indexes' ranges."""
    ranges: dict[str, int] = {}
    writes: list[_Write] = []
    counter = [0]

    def visit(block: Block, genv: dict[str, Affine], parents: dict | None, depth: int) -> None:
        env = {}
        for ix in block.idxs:
            unique = f"{depth}.{counter[0]}/{ix.name}"
            counter[0] += 1
            ranges[unique] = ix.range
            start = Affine() if ix.affine is None else _sub(ix.affine, genv)
            env[ix.name] = start + Affine.var(unique)
        views: dict[str, tuple[str, Affine, tuple[Dim, ...]] | None] = {}
        for r in block.refs:
            if parents is None:
                if r.source not in buffers:
                    views[r.into] = None  # a local allocation: private to its point
                    continue
                if len(r.access) != len(r.shape.dims):
                    raise _NotAffine(r.into)
                buf, base, pdims = r.source, Affine(), r.shape.dims
            else:
                parent = parents.get(r.source)
                if parent is None:
                    views[r.into] = None
                    continue
                buf, base, pdims = parent
            for a, d in zip(r.access, pdims):
                base = base + _sub(a, env) * d.stride
            views[r.into] = (buf, base, r.shape.dims)
        for s in block.stmts:
            if isinstance(s, Store) and views.get(s.into):
                buf, base, _ = views[s.into]
                writes.append(_Write(buf, base, 0, 0))
            elif isinstance(s, Special):
                for o in s.outputs:
                    if views.get(o) and all(d.size > 0 for d in views[o][2]):
                        buf, base, dims = views[o]
                        lo = sum(min(0, (d.size - 1) * d.stride) for d in dims)
                        hi = sum(max(0, (d.size - 1) * d.stride) for d in dims)
                        writes.append(_Write(buf, base, lo, hi))
            elif isinstance(s, Block):
                visit(s, env, {k: v for k, v in views.items() if v}, depth + 1)

    visit(kernel, {}, None, 0)
    return writes, ranges


def _owns(v: str, owned: list[str], writes: list[_Write], ranges: dict[str, int]) -> bool:
    by_buffer: dict[str, list[_Write]] = {}
    for w in writes:
        by_buffer.setdefault(w.buffer, []).append(w)
    fixed = {v, *owned}
    for ws in by_buffer.values():
        c = ws[0].offset.coeff(v)
        if c == 0:
            return False
        for u in fixed:
            if len({w.offset.coeff(u) for w in ws}) != 1:
                return False
        lo = hi = None
        for w in ws:
            wlo, whi = w.offset.const + w.lo, w.offset.const + w.hi
            for u, cu in w.offset.terms:
                if u not in fixed:
                    span = cu * max(ranges[u] - 1, 0)
                    wlo, whi = wlo + min(0, span), whi + max(0, span)
            lo = wlo if lo is None else min(lo, wlo)
            hi = whi if hi is None else max(hi, whi)
        if abs(c) <= hi - lo:
            return False
    return True


def _read_along(kernel: Block, buffers: tuple[str, ...], k: int) -> bool:
    """Whether the kernel's reads of its buffers that move with index ``k`` are contiguous along it
    (coefficient ±1), and at least one does: then the inputs stream with ``k`` innermost too."""
    name = kernel.idxs[k].name
    coeffs = set()
    for r in kernel.refs:
        if r.dir in (RefDir.IN, RefDir.INOUT) and r.source in buffers and len(r.access) == len(r.shape.dims):
            c = sum((a.coeff(name) * d.stride for a, d in zip(r.access, r.shape.dims)), start=0)
            if c:
                coeffs.add(abs(c))
    return coeffs == {1}


def plan(kernel: Block, buffers: tuple[str, ...], threads: int, reorder: bool = True) -> Schedule:
    """The loop order and split of ``kernel`` (see the module docstring for the rule)."""
    n = len(kernel.idxs)
    ranges = tuple(ix.range for ix in kernel.idxs)
    if n == 0:
        return Schedule((), False, (), "no indexes", ranges)
    try:
        writes, var_ranges = _writes(kernel, frozenset(buffers))
    except _NotAffine as e:
        return Schedule(tuple(range(n)), False, (), f"not analysable ({e})", ranges)
    names = [f"0.{k}/{ix.name}" for k, ix in enumerate(kernel.idxs)]
    owned: list[str] = []
    grew = True
    while grew:
        grew = False
        for v in names:
            if v not in owned and _owns(v, owned, writes, var_ranges):
                owned.append(v)
                grew = True
                break
    pos = [names.index(v) for v in owned]
    shown = tuple(kernel.idxs[p].name for p in sorted(pos))
    if not reorder:
        split = bool(pos) and 0 in pos
        why = "first index owned" if split else "the first index is not owned by the output"
        return Schedule(tuple(range(n)), split, shown, why, ranges)
    if not pos:
        return Schedule(tuple(range(n)), False, (), "no index is owned by the output", ranges)

    def stride(p: int) -> int:
        return max((abs(w.offset.coeff(names[p])) for w in writes), default=0)

    by_stride = sorted(pos, key=lambda p: (-stride(p), p))
    big = [p for p in by_stride if ranges[p] >= 2 * threads]
    split = big[0] if big else max(by_stride, key=lambda p: ranges[p])
    rest = [p for p in range(n) if p not in pos]
    inner = [p for p in by_stride if p != split]
    why = f"split over '{kernel.idxs[split].name}'"
    if rest and split == by_stride[-1] and stride(split) == 1 and _read_along(kernel, buffers, split):
        # the output's contiguous index: keep it innermost, each thread's chunk of it inside the
        # other loops (a column max streams rows instead of walking columns)
        return Schedule((*rest, *inner, split), True, shown, why + " (innermost)", ranges, n - 1)
    return Schedule((split, *rest, *inner), True, shown, why, ranges)
