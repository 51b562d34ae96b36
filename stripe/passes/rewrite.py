"""Walking and rebuilding block trees, so each pass states only its rewrite.

* ``matches(block, reqs)``: a block is selected when it carries every tag in ``reqs`` (the seed's
  ``reqs``; an empty list selects every block).
* ``rewrite(root, fn, reqs)``: top-down; each selected block is replaced by ``fn(block, ctx)``
  (a ``Block``; a list of statements spliced into the parent in its place; or ``None`` for no
  change), and what ``fn`` returns is not visited again, so a pass never re-applies itself to
  the blocks it created. Blocks that are not selected are descended into.
* ``Context`` is where a block sits: its enclosing blocks, outermost first, and lookups through
  them (``ctx.parent``, ``ctx.ref_chain(name)``).
* Small facts passes share: which refinements a block reads and writes (at any depth), fresh
  names, and renaming index variables inside a block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from stripe.ir import (
    Block,
    Constant,
    Index,
    Intrinsic,
    Load,
    LoadIndex,
    RefDir,
    Refinement,
    Special,
    Statement,
    Store,
    evolve,
    ref_table,
)
from tile.affine import Affine
from tile.bounds import poly_interval
from tile.gc_pause import paused_gc


def matches(block: Block, reqs: Iterable[str]) -> bool:
    return all(t in block.tags for t in reqs)


@dataclass(frozen=True)
class Context:
    parents: tuple[Block, ...] = ()  # outermost first

    @property
    def parent(self) -> Block | None:
        return self.parents[-1] if self.parents else None

    def inside(self, block: Block) -> Context:
        return Context((*self.parents, block))

    def ref_chain(self, block: Block, name: str) -> list[Refinement]:
        """``block``'s refinement ``name`` followed by each parent it refines, up to the root buffer."""
        chain = [block.ref(name)]
        for p in reversed(self.parents):
            src = chain[-1].source
            found = next((r for r in p.refs if r.into == src), None)
            if found is None:
                break
            chain.append(found)
        return chain


Replacement = Block | Sequence[Statement] | None


def rewrite(
    root: Block,
    fn: Callable[[Block, Context], Replacement],
    reqs: Iterable[str] = (),
    *,
    nested: bool = False,
) -> Block:
    """``root`` with every selected block replaced by ``fn``'s result (see the module docstring).
    With ``nested=True`` the blocks inside a replacement are visited too (for passes like
    ``locate_block`` that only annotate and cannot re-apply themselves)."""
    reqs = tuple(reqs)

    def visit(block: Block, ctx: Context) -> list[Statement]:
        if matches(block, reqs):
            out = fn(block, ctx)
            if out is None:
                return [descend(block, ctx)]
            out = [out] if isinstance(out, Block) else list(out)
            if nested:
                out = [descend(s, ctx) if isinstance(s, Block) else s for s in out]
            return out
        return [descend(block, ctx)]

    def descend(block: Block, ctx: Context) -> Block:
        inner = ctx.inside(block)
        stmts: list[Statement] = []
        changed = False
        for s in block.stmts:
            if isinstance(s, Block):
                new = visit(s, inner)
                changed = changed or len(new) != 1 or new[0] is not s
                stmts.extend(new)
            else:
                stmts.append(s)
        return evolve(block, stmts=tuple(stmts)) if changed else block

    with paused_gc():  # passes rebuild big trees: no cycle hunts over them meanwhile
        result = visit(root, Context())
    assert len(result) == 1 and isinstance(result[0], Block), "the root must stay one block"
    return result[0]


# ------------------------------------------------------------------------------ analysis
def stmt_refs(s: Statement) -> tuple[frozenset[str], frozenset[str]]:
    """The refinements a statement that is not a block reads and writes."""
    if isinstance(s, Load):
        return frozenset({s.from_}), frozenset()
    if isinstance(s, Store):
        return frozenset(), frozenset({s.into})
    if isinstance(s, Special):
        return frozenset(s.inputs), frozenset(s.outputs)
    return frozenset(), frozenset()


def reads_writes(
    block: Block, nested: Callable[[Block], tuple[set[str], set[str]]] | None = None, start: int = 0
) -> tuple[set[str], set[str]]:
    """The names of ``block``'s own refinements that it (or any nested block) reads and writes.
    ``nested`` answers the same for a nested block (default: this function; a pass that asks
    again and again about the same nested blocks passes a remembering one). ``start``: only the
    statements from there on."""
    reads: set[str] = set()
    writes: set[str] = set()
    for s in block.stmts[start:]:
        if isinstance(s, Block):
            r, w = (nested or reads_writes)(s)
            for ref in s.refs:
                if ref.into in r:
                    reads.add(ref.source)
                if ref.into in w:
                    writes.add(ref.source)
        else:
            r, w = stmt_refs(s)
            reads |= r
            writes |= w
    return reads, writes


def fresh(base: str, taken: Iterable[str]) -> str:
    """``base``, or ``base_1``, ``base_2``, ... : the first not in ``taken``."""
    if not isinstance(taken, (set, frozenset, dict)):
        taken = set(taken)  # a set is asked as it is: passes call this per scalar of long blocks
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    return name


