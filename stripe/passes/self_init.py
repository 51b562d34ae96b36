"""``self_init``: a contraction whose output comes freshly filled with its aggregation's identity
and that writes every element of it starts each element from the identity itself. The fill (the
lowering's ``zero`` / ``agg_init_<op>`` block just before the contraction) goes, and the block
takes ``self_initialised``'s form: an outer block over the output's indexes holding a one-element
accumulator filled with the identity, an inner block aggregating the element's points into it,
one assignment to the element. Each element gets the same values in the same order from the same
start, so the meaning is unchanged to the bit (not a reordering pass; strict mode keeps it).

Why: on a CPU the fill is a pass over the whole output and the contraction then reads and
writes each element once per reduction point; a 2x2 max pool spent more time in its one-thread
fill than in its 16-thread pool. With a short reduction (at most ``max_reduction`` points per
element) the code generator unrolls the inner block, and the loop over the output's contiguous
index vectorizes with the accumulators in registers. GEMM-shaped contractions (matmuls, convolutions,
however short) keep their own kernels (the CPU micro-kernel folds the fill in already: its tiles
start from zero in the first K block, the fill is built empty and not launched, backends/llvm/fills.py).

``split_reduction`` builds its partial and combine blocks in the same form (``self_init``); the
helpers here serve both.

With ``assign`` among ``aggs``, an ``=`` contraction (a transpose, ``D[n, m] = =(C[m, n])``)
that writes every element of an output its lowering zero-fills just before, and never reads it,
simply loses the fill: no element keeps its zero, so the block is unchanged (``overwrites``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from stripe.gemm import match as gemm_match
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
    TensorShape,
)
from stripe.lower import writes_every_element
from stripe.passes.registry import register
from stripe.passes.rewrite import fresh, matches
from stripe.passes.tiling import can_split, parent_sizes, tables_of, views_of
from stripe.passes.tiling import split as tile_split
from stripe.specials import fill_name
from tile.affine import Affine
from tile.dtypes import DType

AGGREGATIONS = ("add", "mul", "max", "min")
TAKEN = (*AGGREGATIONS, "assign")  # what ``aggs`` may name (``assign``: ``overwrites``)


@dataclass(frozen=True)
class SelfInitConfig:
    reqs: tuple[str, ...]
    max_reduction: int = 16  # reduction points per output element, at most (unrolled whole)
    aggs: tuple[str, ...] = TAKEN
    gemms: bool = False  # GEMM-shaped sums too, of any length, in the fused form (a GPU's tiled kernel)

    def invalid(self) -> tuple[str, str, str] | None:
        """``(key, message, hint)`` for a value no rewrite can use (``stripe.config`` locates it)."""
        if self.max_reduction < 1:
            return "max_reduction", "max_reduction must be at least 1", "write 1 or more"
        unknown = [a for a in self.aggs if a not in TAKEN]
        if unknown:
            return "aggs", f"'{unknown[0]}' is not an aggregation", f"name some of {', '.join(TAKEN)}"
        return None


@register("self_init", SelfInitConfig)
def self_init(program: Block, cfg: SelfInitConfig, hw: Hardware) -> Block:
    """Every matching block whose fill comes just before it, rewritten as the docstring says."""
    return _visit(program, cfg)


def _visit(block: Block, cfg: SelfInitConfig) -> Block:
    stmts: list[Statement] = []
    changed = False
    for s in block.stmts:
        if isinstance(s, Block) and stmts and overwrites(s, stmts[-1], block, cfg):
            stmts[-1] = s  # the fill goes; the block is unchanged
            changed = True
            continue
        acc = _taken(s, stmts[-1], block, cfg) if isinstance(s, Block) and stmts else None
        if acc is not None:
            stmts.pop()  # the fill
            stmts.append(without_fill(s, acc, block, cfg))
            changed = True
            continue
        child = _visit(s, cfg) if isinstance(s, Block) else s
        changed = changed or child is not s
        stmts.append(child)
    return replace(block, stmts=tuple(stmts)) if changed else block


def _taken(block: Block, prev: Statement, parent: Block, cfg: SelfInitConfig) -> Refinement | None:
    """``block``'s accumulator when the pass rewrites it (``prev`` its fill), else None."""
    if not matches(block, cfg.reqs):
        return None
    acc = fills_for(prev, block, parent, constrained=cfg.gemms)
    if acc is None or acc.agg_op not in cfg.aggs:
        return None
    views = tables_of(parent)
    if gemm_match(block, views.names, views.dtypes, reorder=False, halves=cfg.gemms) is not None:
        # a CPU GEMM's own kernels start from the identity themselves, faster; a GPU's tiled
        # kernel (``gemms``) takes the fused form, its sums in registers, stored once
        return acc if cfg.gemms and acc.agg_op == "add" else None
    if block.constraints:
        return None
    owned = access_indexes(acc)
    points = math.prod(ix.range for ix in block.idxs if ix.name not in owned)
    return acc if points <= cfg.max_reduction else None


