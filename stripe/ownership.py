"""Which indexes of a block its output *owns*: those whose points may run at once, or in any order.

Stripe lets a block's points run in any order, but the interpreter (the oracle) runs them in
row-major order, and an element that several points write (``+=`` of a reduction, ``=`` written
twice) gets their writes in that order; float sums depend on it. A code generator or a pass may
only change what keeps, for every written element, the order of the writes it receives.

**The rule.** An index ``v`` is *owned* when, for every buffer the block writes (stores at any
depth, specials' outputs), every write's element offset (an affine of the block's and nested
blocks' indexes, through the chain of views) has the same non-zero coefficient ``c`` for ``v``
and the same coefficients for the indexes owned before it, and ``|c|`` exceeds the spread of the
rest (the other indexes over their ranges, the constants, a special's view extent). Owned indexes
are found greedily, in index order (the output's row index first, then columns, ...). Two points
writing the same element then agree on every owned index (``|c| * |Δv|`` would have to equal a
smaller spread). So (1) different values of owned indexes may run at once without a race, and
(2) owned indexes may move anywhere in a loop nest while the others keep their relative order,
because the points writing one element differ only in the others. A reduction index is never
owned (it has no coefficient in the output), and ``O[i + k]`` owns nothing. Reads of an element
another point writes are races in Stripe and are not considered.

**Split indexes** (``tiles=True``, for an outer/inner pair that ``autotile`` made): an index split
in two (tile number ``V`` outside, ``v`` of range ``t`` inside, with the same name) is judged as
the one index ``w = t*V + v`` when every write uses it so (``c_V = t * c_v``), with the range the
split's remainder constraint ``r - 1 - t*V - v >= 0`` leaves: a partial last tile would otherwise
seem to overlap the next row. ``w`` owned makes both owned, because ``0 <= v < t`` gives ``V`` and
``v`` from ``w``. (Meant for a leaf or an outer/inner pair, where every store is in the innermost
block, so every constraint limits every write.)

Used by ``backends.llvm.schedule`` (threads and loop order), ``backends.clike.kernel``
(work-items) and ``stripe.passes.thread`` (work-groups and work-items).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from stripe.ir import Block, Dim, Special, Store
from tile.affine import Affine


class NotAnalysable(Exception):
    """An index affine or an access is not an integral affine of the indexes in scope, or an
    access does not match the dims it refines."""


@dataclass(frozen=True)
class Write:
    """One write: the element offset in ``buffer``, over unique index variables, and the extent
    of a special's output view around it (``[offset + lo, offset + hi]``)."""

    buffer: str
    offset: Affine
    lo: int = 0
    hi: int = 0


def _over(aff: Affine, env: dict[str, Affine]) -> Affine:
    if not aff.is_integral or any(v not in env for v in aff.vars):
        raise NotAnalysable(str(aff))
    return aff.substitute(env)


