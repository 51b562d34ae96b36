"""The checks of ``fusion`` (see its module docstring): what each block is (a leaf, a nest this
pass can see through, or neither), which dims of a refinement fix which index, and the pairs of
indexes two blocks can be fused on (``fused_pairs``), refusing whatever the proof does not cover.

Inside ``remembering()`` every analysis of a block is kept per block object: a chain's fused block
is checked again at every step, and most of it (its inner blocks) is the same objects as before,
so each step costs what it adds, not the whole chain again (5,000-statement chains). The pass
``forget``s the two blocks it fused (nothing asks about them again), and the new block, which
starts with the first one's statements, ``inherit``s that block's folds over them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from stripe.ir import Block, Constant, Intrinsic, Load, LoadIndex, Refinement, Store
from stripe.passes.rewrite import reads_writes
from tile.bounds import poly_interval

_LEAF = (Load, Store, LoadIndex, Constant, Intrinsic)

# ------------------------------------------------------------------------------ memo
# Each thread has its own (``_local.memo``: None outside ``remembering()``): per block id, the
# block (kept alive, so its id is not reused) and its analyses by function name.
_local = threading.local()
_T = TypeVar("_T")
_Memo = dict[int, tuple[Block, dict[str, object]]]


@contextmanager
def remembering() -> Iterator[None]:
    """Analyses of blocks are kept inside (see the module docstring); nested uses share one."""
    outer = getattr(_local, "memo", None)
    _local.memo = {} if outer is None else outer
    try:
        yield
    finally:
        _local.memo = outer


def forget(*blocks: Block) -> None:
    """Drop what is remembered about ``blocks`` themselves (not about the blocks nested in them):
    a chain's fused block is replaced at every step, and keeping each step's block alive made
    the heap, and every garbage collection, grow with the chain."""
    memo: _Memo | None = getattr(_local, "memo", None)
    if memo is None:
        return
    for b in blocks:
        hit = memo.get(id(b))
        if hit is not None and hit[0] is b:
            del memo[id(b)]


_FOLDS = ("_kids_ok", "_spreads", "_reads_writes")  # analyses that fold over a block's statements


def inherit(new: Block, old: Block) -> None:
    """``new``'s statements begin with all of ``old``'s (a chain's fused block is the one before
    plus one inner block): what ``old``'s folds over its statements found carries over, so the
    analyses of ``new`` cost its new statements, not all of them again."""
    memo: _Memo | None = getattr(_local, "memo", None)
    hit = memo.get(id(old)) if memo is not None else None
    if memo is None or hit is None or hit[0] is not old:
        return
    folds = {k: v for k, v in hit[1].items() if k in _FOLDS}
    n = len(old.stmts)
    if not folds or len(new.stmts) < n or any(x is not y for x, y in zip(new.stmts, old.stmts)):
        return
    entry = memo.get(id(new))
    if entry is None or entry[0] is not new:
        entry = memo[id(new)] = (new, {})
    entry[1]["_prefix"] = (n, folds)


def _prefix(block: Block, name: str) -> tuple[int, object]:
    """``(n, value)``: the fold ``name`` over the first ``n`` statements of ``block``, where
    ``inherit`` gave it; else ``(0, None)``."""
    memo: _Memo | None = getattr(_local, "memo", None)
    hit = memo.get(id(block)) if memo is not None else None
    if hit is None or hit[0] is not block or "_prefix" not in hit[1]:
        return 0, None
    n, folds = hit[1]["_prefix"]
    return (n, folds[name]) if name in folds else (0, None)


def _per_block(fn: Callable[[Block], _T]) -> Callable[[Block], _T]:
    """``fn`` remembered per block object inside ``remembering()``; computed afresh outside.
    Results must not be mutated."""
    name = fn.__name__

    def wrapper(block: Block) -> _T:
        memo: _Memo | None = getattr(_local, "memo", None)
        if memo is None:
            return fn(block)
        hit = memo.get(id(block))
        if hit is not None and hit[0] is block:
            found = hit[1]
            if name in found:
                return found[name]  # type: ignore[return-value]
        else:
            found = {}
            memo[id(block)] = (block, found)
        result = found[name] = fn(block)
        return result

    wrapper.__name__ = name
    wrapper.__doc__ = fn.__doc__
    return wrapper


# ------------------------------------------------------------------------------ analysis
def kind(block: Block, parent_refs: set[str]) -> str | None:
    """``leaf`` (only scalar statements), ``nest`` (only blocks, each a leaf or a nest, whose views
    use only their own indexes without affines: what tiling and this pass build), or None for
    anything the pass does not handle."""
    if not sources(block) <= parent_refs:
        return None  # a local allocation (fresh per point of the block): leave it alone
    return _own_kind(block)


@_per_block
def sources(block: Block) -> frozenset[str]:
    """The names of the parent's refinements that ``block``'s refinements view."""
    return frozenset(r.source for r in block.refs)


@_per_block
def _own_kind(block: Block) -> str | None:
    """``kind`` without the parent's part."""
    if "special" in block.tags or not block.idxs:
        return None
    if any(i.affine is not None or i.range <= 0 for i in block.idxs):
        return None
    if all(isinstance(s, _LEAF) for s in block.stmts):
        return "leaf"
    return "nest" if _nested_ok(block) else None


