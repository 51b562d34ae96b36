"""``scalarize``: one-element local allocations become SSA scalars; ``inline``: merge single-point
nested blocks into their parent, so a fused elementwise chain becomes one block of scalars.

``scalarize`` rewrites a local allocation T (dir none, no ``from_``, naming nothing of the parent)
with every dim of size 1 whose only uses are ``load``/``store`` statements of its own block (no
nested block refines it, no special touches it). A fresh local allocation holds zero, so the pass
tracks T's current value as a scalar: at first the constant 0 (in T's dtype); each store
``T = store($v)`` becomes ``$c = assign($v):D`` (the conversion a store into T does) and, when T
aggregates (``add``, ``mul``, ``max``, ``min``: the builtins of the same names), ``$n = op($cur,
$c):D``; each load is replaced by the current value (later uses renamed). Bool refinements
aggregating with ``add``/``mul`` are left alone.

``inline`` merges a nested block C into its parent B when C runs exactly once per point of B (every
index has range 1; its value is its affine of B's indexes, or 0) and has no constraints. C's
refinements must each be the same element as the refinement of B they refine (access 0 after
substitution, same shape, and the same ``agg_op`` when C stores through it) — they are renamed to
it — or a local allocation of C, which moves to B under a fresh name (C ran once per point of B,
so it is still fresh for each run). C's statements replace C in place, scalars renamed apart from
B's; nested blocks of C keep their refinements, now of B. Blocks of ``#main`` (the kernels) are
never inlined.
"""

from __future__ import annotations

from dataclasses import dataclass

from stripe.hardware import Hardware
from stripe.ir import (
    Block,
    Constant,
    Intrinsic,
    Load,
    LoadIndex,
    RefDir,
    Refinement,
    Special,
    Statement,
    Store,
    evolve,
)
from stripe.passes.cleanup import apply_inside
from stripe.passes.registry import register
from stripe.passes.rewrite import fresh, is_local, renamed_uses, scalars_of, substitute_indexes
from tile.affine import Affine
from tile.dtypes import DType

_AGG = {"add": "add", "mul": "mul", "max": "max", "min": "min"}


@dataclass(frozen=True)
class ScalarizeConfig:
    reqs: tuple[str, ...] = ("main",)


# ------------------------------------------------------------------------------ scalarize
@register("scalarize", ScalarizeConfig)
def scalarize(program: Block, cfg: ScalarizeConfig, hw: Hardware) -> Block:
    """Matches blocks with every tag in ``reqs`` and every block inside them; turns each
    one-element local allocation used only by its own block's loads and stores into scalars (see
    the module docstring) and removes the refinement. Guarantees: each load sees the value the
    element would hold, converted and aggregated as a store into it would; outputs unchanged."""
    return apply_inside(program, cfg.reqs, _scalarize_block)


def _scalarizable(r: Refinement, parent: Block | None, viewed: set[str]) -> bool:
    """``viewed``: the names that specials or nested blocks of ``r``'s block touch."""
    if not is_local(r, parent) or any(d.size != 1 for d in r.shape.dims):
        return False
    if r.agg_op not in ("", "assign", *_AGG):
        return False
    if r.shape.dtype is DType.BOOL and r.agg_op in ("add", "mul"):
        return False
    return r.into not in viewed


def _viewed(block: Block) -> set[str]:
    """Names of ``block``'s refinements that its specials touch or its nested blocks refine."""
    out: set[str] = set()
    for s in block.stmts:
        if isinstance(s, Special):
            out.update(s.inputs)
            out.update(s.outputs)
        elif isinstance(s, Block):
            out.update(x.source for x in s.refs)
    return out


def _all_scalars(stmts) -> set[str]:
    names: set[str] = set()
    for s in stmts:
        if isinstance(s, (Load, LoadIndex, Constant)):
            names.add(s.into)
        elif isinstance(s, Store):
            names.add(s.from_)
        elif isinstance(s, Intrinsic):
            names.update(s.inputs)
            names.update(s.outputs)
    return names


def _scalarize_block(block: Block, parents: tuple[Block, ...]) -> Block:
    parent = parents[-1] if parents else None
    viewed = _viewed(block)
    chosen = {r.into: r for r in block.refs if _scalarizable(r, parent, viewed)}
    return _scalarize_refs(block, chosen) if chosen else block


def _scalarize_refs(block: Block, chosen: dict[str, Refinement]) -> Block:
    """``block`` with the refinements ``chosen`` (by name) turned into scalars, all in one walk
    over its statements (each refinement's loads and stores are its own)."""
    taken = _all_scalars(block.stmts)

    def new(base: str) -> str:
        name = fresh(base, taken)
        taken.add(name)
        return name

    cur: dict[str, str] = {}  # each refinement's current value, once it has one
    alias: dict[str, str] = {}
    out: list[Statement] = []
    for s in block.stmts:
        s = _rename_uses(s, alias)
        if isinstance(s, Load) and s.from_ in chosen:
            if s.from_ not in cur:
                dt = chosen[s.from_].shape.dtype
                out.append(Constant(s.into, 0.0 if dt.is_float else 0, dt))
                cur[s.from_] = s.into
            else:
                alias[s.into] = cur[s.from_]
            continue
        if isinstance(s, Store) and s.into in chosen:
            r = chosen[s.into]
            dt = r.shape.dtype
            c = new(f"${r.into}")
            out.append(Intrinsic("assign", (s.from_,), (c,), dt))
            if r.agg_op in _AGG:
                if r.into not in cur:
                    cur[r.into] = new(f"${r.into}_0")
                    out.append(Constant(cur[r.into], 0.0 if dt.is_float else 0, dt))
                n = new(f"${r.into}")
                out.append(Intrinsic(_AGG[r.agg_op], (cur[r.into], c), (n,), dt))
                c = n
            cur[r.into] = c
            continue
        out.append(s)
    refs = tuple(x for x in block.refs if x.into not in chosen)
    return evolve(block, refs=refs, stmts=tuple(out))


