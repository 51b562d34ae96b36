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

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TypeVar

from stripe.hardware import Hardware
from stripe.ir import (
    Block,
    Constant,
    Dim,
    Index,
    Intrinsic,
    Load,
    LoadIndex,
    RefDir,
    Refinement,
    Statement,
    Store,
    TensorShape,
)
from stripe.passes.registry import register
from stripe.passes.rewrite import (
    Context,
    fresh,
    index_uses,
    matches,
    reads_writes,
    rename_refs,
    rewrite,
    substitute_indexes,
)
from stripe.passes.tiling import split
from tile.affine import Affine
from tile.bounds import poly_interval

_LEAF = (Load, Store, LoadIndex, Constant, Intrinsic)


@dataclass(frozen=True)
class FusionConfig:
    parent_reqs: tuple[str, ...] = ("main",)  # blocks whose statement lists are scanned
    a_reqs: tuple[str, ...] = ()  # tags the first (producer) block must carry
    b_reqs: tuple[str, ...] = ()  # tags the second (consumer) block must carry
    a_skip: tuple[str, ...] = ()  # a producer carrying any of these tags is left alone
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
        with _memo():
            return _fuse_statements(parent, cfg)

    return rewrite(program, fn, cfg.parent_reqs)


def _fuse_statements(parent: Block, cfg: FusionConfig) -> Block | None:
    """``parent`` with its adjacent pairs fused, chains included (see ``fusion``), or None."""
    stmts: list[Statement] = list(parent.stmts)
    views = _views(parent)  # the parent's refinements do not change while its statements fuse
    changed, i = False, 0
    while i + 1 < len(stmts):
        a, j = stmts[i], i + 1
        # Initialisers between A and B (zero/copy kernels of other buffers) move before A.
        while j + 1 < len(stmts) and _hoistable(stmts[j], a):
            j += 1
        b, fused = stmts[j], None
        if isinstance(a, Block) and isinstance(b, Block):
            skip = any(t in a.tags for t in cfg.a_skip)
            if not skip and matches(a, cfg.a_reqs) and matches(b, cfg.b_reqs):
                fused = fuse_pair(parent, a, b, cfg, views)
        if fused is None:
            i += 1
            continue
        stmts[i : j + 1] = [*stmts[i + 1 : j], fused]
        changed = True
        # The fused block may now fuse with the block before it (and the specials between).
        i = j - 2
        while i > 0 and isinstance(stmts[i], Block) and "special" in stmts[i].tags:
            i -= 1
        i = max(i, 0)
    return replace(parent, stmts=tuple(stmts)) if changed else None


def _hoistable(s: Statement, a: Statement) -> bool:
    """``s`` is a special kernel that commutes with ``a``: neither writes what the other touches."""
    if not (isinstance(s, Block) and isinstance(a, Block) and "special" in s.tags):
        return False
    rs, ws = (set(x) for x in _by_source(s))
    ra, wa = (set(x) for x in _by_source(a))
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


# ------------------------------------------------------------------------------ memo
# A chain's fused block is checked again at every step, and most of it (its inner blocks) is the
# same objects as before: the analyses below are remembered per block object while one statement
# list fuses, so each step costs what it adds, not the whole chain again (5,000-statement chains).
# Each thread has its own (``_local.memo``: None outside ``_memo()``).
_local = threading.local()
_T = TypeVar("_T")


@contextmanager
def _memo() -> Iterator[None]:
    outer = getattr(_local, "memo", None)
    _local.memo = {} if outer is None else outer
    try:
        yield
    finally:
        _local.memo = outer


def _per_block(fn: Callable[[Block], _T]) -> Callable[[Block], _T]:
    """``fn`` remembered per block object inside ``_memo()`` (the block is kept alive with its
    result, so its id is not reused); computed afresh outside. Results must not be mutated."""

    def wrapper(block: Block) -> _T:
        memo: dict[tuple[str, int], tuple[Block, object]] | None = getattr(_local, "memo", None)
        if memo is None:
            return fn(block)
        key = (fn.__name__, id(block))
        hit = memo.get(key)
        if hit is None or hit[0] is not block:
            hit = memo[key] = (block, fn(block))
        return hit[1]  # type: ignore[return-value]

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


