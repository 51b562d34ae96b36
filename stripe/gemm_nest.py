"""Reading a ``gemm_tile`` nest back: what a code generator needs to emit it as one tiled kernel.

``read(block)`` takes a kernel and, when it carries the ``GemmPlan`` that ``gemm_tile`` attached
(``stripe.plans``), returns a ``Nest``, else None. The plan declares the index roles (M, N, batch,
K by name, in order, with their tiles), the refinements and the shape; what the nest's own data
holds is read from it: the index ranges (a tile number's range times its tile, or an *edge*
constraint ``r - 1 - v >= 0``), the operands' and the output's accesses (a level's share of an
index divided by its tile), the constraints (back over whole index values) and a fused
epilogue's statements and refinements. A pass that rewrites a planned nest keeps its plan valid or
drops it (``stripe.verify`` checks it), so nothing here recognises the nest's shape; a nest whose
accesses do not read back (None) runs as any kernel.

``Nest``: ``gemm`` (a ``stripe.gemm.Gemm`` over the kernel's original index names and ranges,
starts 0, K in Stripe order), ``tiles`` (index name -> tile: M and N powers of two, batch 1, K
Stripe-order-keeping) and ``shape`` (``GemmTiles``: ``tm x tn``, ``rm x rn``, ``kt`` the flat K
tile, the product of the K tiles).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stripe.gemm import Gemm, Group, Operand, element_offset
from stripe.gemm_model import GemmTiles
from stripe.ir import Block, Index, Intrinsic, Load, RefDir, Refinement, Store
from stripe.passes.gemm_tile import GemmTileConfig
from stripe.plans import GemmPlan
from tile.affine import Affine

GROUP_SET = frozenset(GemmTileConfig(reqs=()).group_set)  # the work-group level's default tag


@dataclass(frozen=True)
class Nest:
    gemm: Gemm
    tiles: dict[str, int]
    shape: GemmTiles

    def flat(self, name: str, tags: frozenset[str]) -> Block:
        """A stand-in for the kernel the nest computes, one flat block ``O += A * B`` over its own
        indexes (the output's, then K) and constraints: what names and counts it (its epilogue
        left out, its output the refinement the epilogue stores first)."""
        g = self.gemm
        if g.out is not None:
            out = replace(g.out.ref, access=g.out.access)
        else:
            kb, _ = g.epilogue
            stored = next(s.into for s in kb.stmts[1:] if isinstance(s, Store))
            out = next(r for r in kb.refs if r.into == stored)
        out = replace(out, dir=RefDir.OUT, into="$out", from_=out.source, agg_op="add")
        refs = tuple(
            Refinement(RefDir.IN, f"${k}", op.access, op.ref.shape, op.ref.source)
            for k, op in (("a", g.a), ("b", g.b))
        )
        idxs = g.batch.idxs + g.m.idxs + g.n.idxs + g.k.idxs
        stmts = (Load("$a", "$x"), Load("$b", "$y"), Intrinsic("mul", ("$x", "$y"), ("$z",), g.dtype),
                 Store("$z", "$out"))
        cons = tuple(dict.fromkeys(g.a.guards + g.b.guards + g.store_guards))
        return Block(name, idxs, cons, (*refs, out), stmts, tags - GROUP_SET)


class _Refused(Exception):
    """The nest's accesses do not read back over its plan's tiles."""


def read(block: Block) -> Nest | None:
    """The nest ``block``'s ``GemmPlan`` declares (module docstring), or None without one. Kept
    for the last ``_READ_KEPT`` blocks read (by identity; the entry holds the block, so its id is
    not reused meanwhile): naming, the code generator's planning and its epilogue reader each
    read the same kernel, a millisecond of ``Affine`` arithmetic each time."""
    plan = block.plan
    if not isinstance(plan, GemmPlan):
        return None
    kept = _read_kept.get(id(block))
    if kept is not None and kept[0] is block:
        return kept[1]
    try:
        nest = Nest(_read(block, plan), plan.tiles, plan.shape)
    except (_Refused, KeyError, StopIteration, ValueError, IndexError, ZeroDivisionError):
        nest = None
    if len(_read_kept) >= _READ_KEPT:
        _read_kept.pop(next(iter(_read_kept)))  # the oldest
    _read_kept[id(block)] = (block, nest)
    return nest


_READ_KEPT = 4096  # GEMM nests of one program (a 5,000-statement chain has 2,500)
_read_kept: dict[int, tuple[Block, Nest | None]] = {}


def _blocks(stmts) -> list[Block]:
    if not all(isinstance(s, Block) for s in stmts):
        raise _Refused
    return list(stmts)


def _own(b: Block) -> list[Index]:
    return [ix for ix in b.idxs if ix.affine is None]


def _throughs(chain: list[Block]) -> dict[str, tuple[int, str]]:
    """For the last block of ``chain``: each passthrough's (level in the chain, own index name)."""
    known: dict[int, dict[str, tuple[int, str]]] = {}
    for depth, b in enumerate(chain):
        here = {ix.name: (depth, ix.name) for ix in _own(b)}
        for ix in b.idxs:
            if ix.affine is not None:
                (src,) = ix.affine.vars
                if ix.range != 1 or ix.affine != Affine.var(src) or depth == 0:
                    raise _Refused
                here[ix.name] = known[depth - 1][src]
        known[depth] = here
    return known[len(chain) - 1]


