"""``fusion``: run two adjacent blocks, a producer A and a consumer B, on one outer index space.

The form (the seed's "Fusing Contractions" AFTER picture): when B reads a buffer ``T`` that A
writes, pairs ``(a, b)`` of an A index and a B index that address the same dim of ``T`` (``a + k``
in A's write and ``b + k`` in B's read, the same range) become the indexes of an outer block (with
B's names); per outer point the block runs A' (A's points with ``a = b``) and then B' (B's points
with that ``b``). A' and B' keep their other indexes, their constraints and their statements;
where their constraints, ``load_index`` or nested blocks' index affines need a fused value they get
a passthrough ``b_o:1 = b``. Every refinement splits as in ``tiling``: the outer one holds the part
of the access that depends on fused indexes (plus the constant and the least value of the rest),
sized to what one outer point touches (clipped to its parent), the inner one the rest. A's and B's
outer refinements of one buffer merge into one when they differ only by constants (the inner views
shifted to match), else B's is renamed; ``T``'s covers exactly one outer point: the fused dims'
element (or tile), the other dims whole.

Tiles: A may be a tiled block (``tiling.split``, ``autotile``): it writes ``T`` at ``c*a + k`` plus
nested offsets in ``[0, c)``. Then a leaf B reading ``T`` at ``b + k`` is first split into tiles of
``c`` on ``b`` (its untiled indexes left whole), and the two fuse on the tile numbers; blocks that
are both tiled alike pair directly (same ``c`` and ``k``, same range).

Why the meaning is kept (what the pass checks, refusing otherwise):

* every element of ``T`` that A writes fixes every fused index (for each fused ``a``, some dim of
  A's write is ``c*a + k`` with nested offsets in ``[0, c)``, so ``a = floor((e - k) / c)``), and B
  reads that element only at the outer point with those values (``c*b + k``, the same ``c`` and
  ``k``); the other dims use no fused index on either side. So all of A's writes to what B' reads at
  an outer point are done before it, and none come later;
* every other write of A and of B also fixes every fused index, so points writing one element
  stay in one outer point and keep their order (the pass does not reorder aggregation);
* B writes nothing A reads or writes; a buffer a block both reads and writes has one refinement
  that fixes every index of that block (its points touch disjoint elements);
* no local allocations, specials, index affines or aliased buffers in the parent; nested blocks'
  views use only their own indexes (no affines), so the analysis above sees every offset.

A block fused on all of its indexes whose statements are blocks (one this pass built, or a tiled
consumer) gives its inner blocks to the new outer block, so chains stay one level deep; a block
fused on some of its indexes becomes the inner block A' (a tiled contraction keeps its reduction
tiles there). Inner blocks keep their tags except ``kernel``. Special kernels between A and B that
commute with A (initialisers of other buffers, as before a contraction) move before A so that A
and B meet; after a fusion the block before is tried again, so ``A, B, C`` fuses whichever pair
qualifies first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stripe.gemm import match as gemm_match
from stripe.hardware import Hardware
from stripe.ir import Block, Dim, Index, RefDir, Refinement, Statement, TensorShape, evolve
from stripe.passes.fusion_checks import (
    by_source,
    fixed_dims,
    forget,
    fused_pairs,
    inherit,
    kind,
    remembering,
    sources,
)
from stripe.passes.registry import register
from stripe.passes.rewrite import (
    Context,
    fresh,
    index_uses,
    matches,
    rename_refs,
    rewrite,
    substitute_indexes,
)
from stripe.passes.tiling import split
from tile.affine import Affine
from tile.bounds import poly_interval


@dataclass(frozen=True)
class FusionConfig:
    parent_reqs: tuple[str, ...] = ("main",)  # blocks whose statement lists are scanned
    a_reqs: tuple[str, ...] = ()  # tags the first (producer) block must carry
    b_reqs: tuple[str, ...] = ()  # tags the second (consumer) block must carry
    a_skip: tuple[str, ...] = ()  # a producer carrying any of these tags is left alone
    a_gemm: bool = False  # only a producer that stripe.gemm.match reads as a GEMM (llvm_cpu)
    fused_set: tuple[str, ...] = ("fused",)  # tags added to the fused outer block
    max_refs: int | None = None  # refuse when the fused block would have more refinements
    # Refuse unless every index of B (of its tiles, when B is tiled to match A) is fused, so B'
    # has no loops of its own: a broadcasting consumer would rerun a whole loop per outer point.
    b_fully_fused: bool = False


@register("fusion", FusionConfig, reorders=False)
def fusion(program: Block, cfg: FusionConfig, hw: Hardware) -> Block:
    """Matches blocks with every tag in ``parent_reqs`` and scans their statements: each adjacent
    pair of blocks A (tags ``a_reqs``) then B (tags ``b_reqs``) that the module docstring's checks
    accept becomes one outer block named ``A.name+B.name`` with tags A's ∪ B's ∪ ``fused_set``
    holding A' and B' (``a_skip``: tags that keep A out, as ``split_reduction`` marks its partial
    blocks, whose lanes fusion would make serial again); the result is tried again with the
    statements before and after it, so chains fuse. ``max_refs`` caps the fused block's
    refinements; ``b_fully_fused`` refuses pairs where B (or its tiles) would keep loops of its own
    inside the fused block.
    Guarantees: every point of A and of B runs once, with the same elements, and every element
    receives its writes in the same order as before; pairs that fail a check stay as they were."""

    def fn(parent: Block, ctx: Context) -> Block | None:
        if not _unaliased(parent, ctx):
            return None
        with remembering():
            return _fuse_statements(parent, cfg)

    return rewrite(program, fn, cfg.parent_reqs)


def _fuse_statements(parent: Block, cfg: FusionConfig) -> Block | None:
    """``parent`` with its adjacent pairs fused, chains included (see ``fusion``), or None."""
    stmts: list[Statement] = list(parent.stmts)
    views = _views(parent)  # the parent's refinements do not change while its statements fuse
    # their dtypes, for a_gemm's match: once per parent, not once per pair (that was quadratic)
    dtypes = {r.into: r.shape.dtype for r in parent.refs} if cfg.a_gemm else {}
    changed, i = False, 0
    while i + 1 < len(stmts):
        a, j = stmts[i], i + 1
        # Initialisers between A and B (zero/copy kernels of other buffers) move before A.
        while j + 1 < len(stmts) and _hoistable(stmts[j], a):
            j += 1
        b, fused = stmts[j], None
        if isinstance(a, Block) and isinstance(b, Block):
            skip = any(t in a.tags for t in cfg.a_skip)
            if not skip and matches(a, cfg.a_reqs) and matches(b, cfg.b_reqs) and _gemm(a, dtypes, cfg):
                fused = fuse_pair(parent, a, b, cfg, views)
        if fused is None:
            i += 1
            continue
        stmts[i : j + 1] = [*stmts[i + 1 : j], fused]
        inherit(fused, a)  # a chain's fused block starts with A's statements
        forget(a, b)  # replaced: only the blocks nested in them are asked about again
        changed = True
        # The fused block may now fuse with the block before it (and the specials between).
        i = j - 2
        while i > 0 and isinstance(stmts[i], Block) and "special" in stmts[i].tags:
            i -= 1
        i = max(i, 0)
    return evolve(parent, stmts=tuple(stmts)) if changed else None


def _gemm(a: Block, dtypes: dict, cfg: FusionConfig) -> bool:
    """Unless ``a_gemm``, True; else whether ``a`` is a GEMM-shaped contraction (``stripe.gemm``)
    over the parent's views (``dtypes``: their dtypes by name)."""
    # the names as a view of the dict (match only asks whether a name is one), not a tuple copied
    # per pair and searched per operand: with 5,000 buffers that was quadratic
    return not cfg.a_gemm or gemm_match(a, dtypes.keys(), dtypes, reorder=False) is not None  # type: ignore[arg-type]


