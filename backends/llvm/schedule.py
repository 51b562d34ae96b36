"""Which kernel indexes may be split over threads, and the loop order the kernel runs in.

The kernel's *owned* indexes (``stripe.ownership``: every element it writes belongs to exactly
one value of them) may be split over threads without a race, and may move anywhere in the loop
nest as long as the others keep their relative order, because the points writing one element
differ only in the others: every element keeps the interpreter's order of writes. The kernel
loops over the *split* index outermost (the owned index of largest stride with range >= 2 x
threads, else the owned one with the largest range), then the not-owned indexes in Stripe order,
then the other owned ones by decreasing stride (so the innermost loop walks the output
contiguously and vectorizes); when the split index is itself the output's stride-1 index, the
kernel's inputs read it contiguously and there are not-owned indexes, it stays the innermost loop
instead and the threads divide its range there (``split_at``): each thread streams every row of
``O[j] = >(X[i, j])`` over its chunk of ``j`` rather than walking columns. A reduction index is
never owned (it has no coefficient in the output), so ``O[j] = +(I[i, j])`` (``i`` first) is
split over ``j``, and ``O[i + k]`` owns nothing: it runs on one thread, in Stripe's order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stripe.ir import Block, RefDir
from stripe.ownership import NotAnalysable, Ownership


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
        own = Ownership(kernel, dict.fromkeys(buffers), depth=0)
    except NotAnalysable as e:
        return Schedule(tuple(range(n)), False, (), f"not analysable ({e})", ranges)
    pos = [k for k, ix in enumerate(kernel.idxs) if own.owns(0, ix.name)]
    shown = tuple(kernel.idxs[p].name for p in sorted(pos))
    if not reorder:
        split = bool(pos) and 0 in pos
        why = "first index owned" if split else "the first index is not owned by the output"
        return Schedule(tuple(range(n)), split, shown, why, ranges)
    if not pos:
        return Schedule(tuple(range(n)), False, (), "no index is owned by the output", ranges)

    def stride(p: int) -> int:
        return own.stride(0, kernel.idxs[p].name)

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
