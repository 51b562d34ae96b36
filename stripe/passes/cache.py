"""``cache``: stage the tile views of a block into a local memory, with transfer blocks around the
nested block that uses them; and the staging primitive that ``schedule`` shares.

The primitive (``Region``, ``footprint``, ``chain_of``, ``transfer``, ``restaged``): a *region* of
a block S's refinement P is an origin (constant element offsets from P's base) and sizes. A
transfer block copies it element by element between P and a dense allocation (one index per dim,
passthroughs of S's indexes where its constraints need them, constraints keeping every copied
element inside the buffer when the region may overhang it). ``restaged`` makes a consumer block
refine the allocation instead of P: accesses shifted by the origin and every stride along the
refinement chain below rewritten to the allocation's dense strides (strides count elements of the
underlying buffer, so they change with it). ``footprint`` is what a consumer and its descendants
can touch through a refinement, over their index boxes, so the region covers every load, store
and special that the consumer runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from stripe.hardware import Hardware
from stripe.ir import (
    Block,
    Dim,
    Index,
    Load,
    Location,
    RefDir,
    Refinement,
    Special,
    Store,
    TensorShape,
    dense_strides,
)
from stripe.passes.locate import LocSpec
from stripe.passes.registry import register
from stripe.passes.rewrite import Box, Context, fresh, index_box, is_allocation, reads_writes, rewrite
from tile.affine import Affine
from tile.bounds import poly_interval

Span = tuple[int, int]  # an inclusive element range


# ------------------------------------------------------------------------------ the primitive
def nonempty_box(block: Block, outer: Box) -> Box | None:
    """``rewrite.index_box``, or None when the block has no points."""
    return None if any(i.range <= 0 for i in block.idxs) else index_box(block, outer)


def boxes(ctx: Context, block: Block) -> list[Box] | None:
    """The index boxes of ``ctx``'s blocks (outermost first) and of ``block``, None if one is empty."""
    out: list[Box] = []
    outer: Box = {}
    for b in (*ctx.parents, block):
        box = nonempty_box(b, outer)
        if box is None:
            return None
        out.append(box)
        outer = box
    return out


def _span(a: Affine, box: Box) -> Span:
    lo, hi = poly_interval(a, box)
    return math.floor(lo), math.ceil(hi)


def footprint(block: Block, ref: str, outer: Box) -> list[Span] | None:
    """Per dim, the element range (relative to the base of the view ``block``'s refinement ``ref``
    refines) that ``block`` and its descendants may touch through ``ref``, each touching view
    counted whole; ``[]`` when nothing is touched. None when it cannot be told: a nested view's
    stride differs from its parent's, or the block has no points."""
    box = nonempty_box(block, outer)
    r = block.ref(ref)
    if box is None or any(not a.is_integral for a in r.access):
        return None
    inner = _touched(block, r, box)
    if inner is None or not inner:
        return inner
    out = []
    for a, (lo, hi) in zip(r.access, inner, strict=True):
        alo, ahi = _span(a, box)
        out.append((alo + lo, ahi + hi))
    return out


def _touched(block: Block, r: Refinement, box: Box) -> list[Span] | None:
    """Element ranges relative to ``r``'s own base that ``block``'s statements and nested blocks
    touch through it (``[]`` for none)."""
    spans: list[list[Span]] = []
    for s in block.stmts:
        used = (
            (isinstance(s, Load) and s.from_ == r.into)
            or (isinstance(s, Store) and s.into == r.into)
            or (isinstance(s, Special) and r.into in (*s.inputs, *s.outputs))
        )
        if used:
            spans.append([(0, d.size - 1) for d in r.shape.dims])
        if isinstance(s, Block):
            for c in s.refs:
                if c.source != r.into:
                    continue
                if tuple(d.stride for d in c.shape.dims) != tuple(d.stride for d in r.shape.dims):
                    return None
                sub = footprint(s, c.into, box)
                if sub is None:
                    return None
                if sub:
                    spans.append(sub)
    if not spans:
        return []
    return [(min(s[d][0] for s in spans), max(s[d][1] for s in spans)) for d in range(len(r.access))]