def _hoistable(s: Statement, a: Statement) -> bool:
    """``s`` is a special kernel that commutes with ``a``: neither writes what the other touches."""
    if not (isinstance(s, Block) and isinstance(a, Block) and "special" in s.tags):
        return False
    rs, ws = (set(x) for x in by_source(s))
    ra, wa = (set(x) for x in by_source(a))
    return not (ws & (ra | wa) or rs & wa)


def _unaliased(parent: Block, ctx: Context) -> bool:
    """No two refinements of ``parent`` view the same root buffer (so names compare buffers)."""
    levels = [{r.into: r for r in p.refs} for p in reversed(ctx.parents)]  # one table per level
    roots = []
    for r in parent.refs:
        for level in levels:  # as ``Context.ref_chain``, without its linear search per name
            if r.source not in level:
                break
            r = level[r.source]
        roots.append(r.into)
    return len(roots) == len(set(roots))


# ------------------------------------------------------------------------------ rewrite
def _views(parent: Block) -> tuple[set[str], dict[str, tuple[int, ...]]]:
    """The parent's refinement names and their sizes."""
    return {r.into for r in parent.refs}, {r.into: r.shape.sizes for r in parent.refs}


def fuse_pair(
    parent: Block,
    a: Block,
    b: Block,
    cfg: FusionConfig,
    views: tuple[set[str], dict[str, tuple[int, ...]]] | None = None,
) -> Block | None:
    """The fused block of A then B, or None where the checks refuse (see the module docstring).
    ``views``: ``_views(parent)``, when the caller has it."""
    parent_refs, sizes = views or _views(parent)
    if cfg.max_refs is not None and len(sources(a) | sources(b)) > cfg.max_refs:
        return None  # each buffer needs a refinement of its own: refused before the work
    for candidate in (_tiled_to_match(a, b, parent_refs, sizes), b):  # B in A's tiles, else as is
        if candidate is None:
            continue
        pairs = fused_pairs(a, candidate, parent_refs)
        if pairs is not None and not (cfg.b_fully_fused and len(pairs) < len(candidate.idxs)):
            b = candidate
            break
    else:
        return None
    part_a = _part(a, {av: bv for av, bv in pairs}, sizes)
    part_b = _part(b, {bv: bv for _, bv in pairs}, sizes)
    _, wa = by_source(a)
    rb, _ = by_source(b)
    refs, stmts = _merge(part_a, part_b, set(wa) & set(rb), sizes)
    if cfg.max_refs is not None and len(refs) > cfg.max_refs:
        return None
    range_b = {i.name: i.range for i in b.idxs}
    return Block(
        name=f"{a.name}+{b.name}",
        idxs=tuple(Index(bv, range_b[bv]) for _, bv in pairs),
        refs=tuple(refs),
        stmts=tuple(stmts),
        tags=a.tags | b.tags | frozenset(cfg.fused_set),
    )


