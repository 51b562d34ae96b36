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

from dataclasses import dataclass, replace

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
)
from stripe.passes.cleanup import apply_inside
from stripe.passes.registry import register
from stripe.passes.rewrite import fresh, is_local, rename_refs, scalars_of, substitute_indexes
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


def _scalarizable(block: Block, r: Refinement, parent: Block | None) -> bool:
    if not is_local(r, parent) or any(d.size != 1 for d in r.shape.dims):
        return False
    if r.agg_op not in ("", "assign", *_AGG):
        return False
    if r.shape.dtype is DType.BOOL and r.agg_op in ("add", "mul"):
        return False
    for s in block.stmts:
        if isinstance(s, Special) and r.into in (*s.inputs, *s.outputs):
            return False
        if isinstance(s, Block) and any(x.source == r.into for x in s.refs):
            return False
    return True


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
    for r in block.refs:
        if _scalarizable(block, r, parent):
            block = _scalarize_ref(block, r)
    return block


def _scalarize_ref(block: Block, r: Refinement) -> Block:
    dt = r.shape.dtype
    taken = _all_scalars(block.stmts)
    zero_value = 0.0 if dt.is_float else 0

    def new(base: str) -> str:
        name = fresh(base, taken)
        taken.add(name)
        return name

    cur: str | None = None
    alias: dict[str, str] = {}
    out: list[Statement] = []
    for s in block.stmts:
        s = _rename_uses(s, alias)
        if isinstance(s, Load) and s.from_ == r.into:
            if cur is None:
                out.append(Constant(s.into, zero_value, dt))
                cur = s.into
            else:
                alias[s.into] = cur
            continue
        if isinstance(s, Store) and s.into == r.into:
            c = new(f"${r.into}")
            out.append(Intrinsic("assign", (s.from_,), (c,), dt))
            if r.agg_op in _AGG:
                if cur is None:
                    cur = new(f"${r.into}_0")
                    out.append(Constant(cur, zero_value, dt))
                n = new(f"${r.into}")
                out.append(Intrinsic(_AGG[r.agg_op], (cur, c), (n,), dt))
                c = n
            cur = c
            continue
        out.append(s)
    refs = tuple(x for x in block.refs if x.into != r.into)
    return replace(block, refs=refs, stmts=tuple(out))


def _rename_uses(s: Statement, m: dict[str, str]) -> Statement:
    """``s`` with the scalars it reads renamed by ``m``."""
    if not m:
        return s
    if isinstance(s, Store) and s.from_ in m:
        return replace(s, from_=m[s.from_])
    if isinstance(s, Intrinsic) and any(x in m for x in s.inputs):
        return replace(s, inputs=tuple(m.get(x, x) for x in s.inputs))
    return s


def _rename_scalars(s: Statement, m: dict[str, str]) -> Statement:
    """``s`` with every scalar it defines or reads renamed by ``m``."""
    if isinstance(s, (Load, LoadIndex, Constant)):
        return replace(s, into=m.get(s.into, s.into))
    if isinstance(s, Intrinsic):
        return replace(
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
    outer_names = {r.into for r in parents[-1].refs}
    refs = list(block.refs)
    stmts: list[Statement] = []
    changed = False
    for s in block.stmts:
        merged = _inline_one(s, refs, outer_names, taken) if isinstance(s, Block) else None
        if merged is None:
            stmts.append(s)
            continue
        changed = True
        stmts.extend(merged)
    if not changed:
        return block
    return replace(block, refs=tuple(refs), stmts=tuple(stmts))


def _inline_one(
    c: Block, refs: list[Refinement], outer_names: set[str], taken: set[str]
) -> list[Statement] | None:
    """``c``'s statements, rewritten for its parent (whose refs ``refs`` gain ``c``'s local
    allocations), or None when ``c`` cannot be inlined."""
    if c.constraints or any(i.range != 1 for i in c.idxs):
        return None
    env = {i.name: i.affine if i.affine is not None else Affine.constant(0) for i in c.idxs}
    c = substitute_indexes(c, env)
    stores = {s.into for s in c.stmts if isinstance(s, Store)}
    by_name = {r.into: r for r in refs}
    names: dict[str, str] = {}
    moved: list[Refinement] = []
    ref_names = set(by_name) | outer_names
    for r in c.refs:
        p = by_name.get(r.source)
        if p is None:
            if r.from_ is not None or r.dir is not RefDir.NONE:
                return None
            name = fresh(r.into, ref_names | {x.into for x in c.refs} - {r.into})
            ref_names.add(name)
            names[r.into] = name
            moved.append(replace(r, into=name, access=tuple(Affine() for _ in r.access)))
            continue
        if any(not a.is_constant or a.const != 0 for a in r.access) or r.shape != p.shape:
            return None
        if r.into in stores and (r.agg_op or "assign") != (p.agg_op or "assign"):
            return None
        names[r.into] = p.into
    c = _rename_all_refs(c, names)
    ms: dict[str, str] = {}
    for nm in sorted(_all_scalars(c.stmts)):
        ms[nm] = fresh(nm, taken)
        taken.add(ms[nm])
    refs.extend(moved)
    return [_rename_scalars(s, ms) for s in c.stmts]


def _rename_all_refs(c: Block, names: dict[str, str]) -> Block:
    """``rename_refs`` for a map that may send two refinements to one name (merged views)."""
    renamed = rename_refs(c, {k: f"\0{k}" for k in names})
    return rename_refs(renamed, {f"\0{k}": v for k, v in names.items()})
