"""``thread``: map a block onto a GPU, its work-groups and the work-items of one work-group.

Only an index that the output **owns** (``stripe.ownership``: points that write one element
agree on every owned index) may be spread over work-items or work-groups: running different owned
values at once never races, and the order in which one element receives its values (the
not-owned indexes, in Stripe order) is the interpreter's: the pass does not reorder.

Shapes produced (``gpu_group`` / ``gpu_thread`` stand for ``outer_set`` / ``inner_set``):

* a **leaf** block ``[i:64, j:64, k:64]`` with ``threads=16`` (``i``, ``j`` owned):
  ``#gpu_group [i:64, j:4, k:1] { #gpu_thread #threads=16 [i:1, j:16, k:64] }``. The owned
  indexes are tiled so that the inner block's owned product is at most ``threads``, the
  contiguous one (smallest output stride) filled first; a not-owned index stays whole in the
  inner block, a loop every work-item runs.
* an **outer/inner pair** (autotile's output: a block whose one statement is a leaf block): the
  outer block becomes the ``gpu_group``, the inner one the ``gpu_thread`` when its owned product
  fits; otherwise the inner block is split again and the middle block is a loop every work-item
  runs (``split_through`` keeps the passthroughs a split with remainders left in the leaf). An
  index split in two by autotile is judged whole (``stripe.ownership``'s split indexes), so
  partial tiles do not hide that the output owns it.

Attrs say what the OpenCL generator needs: ``threads`` (work-items per group: the product of the
thread indexes' ranges) and ``thread_idxs`` (comma-separated) on the ``gpu_thread`` block, and
``group_idxs`` on the ``gpu_group`` block (its other indexes are loops run by the whole group).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stripe.hardware import Hardware
from stripe.ir import Block, Index, RefDir, Special
from stripe.ownership import NotAnalysable, Ownership
from stripe.passes.registry import register
from stripe.passes.rewrite import Context, rewrite
from stripe.passes.tiling import can_split, parent_sizes, split
from tile.affine import Affine


@dataclass(frozen=True)
class ThreadConfig:
    reqs: tuple[str, ...]
    threads: int = 0  # work-items per work-group; 0: the hardware's (the least over exec units)
    outer_set: tuple[str, ...] = ("gpu_group",)
    inner_set: tuple[str, ...] = ("gpu_thread",)


@register("thread", ThreadConfig, reorders=False)
def thread(program: Block, cfg: ThreadConfig, hw: Hardware) -> Block:
    """Matches blocks carrying every tag in ``reqs`` that are a leaf (no nested blocks or
    specials, indexes without affines, no local allocations) or an outer block holding exactly
    one such leaf, with at least one index owned by the output and not mapped already. Rewrites
    them as the module docstring shows. Guarantees: the only changes are tags, attrs and
    ``tiling.split`` of owned indexes (every point runs once with the same accesses, and the
    points writing one element keep their order); the block keeps its name and tags. Other
    blocks are unchanged."""
    threads = cfg.threads or min((u.threads for u in hw.exec_units.values()), default=1)
    threads = max(1, threads)
    group_tags, thread_tags = frozenset(cfg.outer_set), frozenset(cfg.inner_set)

    def fn(block: Block, ctx: Context) -> Block | None:
        if block.tags & (group_tags | thread_tags):
            return None  # mapped already
        parent = ctx.parent
        if _is_leaf(block, parent):
            return _map_leaf(block, parent, threads, group_tags, thread_tags)
        if (
            can_split(block)
            and len(block.stmts) == 1
            and isinstance(block.stmts[0], Block)
            and _is_leaf(block.stmts[0], block, need_split=False)
            and not block.stmts[0].tags & thread_tags
            and _no_locals(block, parent)
        ):
            return _map_pair(block, parent, threads, group_tags, thread_tags)
        return None

    return rewrite(program, fn, cfg.reqs)


def _ownership(block: Block, parent: Block | None) -> Ownership | None:
    """Who owns what in ``block`` and its nested blocks, split indexes judged whole; its
    refinements count in the strides of the parent's views they refine (None: not analysable)."""
    views = {r.into: r.shape.dims for r in parent.refs} if parent is not None else {}
    try:
        return Ownership(block, {r.source: views.get(r.source) for r in block.refs}, tiles=True)
    except NotAnalysable:
        return None


def _map_leaf(block: Block, parent: Block | None, threads: int, group_tags, thread_tags) -> Block | None:
    analysis = _ownership(block, parent)
    if analysis is None:
        return None
    owned = [ix.name for ix in block.idxs if analysis.owns(0, ix.name)]
    if not owned:
        return None
    tiles = _thread_tiles(block, owned, analysis, 0, threads)
    out = split(
        block, tiles, outer_tags=group_tags, inner_tags=thread_tags, parent_sizes=parent_sizes(block, parent)
    )
    inner = _thread_attrs(out.stmts[0], owned)
    return replace(out, stmts=(inner,), attrs=out.attrs + (("group_idxs", ",".join(owned)),))