def _tiled_to_match(
    a: Block, b: Block, parent_refs: set[str], sizes: dict[str, tuple[int, ...]]
) -> Block | None:
    """B split into tiles of A's (``tiling.split``) where A writes ``T`` by tiles (``c*a + k`` with
    nested offsets in ``[0, c)``) and leaf B reads it element by element (``b + k``); None when
    there is nothing to match."""
    if kind(a, parent_refs) is None or kind(b, parent_refs) != "leaf":
        return None
    _, wa = by_source(a)
    rb, _ = by_source(b)
    want: dict[str, set[int]] = {}
    for t in set(wa) & set(rb):
        writers = [r for r in a.refs if r.source == t]
        if len(writers) != 1:
            return None
        fa = fixed_dims(a, writers[0])
        for r in (r for r in b.refs if r.source == t):
            for d, (bv, bc, bk) in fixed_dims(b, r).items():
                if d in fa and fa[d][1] > 1 and bc == 1 and fa[d][2] == bk:
                    want.setdefault(bv, set()).add(fa[d][1])
    tiles = {v: cs.pop() for v, cs in want.items() if len(cs) == 1}
    if not tiles:
        return None
    out = split(
        b,
        tiles,
        inner_tags=b.tags - {"kernel"},
        parent_sizes={r.into: sizes[r.source] for r in b.refs},
    )
    whole = [i.name for i in b.idxs if i.name not in tiles]  # range 1 in the outer block: drop them
    out = substitute_indexes(out, {v: Affine.constant(0) for v in whole})
    return evolve(out, idxs=tuple(i for i in out.idxs if i.name not in whole))