def scalars_of(block: Block) -> set[str]:
    """Scalar names a block's own statements define."""
    out: set[str] = set()
    for s in block.stmts:
        if isinstance(s, (Load, LoadIndex, Constant)):
            out.add(s.into)
        elif isinstance(s, Intrinsic):
            out.update(s.outputs)
    return out


def substitute_indexes(block: Block, env: dict[str, Affine]) -> Block:
    """``block`` with its own index variables replaced by affines in every place they are used
    (constraints, accesses, ``load_index``, nested blocks' index affines). The index list itself
    is left to the caller."""
    env = {k: v for k, v in env.items() if v != Affine.var(k)}
    if not env:
        return block  # nothing to replace (fusion renames a chain's indexes to the same names)

    def sub(a: Affine) -> Affine:
        return a.substitute(env)

    refs = tuple(evolve(r, access=tuple(sub(a) for a in r.access)) for r in block.refs)
    stmts: list[Statement] = []
    for s in block.stmts:
        if isinstance(s, LoadIndex):
            s = evolve(s, affine=sub(s.affine))
        elif isinstance(s, Block):
            s = evolve(
                s,
                idxs=tuple(
                    evolve(i, affine=sub(i.affine)) if i.affine is not None else i for i in s.idxs
                ),
            )
        stmts.append(s)
    return evolve(block, constraints=tuple(sub(c) for c in block.constraints), refs=refs, stmts=tuple(stmts))


def rename_refs(block: Block, names: dict[str, str]) -> Block:
    """``block`` with its own refinements renamed (``into``) and every statement using them,
    nested blocks' ``from_`` included."""
    if not names:
        return block
    refs = tuple(evolve(r, into=names[r.into]) if r.into in names else r for r in block.refs)
    return evolve(block, refs=refs, stmts=renamed_uses(block.stmts, names))


def renamed_uses(stmts: Sequence[Statement], names: dict[str, str]) -> tuple[Statement, ...]:
    """``stmts`` with the refinement names they use renamed by ``names`` (all at once: two names
    may become one), nested blocks' ``from_`` included; statements that use none stay as they
    are."""
    out: list[Statement] = []
    for s in stmts:
        if isinstance(s, Load):
            if s.from_ in names:
                s = evolve(s, from_=names[s.from_])
        elif isinstance(s, Store):
            if s.into in names:
                s = evolve(s, into=names[s.into])
        elif isinstance(s, Special):
            s = evolve(
                s,
                inputs=tuple(names.get(n, n) for n in s.inputs),
                outputs=tuple(names.get(n, n) for n in s.outputs),
            )
        elif isinstance(s, Block):
            if any(r.source in names for r in s.refs):
                s = evolve(
                    s,
                    refs=tuple(
                        evolve(r, from_=names[r.source]) if r.source in names else r for r in s.refs
                    ),
                )
        out.append(s)
    return tuple(out)


def index_uses(block: Block, *, accesses: bool = False) -> set[str]:
    """Index names ``block`` reads outside its refinement accesses: in constraints, ``load_index``
    and nested blocks' index affines (plus the accesses themselves with ``accesses=True``)."""
    names: set[str] = set()
    for c in block.constraints:
        names.update(c.vars)
    if accesses:
        for r in block.refs:
            for a in r.access:
                names.update(a.vars)
    for s in block.stmts:
        if isinstance(s, LoadIndex):
            names.update(s.affine.vars)
        elif isinstance(s, Block):
            for i in s.idxs:
                if i.affine is not None:
                    names.update(i.affine.vars)
    return names


Box = dict[str, tuple[int, int]]


def index_box(block: Block, parent_box: Box) -> Box:
    """The values each index of ``block`` takes, over the parent's box (a range-0 index gives an
    empty interval ``(lo, lo - 1)``)."""
    box: Box = {}
    for i in block.idxs:
        lo, hi = (0, 0) if i.affine is None else (int(x) for x in poly_interval(i.affine, parent_box))
        box[i.name] = (lo, hi + i.range - 1)
    return box


def box_of(parents: tuple[Block, ...], block: Block) -> Box:
    """``block``'s index box, through the boxes of its enclosing blocks (outermost first)."""
    box: Box = {}
    for b in (*parents, block):
        box = index_box(b, box)
    return box


def is_allocation(ref: Refinement, parent: Block | None) -> bool:
    """A refinement that allocates: dir none, no ``from_``, naming nothing of the enclosing block
    (every refinement of the root, which has none, is one: the program's buffers)."""
    if ref.dir is not RefDir.NONE or ref.from_ is not None:
        return False
    return parent is None or ref.into not in ref_table(parent)


def is_local(ref: Refinement, parent: Block | None) -> bool:
    """A local allocation: an allocation inside some block (not a buffer of the root)."""
    return parent is not None and is_allocation(ref, parent)


def passthrough(name: str) -> Index:
    """The range-1 index ``name:1 = name``: an enclosing index's value, visible in a nested block."""
    return Index(name, 1, Affine.var(name))