@_per_block
def _nested_ok(block: Block) -> bool:
    if not block.stmts:
        return False
    ok, viewed = _kids_ok(block)
    return ok and viewed <= {r.into for r in block.refs}  # else a local allocation in a child


@_per_block
def _kids_ok(block: Block) -> tuple[bool, frozenset[str]]:
    """Whether every statement of ``block`` is a block passing ``_child_ok``, and the names those
    blocks refine (a fold over the statements: see ``inherit``)."""
    start, seed = _prefix(block, "_kids_ok")
    ok, viewed = seed if seed is not None else (True, frozenset())  # type: ignore[misc]
    more: set[str] = set()
    for child in block.stmts[start:]:
        if not ok:
            break
        if not isinstance(child, Block):
            return False, frozenset()
        more.update(r.source for r in child.refs)
        ok = _child_ok(child)
    return ok, viewed | more


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
    start, seed = _prefix(block, "_spreads")  # a fold over the statements: see ``inherit``
    out: dict[tuple[str, int], tuple[int, int]] = {}
    if seed is not None:
        out.update(seed)  # type: ignore[call-overload]
    for child in block.stmts[start:]:
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


def fixed_dims(block: Block, ref: Refinement) -> dict[int, tuple[str, int, object]]:
    """Dims ``d`` where ``ref``'s access is ``c*v + k`` for an index ``v`` of ``block`` (``c >= 1``)
    and nested views add offsets in ``[0, c)``: ``{d: (v, c, k)}``. Every element touched through
    ``ref`` in such a dim fixes ``v`` (it is ``floor((e - k) / c)``). ``ref`` is one of
    ``block``'s refinements."""
    return _all_fixed(block)[ref.into]


@_per_block
def _all_fixed(block: Block) -> dict[str, dict[int, tuple[str, int, object]]]:
    """``fixed_dims`` of each refinement of ``block``, by name."""
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
            c = c.numerator  # an int: the comparisons below stay off Fraction's slow path
            lo, hi = spreads.get((ref.into, d), (0, 0))
            if 0 <= lo and hi < c:
                out[d] = (a.terms[0][0], c, a.const)
        result[ref.into] = out
    return result


@_per_block
def by_source(block: Block) -> tuple[dict[str, list[Refinement]], dict[str, list[Refinement]]]:
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
    """``reads_writes``, remembering nested blocks' answers too (a fold over the statements: see
    ``inherit``)."""
    start, seed = _prefix(block, "_reads_writes")
    reads, writes = reads_writes(block, _reads_writes, start)
    if seed is not None:
        reads |= seed[0]  # type: ignore[index]
        writes |= seed[1]  # type: ignore[index]
    return reads, writes


@_per_block
def _inout_disjoint(block: Block) -> bool:
    """Every buffer ``block`` both reads and writes has one refinement, whose element fixes every
    index: the block's points touch disjoint elements of it."""
    reads, writes = by_source(block)
    both = set(reads) & set(writes)
    if not both:
        return True
    views: dict[str, list[Refinement]] = {}
    for r in block.refs:
        views.setdefault(r.source, []).append(r)
    fixed = _all_fixed(block)
    names = {i.name for i in block.idxs}
    for src in both:
        refs = views[src]
        if len(refs) != 1 or not {f[0] for f in fixed[refs[0].into].values()} >= names:
            return False
    return True


@_per_block
def _fixed_by_writes(block: Block) -> set[str]:
    """The indexes of ``block`` that every element it writes fixes (``fixed_dims`` of each write)."""
    out = {i.name for i in block.idxs}
    fixed = _all_fixed(block)
    for refs in by_source(block)[1].values():
        for r in refs:
            out &= {f[0] for f in fixed[r.into].values()}
    return out


def fused_pairs(a: Block, b: Block, parent_refs: set[str]) -> list[tuple[str, str]] | None:
    """The ``(A index, B index)`` pairs A and B can be fused on (B's index order), or None."""
    ka, kb = kind(a, parent_refs), kind(b, parent_refs)
    if ka is None or kb is None:
        return None
    ra, wa = by_source(a)
    rb, wb = by_source(b)
    if set(wb) & (set(ra) | set(wa)):
        return None  # B writes what A reads or writes
    if not (_inout_disjoint(a) and _inout_disjoint(b)):
        return None
    ts = sorted(set(wa) & set(rb))
    if not ts:
        return None
    range_a = {i.name: i.range for i in a.idxs}
    range_b = {i.name: i.range for i in b.idxs}
    fixed_a, fixed_b = _all_fixed(a), _all_fixed(b)

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
        b_fixed = [fixed_b[r.into] for r in readers[t]]
        for d, (av, c, k) in fixed_a[writer[t].into].items():
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