Part = tuple[list[Refinement], list[Block]]  # outer refinements (outer index names), inner blocks


def _part(block: Block, to_outer: dict[str, str], sizes: dict[str, tuple[int, ...]]) -> Part:
    fully = {i.name for i in block.idxs} <= set(to_outer)
    if fully and not block.constraints and all(isinstance(s, Block) for s in block.stmts):
        return _lift(block, to_outer)
    return _split(block, to_outer, sizes)


def _split(block: Block, to_outer: dict[str, str], parent_sizes: dict[str, tuple[int, ...]]) -> Part:
    """A block as outer refinements and the inner block over its non-fused indexes."""
    inner_idxs = [i for i in block.idxs if i.name not in to_outer]
    used = index_uses(block)
    taken = {i.name for i in inner_idxs}
    through: list[Index] = []
    env: dict[str, Affine] = {}
    for i in block.idxs:
        if i.name in to_outer and i.name in used:
            name = fresh(f"{to_outer[i.name]}_o", taken)
            taken.add(name)
            through.append(Index(name, 1, Affine.var(to_outer[i.name])))
            env[i.name] = Affine.var(name)

    box = {i.name: (0, i.range - 1) for i in inner_idxs}
    outer_refs, inner_refs = [], []
    for r in block.refs:
        o_acc, i_acc, dims = [], [], []
        for d, acc in enumerate(r.access):
            if all(to_outer.get(v) == v for v, _ in acc.terms):  # all fused, same names: as it is
                o_acc.append(acc)
                i_acc.append(_ZERO)
                dim = r.shape.dims[d]
                size = min(dim.size, parent_sizes[r.source][d])
                dims.append(dim if size == dim.size else Dim(size, dim.stride))
                continue
            fused = Affine.build({to_outer[v]: acc.coeff(v) for v in acc.vars if v in to_outer})
            rest = Affine.build({v: acc.coeff(v) for v in acc.vars if v not in to_outer})
            lo, hi = (int(x) for x in poly_interval(rest, box))
            o_acc.append(fused + acc.const + lo)
            i_acc.append(rest - lo)
            size = min(hi - lo + r.shape.dims[d].size, parent_sizes[r.source][d])
            dims.append(Dim(size, r.shape.dims[d].stride))
        o_acc, dims = tuple(o_acc), tuple(dims)
        if o_acc == r.access and dims == r.shape.dims:
            outer_refs.append(r)  # the view as it was (a leaf fused on all its indexes)
        else:
            outer_refs.append(evolve(r, access=o_acc, shape=TensorShape(r.shape.dtype, dims)))
        inner_refs.append(evolve(r, access=tuple(i_acc), from_=None))
    inner = evolve(block, idxs=tuple(inner_idxs), refs=tuple(inner_refs), tags=block.tags - {"kernel"})
    inner = substitute_indexes(inner, env)
    return outer_refs, [evolve(inner, idxs=tuple(inner_idxs) + tuple(through))]


_ZERO = Affine()