@dataclass(frozen=True)
class Chain:
    """What the buffer under a refinement ``ref`` of a block S looks like from S."""

    sizes: tuple[int, ...]  # the buffer's
    dtype: object  # the buffer's DType
    above: tuple[Span, ...]  # per dim, the range of the accesses above S (of S's ancestors)
    fixed: tuple[int, ...] | None  # those accesses when they are constants, else None


def chain_of(ctx: Context, block: Block, ref: str) -> Chain | None:
    """The buffer under ``block``'s refinement ``ref`` (None when a view along the chain has other
    strides than the buffer, or another rank, so positions are not per-dim sums)."""
    chain = ctx.ref_chain(block, ref)
    bufs = boxes(ctx, block)
    if bufs is None:
        return None
    buf = chain[-1]
    strides = tuple(d.stride for d in buf.shape.dims)
    if any(tuple(d.stride for d in r.shape.dims) != strides for r in chain):
        return None
    # chain[k] (k >= 1) is a refinement of ctx.parents[-k]; its access uses that block's indexes.
    spans = [(0, 0)] * len(strides)
    consts = True
    for k, r in enumerate(chain[1:-1], start=1):
        box = bufs[-1 - k]
        if any(not a.is_integral for a in r.access):
            return None
        spans = [
            (lo + a, hi + b)
            for (lo, hi), (a, b) in zip(spans, (_span(a, box) for a in r.access), strict=True)
        ]
        consts = consts and all(a.is_constant for a in r.access)
    fixed = tuple(lo for lo, _ in spans) if consts else None
    return Chain(buf.shape.sizes, buf.shape.dtype, tuple(spans), fixed)