def _map_pair(block: Block, parent: Block | None, threads: int, group_tags, thread_tags) -> Block | None:
    leaf = block.stmts[0]
    analysis = _ownership(block, parent)
    if analysis is None:
        return None
    owned = [ix.name for ix in leaf.idxs if ix.affine is None and analysis.owns(1, ix.name)]
    if not owned:
        return None
    group_owned = [ix.name for ix in block.idxs if analysis.owns(0, ix.name)]
    product = 1
    for ix in leaf.idxs:
        if ix.name in owned:
            product *= ix.range
    if product <= threads:
        inner = _thread_attrs(replace(leaf, tags=leaf.tags | thread_tags), owned)
    else:
        tiles = _thread_tiles(leaf, owned, analysis, 1, threads)
        middle = split_through(leaf, tiles, thread_tags, parent_sizes(leaf, block))
        if middle is None:
            return None
        inner = replace(middle, stmts=(_thread_attrs(middle.stmts[0], owned),))
    return replace(
        block,
        stmts=(inner,),
        tags=block.tags | group_tags,
        attrs=block.attrs + (("group_idxs", ",".join(group_owned)),),
    )


def split_through(
    leaf: Block, tiles: dict[str, int], inner_tags: frozenset[str], parent_sizes: dict
) -> Block | None:
    """``tiling.split`` of a leaf that may have passthrough indexes (``v_o:1 = v``, as a split
    with remainders leaves them), when they are used only in constraints and ``load_index``:
    each is split as a plain range-1 index, then made a passthrough again in the outer block and
    a passthrough of that one in the inner block, so the constraints still read the tile number.
    None when a passthrough is used in an access (the outer block would count it twice)."""
    through = {ix.name: ix.affine for ix in leaf.idxs if ix.affine is not None}
    if not through:
        return split(leaf, tiles, inner_tags=inner_tags, parent_sizes=parent_sizes)
    if any(leaf.idxs[k].range != 1 for k, ix in enumerate(leaf.idxs) if ix.name in through):
        return None
    if any(v in through for r in leaf.refs for a in r.access for v in a.vars):
        return None
    plain = replace(leaf, idxs=tuple(Index(ix.name, ix.range) for ix in leaf.idxs))
    out = split(plain, {**tiles, **{v: 1 for v in through}}, inner_tags=inner_tags, parent_sizes=parent_sizes)
    inner = out.stmts[0]
    inner_idxs = tuple(
        Index(ix.name, 1, Affine.var(ix.name)) if ix.name in through else ix for ix in inner.idxs
    )
    outer_idxs = tuple(Index(ix.name, 1, through[ix.name]) if ix.name in through else ix for ix in out.idxs)
    return replace(out, idxs=outer_idxs, stmts=(replace(inner, idxs=inner_idxs),))


def _thread_attrs(inner: Block, owned: list[str]) -> Block:
    count = 1
    for ix in inner.idxs:
        if ix.name in owned and ix.affine is None:
            count *= ix.range
    return replace(inner, attrs=inner.attrs + (("threads", count), ("thread_idxs", ",".join(owned))))


def _thread_tiles(
    block: Block, owned: list[str], analysis: Ownership, depth: int, threads: int
) -> dict[str, int]:
    """Tiles for ``block``'s owned indexes whose product is at most ``threads``: the most
    contiguous index first (smallest output stride); a range that fits is taken whole, else its
    largest divisor within the budget when that fills at least half of it (no idle work-items),
    else the budget (the remainder excluded by ``split``'s constraints). Other indexes stay whole."""
    ranges = {ix.name: ix.range for ix in block.idxs}
    order = sorted(owned, key=lambda v: (analysis.stride(depth, v), -owned.index(v)))
    budget = threads
    tiles = {}
    for v in order:
        r = ranges[v]
        if r <= budget:
            t = r
        else:
            d = max(d for d in range(1, budget + 1) if r % d == 0)
            t = d if 2 * d >= budget else budget
        tiles[v] = t
        budget //= t
    return tiles


def _no_locals(block: Block, parent: Block | None) -> bool:
    names = {r.into for r in parent.refs} if parent is not None else set()
    return all(r.dir is not RefDir.NONE or r.source in names for r in block.refs)


def _is_leaf(block: Block, parent: Block | None, need_split: bool = True) -> bool:
    """No nested blocks or specials, and no local allocation (a fresh buffer per point that a
    split would share among a whole tile)."""
    if need_split and not can_split(block):
        return False
    if not block.idxs or any(isinstance(s, (Block, Special)) for s in block.stmts):
        return False
    return _no_locals(block, parent)