def _lift(block: Block, to_outer: dict[str, str]) -> Part:
    """A block this pass built, fused on all its indexes: its refinements and inner blocks, with its
    index names replaced by the outer ones."""
    renamed = substitute_indexes(block, {v: Affine.var(o) for v, o in to_outer.items()})
    return list(renamed.refs), [s for s in renamed.stmts if isinstance(s, Block)]


def _mergeable(x: Refinement, y: Refinement) -> bool:
    return (
        x.source == y.source
        and x.shape.dtype == y.shape.dtype
        and [d.stride for d in x.shape.dims] == [d.stride for d in y.shape.dims]
        and x.location == y.location
        and all(p.terms == q.terms for p, q in zip(x.access, y.access))  # equal but for constants
    )


def _merge(part_a: Part, part_b: Part, ts: set[str], parent_sizes: dict[str, tuple[int, ...]]) -> Part:
    """The outer block's refinements and statements: A's and B's refinements, one per buffer where
    they differ only by constants (the inner views shifted to match), B's renamed otherwise. A
    buffer in ``ts`` (written by A, read by B) is viewed whole in its dims without fused indexes."""
    refs_a, stmts_a = part_a
    refs_b, stmts_b = part_b
    own_a = {r.into: r for r in refs_a}
    taken = set(own_a) | {r.into for r in refs_b}
    renames = {}
    for r in refs_b:
        if r.into in own_a and not _mergeable(own_a[r.into], r):
            renames[r.into] = fresh(r.into, taken)
            taken.add(renames[r.into])
    if renames:
        refs_b = [evolve(r, from_=r.source) if r.into in renames else r for r in refs_b]
        wrapped = rename_refs(Block(refs=tuple(refs_b), stmts=tuple(stmts_b)), renames)
        refs_b, stmts_b = list(wrapped.refs), list(wrapped.stmts)

    own_b = {r.into: r for r in refs_b}
    out = []
    for r in refs_a + [r for r in refs_b if r.into not in own_a]:
        group = [x for x in (own_a.get(r.into), own_b.get(r.into)) if x is not None]
        if len(group) == 1 and r.source not in ts:
            out.append(r)
            continue
        starts, dims, access = [], [], []
        for d, acc in enumerate(r.access):
            var = acc - acc.const
            lo = min(int(x.access[d].const) for x in group)
            hi = max(int(x.access[d].const) + x.shape.dims[d].size for x in group)
            if r.source in ts and var.is_constant:
                lo, hi = 0, parent_sizes[r.source][d]
            starts.append(lo)
            access.append(var + lo)
            dims.append(Dim(min(hi - lo, parent_sizes[r.source][d]), r.shape.dims[d].stride))
        stmts_a = _shift(stmts_a, own_a.get(r.into), starts)
        stmts_b = _shift(stmts_b, own_b.get(r.into), starts)
        out.append(
            evolve(
                r,
                dir=_join(x.dir for x in group),
                access=tuple(access),
                shape=TensorShape(r.shape.dtype, tuple(dims)),
                agg_op=r.agg_op if all(x.agg_op == r.agg_op for x in group) else "",
                is_const=all(x.is_const for x in group),
                tags=frozenset().union(*(x.tags for x in group)),
            )
        )
    return out, stmts_a + stmts_b


def _join(dirs: Iterable[RefDir]) -> RefDir:
    found = set(dirs)
    return found.pop() if len(found) == 1 else RefDir.INOUT


def _shift(stmts: list[Block], ref: Refinement | None, starts: list[int]) -> list[Block]:
    """``stmts`` with the views of ``ref`` moved so that positions stay the same once ``ref``'s
    constant offsets become ``starts``."""
    if ref is None:
        return stmts
    delta = [int(a.const) - s for a, s in zip(ref.access, starts)]
    if not any(delta):
        return stmts
    out = []
    for s in stmts:
        refs = tuple(
            evolve(r, access=tuple(a + k for a, k in zip(r.access, delta))) if r.source == ref.into else r
            for r in s.refs
        )
        out.append(evolve(s, refs=refs))
    return out