@dataclass(frozen=True)
class Region:
    """Elements ``origin[d] .. origin[d] + sizes[d] - 1`` of a block's refinement ``ref``."""

    ref: str
    origin: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def elements(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n


@dataclass(frozen=True)
class Transfer:
    """How a transfer block is dressed: its tags, location and name."""

    tags: frozenset[str] = frozenset({"xfer"})
    location: Location | None = None
    name: str = ""


def transfer(
    owner: Block,
    owner_box: Box,
    chain: Chain,
    region: Region,
    local: str,
    *,
    copy_out: bool,
    agg: str,
    dress: Transfer,
) -> Block | None:
    """The block copying ``region`` of ``owner``'s refinement into the dense allocation ``local``
    (or back with ``copy_out``, storing through ``agg``). Elements that may fall outside the buffer
    are excluded by constraints over passthroughs of ``owner``'s indexes; None when that needs the
    position of an ancestor's index (an access above ``owner`` that is not constant)."""
    parent = owner.ref(region.ref)
    taken = {i.name for i in owner.idxs}
    names = [fresh(f"d{d}", taken) for d in range(len(region.sizes))]
    taken.update(names)
    x = [Affine.var(n) for n in names]
    constraints: list[Affine] = []
    through: set[str] = set()
    for d, a in enumerate(parent.access):
        pos = a + region.origin[d] + x[d]  # without the part above ``owner``
        lo, hi = _span(a, owner_box)
        lo += chain.above[d][0] + region.origin[d]
        hi += chain.above[d][1] + region.origin[d] + region.sizes[d] - 1
        if lo >= 0 and hi <= chain.sizes[d] - 1:
            continue
        if chain.fixed is None:
            return None
        pos = pos + chain.fixed[d]
        if lo < 0:
            constraints.append(pos)
        if hi > chain.sizes[d] - 1:
            constraints.append(Affine.constant(chain.sizes[d] - 1) - pos)
        through.update(v for v in a.vars)
    idxs = [Index(n, s) for n, s in zip(names, region.sizes, strict=True)]
    idxs += [Index(v, 1, Affine.var(v)) for v in (i.name for i in owner.idxs) if v in through]
    strides = tuple(d.stride for d in parent.shape.dims)
    src = Refinement(
        RefDir.IN,
        region.ref,
        tuple(xd + o for xd, o in zip(x, region.origin, strict=True)),
        TensorShape(chain.dtype, tuple(Dim(1, s) for s in strides)),
    )
    dst = Refinement(
        RefDir.IN,
        local,
        tuple(x),
        TensorShape(chain.dtype, tuple(Dim(1, s) for s in dense_strides(region.sizes))),
    )
    if copy_out:
        frm, to = dst, replace(src, dir=RefDir.OUT, agg_op=agg)
    else:
        frm, to = src, replace(dst, dir=RefDir.OUT, agg_op=agg)
    return Block(
        dress.name,
        tuple(idxs),
        tuple(constraints),
        (frm, to),
        (Load(frm.into, "$x"), Store("$x", to.into)),
        dress.tags,
        location=dress.location,
    )


def restaged(consumer: Block, ref: str, local: str, region: Region, location: Location | None) -> Block:
    """``consumer`` with each refinement of the parent's ``ref`` refining ``local`` instead: access
    minus the region's origin, strides (here and in every nested view below) the allocation's,
    and the allocation's ``location``."""
    strides = dense_strides(region.sizes)
    refs = []
    for r in consumer.refs:
        if r.source == ref:
            r = replace(
                r,
                from_=local,
                location=location,
                access=tuple(a - o for a, o in zip(r.access, region.origin, strict=True)),
                shape=_restrided(r.shape, strides),
            )
            consumer = _restride_below(consumer, r.into, strides)
        refs.append(r)
    return replace(consumer, refs=tuple(refs))


def _restrided(shape: TensorShape, strides: tuple[int, ...]) -> TensorShape:
    return replace(shape, dims=tuple(Dim(d.size, s) for d, s in zip(shape.dims, strides, strict=True)))


def _restride_below(block: Block, ref: str, strides: tuple[int, ...]) -> Block:
    stmts = []
    for s in block.stmts:
        if isinstance(s, Block):
            refs = []
            for r in s.refs:
                if r.source == ref:
                    s = _restride_below(s, r.into, strides)
                    r = replace(r, shape=_restrided(r.shape, strides))
                refs.append(r)
            s = replace(s, refs=tuple(refs))
        stmts.append(s)
    return replace(block, stmts=tuple(stmts))


def allocation(name: str, region: Region, dtype, location: Location | None) -> Refinement:
    """A dense allocation (dir none) holding a region."""
    shape = TensorShape.dense(dtype, region.sizes)
    return Refinement(
        RefDir.NONE, name, tuple(Affine.constant(0) for _ in region.sizes), shape, location=location
    )


def aliased(ctx: Context, block: Block, ref: str) -> bool:
    """Whether another refinement along the chain of ``ref`` views the same parent (so a write
    through one could change what the other sees)."""
    level, name = block, ref
    for p in (*reversed(ctx.parents), None):
        r = level.ref(name)
        if any(o.into != name and o.source == r.source and not is_allocation(o, p) for o in level.refs):
            return True
        if p is None or not any(q.into == r.source for q in p.refs):
            return False
        level, name = p, r.source
    return False


# ------------------------------------------------------------------------------ the pass
@dataclass(frozen=True)
class CacheConfig:
    reqs: tuple[str, ...]
    mem_loc: LocSpec
    dirs: tuple[str, ...] = ("in",)
    xfer_tags: tuple[str, ...] = ("xfer",)
    ref_reqs: tuple[str, ...] = ()  # only refinements of the selected block with these tags
    xfer_loc: LocSpec | None = None  # where the transfer blocks run


@register("cache", CacheConfig, reorders=True)
def cache(program: Block, cfg: CacheConfig, hw: Hardware) -> Block:
    """Matches blocks B with every tag in ``reqs`` (autotile's outer blocks) and each nested block C
    of B that uses a refinement R of B: with ``"in"`` in ``dirs``, when C only reads R (C's views
    of it are ``in``); with ``"out"``, when R aggregates with ``add`` and C only adds into it (its
    views, and theirs below, are ``out`` with ``add``; no loads, no specials). R must carry
    ``ref_reqs``, view its buffer with the buffer's strides, and share its buffer with no other
    refinement of B or its ancestors.

    Rewrite: B gets a dense allocation ``R_c`` (dir none, location ``mem_loc``) of the region of
    R that C and its descendants can touch (R's view sizes for autotile's tiles; more where a
    clipped view is overhung) and, for ``in``, a transfer block before C (tags ``xfer_tags``,
    location ``xfer_loc``) copying R into R_c; C refines R_c instead of R (accesses shifted by the
    region's origin, dense strides, location ``mem_loc``). For ``out`` C adds into R_c (fresh
    zeros for each point of B) and a transfer block after C adds R_c into R.

    Guarantees: C reads the same values (R_c holds that region of R; where it may overhang the
    buffer, at a partial tile or padding, the copy is constrained to the buffer, and C's own
    constraints never reach the rest) and every element receives the same sum. Outputs with
    ``assign``, ``max``, ``min`` or ``mul`` are not cached: the copy-out would also write the
    elements C never wrote (with zeros or stale values), so it is exact only for an ``add``,
    whose untouched elements add zero. Caching an ``add`` output sums a tile's part before adding
    it, so floats may round differently: the pass is registered as reordering."""
    mem = cfg.mem_loc.location()
    dress = Transfer(frozenset(cfg.xfer_tags), cfg.xfer_loc.location() if cfg.xfer_loc else None)

    def fn(b: Block, ctx: Context) -> Block | None:
        bxs = boxes(ctx, b)
        if bxs is None:
            return None
        box = bxs[-1]
        stmts: list = []
        allocs: list[Refinement] = []
        taken = {r.into for r in b.refs}
        for s in b.stmts:
            if not isinstance(s, Block):
                stmts.append(s)
                continue
            before, after = [], []
            reads, writes = reads_writes(s)
            for r in b.refs:
                found = _cacheable(ctx, b, r, s, cfg, reads, writes, box)
                if found is None:
                    continue
                kind, region = found
                chain = chain_of(ctx, b, r.into)
                local = fresh(f"{r.into}_c", taken)
                x = transfer(
                    b,
                    box,
                    chain,
                    region,
                    local,
                    copy_out=kind == "out",
                    agg="add" if kind == "out" else "assign",
                    dress=replace(dress, name=f"{local} {'->' if kind == 'out' else '<-'} {r.into}"),
                )
                if x is None:
                    continue
                taken.add(local)
                allocs.append(allocation(local, region, chain.dtype, mem))
                s = restaged(s, r.into, local, region, mem)
                (after if kind == "out" else before).append(x)
            stmts += [*before, s, *after]
        if not allocs:
            return None
        return replace(b, refs=b.refs + tuple(allocs), stmts=tuple(stmts))

    return rewrite(program, fn, cfg.reqs)


def _adds_only(block: Block, parents: set[str]) -> bool:
    """Whether every use of ``block``'s views of ``parents``, down the tree, is a store through an
    ``out`` view aggregating with ``add`` (no loads; no specials, which overwrite)."""
    names = {v.into for v in block.refs if v.source in parents}
    if any(v.dir is not RefDir.OUT or v.agg_op != "add" for v in block.refs if v.into in names):
        return False
    for s in block.stmts:
        if isinstance(s, Load) and s.from_ in names:
            return False
        if isinstance(s, Special) and names & {*s.inputs, *s.outputs}:
            return False
        if isinstance(s, Block) and not _adds_only(s, names):
            return False
    return True


def _cacheable(
    ctx, b: Block, r: Refinement, c: Block, cfg: CacheConfig, reads, writes, box
) -> tuple[str, Region] | None:
    """Whether C's use of R can be cached (``"in"`` or ``"out"``), and the region of R that C can
    touch (R's view, or more where C's views overhang it inside the buffer)."""
    views = [v for v in c.refs if v.source == r.into]
    if not views or not all(t in r.tags for t in cfg.ref_reqs) or is_allocation(r, ctx.parent):
        return None
    names = {v.into for v in views}
    if "in" in cfg.dirs and all(v.dir is RefDir.IN for v in views) and not names & writes:
        kind = "in"
    elif "out" in cfg.dirs and r.agg_op == "add" and _adds_only(c, {r.into}):
        kind = "out"
    else:
        return None
    if chain_of(ctx, b, r.into) is None or aliased(ctx, b, r.into):
        return None
    spans: list[Span] = []
    for v in views:
        if tuple(d.stride for d in v.shape.dims) != tuple(d.stride for d in r.shape.dims):
            return None
        fp = footprint(c, v.into, box)
        if fp is None:
            return None
        spans = (
            fp if not spans else [(min(a, c), max(b, d)) for (a, b), (c, d) in zip(spans, fp, strict=True)]
        )
    if not spans:
        return None
    return kind, Region(r.into, tuple(lo for lo, _ in spans), tuple(hi - lo + 1 for lo, hi in spans))
