"""``stencil`` (the seed's "tensorize"): tile a block so that its inner block is exactly a hardware
stencil (a micro-kernel shape: a 4x4 GEMM tile, a convolution unit's window), for a later pass or
a backend to substitute.

A **stencil** is a list of index roles ``{"name", "size", "outs", "ins"}``. A block matches when
distinct block indexes can be given to the roles so that, for each role's index ``v``, the stride
code listed for each output refinement (``outs``: the ``out``/``inout`` refs, in block order) and
each input refinement (``ins``: the ``in`` refs, in block order) holds. The block must have exactly
as many outputs and inputs as the codes listed. A code is about ``v``'s *flat stride* in that ref,
``Σ_d coeff_d(v) * stride_d`` in elements of the buffer:

* ``0``: ``v`` does not appear in the ref's access at all;
* ``-1``: ``v`` appears and its flat stride is not zero (any stride);
* ``k`` (``1``: contiguous): ``v`` appears with flat stride exactly ``k``.

``size`` ``N`` tiles the index by ``N`` (its range must be ``>= N``; a remainder is excluded by
``tiling.split``'s constraints); ``-1`` takes the whole range.

The **cost** of a match is PlaidML's: ``Π_v ceil(r_v / t_v) * t_v`` (the points run, padding
included) ``+ startup_cost * Π_v ceil(r_v / t_v)`` (one start-up per inner block), where ``t_v`` is
the matched size and 1 for indexes no role takes. The cheapest match over every stencil and every
assignment wins; ties go to the earlier stencil, then to the assignment of earlier block indexes.
A stencil's own ``startup_cost`` overrides the pass's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from stripe.hardware import Hardware
from stripe.ir import Block, RefDir, Refinement, Special
from stripe.passes.registry import register
from stripe.passes.rewrite import Context, rewrite
from stripe.passes.tiling import can_split, parent_sizes, split


@dataclass(frozen=True)
class StencilIdx:
    name: str  # the role's name (recorded in the inner block's attrs)
    size: int  # the tile; -1 for the whole range
    outs: tuple[int, ...]  # one stride code per output ref
    ins: tuple[int, ...]  # one stride code per input ref


@dataclass(frozen=True)
class Stencil:
    idxs: tuple[StencilIdx, ...]
    startup_cost: int | None = None  # overrides the pass's startup_cost


@dataclass(frozen=True)
class StencilConfig:
    reqs: tuple[str, ...]
    outer_set: tuple[str, ...] = ()
    inner_set: tuple[str, ...] = ()
    stencils: tuple[Stencil, ...] = ()
    startup_cost: int = 0


@dataclass(frozen=True)
class Match:
    cost: int
    stencil: int  # position in the config's list
    positions: tuple[int, ...]  # the block index given to each role, by position
    tiles: dict[str, int]
    roles: tuple[tuple[str, str], ...]  # (role name, block index name)


@register("stencil", StencilConfig, reorders=True)
def stencil(program: Block, cfg: StencilConfig, hw: Hardware) -> Block:
    """Matches leaf blocks (no nested blocks or specials, indexes without affines, no local
    allocations) carrying every tag in ``reqs`` that fit some stencil (see the module docstring).
    Rewrites the cheapest match with ``tiling.split``: the matched indexes are tiled by their
    sizes and every other index by 1, so the inner block's index space is exactly the stencil;
    the outer block keeps the name and tags (plus ``outer_set``), the inner one is tagged
    ``inner_set`` and has attrs ``stencil_<role> = <block index>``. Guarantees: every point runs
    once with the same accesses (``split``); only the order of points changes, tile by tile
    (so a reduction index's values may reach an element in another order: ``reorders``).
    Blocks with no match, and every block when there are no stencils, are unchanged."""
    if not cfg.stencils:
        return program

    def fn(block: Block, ctx: Context) -> Block | None:
        if not _is_leaf(block, ctx.parent):
            return None
        best = best_match(block, cfg)
        if best is None:
            return None
        out = split(
            block,
            best.tiles,
            outer_tags=frozenset(cfg.outer_set),
            inner_tags=frozenset(cfg.inner_set),
            parent_sizes=parent_sizes(block, ctx.parent),
        )
        inner = out.stmts[0]
        attrs = tuple((f"stencil_{role}", idx) for role, idx in best.roles)
        return replace(out, stmts=(replace(inner, attrs=inner.attrs + attrs),))

    return rewrite(program, fn, cfg.reqs)


def best_match(block: Block, cfg: StencilConfig) -> Match | None:
    """The cheapest way to fit one of ``cfg.stencils`` to ``block``, or None."""
    outs = [r for r in block.refs if r.dir in (RefDir.OUT, RefDir.INOUT)]
    ins = [r for r in block.refs if r.dir is RefDir.IN]
    best: Match | None = None
    for k, st in enumerate(cfg.stencils):
        if not st.idxs or any(len(role.outs) != len(outs) or len(role.ins) != len(ins) for role in st.idxs):
            continue
        startup = cfg.startup_cost if st.startup_cost is None else st.startup_cost
        candidates = [
            [
                p
                for p, ix in enumerate(block.idxs)
                if (role.size == -1 or ix.range >= role.size > 0)
                and all(stride_fits(c, r, ix.name) for c, r in zip(role.outs, outs))
                and all(stride_fits(c, r, ix.name) for c, r in zip(role.ins, ins))
            ]
            for role in st.idxs
        ]
        for positions in _assignments(candidates):
            m = _match(block, st, k, positions, startup)
            if best is None or (m.cost, m.stencil, m.positions) < (best.cost, best.stencil, best.positions):
                best = m
    return best


def stride_fits(code: int, ref: Refinement, idx: str) -> bool:
    """Whether index ``idx`` appears in ``ref``'s access as stride ``code`` says."""
    coeffs = [int(a.coeff(idx)) for a in ref.access]
    appears = any(coeffs)
    flat = sum(c * d.stride for c, d in zip(coeffs, ref.shape.dims))
    if code == 0:
        return not appears
    if code == -1:
        return appears and flat != 0
    return appears and flat == code


def _is_leaf(block: Block, parent: Block | None) -> bool:
    """A block ``split`` can tile without changing meaning: no nested blocks or specials, and no
    local allocation (a fresh buffer per point would become one shared by a whole tile)."""
    if not can_split(block) or any(isinstance(s, (Block, Special)) for s in block.stmts):
        return False
    parent_names = {r.into for r in parent.refs} if parent is not None else set()
    return all(r.dir is not RefDir.NONE or r.source in parent_names for r in block.refs)


def _assignments(candidates: list[list[int]]) -> Iterator[tuple[int, ...]]:
    """Every choice of one candidate per role, no block index taken twice."""

    def go(k: int, taken: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        if k == len(candidates):
            yield taken
            return
        for p in candidates[k]:
            if p not in taken:
                yield from go(k + 1, (*taken, p))

    return go(0, ())


def _match(block: Block, st: Stencil, k: int, positions: tuple[int, ...], startup: int) -> Match:
    tiles = {ix.name: 1 for ix in block.idxs}
    for role, p in zip(st.idxs, positions):
        ix = block.idxs[p]
        tiles[ix.name] = ix.range if role.size == -1 else role.size
    points, count = 1, 1
    for ix in block.idxs:
        n = -(-ix.range // tiles[ix.name])
        points *= n * tiles[ix.name]
        count *= n
    roles = tuple((role.name, block.idxs[p].name) for role, p in zip(st.idxs, positions))
    return Match(points + startup * count, k, positions, tiles, roles)