class Ownership:
    """The owned indexes of ``block`` (depth 0) and of the blocks nested in it (depth 1, ...).

    ``buffers``: the sources ``block``'s refinements may refine as memory shared by its points,
    each with the dims its accesses count in (None: the refinement's own); a refinement of any
    other source is a local allocation, private to its point. ``tiles``: judge split indexes as
    one (module docstring). ``depth``: consider the indexes of that depth only (None: every depth).
    Raises ``NotAnalysable`` when a write's offset cannot be written as an affine."""

    def __init__(
        self,
        block: Block,
        buffers: Mapping[str, tuple[Dim, ...] | None],
        tiles: bool = False,
        depth: int | None = None,
    ):
        self.ranges: dict[str, int] = {}  # variable -> range
        self.keys: dict[tuple[int, str], str] = {}  # (depth, index name) -> variable
        self.depths: dict[str, int] = {}  # variable -> depth
        self.writes: list[Write] = []
        self.constraints: list[Affine] = []
        top = {src: (src, Affine(), dims) for src, dims in buffers.items()}
        self._visit(block, {}, top, 0)
        self.members = {key: (key,) for key in self.ranges}  # variable -> the keys it stands for
        self.var_ranges = dict(self.ranges)
        self.offsets = list(self.writes)  # the writes over the variables (split indexes merged)
        if tiles:
            self._merge_tiles()
        candidates = [
            var for var in self.var_ranges if depth is None or self.depths[self.members[var][0]] == depth
        ]
        self.owned: list[str] = []
        grew = True
        while grew:
            grew = False
            for var in candidates:
                if var not in self.owned and self._owns(var):
                    self.owned.append(var)
                    grew = True
                    break
        self.owned_keys = {k for var in self.owned for k in self.members[var]}

    def owns(self, depth: int, name: str) -> bool:
        """Whether the output owns index ``name`` of the block(s) at ``depth``."""
        return self.keys.get((depth, name)) in self.owned_keys

    def stride(self, depth: int, name: str) -> int:
        """The largest magnitude of the index's coefficient in a write's offset."""
        key = self.keys[(depth, name)]
        return max((abs(int(w.offset.coeff(key))) for w in self.writes), default=0)

    def _visit(self, block: Block, env: dict[str, Affine], parents: dict, depth: int) -> None:
        """``parents``: per name a refinement of ``block`` may refine, (buffer, base offset, dims
        its access counts in); dims None means the refinement's own (a top-level view)."""
        own: dict[str, Affine] = {}
        for ix in block.idxs:
            key = f"{depth}.{len(self.ranges)}/{ix.name}"
            self.ranges[key] = ix.range
            self.depths[key] = depth
            self.keys.setdefault((depth, ix.name), key)
            start = Affine() if ix.affine is None else _over(ix.affine, env)
            own[ix.name] = start + Affine.var(key)
        self.constraints.extend(c.substitute(own) for c in block.constraints)
        views: dict[str, tuple[str, Affine, tuple[Dim, ...]]] = {}
        for r in block.refs:
            if r.source not in parents:
                continue  # a local allocation: private to its point
            buf, base, dims = parents[r.source]
            dims = r.shape.dims if dims is None else dims
            if len(r.access) != len(dims):
                raise NotAnalysable(r.into)
            for a, d in zip(r.access, dims):
                base = base + _over(a, own) * d.stride
            views[r.into] = (buf, base, r.shape.dims)
        for s in block.stmts:
            if isinstance(s, Store) and s.into in views:
                buf, base, _ = views[s.into]
                self.writes.append(Write(buf, base))
            elif isinstance(s, Special):
                for o in s.outputs:
                    if o in views and all(d.size > 0 for d in views[o][2]):
                        buf, base, dims = views[o]
                        lo = sum(min(0, (d.size - 1) * d.stride) for d in dims)
                        hi = sum(max(0, (d.size - 1) * d.stride) for d in dims)
                        self.writes.append(Write(buf, base, lo, hi))
            elif isinstance(s, Block):
                self._visit(s, own, views, depth + 1)

    def _merge_tiles(self) -> None:
        for (depth, name), a in list(self.keys.items()):
            b = self.keys.get((depth + 1, name))
            if b is None or a not in self.var_ranges or b not in self.var_ranges:
                continue
            t = self.ranges[b]
            if any(w.offset.coeff(a) != t * w.offset.coeff(b) for w in self.offsets):
                continue
            bound = t * self.ranges[a]
            for c in self.constraints:
                live = {v: k for v, k in c.terms if self.ranges.get(v, 0) > 1}
                if live == {a: -t, b: -1}:
                    bound = min(bound, int(c.const) + 1)
            var = f"{a}+{b}"
            self.members[var] = (a, b)
            self.var_ranges = {
                (var if u == a else u): (max(bound, 1) if u == a else r)
                for u, r in self.var_ranges.items()
                if u != b
            }
            env = {a: Affine(), b: Affine.var(var)}
            self.offsets = [replace(w, offset=w.offset.substitute(env)) for w in self.offsets]

    def _owns(self, v: str) -> bool:
        fixed = {v, *self.owned}
        by_buffer: dict[str, list[Write]] = {}
        for w in self.offsets:
            by_buffer.setdefault(w.buffer, []).append(w)
        for ws in by_buffer.values():
            c = ws[0].offset.coeff(v)
            if c == 0:
                return False
            if any(len({w.offset.coeff(u) for w in ws}) != 1 for u in fixed):
                return False
            lo = hi = None
            for w in ws:
                wlo, whi = w.offset.const + w.lo, w.offset.const + w.hi
                for u, cu in w.offset.terms:
                    if u not in fixed:
                        span = cu * max(self.var_ranges[u] - 1, 0)
                        wlo, whi = wlo + min(0, span), whi + max(0, span)
                lo = wlo if lo is None else min(lo, wlo)
                hi = whi if hi is None else max(hi, whi)
            if abs(c) <= hi - lo:
                return False
        return True


def owned_indexes(kernel: Block, buffers: tuple[str, ...]) -> tuple[str, ...]:
    """The indexes of ``kernel`` (a child of ``#main`` refining the buffers named) that its output
    owns, in Stripe order; none when its writes are not analysable."""
    if not kernel.idxs:
        return ()
    try:
        own = Ownership(kernel, dict.fromkeys(buffers), depth=0)
    except NotAnalysable:
        return ()
    return tuple(ix.name for ix in kernel.idxs if own.owns(0, ix.name))


__all__ = ["NotAnalysable", "Ownership", "Write", "owned_indexes"]
