"""``localize``: move a temporary that one nested block uses into it, as a small local allocation.

In a selected block P (and, recursively, in every block inside it) a *temporary* is a refinement
whose contents nothing outside P can observe: in a child of the root (``#main``) a refinement of a
root buffer tagged ``tmp`` (never ``input``/``output``), elsewhere a local allocation. When exactly
one statement block K of P uses a temporary T (other statements of P may only be blocks or specials
that ``zero`` it: a fresh allocation starts at zero, so they become unnecessary and are removed),
T moves into K: K's refinement of T becomes a local allocation (dir none, no ``from_``, K's view's
sizes with dense row-major strides, its ``agg_op``, tags and location), K's access is dropped, and
T leaves P (and the root, when it was a program buffer). Nested views of it in K keep their
accesses (they were relative to K's view) but take the new dense strides.

Why this keeps the meaning (the pass checks each point, refusing otherwise):

* a local allocation is a fresh zero buffer per point of K, so no data may flow between points
  of K through T: either K has one point, or different points of K touch disjoint elements. The
  proof used: every index of K with range > 1 appears alone in one dim of K's access of T with a
  coefficient at least that dim's view size, in a dim no other such index uses, and everything K's
  nested blocks touch lies inside K's view (their accesses' intervals over their boxes);
* T's storage and K's view have the same dtype and strides along the whole chain (no conversion
  or reinterpretation is lost), the buffer's strides are dense, and no special in K touches T;
* for a local allocation (whose accesses ``verify`` does not bound) K's view must also fit the
  allocation; for a program buffer ``verify`` already keeps every touched element inside it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from stripe.hardware import Hardware
from stripe.ir import Block, Dim, RefDir, Refinement, Special, Statement, TensorShape, dense_strides, evolve
from stripe.passes.cleanup import drop_unused_tmps, uses
from stripe.passes.registry import register
from stripe.passes.rewrite import Box, Context, box_of, index_box, is_local, rewrite, stmt_refs
from tile.affine import Affine
from tile.bounds import poly_interval


@dataclass(frozen=True)
class LocalizeConfig:
    reqs: tuple[str, ...] = ("main",)


@register("localize", LocalizeConfig)
def localize(program: Block, cfg: LocalizeConfig, hw: Hardware) -> Block:
    """Matches blocks with every tag in ``reqs``; in each, and in every block inside it, moves each
    temporary used by a single nested block into that block as a local allocation shrunk to its
    view (see the module docstring for the checks). Guarantees: outputs are unchanged; inputs and
    outputs are never localized; ``#main``'s statements stay ``#kernel`` blocks."""

    def fn(block: Block, ctx: Context) -> Block | None:
        out = _localize_tree(block, ctx.parents)
        return None if out is block else out

    return drop_unused_tmps(rewrite(program, fn, cfg.reqs))


def _localize_tree(block: Block, parents: tuple[Block, ...]) -> Block:
    """``block`` with its temporaries localized, then each nested block done the same way."""
    block = _localize_block(block, parents)
    inner = (*parents, block)
    stmts = tuple(_localize_tree(s, inner) if isinstance(s, Block) else s for s in block.stmts)
    return block if stmts == block.stmts else evolve(block, stmts=stmts)


def _temporaries(block: Block, parents: tuple[Block, ...]) -> list[tuple[Refinement, list[Refinement]]]:
    """``(ref, chain up to its buffer)`` for each temporary of ``block``."""
    parent = parents[-1] if parents else None
    out = []
    if len(parents) == 1:
        buffers = {b.into: b for b in parents[0].refs}
        views = Counter(r.source for r in block.refs)
        for r in block.refs:
            buf = buffers.get(r.source)
            if buf is None or "tmp" not in buf.tags or {"input", "output"} & buf.tags:
                continue
            if views[r.source] > 1:  # another view of the same buffer: not tracked
                continue
            if any(not a.is_constant or a.const != 0 for a in r.access):
                continue
            out.append((r, [r, buf]))
    elif parents:
        out = [(r, [r]) for r in block.refs if is_local(r, parent)]
    return out


