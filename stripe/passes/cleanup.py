"""The clean-up passes: ``dead_code``, ``prune_indexes``, ``prune_refs``, ``reduce_constraints``.

Each removes what provably has no effect, so the rewritten program computes exactly what it did:

* ``dead_code``: statements whose results nobody observes (a backward liveness walk over each
  block's statements: a kernel or store survives only when it writes something live; scalars only
  when a surviving statement uses them), then the ``tmp`` buffers no kernel uses any more.
* ``prune_indexes``: range-1 indexes that nothing uses (a range-1 index without an affine is always
  0, so it is replaced by 0 first).
* ``prune_refs``: refinements that no statement and no nested block uses.
* ``reduce_constraints``: constraints every point of the index box satisfies.

Program inputs and outputs (root refs tagged ``input``/``output``) are never removed, and every
statement of ``#main`` stays a ``#kernel`` block. Shared helpers the other passes use:
``uses``, ``drop_unused_tmps``, ``apply_inside`` (index boxes and allocation tests are in
``stripe.passes.rewrite``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from stripe.hardware import Hardware
from stripe.ir import (
    Block,
    Constant,
    Index,
    Intrinsic,
    Load,
    LoadIndex,
    Special,
    Statement,
    Store,
    evolve,
)
from stripe.passes.registry import register
from stripe.passes.rewrite import (
    Context,
    box_of,
    index_uses,
    is_local,
    reads_writes,
    rewrite,
    stmt_refs,
    substitute_indexes,
)
from tile.affine import Affine
from tile.bounds import poly_interval


@dataclass(frozen=True)
class CleanupConfig:
    reqs: tuple[str, ...] = ("main",)


# ------------------------------------------------------------------------------ helpers


def uses(block: Block) -> set[str]:
    """Names of ``block``'s refinements that its own statements use or nested blocks refine."""
    out: set[str] = set()
    for s in block.stmts:
        if isinstance(s, Block):
            out.update(r.source for r in s.refs)
        else:
            out.update(*stmt_refs(s))
    return out


def _protected(program: Block) -> set[str]:
    return {r.into for r in program.refs if "tmp" not in r.tags or {"input", "output"} & r.tags}


def drop_unused_tmps(program: Block) -> Block:
    """``program`` without the ``tmp`` root buffers (and their ``#main`` refinements) that no
    statement of ``#main`` uses."""
    keep = _protected(program)
    used: set[str] = set()
    stmts: list[Statement] = []
    for s in program.stmts:
        if isinstance(s, Block):
            u = uses(s)
            gone = {r.into for r in s.refs if r.source not in keep and r.into not in u}
            s = evolve(s, refs=tuple(r for r in s.refs if r.into not in gone))
            used.update(r.source for r in s.refs)
        stmts.append(s)
    refs = tuple(r for r in program.refs if r.into in keep or r.into in used)
    if refs == program.refs and tuple(stmts) == program.stmts:
        return program
    return evolve(program, refs=refs, stmts=tuple(stmts))


def _subtree(fn):
    """Apply ``fn(block, parents)`` bottom-up to every block under (and including) a block."""

    def go(block: Block, parents: tuple[Block, ...]) -> Block:
        inner = (*parents, block)
        stmts = tuple(go(s, inner) if isinstance(s, Block) else s for s in block.stmts)
        if stmts != block.stmts:
            block = evolve(block, stmts=stmts)
        return fn(block, parents)

    return go


def apply_inside(program: Block, reqs: tuple[str, ...], fn) -> Block:
    """Run ``fn`` on every block inside a selected block (the root's own refs are never touched
    here), then drop the ``tmp`` buffers left unused."""
    go = _subtree(fn)

    def visit(b: Block, ctx: Context) -> Block:
        if not ctx.parents:  # the root: only its statements are rewritten
            return evolve(b, stmts=tuple(go(s, (b,)) if isinstance(s, Block) else s for s in b.stmts))
        return go(b, ctx.parents)

    return drop_unused_tmps(rewrite(program, visit, reqs))