# ------------------------------------------------------------------------------ analysis
def _kind(block: Block, parent_refs: set[str]) -> str | None:
    """``leaf`` (only scalar statements), ``nest`` (only blocks, each a leaf or a nest, whose views
    use only their own indexes without affines: what tiling and this pass build), or None for
    anything the pass does not handle."""
    if any(r.source not in parent_refs for r in block.refs):
        return None  # a local allocation (fresh per point of the block): leave it alone
    return _own_kind(block)


@_per_block
def _own_kind(block: Block) -> str | None:
    """``_kind`` without the parent's part."""
    if "special" in block.tags or not block.idxs:
        return None
    if any(i.affine is not None or i.range <= 0 for i in block.idxs):
        return None
    if all(isinstance(s, _LEAF) for s in block.stmts):
        return "leaf"
    return "nest" if _nested_ok(block) else None


@_per_block
def _nested_ok(block: Block) -> bool:
    if not block.stmts or not all(isinstance(s, Block) for s in block.stmts):
        return False
    names = {r.into for r in block.refs}
    for child in block.stmts:
        if any(r.source not in names for r in child.refs) or not _child_ok(child):
            return False  # a local allocation, or see _child_ok
    return True


@_per_block
def _child_ok(child: Block) -> bool:
    """The part of ``_nested_ok`` that depends on the nested block alone (so it is remembered):
    its views use only its own indexes (none moved by an enclosing index), and it is a leaf or
    nests only such blocks itself."""
    free = {i.name for i in child.idxs if i.affine is None}
    if any(v not in free for r in child.refs for a in r.access for v, _ in a.terms):
        return False
    return all(isinstance(s, _LEAF) for s in child.stmts) or _nested_ok(child)


@_per_block
def _spreads(block: Block) -> dict[tuple[str, int], tuple[int, int]]:
    """The least and greatest offsets that blocks nested in ``block`` add, in dim ``d``, to the
    position of its refinement ``name``: ``{(name, d): (lo, hi)}`` ((0, 0) where absent: the
    block's own loads and stores), every refinement and dim in one walk."""
    out: dict[tuple[str, int], tuple[int, int]] = {}
    for child in block.stmts:
        if isinstance(child, Block):
            for key, (a, b) in _offsets(child).items():
                lo, hi = out.get(key, (0, 0))
                out[key] = (min(lo, a), max(hi, b))
    return out


@_per_block
def _offsets(child: Block) -> dict[tuple[str, int], tuple[int, int]]:
    """What ``child`` adds to ``_spreads`` of the block it is nested in: per ``(source, d)``, the
    offsets its views (and the blocks nested in it) reach, over its indexes. Remembered per block:
    a growing chain's inner blocks are the same objects at every step."""
    box = {i.name: (0, i.range - 1) for i in child.idxs if i.affine is None}
    inner = _spreads(child)
    out: dict[tuple[str, int], tuple[int, int]] = {}
    for r in child.refs:
        for d, acc in enumerate(r.access):
            a, b = poly_interval(acc, box)
            sl, sh = inner.get((r.into, d), (0, 0))
            lo, hi = out.get((r.source, d), (0, 0))
            out[(r.source, d)] = (min(lo, int(a) + sl), max(hi, int(b) + sh))
    return out


def _fixed(block: Block, ref: Refinement) -> dict[int, tuple[str, int, object]]:
    """Dims ``d`` where ``ref``'s access is ``c*v + k`` for an index ``v`` of ``block`` (``c >= 1``)
    and nested views add offsets in ``[0, c)``: ``{d: (v, c, k)}``. Every element touched through
    ``ref`` in such a dim fixes ``v`` (it is ``floor((e - k) / c)``). ``ref`` is one of
    ``block``'s refinements."""
    return _all_fixed(block)[ref.into]