def _is_zero_fill(s: Statement, name: str) -> bool:
    """A statement that only zero-fills ``name`` (a special, or a block of such specials)."""
    if isinstance(s, Special):
        return s.name == "zero" and not s.inputs and s.outputs == (name,)
    if not isinstance(s, Block) or not s.stmts or not isinstance(s.stmts[0], (Special, Block)):
        return False
    own = [r for r in s.refs if r.source == name]
    if len(own) != 1 or not all(_is_zero_fill(x, own[0].into) for x in s.stmts):
        return False  # (asked first: it fails at once on a fused group, ``uses`` walks it all)
    return uses(s) == {own[0].into}


def _localize_block(block: Block, parents: tuple[Block, ...]) -> Block:
    """Each temporary of ``block`` moved into its one user where it can be. Moving one changes
    only its user (which may take others too) and drops its zero fills, so every temporary is
    tried once against the same statement list: the work grows with temporaries plus statements,
    not their product (long fused chains)."""
    temporaries = _temporaries(block, parents)
    if not temporaries:
        return block
    users_of = _users(block)
    inner_users: dict[int, dict[str, list[int]]] = {}  # _users of statement k (moves keep them)
    stmts = list(block.stmts)
    dropped_stmts: set[int] = set()
    dropped_refs: set[str] = set()
    for t, chain in temporaries:
        users = users_of.get(t.into, [])
        fills = [k for k in users if _is_zero_fill(block.stmts[k], t.into)]
        rest = [k for k in users if k not in fills]
        if len(rest) != 1 or not isinstance(stmts[rest[0]], Block):
            continue
        k = rest[0]
        if k not in inner_users:
            inner_users[k] = _users(stmts[k])
        new_k = _move_into(block, parents, t, chain, stmts[k], inner_users[k])
        if new_k is None:
            continue
        stmts[k] = new_k
        dropped_stmts.update(fills)
        dropped_refs.add(t.into)
    if not dropped_refs:
        return block
    refs = tuple(r for r in block.refs if r.into not in dropped_refs)
    return evolve(block, refs=refs, stmts=tuple(s for j, s in enumerate(stmts) if j not in dropped_stmts))


def _users(block: Block) -> dict[str, list[int]]:
    """For each name, the positions of the statements of ``block`` that touch it (a move into a
    statement keeps the positions of its own statements and what each touches)."""
    out: dict[str, list[int]] = {}
    for k, s in enumerate(block.stmts):
        names = {r.source for r in s.refs} if isinstance(s, Block) else set().union(*stmt_refs(s))
        for n in names:
            out.setdefault(n, []).append(k)
    return out


def _move_into(
    p: Block,
    parents: tuple[Block, ...],
    t: Refinement,
    chain: list[Refinement],
    k: Block,
    k_users: dict[str, list[int]],
) -> Block | None:
    """``k`` holding ``t`` as a local allocation, or None when the checks fail. ``k_users``:
    ``_users(k)``, so that only the statements of ``k`` touching ``t`` are visited (a fused group
    takes one temporary after another)."""
    mine = [r for r in k.refs if r.source == t.into]
    if len(mine) != 1:
        return None
    kr = mine[0]
    buf = chain[-1]
    strides = tuple(d.stride for d in kr.shape.dims)
    if len(kr.access) != len(t.shape.dims) or len(kr.shape.dims) != len(buf.shape.dims):
        return None
    if any(
        tuple(d.stride for d in r.shape.dims) != strides or r.shape.dtype != kr.shape.dtype for r in chain
    ):
        return None
    renamed_clash = kr.into != t.into and any(r.into == kr.into for r in p.refs)
    if strides != dense_strides(buf.shape.sizes) or renamed_clash:
        return None
    box = box_of((*parents, p), k)
    sizes = kr.shape.sizes
    at = k_users.get(kr.into, [])
    if not _inside(k, kr.into, box, sizes, at) or not _disjoint(k, kr, box):
        return None
    if len(chain) == 1:  # a local allocation: k's view must fit it
        for a, s, full in zip(kr.access, sizes, buf.shape.sizes):
            lo, hi = poly_interval(a, box)
            if lo < 0 or hi + s > full:
                return None
    new_strides = dense_strides(sizes)
    shape = kr.shape
    if new_strides != strides:
        shape = TensorShape(kr.shape.dtype, tuple(Dim(s, st) for s, st in zip(sizes, new_strides)))
    local = Refinement(
        RefDir.NONE,
        kr.into,
        tuple(Affine() for _ in sizes),
        shape,
        agg_op=kr.agg_op,
        location=kr.location or t.location or buf.location,
        is_const=kr.is_const,
        tags=kr.tags,
    )
    refs = tuple(local if r is kr else r for r in k.refs)
    if new_strides == strides:  # (a one-element view of a vector, say) nested views stay as they are
        return evolve(k, refs=refs)
    stmts = list(k.stmts)
    for j in at:
        stmts[j] = _restride(stmts[j], kr.into, new_strides)
    return evolve(k, refs=refs, stmts=tuple(stmts))