def access_indexes(ref: Refinement) -> set[str]:
    """The indexes ``ref``'s access uses (for an accumulator: those that pick the output element)."""
    return {v for a in ref.access for v in a.vars}


def self_initialised(
    block: Block, acc: Refinement, dtype: DType, sizes: dict, fill: bool = True
) -> Block:
    """``block``, aggregating into ``acc`` (its only output), as an outer block over the indexes
    of ``acc``'s access that fills a one-element local accumulator (of the buffer's ``dtype``) with
    the aggregation's identity, runs the other indexes in an inner block aggregating into it (every
    constraint moves there), and assigns it to ``acc``'s element. Each element the outer block
    reaches is written once, so no fill of the whole buffer has to come first; each gets the same
    values in the same order, started at the same identity (``sizes``: the parent views' sizes).
    Without ``fill`` (a sum: a local allocation starts at zero) the outer block is ``fusion``'s form
    of a contraction with an epilogue, which ``stripe.gemm.match`` reads."""
    owned = access_indexes(acc)
    outer = tile_split(block, {ix.name: 1 if ix.name in owned else ix.range for ix in block.idxs},
                       parent_sizes=sizes)
    (inner,) = outer.stmts
    assert isinstance(inner, Block)
    local = fresh(f"{acc.into}_sum" if acc.agg_op == "add" else f"{acc.into}_{acc.agg_op}",
                  {r.into for r in outer.refs})
    value = f"${local}"
    fn = fill_name(acc.agg_op)
    rank = len(acc.access)
    alloc = Refinement(RefDir.NONE, local, (Affine(),) * rank, TensorShape.dense(dtype, (1,) * rank),
                       agg_op="assign")
    inner = replace(
        inner, refs=tuple(replace(r, from_=local) if r.into == acc.into else r for r in inner.refs)
    )
    refs = tuple(replace(r, agg_op="assign") if r.into == acc.into else r for r in outer.refs)
    return replace(
        outer,
        refs=(*refs, alloc),
        stmts=(*((Special(fn, (), (local,)),) if fill else ()), inner, Load(local, value),
               Store(value, acc.into)),
    )


def only_output(block: Block, acc: Refinement) -> bool:
    return all(r is acc or r.dir is RefDir.IN for r in block.refs)


def fills_for(prev: Statement, last: Block, parent: Block, constrained: bool = False) -> Refinement | None:
    """``last``'s accumulator when ``prev`` fills the whole output of ``last`` with its
    aggregation's identity and ``last`` writes every element of it (an output access numbering
    every element; no constraints unless ``constrained``: a constraint only skips points, and an
    element left without any keeps the identity either way): ``last`` may start from the identity
    itself. Else None."""
    acc = accumulator(last, parent)
    if acc is None or not only_output(last, acc) or (last.constraints and not constrained):
        return None
    sizes = _whole_fill(prev, acc, fill_name(acc.agg_op), parent)
    return acc if sizes is not None and writes_every_element(acc.access, last.idxs, sizes) else None