# ------------------------------------------------------------------------------ dead_code
def _dead_code(block: Block, parents: tuple[Block, ...]) -> Block:
    """Backward liveness over ``block``'s statements. Live at the end: every refinement that is not
    a local allocation (or, in a child of the root, every buffer that is not a ``tmp``), and every
    refinement sharing its source with another (aliases are not tracked apart)."""
    parent = parents[-1] if parents else None
    if len(parents) == 1:
        keep = _protected(parents[0])
        live = {r.into for r in block.refs if r.source in keep}
    else:
        live = {r.into for r in block.refs if not is_local(r, parent)}
    sources = Counter(r.source for r in block.refs)
    live.update(r.into for r in block.refs if sources[r.source] > 1)  # aliased views
    scalars: set[str] = set()
    kept: list[Statement] = []
    for s in reversed(block.stmts):
        if isinstance(s, Store):
            if s.into not in live:
                continue
            scalars.add(s.from_)
        elif isinstance(s, Load):
            if s.into not in scalars:
                continue
            live.add(s.from_)
        elif isinstance(s, (LoadIndex, Constant)):
            if s.into not in scalars:
                continue
        elif isinstance(s, Intrinsic):
            if not set(s.outputs) & scalars:
                continue
            scalars.update(s.inputs)
        elif isinstance(s, Special):
            if not set(s.outputs) & live:
                continue
            live.update(s.inputs)
        elif isinstance(s, Block):
            reads, writes = (_sources(s, names) for names in reads_writes(s))
            if not writes & live:
                continue
            live.update(reads)
        kept.append(s)
    kept.reverse()
    return block if tuple(kept) == block.stmts else evolve(block, stmts=tuple(kept))


def _sources(block: Block, names: set[str]) -> set[str]:
    """What ``block``'s refinements ``names`` refine in the enclosing block."""
    return {r.source for r in block.refs if r.into in names}


@register("dead_code", CleanupConfig)
def dead_code(program: Block, cfg: CleanupConfig, hw: Hardware) -> Block:
    """Matches blocks with every tag in ``reqs`` and every block inside them. Removes statements
    whose effects nobody observes: a store, special or nested block (a ``#main`` kernel included)
    that writes only local allocations or ``tmp`` buffers that no later statement reads, and
    scalar statements whose results no kept statement uses; then the ``tmp`` buffers that no
    kernel uses, from the root and ``#main``. Guarantees: outputs are unchanged; inputs and
    outputs are never removed; what stays is unchanged and in order."""
    return apply_inside(program, cfg.reqs, _dead_code)


# ------------------------------------------------------------------------------ prune_indexes


def _prune_indexes(block: Block, parents: tuple[Block, ...]) -> Block:
    zero = {i.name: Affine.constant(0) for i in block.idxs if i.range == 1 and i.affine is None}
    if zero:
        block = substitute_indexes(block, zero)
    used = index_uses(block, accesses=True)
    idxs: tuple[Index, ...] = tuple(i for i in block.idxs if i.range != 1 or i.name in used)
    return block if idxs == block.idxs else evolve(block, idxs=idxs)


@register("prune_indexes", CleanupConfig)
def prune_indexes(program: Block, cfg: CleanupConfig, hw: Hardware) -> Block:
    """Matches blocks with every tag in ``reqs`` and every block inside them. A range-1 index
    without an affine is always 0: its uses become 0. Then range-1 indexes that nothing uses
    (constraints, accesses, ``load_index``, nested index affines) are dropped, unused passthroughs
    included. Guarantees: the same points run (a range-1 index adds none) with the same values."""
    return apply_inside(program, cfg.reqs, _prune_indexes)


# ------------------------------------------------------------------------------ prune_refs
def _prune_refs(block: Block, parents: tuple[Block, ...]) -> Block:
    if len(parents) <= 1:  # the root and its children keep their refs (drop_unused_tmps decides)
        return block
    used = uses(block)
    refs = tuple(r for r in block.refs if r.into in used)
    return block if refs == block.refs else evolve(block, refs=refs)


@register("prune_refs", CleanupConfig)
def prune_refs(program: Block, cfg: CleanupConfig, hw: Hardware) -> Block:
    """Matches blocks with every tag in ``reqs`` and every block inside them; drops refinements
    that no statement uses and no nested block refines (inner blocks first, so chains of unused
    views go together). ``#main``'s refinements of ``tmp`` buffers no kernel uses go too, with
    their root buffers; other root buffers and ``#main``'s refinements of them stay. Guarantees:
    an unused refinement has no effect, so outputs are unchanged."""
    return apply_inside(program, cfg.reqs, _prune_refs)


# ------------------------------------------------------------------------------ reduce_constraints
def _reduce_constraints(block: Block, parents: tuple[Block, ...]) -> Block:
    if not block.constraints:
        return block
    box = box_of(parents, block)
    if any(lo > hi for lo, hi in box.values()):
        return block
    cons = tuple(c for c in block.constraints if poly_interval(c, box)[0] < 0)
    return block if cons == block.constraints else evolve(block, constraints=cons)


@register("reduce_constraints", CleanupConfig)
def reduce_constraints(program: Block, cfg: CleanupConfig, hw: Hardware) -> Block:
    """Matches blocks with every tag in ``reqs`` and every block inside them; drops each
    constraint whose least value over the index box is ``>= 0`` (a passthrough's values are its
    affine's interval over the parent's box). Guarantees: every point ran before runs now, and no
    other: the dropped constraints held at every point of the box."""
    return apply_inside(program, cfg.reqs, _reduce_constraints)