def _rename_uses(s: Statement, m: dict[str, str]) -> Statement:
    """``s`` with the scalars it reads renamed by ``m``."""
    if not m:
        return s
    if isinstance(s, Store) and s.from_ in m:
        return evolve(s, from_=m[s.from_])
    if isinstance(s, Intrinsic) and any(x in m for x in s.inputs):
        return evolve(s, inputs=tuple(m.get(x, x) for x in s.inputs))
    return s


def _rename_scalars(s: Statement, m: dict[str, str]) -> Statement:
    """``s`` with every scalar it defines or reads renamed by ``m``."""
    if isinstance(s, (Load, LoadIndex, Constant)):
        return evolve(s, into=m[s.into]) if s.into in m else s
    if isinstance(s, Intrinsic):
        if not any(x in m for x in s.outputs) and not any(x in m for x in s.inputs):
            return s
        return evolve(
            s, outputs=tuple(m.get(x, x) for x in s.outputs), inputs=tuple(m.get(x, x) for x in s.inputs)
        )
    return _rename_uses(s, m)


# ------------------------------------------------------------------------------ inline
@register("inline", ScalarizeConfig)
def inline(program: Block, cfg: ScalarizeConfig, hw: Hardware) -> Block:
    """Matches blocks with every tag in ``reqs`` and every block inside them (inner blocks first);
    merges each nested block that runs once per point of its parent into it (see the module
    docstring), except the kernels of ``#main``. Guarantees: the same statements run in the same
    order on the same elements; outputs unchanged."""
    return apply_inside(program, cfg.reqs, _inline_children)


def _inline_children(block: Block, parents: tuple[Block, ...]) -> Block:
    if len(parents) < 2:  # the root and #main keep their blocks
        return block
    taken = _all_scalars(block.stmts) | scalars_of(block)
    refs = list(block.refs)
    by_name = {r.into: r for r in refs}  # kept up to date as ``refs`` grows
    stmts: list[Statement] = []
    changed = False
    for s in block.stmts:
        merged = _inline_one(s, refs, by_name, parents[-1], taken) if isinstance(s, Block) else None
        if merged is None:
            stmts.append(s)
            continue
        changed = True
        stmts.extend(merged)
    if not changed:
        return block
    return evolve(block, refs=tuple(refs), stmts=tuple(stmts))


def _inline_one(
    c: Block, refs: list[Refinement], by_name: dict[str, Refinement], outer: Block, taken: set[str]
) -> list[Statement] | None:
    """``c``'s statements, rewritten for its parent (whose refs ``refs``, by name ``by_name``, gain
    ``c``'s local allocations; ``outer`` encloses the parent), or None when ``c`` cannot be
    inlined."""
    if c.constraints or any(i.range != 1 for i in c.idxs):
        return None
    env = {i.name: i.affine if i.affine is not None else Affine.constant(0) for i in c.idxs}
    c = substitute_indexes(c, env)
    stores = {s.into for s in c.stmts if isinstance(s, Store)}
    names: dict[str, str] = {}
    moved: list[Refinement] = []
    ref_names: set[str] | None = None  # names a moved allocation must avoid (built when needed)
    for r in c.refs:
        p = by_name.get(r.source)
        if p is None:
            if r.from_ is not None or r.dir is not RefDir.NONE:
                return None
            if ref_names is None:
                ref_names = set(by_name) | {x.into for x in outer.refs}
            name = fresh(r.into, ref_names | {x.into for x in c.refs} - {r.into})
            ref_names.add(name)
            names[r.into] = name
            moved.append(evolve(r, into=name, access=tuple(Affine() for _ in r.access)))
            continue
        if any(not a.is_constant or a.const != 0 for a in r.access) or r.shape != p.shape:
            return None
        if r.into in stores and (r.agg_op or "assign") != (p.agg_op or "assign"):
            return None
        names[r.into] = p.into
    stmts = renamed_uses(c.stmts, names)  # only the statements are kept
    ms: dict[str, str] = {}
    for nm in sorted(_all_scalars(stmts)):
        ms[nm] = fresh(nm, taken)
        taken.add(ms[nm])
        if ms[nm] == nm:
            del ms[nm]
    refs.extend(moved)
    by_name.update((m.into, m) for m in moved)
    return [_rename_scalars(s, ms) for s in stmts] if ms else list(stmts)