def overwrites(last: Block, prev: Statement, parent: Block, cfg: SelfInitConfig) -> bool:
    """Whether ``prev`` zero-fills the whole output of ``last``, an ``=`` contraction (``assign``
    in ``cfg.aggs``) without constraints that writes every element of it and never reads it:
    then the fill is dead."""
    if "assign" not in cfg.aggs or not matches(last, cfg.reqs) or last.constraints:
        return False
    outs = [r for r in last.refs if r.dir is not RefDir.IN]
    if len(outs) != 1 or outs[0].agg_op != "assign" or outs[0].source not in views_of(parent):
        return False
    out = outs[0]
    if not _scalar(last) or any(isinstance(s, Load) and s.from_ == out.into for s in last.stmts):
        return False
    sizes = _whole_fill(prev, out, "zero", parent)
    return sizes is not None and writes_every_element(out.access, last.idxs, sizes)


def _whole_fill(prev: Statement, out: Refinement, fn: str, parent: Block) -> tuple[int, ...] | None:
    """The sizes of the buffer ``out`` views when ``prev`` is a block filling all of it with the
    special ``fn`` and ``parent`` views it whole; else None."""
    if not isinstance(prev, Block) or prev.idxs or prev.constraints or len(prev.stmts) != 1:
        return None
    fill = prev.stmts[0]
    if not isinstance(fill, Special) or fill.name != fn or len(prev.refs) != 1 or fill.inputs:
        return None
    ref, view = prev.refs[0], views_of(parent)[out.source]
    if ref.source != out.source or ref.into not in fill.outputs:
        return None
    if any(not (a.is_constant and a.const == 0) for a in (*ref.access, *view.access)):
        return None
    if ref.shape.sizes != view.shape.sizes or view.dir is RefDir.IN:
        return None
    return view.shape.sizes


def without_fill(
    last: Block, acc: Refinement, parent: Block, cfg: SelfInitConfig = SelfInitConfig(()),
    dtype: DType | None = None,
) -> Block:
    """``last`` (whose fill ``fills_for`` found, ``acc`` its accumulator) in the self-initialised
    form, for a ``parent`` that drops the fill; the local accumulator of ``dtype`` (default: the
    buffer's)."""
    dtype = dtype or views_of(parent)[acc.source].shape.dtype
    fill = acc.agg_op != "add" or not cfg.gemms
    return self_initialised(last, acc, dtype, parent_sizes(last, parent), fill)


def _scalar(block: Block) -> bool:
    """Whether every statement of ``block`` is a scalar one (no nested block, no special)."""
    return all(isinstance(s, (Load, Store, Intrinsic, Constant, LoadIndex)) for s in block.stmts)


def accumulator(block: Block, parent: Block) -> Refinement | None:
    """The one ``add|mul|max|min`` output of a leaf block over its parent's views (stored once,
    never loaded), or None when the block is not of that form."""
    if not can_split(block) or not _scalar(block):
        return None
    views = views_of(parent)
    if any(r.source not in views for r in block.refs):
        return None
    accs = [r for r in block.refs if r.agg_op in AGGREGATIONS]
    others_ok = all(r.agg_op in ("", "assign", *AGGREGATIONS) or r.dir is RefDir.IN for r in block.refs)
    if len(accs) != 1 or not others_ok or accs[0].dir not in (RefDir.OUT, RefDir.INOUT):
        return None
    acc = accs[0]
    loads = [s for s in block.stmts if isinstance(s, Load) and s.from_ == acc.into]
    stores = [s for s in block.stmts if isinstance(s, Store) and s.into == acc.into]
    return acc if not loads and len(stores) == 1 else None