@_per_block
def _all_fixed(block: Block) -> dict[str, dict[int, tuple[str, int, object]]]:
    """``_fixed`` of each refinement of ``block``, by name."""
    idx = {i.name for i in block.idxs}
    spreads = _spreads(block)
    result = {}
    for ref in block.refs:
        out = {}
        for d, a in enumerate(ref.access):
            if len(a.terms) != 1 or a.terms[0][0] not in idx:
                continue
            c = a.terms[0][1]
            if c.denominator != 1 or c.numerator < 1:
                continue
            lo, hi = spreads.get((ref.into, d), (0, 0))
            if 0 <= lo and hi < c:
                out[d] = (a.terms[0][0], int(c), a.const)
        result[ref.into] = out
    return result


@_per_block
def _by_source(block: Block) -> tuple[dict[str, list[Refinement]], dict[str, list[Refinement]]]:
    """The block's refinements that are read and written, by the parent refinement they view."""
    reads, writes = _reads_writes(block)
    r_out: dict[str, list[Refinement]] = {}
    w_out: dict[str, list[Refinement]] = {}
    for r in block.refs:
        if r.into in reads:
            r_out.setdefault(r.source, []).append(r)
        if r.into in writes:
            w_out.setdefault(r.source, []).append(r)
    return r_out, w_out


@_per_block
def _reads_writes(block: Block) -> tuple[set[str], set[str]]:
    """``reads_writes``, remembering nested blocks' answers too."""
    return reads_writes(block, _reads_writes)


@_per_block
def _inout_disjoint(block: Block) -> bool:
    """Every buffer ``block`` both reads and writes passes ``_disjoint_points``."""
    reads, writes = _by_source(block)
    views: dict[str, list[Refinement]] = {}
    for r in block.refs:
        views.setdefault(r.source, []).append(r)
    return all(_disjoint_points(block, views[src]) for src in set(reads) & set(writes))


@_per_block
def _fixed_by_writes(block: Block) -> set[str]:
    """The indexes of ``block`` that every element it writes fixes (``_fixed`` of each write)."""
    out = {i.name for i in block.idxs}
    for refs in _by_source(block)[1].values():
        for r in refs:
            out &= {f[0] for f in _fixed(block, r).values()}
    return out


def _disjoint_points(block: Block, refs: list[Refinement]) -> bool:
    """One refinement whose element fixes every index: the block's points touch disjoint elements."""
    if len(refs) != 1:
        return False
    return {f[0] for f in _fixed(block, refs[0]).values()} >= {i.name for i in block.idxs}


