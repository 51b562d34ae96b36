"""Splitting a block into an outer block of tiles and an inner block over one tile.

``split(block, tiles, outer_tags=..., inner_tags=...)`` is the one tiling rewrite that autotile,
stencil (tensorize) and thread mapping share. For each index ``v`` of range ``r`` and tile ``t``
(``tiles[v]``; missing means ``r``, the whole range in the inner block):

* the **outer** block keeps the block's name, tags (plus ``outer_tags``) and comments, and has
  index ``v`` of range ``ceil(r / t)``: tile number ``V``;
* the **inner** block (tags ``inner_tags``) has index ``v`` of range ``t`` and, where its
  constraints or ``load_index`` need the tile number, a passthrough ``v_o:1 = v``; the original
  index value is ``t*V + v``;
* each refinement splits in two: the outer one (same name, same parent) is offset by
  ``Σ c_v t_v V`` (plus the constant and the inner part's least value) and sized to cover one
  tile's accesses (clipped to its parent's size), the inner one refines it with the rest of the
  access and the original view size;
* the original constraints move to the inner block rewritten over ``t*V + v``, and an index whose
  tile does not divide its range gets ``r - 1 - t*V - v >= 0``: remainders are excluded by
  constraints, never by reading past a buffer.

Every point of the original block is run exactly once (as inner point ``v`` of tile ``V``), with
the same element positions, so the meaning is unchanged; what changes is the order of points:
tile by tile. ``can_split`` says whether a block has the form this handles (no index affines).
"""

from __future__ import annotations

from dataclasses import replace

from stripe.ir import Block, Dim, Index, LoadIndex, Refinement, Statement, TensorShape
from stripe.passes.rewrite import fresh, index_uses, passthrough
from tile.affine import Affine
from tile.bounds import poly_interval


def can_split(block: Block) -> bool:
    return bool(block.idxs) and all(i.affine is None and i.range > 0 for i in block.idxs)


def parent_sizes(block: Block, parent: Block | None) -> dict[str, tuple[int, ...]]:
    """Per refinement of ``block``, the sizes of the parent view it refines (for ``split``)."""
    if parent is None:
        return {}
    views = views_of(parent)
    return {r.into: views[r.source].shape.sizes for r in block.refs if r.source in views}


class Views:
    """A block's refinements by name, and their dtypes (what ``stripe.gemm.match`` takes)."""

    __slots__ = ("by_name", "dtypes", "names")

    def __init__(self, block: Block):
        self.by_name = {r.into: r for r in block.refs}
        self.dtypes = {r.into: r.shape.dtype for r in block.refs}
        self.names = tuple(self.dtypes)


_LAST: tuple[Block | None, Views | None] = (None, None)


def tables_of(parent: Block) -> Views:
    """``Views`` of ``parent``, kept for the last parent asked about: the passes ask once per child
    block, and building the tables each time made them quadratic in a program's length (a
    5,000-statement program's ``main`` has 5,000 views). Blocks are immutable, so the same object
    has the same refinements."""
    global _LAST
    last = _LAST
    if last[0] is not parent:
        last = _LAST = (parent, Views(parent))
    return last[1]  # type: ignore[return-value]


def views_of(parent: Block) -> dict[str, Refinement]:
    """``parent``'s refinements by name (``tables_of``)."""
    return tables_of(parent).by_name


def split(
    block: Block,
    tiles: dict[str, int],
    *,
    outer_tags: frozenset[str] | set[str] = frozenset(),
    inner_tags: frozenset[str] | set[str] = frozenset(),
    parent_sizes: dict[str, tuple[int, ...]] | None = None,
) -> Block:
    """The outer block holding the inner one (see the module docstring). ``parent_sizes`` gives,
    per refinement, the sizes of the view it refines, to clip outer views to (default: none)."""
    assert can_split(block), "split needs indexes without affines"
    t = {i.name: max(1, min(tiles.get(i.name, i.range), i.range)) for i in block.idxs}
    outer_range = {i.name: -(-i.range // t[i.name]) for i in block.idxs}
    names = {i.name for i in block.idxs}

    # Which tile numbers the inner block must see: those in constraints, load_index, nested
    # blocks' index affines, or a remainder constraint.
    used = index_uses(block)
    for i in block.idxs:
        if i.range % t[i.name]:
            used.add(i.name)
    through = [v for v in (i.name for i in block.idxs) if v in used and outer_range[v] > 1]
    taken = set(names)
    pname = {}
    for v in through:
        pname[v] = fresh(f"{v}_o", taken)
        taken.add(pname[v])
    whole = {
        v: Affine.var(v) + Affine.var(pname[v]) * t[v] if v in pname else Affine.var(v) for v in names
    }

    inner_box = {v: (0, t[v] - 1) for v in names}
    outer_refs: list[Refinement] = []
    inner_refs: list[Refinement] = []
    for r in block.refs:
        o_acc, i_acc, dims = [], [], []
        for d, a in enumerate(r.access):
            tile_part = Affine.build({v: a.coeff(v) * t[v] for v in a.vars if v in names})
            inner_part = Affine.build({v: a.coeff(v) for v in a.vars if v in names})
            lo, hi = (int(x) for x in poly_interval(inner_part, inner_box))
            o_acc.append(tile_part + a.const + lo)
            i_acc.append(inner_part - lo)
            size = hi - lo + r.shape.dims[d].size
            if parent_sizes and r.into in parent_sizes:
                size = min(size, parent_sizes[r.into][d])
            dims.append(Dim(size, r.shape.dims[d].stride))
        outer_refs.append(replace(r, access=tuple(o_acc), shape=TensorShape(r.shape.dtype, tuple(dims))))
        inner_refs.append(replace(r, access=tuple(i_acc), from_=None))

    constraints = [c.substitute(whole) for c in block.constraints]
    for i in block.idxs:
        if i.range % t[i.name]:
            constraints.append(Affine.constant(i.range - 1) - whole[i.name])
    stmts: list[Statement] = []
    for s in block.stmts:
        if isinstance(s, LoadIndex):
            s = replace(s, affine=s.affine.substitute(whole))
        elif isinstance(s, Block):
            s = replace(
                s,
                idxs=tuple(
                    replace(i, affine=i.affine.substitute(whole)) if i.affine is not None else i
                    for i in s.idxs
                ),
            )
        stmts.append(s)
    inner = Block(
        block.name,
        tuple(Index(i.name, t[i.name]) for i in block.idxs) + tuple(passthrough(v) for v in through),
        tuple(constraints),
        tuple(inner_refs),
        tuple(stmts),
        frozenset(inner_tags),
    )
    inner = _rename_passthroughs(inner, pname)
    return replace(
        block,
        idxs=tuple(Index(i.name, outer_range[i.name]) for i in block.idxs),
        constraints=(),
        refs=tuple(outer_refs),
        stmts=(inner,),
        tags=block.tags | frozenset(outer_tags),
    )


def _rename_passthroughs(inner: Block, pname: dict[str, str]) -> Block:
    """``passthrough(v)`` names the index ``v``; give it its fresh name ``pname[v]`` (its affine
    still reads the outer ``v``)."""
    idxs = tuple(
        Index(pname[i.name], 1, i.affine) if i.affine is not None and i.name in pname else i
        for i in inner.idxs
    )
    return replace(inner, idxs=idxs)