def _restride(s: Statement, name: str, new: tuple[int, ...]) -> Statement:
    """``s`` with its views of ``name`` (and those nested in them) given the strides ``new``."""
    if not isinstance(s, Block) or all(r.source != name for r in s.refs):
        return s  # others stay as they are
    refs = []
    for r in s.refs:
        if r.source == name:
            dims = tuple(Dim(d.size, n) for d, n in zip(r.shape.dims, new))
            r = evolve(r, shape=TensorShape(r.shape.dtype, dims))
            if any(isinstance(x, Block) for x in s.stmts):
                s = evolve(s, stmts=tuple(_restride(x, r.into, new) for x in s.stmts))
        refs.append(r)
    return evolve(s, refs=tuple(refs))


def _inside(block: Block, name: str, box: Box, sizes: tuple[int, ...], at: list[int]) -> bool:
    """Every nested view of ``block``'s refinement ``name`` lies inside it (positions relative to
    it, summed along the chain, over the nested boxes), keeps its strides, and no special (in
    ``block`` or nested) touches it. ``at``: the positions of ``block``'s statements that touch
    ``name`` (the others need no look)."""
    want = next(r for r in block.refs if r.into == name).shape.dims

    def check(b: Block, nm: str, bx: Box, lo: tuple[int, ...], hi: tuple[int, ...], stmts) -> bool:
        for s in stmts:
            if isinstance(s, Special) and (nm in s.inputs or nm in s.outputs):
                return False
            if not isinstance(s, Block) or all(r.source != nm for r in s.refs):
                continue  # a block that does not view it (most of a long fused chain's)
            sbox = index_box(s, bx)
            if any(a > z for a, z in sbox.values()):
                continue  # runs no point
            for r in s.refs:
                if r.source != nm:
                    continue
                if len(r.access) != len(sizes) or any(
                    d.stride != w.stride for d, w in zip(r.shape.dims, want)
                ):
                    return False
                ivs = [poly_interval(a, sbox) for a in r.access]
                nlo = tuple(_plus(x, iv[0]) for x, iv in zip(lo, ivs))
                nhi = tuple(_plus(x, iv[1]) for x, iv in zip(hi, ivs))
                if any(a < 0 for a in nlo) or any(
                    h + d.size > full for h, d, full in zip(nhi, r.shape.dims, sizes)
                ):
                    return False
                if not check(s, r.into, sbox, nlo, nhi, s.stmts):
                    return False
        return True

    zeros = tuple(0 for _ in sizes)
    return check(block, name, box, zeros, zeros, [block.stmts[j] for j in at])


def _plus(x: int, f: Fraction) -> int:
    """``int(x + f)``, off Fraction's slow path where ``f`` is a whole number (always, in Stripe)."""
    return x + f.numerator if f.denominator == 1 else int(x + f)


def _disjoint(k: Block, kr: Refinement, box: Box) -> bool:
    """Different points of ``k`` touch disjoint elements of its view ``kr`` (given that what they
    touch lies inside the view): each index of range > 1 sits alone in its own dim, scaled by at
    least the view's size there."""
    many = [i.name for i in k.idxs if i.range > 1]
    if not many:
        return True
    owner: dict[str, int] = {}
    for d, a in enumerate(kr.access):
        vs = [v for v in a.vars if v in many]  # the others are constant within one run of k
        if not vs:
            continue
        if len(vs) > 1:
            return False
        c = abs(a.coeff(vs[0]))
        if c < kr.shape.dims[d].size or c == 0:
            return False
        owner[vs[0]] = d
    return set(owner) == set(many)
