"""Which of ``split_reduction``'s marked blocks a work-group tree runs, declared as a ``CombinePlan``.

``split_reduction`` marks the blocks that combine partials (``combine_set``: its combines, and the
partials of a combine that split again). ``planned`` gives each such block it built the plan
(``stripe.plans.CombinePlan``) when it has one of the two forms a per-output-point tree of lanes
computes (``backends.clike.groupreduce``), else leaves it as it is (the general kernel runs it):

* plain: ``O[outs] = agg over lanes of P[outs, lanes]`` (``add mul max min``), one load of an
  ``in`` view, one store into an ``out``/``inout`` one of the same type, then the constant stores of
  ``written`` masks (``c = constant; M = store(c)`` into ``out`` views assigning at the output
  points); the lanes are the indexes the output access does not own.
* self-initialised (``self_init.self_initialised``): an outer block over the output points filling
  a one-element local with the identity, an inner block over the lanes aggregating one ``in`` view
  (strided as its parent view) into it, the local assigned to the output; every type the same.

Both without constraints, without index affines other than constants, and with an output access
that gives each output point its own element (each dim a constant or one output index of
coefficient 1, each in one dim only), once the range-1 indexes are gone (``prune_indexes``).
"""

from __future__ import annotations

from dataclasses import replace

from stripe.ir import Block, Constant, Index, Load, RefDir, Refinement, Special, Store, evolve
from stripe.passes.rewrite import substitute_indexes
from stripe.plans import AGGS, CombinePlan
from stripe.specials import fill_name
from tile.affine import Affine


def planned(block: Block, marks: tuple[str, ...], one_kernel: bool = False) -> Block:
    """``block`` with its ``CombinePlan`` when it carries every tag of ``marks`` (not empty) and has
    one of the module docstring's forms, else ``block``; ``one_kernel``: the plan asks for the
    combine to run in one kernel with its partials (``split_reduction``'s ``one_kernel``)."""
    if not marks or not set(marks) <= block.tags or block.constraints or len(block.stmts) < 2:
        return block
    form = _without_units(block)
    plan = _self_initialised(form) if isinstance(form.stmts[0], Special) else _plain(form)
    if plan is not None and one_kernel:
        plan = replace(plan, one_kernel=True)
    return block if plan is None else evolve(block, plan=plan)


def _without_units(block: Block) -> Block:
    """``block`` as ``prune_indexes`` leaves it, which the code generator sees: its range-1 indexes
    without an affine (always 0) substituted and dropped, in its nested blocks too (the plan names
    no such index, so it holds before and after)."""
    ones = {ix.name: Affine.constant(0) for ix in block.idxs if ix.range == 1 and ix.affine is None}
    out = substitute_indexes(block, ones)
    stmts = tuple(_without_units(s) if isinstance(s, Block) else s for s in out.stmts)
    return evolve(out, idxs=tuple(ix for ix in out.idxs if ix.name not in ones), stmts=stmts)


def _plain(block: Block) -> CombinePlan | None:
    load, store = block.stmts[:2]
    if not (isinstance(load, Load) and isinstance(store, Store) and store.from_ == load.into):
        return None
    refs = {r.into: r for r in block.refs}
    src, dst = refs.get(load.from_), refs.get(store.into)
    marks = _marks(block.stmts[2:], refs)
    if marks is None or len(block.refs) != 2 + len(marks) or src is None or dst is None:
        return None
    if src.dir is not RefDir.IN or dst.agg_op not in AGGS or dst.dir not in (RefDir.OUT, RefDir.INOUT):
        return None
    if src.shape.dtype is not dst.shape.dtype:
        return None
    if any(ix.affine is not None and not ix.affine.is_constant for ix in block.idxs):
        return None
    outs = _owned(dst, block.idxs)
    if outs is None or any(not {v for a in r.access for v in a.vars} <= outs for r in marks):
        return None
    lanes = tuple((ix.name, ix.range) for ix in block.idxs if ix.name not in outs)
    return CombinePlan(lanes, dst.agg_op, src.into, dst.into, False)


def _self_initialised(block: Block) -> CombinePlan | None:
    if len(block.stmts) != 4 or len(block.refs) != 3:
        return None
    fill, inner, load, store = block.stmts
    refs = {r.into: r for r in block.refs}
    if not (isinstance(fill, Special) and isinstance(inner, Block) and isinstance(load, Load)):
        return None
    if not isinstance(store, Store) or store.from_ != load.into or fill.inputs or len(fill.outputs) != 1:
        return None
    local, dst = refs.get(load.from_), refs.get(store.into)
    if local is None or dst is None or local.into != fill.outputs[0] or local.dir is not RefDir.NONE:
        return None
    if local.from_ is not None or dst.dir is not RefDir.OUT or dst.agg_op not in ("", "assign"):
        return None
    if inner.constraints or len(inner.refs) != 2 or len(inner.stmts) != 2:
        return None
    if any(ix.affine is not None for ix in (*block.idxs, *inner.idxs)):
        return None
    iload, istore = inner.stmts
    irefs = {r.into: r for r in inner.refs}
    if not (isinstance(iload, Load) and isinstance(istore, Store) and istore.from_ == iload.into):
        return None
    part, acc = irefs.get(iload.from_), irefs.get(istore.into)
    if part is None or acc is None or acc.source != local.into or acc.agg_op not in AGGS:
        return None
    src = refs.get(part.source)
    if fill.name != fill_name(acc.agg_op) or src is None:
        return None
    if src.dir is not RefDir.IN or part.dir is not RefDir.IN:
        return None
    if [d.stride for d in part.shape.dims] != [d.stride for d in src.shape.dims]:
        return None
    if len({src.shape.dtype, part.shape.dtype, local.shape.dtype, acc.shape.dtype, dst.shape.dtype}) != 1:
        return None
    if _owned(dst, block.idxs) != {ix.name for ix in block.idxs}:
        return None
    return CombinePlan(tuple((ix.name, ix.range) for ix in inner.idxs), acc.agg_op, src.into, dst.into, True)


def _marks(stmts, refs: dict[str, Refinement]) -> list[Refinement] | None:
    """The refinement of each ``c = constant; M = store(c)`` pair (the ``written`` masks
    ``split_reduction`` moves to its combine), or None for any other statement."""
    if len(stmts) % 2:
        return None
    out = []
    for const, store in zip(stmts[::2], stmts[1::2]):
        if not (isinstance(const, Constant) and isinstance(store, Store) and store.from_ == const.into):
            return None
        r = refs.get(store.into)
        if r is None or r.dir is not RefDir.OUT or r.agg_op not in ("", "assign"):
            return None
        if r.shape.dtype is not const.dtype:
            return None
        out.append(r)
    return out


def _owned(dst: Refinement, idxs: tuple[Index, ...]) -> set[str] | None:
    """The output indexes when each dim of ``dst`` is a constant or one of them (coefficient 1,
    each in one dim only: every output point its own element), else None."""
    seen: set[str] = set()
    for a in dst.access:
        names = list(a.vars)
        if not names:
            continue
        if len(names) != 1 or a.coeff(names[0]) != 1 or names[0] in seen:
            return None
        seen.add(names[0])
    return seen if seen <= {ix.name for ix in idxs} else None


__all__ = ["planned"]