def _read(G: Block, plan: GemmPlan) -> Gemm:
    """The GEMM of the nest ``G``, its index roles and tiles from ``plan``: the kernel holds the
    K step ``S`` (the fills ``FA``, ``FB`` of the staged tiles, the work-items ``T`` with their
    register blocks ``R``), then a fused epilogue ``E``."""
    S = _blocks(G.stmts[:1])[0]
    FA, FB, T = _blocks(S.stmts)
    (R,) = _blocks(T.stmts)
    mnames, nnames, knames, bnames = ([v for v, _ in grp] for grp in (plan.m, plan.n, plan.k, plan.batch))
    gnames = [ix.name for ix in G.idxs]
    tiles = plan.tiles
    counts = {ix.name: ix.range for ix in G.idxs + tuple(_own(S))}
    level = {v: 0 for v in gnames} | {k: 1 for k in knames}  # where a tile number lives

    def whole(c: Affine, chain: list[Block]) -> Affine:
        """A leaf's constraint over the kernel's own index values (the tile numbers' shares)."""
        through = _throughs(chain)
        out = Affine.constant(c.const)
        for name, coeff in c.terms:
            if name not in through:
                raise _Refused
            depth, own = through[name]
            if depth == len(chain) - 1 or level.get(own) != depth:
                continue  # the tile's own part
            if int(coeff) % tiles[own]:
                raise _Refused
            out = out + Affine.var(own) * (int(coeff) // tiles[own])
        return out

    def original(r: Refinement, at_g: Refinement, at_s: Refinement | None) -> tuple[Affine, ...]:
        out = []
        for d, a in enumerate(at_g.access):
            acc = Affine.constant(a.const)
            for name, coeff in list(a.terms) + (list(at_s.access[d].terms) if at_s else []):
                if int(coeff) % tiles[name]:
                    raise _Refused
                acc = acc + Affine.var(name) * (int(coeff) // tiles[name])
            out.append(acc)
        return tuple(out)

    g_refs = {r.into: r for r in G.refs}
    s_refs = {r.into: r for r in S.refs}
    edges_order = mnames + knames + nnames

    def split_edges(cons: list[Affine], order: list[str]) -> tuple[list[Affine], dict[str, int]]:
        """The guards and, from the end, the edges (``r - 1 - v``, in ``order``) with each range."""
        found: dict[str, int] = {}
        pos = len(order)
        rest = list(cons)
        while rest:
            c = rest[-1]
            terms = list(c.terms)
            if len(terms) != 1 or int(terms[0][1]) != -1 or terms[0][0] not in order[:pos]:
                break
            v = terms[0][0]
            pos = order.index(v)
            found[v] = int(c.const) + 1
            rest.pop()
        return rest, found

    mul = [whole(c, [G, S, T, R]) for c in R.constraints]
    guards, found = split_edges(mul, edges_order)
    ranges = {}
    for v in edges_order + bnames:
        ranges[v] = found.get(v, counts[v] * tiles[v])
        if -(-ranges[v] // tiles[v]) != counts[v]:
            raise _Refused
    idx = {v: Index(v, ranges[v]) for v in ranges}

    def operand(F: Block, order: list[str]) -> tuple[Operand, str]:
        load, store = F.stmts
        ref_f = F.ref(load.from_)
        at_g, at_s = g_refs[ref_f.source], s_refs[ref_f.source]
        cons, _ = split_edges([whole(c, [G, S, F]) for c in F.constraints], order)
        access = original(ref_f, at_g, at_s)
        alloc = F.ref(store.into).source
        leaf = next(r for r in R.refs if r.source == alloc)
        off = element_offset(replace(at_g, access=access))
        if off is None:
            raise _Refused
        leaf_ref = Refinement(RefDir.IN, leaf.into, (), ref_f.shape)
        return Operand(at_g, off, tuple(cons), access, leaf_ref), alloc

    a, _ = operand(FA, mnames + knames)
    b, _ = operand(FB, knames + nnames)
    gs = [c for c in guards if c not in a.guards and c not in b.guards]
    dtype = a.ref.shape.dtype
    epilogue, out = None, None
    staged = {FA.stmts[1].into, FB.stmts[1].into}
    (leaf,) = [r for r in R.refs if r.source not in staged]
    o = g_refs[plan.out]
    if plan.epilogue:
        (E,) = _blocks(G.stmts[1:])
        (ER,) = _blocks(E.stmts)
        erefs = [r for r in G.refs if r.into not in (a.ref.into, b.ref.into, o.into)]
        er = {r.into: r for r in ER.refs}
        kernel_refs = [replace(r, access=original(r, r, None), shape=er[r.into].shape) for r in erefs]
        zero = lambda r: replace(r, access=tuple(Affine.constant(0) for _ in r.access))  # noqa: E731
        inner = Block("", (), (), R.refs, R.stmts)
        local = zero(Refinement(RefDir.NONE, o.into, o.access, o.shape, agg_op=o.agg_op))
        kb = replace(G, idxs=(), constraints=(), refs=(zero(a.ref), zero(b.ref), local, *kernel_refs),
                     stmts=(inner, *ER.stmts), tags=G.tags - GROUP_SET, plan=None)
        epilogue = (kb, local)
    else:
        access = original(o, o, None)
        off = element_offset(replace(o, access=access))
        if off is None:
            raise _Refused
        out = Operand(o, off, (), access, leaf)
    return Gemm(
        dtype,
        a,
        b,
        out,
        Group(tuple(idx[v] for v in mnames)),
        Group(tuple(idx[v] for v in nnames)),
        Group(tuple(idx[v] for v in knames)),
        Group(tuple(idx[v] for v in bnames)),
        tuple(gs),
        {v: 0 for v in ranges},
        epilogue,
    )