def fused_pairs(a: Block, b: Block, parent_refs: set[str]) -> list[tuple[str, str]] | None:
    """The ``(A index, B index)`` pairs A and B can be fused on (B's index order), or None."""
    ka, kb = _kind(a, parent_refs), _kind(b, parent_refs)
    if ka is None or kb is None:
        return None
    ra, wa = _by_source(a)
    rb, wb = _by_source(b)
    if set(wb) & (set(ra) | set(wa)):
        return None  # B writes what A reads or writes
    if not (_inout_disjoint(a) and _inout_disjoint(b)):
        return None
    ts = sorted(set(wa) & set(rb))
    if not ts:
        return None
    range_a = {i.name: i.range for i in a.idxs}
    range_b = {i.name: i.range for i in b.idxs}

    # Candidates: per T, the dims where A writes c*a + k (+ [0, c)) and B reads c*b + k (+ [0, c)).
    cand: dict[str, dict[int, tuple[str, str]]] = {}
    writer: dict[str, Refinement] = {}
    readers: dict[str, list[Refinement]] = {}
    for t in ts:
        a_refs = [r for r in a.refs if r.source == t]
        if len(a_refs) != 1:
            return None
        writer[t] = a_refs[0]
        readers[t] = [r for r in b.refs if r.source == t]
        per: dict[int, tuple[str, str]] = {}
        b_fixed = [_fixed(b, r) for r in readers[t]]
        for d, (av, c, k) in _fixed(a, writer[t]).items():
            seen = {f.get(d) for f in b_fixed}
            if len(seen) != 1 or None in seen:
                continue
            bv, bc, bk = seen.pop()
            if (bc, bk) == (c, k) and range_a[av] == range_b[bv]:
                per[d] = (av, bv)
        cand[t] = per
    pairs = set.intersection(*(set(cand[t].values()) for t in ts))
    a_count: dict[str, int] = {}
    b_count: dict[str, int] = {}
    for av, bv in pairs:
        a_count[av] = a_count.get(av, 0) + 1
        b_count[bv] = b_count.get(bv, 0) + 1
    pairs = {p for p in pairs if a_count[p[0]] == 1 and b_count[p[1]] == 1}

    while pairs:
        bad: set[tuple[str, str]] = set()
        for t in ts:  # the dims of T that no fused index addresses use no fused index
            dims = {d for d, p in cand[t].items() if p in pairs}
            for d, acc in enumerate(writer[t].access):
                if d not in dims:
                    bad |= {p for p in pairs if p[0] in acc.vars}
                    for r in readers[t]:
                        bad |= {p for p in pairs if p[1] in r.access[d].vars}
        for blk, side in ((a, 0), (b, 1)):  # every write fixes every fused index
            fixed = _fixed_by_writes(blk)
            bad |= {p for p in pairs if p[side] not in fixed}
        if not bad:
            break
        pairs -= bad
    if not pairs:
        return None
    order = [i.name for i in b.idxs]
    return sorted(pairs, key=lambda p: order.index(p[1]))


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
    if cfg.max_refs is not None and len({r.source for r in a.refs + b.refs}) > cfg.max_refs:
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
    _, wa = _by_source(a)
    rb, _ = _by_source(b)
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
    if _kind(a, parent_refs) is None or _kind(b, parent_refs) != "leaf":
        return None
    _, wa = _by_source(a)
    rb, _ = _by_source(b)
    want: dict[str, set[int]] = {}
    for t in set(wa) & set(rb):
        writers = [r for r in a.refs if r.source == t]
        if len(writers) != 1:
            return None
        fa = _fixed(a, writers[0])
        for r in (r for r in b.refs if r.source == t):
            for d, (bv, bc, bk) in _fixed(b, r).items():
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
    return replace(out, idxs=tuple(i for i in out.idxs if i.name not in whole))


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
                i_acc.append(Affine())
                dims.append(Dim(min(r.shape.dims[d].size, parent_sizes[r.source][d]), r.shape.dims[d].stride))
                continue
            fused = Affine.build({to_outer[v]: acc.coeff(v) for v in acc.vars if v in to_outer})
            rest = Affine.build({v: acc.coeff(v) for v in acc.vars if v not in to_outer})
            lo, hi = (int(x) for x in poly_interval(rest, box))
            o_acc.append(fused + acc.const + lo)
            i_acc.append(rest - lo)
            size = min(hi - lo + r.shape.dims[d].size, parent_sizes[r.source][d])
            dims.append(Dim(size, r.shape.dims[d].stride))
        outer_refs.append(replace(r, access=tuple(o_acc), shape=TensorShape(r.shape.dtype, tuple(dims))))
        inner_refs.append(replace(r, access=tuple(i_acc), from_=None))
    inner = replace(block, idxs=tuple(inner_idxs), refs=tuple(inner_refs), tags=block.tags - {"kernel"})
    inner = substitute_indexes(inner, env)
    return outer_refs, [replace(inner, idxs=tuple(inner_idxs) + tuple(through))]


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
        and all(p - p.const == q - q.const for p, q in zip(x.access, y.access))
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
        refs_b = [replace(r, from_=r.source) if r.into in renames else r for r in refs_b]
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
            replace(
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
            replace(r, access=tuple(a + k for a, k in zip(r.access, delta))) if r.source == ref.into else r
            for r in s.refs
        )
        out.append(replace(s, refs=refs))
    return out
