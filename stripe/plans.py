"""Declared hand-offs: what a pass that shaped a block for a special emitter tells the code generator.

A pass that makes a block for one emitter (``gemm_tile``'s nest, ``row_fusion``'s row program,
``split_reduction``'s combine) attaches a *plan* to it (``Block.plan``): which of the block's
indexes and refinements play which role, and the sizes it chose. A code generator picks the
emitter by the plan's type and reads the roles from it, instead of recognising the block's shape;
a block without a plan runs through the general emitters. The plan is part of the IR: the Stripe
text prints it (``plan gemm(m: [i0:64], ...)``, ``stripe.printer``), ``stripe.verify`` checks it
against its block (``problems``), and a pass that rewrites a planned block keeps the plan valid or
drops it.

* ``GemmPlan`` (``gemm``): a ``gemm_tile`` nest. ``m``, ``n``, ``batch``, ``k``: the GEMM's index
  names in their order with each one's tile (batch tiles are 1); M, N and batch are the kernel's
  own indexes (tile numbers), K the indexes of its first statement (the K step). ``a``, ``b``,
  ``out``: the kernel's refinements of the operands and of the products' output (a fused kernel's
  accumulator). ``tm tn rm rn kt``: the ``GemmTiles`` shape. ``epilogue``: the kernel's second
  statement applies a fused epilogue. ``unit``: empty, or the matrix unit and precision mode
  (``tensor_core.f16``) the kernel runs on; each work-item of the nest is then a warp of the unit's
  lanes, its ``rm x rn`` register block a grid of the unit's operations (``stripe.passes.tensorize``).
* ``RowPlan`` (``row``): a row program. ``rows``: the block's indexes (one row per point);
  ``values``: its one-element locals, the per-row values; ``group``: the suggested work-items per
  row (a power of two).
* ``CombinePlan`` (``combine``): a split reduction's combine ``out[outs] = agg over lanes of
  src[outs, lanes]``. ``lanes``: the lane indexes with their extents (the block's, or, when
  ``self_init``, its inner block's); ``agg``: the aggregation; ``src``, ``out``: the refinements
  read and written; ``self_init``: the block starts from the identity itself (a local filled with
  it, an inner block over the lanes aggregating into it, the result assigned to ``out``).
  ``one_kernel``: the config asks for the combine to run in one kernel with the partials that
  write ``src`` (``split_reduction``'s ``one_kernel``: a global reduction, its combine not split
  again); ``counter``: empty until the pass ``one_kernel`` nests that partial block into this one
  (its first statement; the combine's own statements follow) and adds the refinement it names, a
  one-element int32 buffer the kernel leaves at zero: the last work-group's counter
  (``backends.clike.lastgroup``).
* ``AttentionPlan`` (``attention``): a softmax attention chain (``stripe.passes.attention``), a
  block over no indexes whose statements are the chain's kernels (the interpreter runs them) and
  whose temporaries are local allocations; a code generator that knows it runs one fused kernel
  (``backends.clike.attention``). Roles: the batch indexes ``b0 b1 ..`` (with their extents), the
  rows ``i`` (``rows`` of them), the keys ``j`` (``keys``), the depth ``d`` of ``Q·K`` (``depth``)
  and the width ``e`` of ``V`` and ``O`` (``width``); ``_0`` a dim of size 1 read at 0. ``q``, ``k``,
  ``v``, ``out``: the block's refinements of the operands and of the result, and ``q_dims`` ..
  ``out_dims`` the role of each of their dims; ``s``: the scores' local allocation, ``s_dims`` its
  dims' roles; ``scores``: the names of the elementwise kernels (children) that make the score P
  from S point by point (a bias, a scale, a ``cond`` mask), in order; ``mask``: the constraints
  every sum over the keys carries, each its ``role:coefficient`` terms then ``c:constant``
  (``>= 0``); ``scale_num / scale_den``: the exact ``c`` of ``exp(c * (P - Mx))``; ``block_rows``,
  ``block_keys``: the query rows per work-group and the keys per staged step.
* ``AttentionBackwardPlan`` (``attention_backward``): one of the two blocks the gradient of a
  softmax attention chain becomes (``stripe.passes.attention_backward``), each a block over no
  indexes whose statements are the derived program's kernels it needs (the interpreter runs them).
  ``part`` ``dq``: a work-group of ``group`` query rows recomputes the rows' softmax statistics,
  writes them (``mx``, ``z``: the chain's row max and row sum; ``dz``: the cotangent of the sum)
  and accumulates ``dq``; ``part`` ``dkv``: a work-group of ``group`` keys reads the statistics and
  accumulates ``dk`` and ``dv``; each stages ``step`` keys (rows) per step. Roles, dims and the mask
  as in ``AttentionPlan``; ``do`` is the result's cotangent (its dims ``do_dims``), ``stat_dims``
  the statistics' dims; ``dq``, ``dk``, ``dv`` are empty in the part that does not write them.
  With score kernels: ``s``, ``s_dims`` and ``scores`` as in ``AttentionPlan``, ``dp`` the
  cotangent of the last score and ``grad_scores`` the elementwise kernels (children) that make
  the cotangent of S from it point by point, in order.
* ``TransposePlan`` (``transpose``): a permuting copy whose input and output are contiguous along
  different indexes (``stripe.passes.transpose``), run as square tiles of ``tile`` x ``tile``
  points through ``__local`` memory (``backends.clike.transpose``). ``cols``: the index along which
  the input ``src`` is contiguous (a tile is read a row at a time); ``rows``: the one along which
  the output ``out`` is (it is written a column at a time); the block's other indexes are batch
  indexes, one tile per work-group at each of their points.
"""

from __future__ import annotations

import math
import typing
from dataclasses import MISSING, dataclass, fields

from stripe.gemm_model import GemmTiles
from stripe.ir import Block, Load, RefDir, Special, Store
from tile.dtypes import DType

Named = tuple[tuple[str, int], ...]  # (index name, tile or extent), in order
ROW_TAG = "row_program"
ATTENTION_TAG = "attention"
AGGS = ("add", "mul", "max", "min")


@dataclass(frozen=True, slots=True)
class GemmPlan:
    m: Named
    n: Named
    batch: Named
    k: Named
    a: str
    b: str
    out: str
    tm: int
    tn: int
    rm: int
    rn: int
    kt: int
    epilogue: bool
    unit: str = ""

    @property
    def shape(self) -> GemmTiles:
        return GemmTiles(self.tm, self.tn, self.rm, self.rn, self.kt, unit=self.unit)

    @property
    def tiles(self) -> dict[str, int]:
        """Index name -> tile: M, K and N (the staged tiles' order), then batch."""
        return dict(self.m + self.k + self.n + self.batch)


@dataclass(frozen=True, slots=True)
class RowPlan:
    rows: tuple[str, ...]
    values: tuple[str, ...]
    group: int


@dataclass(frozen=True, slots=True)
class CombinePlan:
    lanes: Named
    agg: str
    src: str
    out: str
    self_init: bool
    one_kernel: bool = False
    counter: str = ""

    @property
    def lane_count(self) -> int:
        return math.prod(n for _, n in self.lanes)


@dataclass(frozen=True, slots=True)
class TransposePlan:
    rows: str
    cols: str
    src: str
    out: str
    tile: int


@dataclass(frozen=True, slots=True)
class AttentionPlan:
    q: str
    k: str
    v: str
    out: str
    scores: tuple[str, ...]
    s: str
    batch: Named
    rows: int
    keys: int
    depth: int
    width: int
    q_dims: tuple[str, ...]
    k_dims: tuple[str, ...]
    v_dims: tuple[str, ...]
    out_dims: tuple[str, ...]
    s_dims: tuple[str, ...]
    mask: Named
    scale_num: int
    scale_den: int
    block_rows: int
    block_keys: int

    @property
    def extents(self) -> dict[str, int]:
        """Role -> extent (``_0`` is 1)."""
        return dict(self.batch) | {"i": self.rows, "j": self.keys, "d": self.depth, "e": self.width, "_0": 1}

    @property
    def constraints(self) -> list[tuple[tuple[tuple[str, int], ...], int]]:
        """The mask as ``(terms, constant)`` pairs, each ``Σ coeff * role + constant >= 0``."""
        out, terms = [], []
        for name, n in self.mask:
            if name == "c":
                out.append((tuple(terms), n))
                terms = []
            else:
                terms.append((name, n))
        return out


@dataclass(frozen=True, slots=True)
class AttentionBackwardPlan:
    part: str
    q: str
    k: str
    v: str
    do: str
    dq: str
    dk: str
    dv: str
    mx: str
    z: str
    dz: str
    batch: Named
    rows: int
    keys: int
    depth: int
    width: int
    q_dims: tuple[str, ...]
    k_dims: tuple[str, ...]
    v_dims: tuple[str, ...]
    do_dims: tuple[str, ...]
    stat_dims: tuple[str, ...]
    mask: Named
    scale_num: int
    scale_den: int
    group: int
    step: int
    s: str = ""
    s_dims: tuple[str, ...] = ()
    scores: tuple[str, ...] = ()
    dp: str = ""
    grad_scores: tuple[str, ...] = ()

    @property
    def extents(self) -> dict[str, int]:
        """Role -> extent (``_0`` is 1)."""
        return dict(self.batch) | {"i": self.rows, "j": self.keys, "d": self.depth, "e": self.width, "_0": 1}

    @property
    def constraints(self) -> list[tuple[tuple[tuple[str, int], ...], int]]:
        """The mask as ``(terms, constant)`` pairs, each ``Σ coeff * role + constant >= 0``."""
        return AttentionPlan.constraints.fget(self)


Plan = GemmPlan | RowPlan | CombinePlan | TransposePlan | AttentionPlan | AttentionBackwardPlan
KINDS: dict[str, type] = {
    "gemm": GemmPlan, "row": RowPlan, "combine": CombinePlan, "transpose": TransposePlan,
    "attention": AttentionPlan, "attention_backward": AttentionBackwardPlan,
}
_KIND_OF = {cls: kind for kind, cls in KINDS.items()}


def kind(plan: Plan) -> str:
    return _KIND_OF[type(plan)]


def items(plan: Plan) -> list[tuple[str, object]]:
    """The plan's fields in order, as the text format writes them (a field left at its default,
    such as a GEMM's empty ``unit``, is not written)."""
    return [(f.name, getattr(plan, f.name)) for f in fields(plan) if getattr(plan, f.name) != f.default]


def make(kind_: str, values: dict[str, object]) -> Plan:
    """The plan of kind ``kind_`` from the text's fields (lists as tuples, ``[]`` of either list
    type); a ``ValueError`` names a missing, unknown or mistyped field."""
    cls = KINDS.get(kind_)
    if cls is None:
        raise ValueError(f"no plan kind '{kind_}' (one of {', '.join(KINDS)})")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    needed = {f.name for f in fields(cls) if f.default is MISSING}
    if not needed <= set(values) <= set(names):
        raise ValueError(f"a {kind_} plan has the fields {', '.join(names)}")
    for name in values:
        if not _fits(values[name], hints[name]):
            raise ValueError(f"the {kind_} plan's field '{name}' is not a {_spell(hints[name])}")
    return cls(**values)


def _fits(value: object, hint) -> bool:
    if hint is bool or hint is str:
        return type(value) is hint
    if hint is int:
        return type(value) is int
    if not isinstance(value, tuple):
        return False
    if hint == tuple[str, ...]:
        return all(isinstance(v, str) for v in value)
    return all(isinstance(v, tuple) and isinstance(v[1], int) for v in value)  # Named


def _spell(hint) -> str:
    spelled = {bool: "bool", str: "name", int: "int", tuple[str, ...]: "list of names"}
    return spelled.get(hint, "list of name:int")


# ------------------------------------------------------------------------------ checks
def problems(plan: Plan, block: Block) -> list[str]:
    """What is wrong with ``plan`` as ``block``'s plan: names it refers to that the block lacks,
    inconsistent tiles or ranges, a missing tag the emitter expects. Empty when it is valid."""
    if isinstance(plan, GemmPlan):
        return _gemm_problems(plan, block)
    if isinstance(plan, RowPlan):
        return _row_problems(plan, block)
    if isinstance(plan, TransposePlan):
        return _transpose_problems(plan, block)
    if isinstance(plan, AttentionPlan):
        return _attention_problems(plan, block)
    if isinstance(plan, AttentionBackwardPlan):
        return _backward_problems(plan, block)
    return _combine_problems(plan, block)


def _missing(names, have, what: str) -> list[str]:
    return [f"names the {what} '{n}', which the block does not have" for n in names if n not in have]


def _gemm_problems(p: GemmPlan, b: Block) -> list[str]:
    own = {ix.name for ix in b.idxs}
    refs = {r.into for r in b.refs}
    first = b.stmts[0] if b.stmts and isinstance(b.stmts[0], Block) else Block()
    out = _missing([v for v, _ in p.batch + p.m + p.n], own, "index")
    out += _missing([v for v, _ in p.k], {ix.name for ix in first.idxs}, "K step index")
    out += _missing((p.a, p.b, p.out), refs, "refinement")
    if any(t < 1 for _, t in p.batch + p.m + p.n + p.k) or any(t != 1 for _, t in p.batch):
        out.append("has a tile below 1, or a batch tile other than 1")
    if (math.prod(t for _, t in p.m), math.prod(t for _, t in p.n)) != (p.tm, p.tn):
        out.append(f"has tiles whose products are not its shape's {p.tm} x {p.tn}")
    if math.prod(t for _, t in p.k) != p.kt or p.rm < 1 or p.rn < 1 or p.tm % p.rm or p.tn % p.rn:
        out.append("has a K tile or register block inconsistent with its tiles")
    if p.epilogue != (len(b.stmts) == 2):
        out.append(f"says epilogue={str(p.epilogue).lower()} for a block of {len(b.stmts)} statements")
    return out


def _row_problems(p: RowPlan, b: Block) -> list[str]:
    locals_ = {r.into for r in b.refs if r.dir is RefDir.NONE and r.from_ is None}
    out = [] if ROW_TAG in b.tags else [f"needs the tag #{ROW_TAG}"]
    if p.rows != tuple(ix.name for ix in b.idxs):
        out.append(f"names the rows {list(p.rows)}, not the block's indexes")
    out += _missing(p.values, locals_, "row-value local")
    if p.group < 1 or p.group & (p.group - 1):
        out.append(f"suggests {p.group} work-items, not a power of two")
    return out


def _transpose_problems(p: TransposePlan, b: Block) -> list[str]:
    out = _missing((p.rows, p.cols), {ix.name for ix in b.idxs}, "index")
    refs = {r.into: r for r in b.refs}
    out += _missing((p.src, p.out), refs, "refinement")
    if out:
        return out
    if p.rows == p.cols:
        out.append(f"names '{p.rows}' as both its rows and its columns")
    src, dst = refs[p.src], refs[p.out]
    if src.dir not in (RefDir.IN, RefDir.INOUT) or dst.dir not in (RefDir.OUT, RefDir.INOUT):
        out.append(f"reads '{p.src}' or writes '{p.out}', which the block does not read or write")
    if dst.agg_op not in ("", "assign"):
        out.append(f"copies into '{p.out}', which aggregates with '{dst.agg_op}'")
    if not any(p.cols in a.vars for a in src.access) or not any(p.rows in a.vars for a in dst.access):
        out.append(f"has columns '{p.cols}' that '{p.src}' does not use or rows '{p.rows}' that "
                   f"'{p.out}' does not")
    if p.tile < 4 or p.tile & (p.tile - 1):
        out.append(f"has the tile {p.tile}, not a power of two of at least 4")
    if b.constraints or any(ix.affine is not None for ix in b.idxs):
        out.append("is on a block with constraints or index affines (every point is copied)")
    first, last = (b.stmts[0], b.stmts[-1]) if len(b.stmts) >= 2 else (None, None)
    ends = isinstance(first, Load) and first.from_ == p.src and isinstance(last, Store) and last.into == p.out
    if not ends or any(isinstance(s, (Block, Load, Store, Special)) for s in b.stmts[1:-1]):
        out.append(f"is on a block that does not load '{p.src}', convert and store into '{p.out}'")
    return out


def _attention_problems(p: AttentionPlan, b: Block) -> list[str]:
    refs = {r.into: r for r in b.refs}
    out = [] if ATTENTION_TAG in b.tags else [f"needs the tag #{ATTENTION_TAG}"]
    out += _missing((p.q, p.k, p.v, p.out, p.s), refs, "refinement")
    out += _missing(p.scores, {s.name for s in b.stmts if isinstance(s, Block)}, "score kernel")
    if b.idxs or b.constraints:
        out.append("is on a block with indexes or constraints (the chain runs once)")
    roles = p.extents
    roles_of = (("q", p.q_dims), ("k", p.k_dims), ("v", p.v_dims), ("out", p.out_dims), ("s", p.s_dims))
    for name, dims in roles_of:
        r = refs.get(getattr(p, name))
        if r is not None and len(dims) != len(r.shape.dims):
            out.append(f"gives '{getattr(p, name)}' {len(dims)} dims' roles, not {len(r.shape.dims)}")
        out += [f"names the role '{d}' of no extent" for d in dims if d not in roles]
        if r is not None and len(dims) == len(r.shape.dims):
            out += [f"gives '{r.into}' a dim of size {dd.size} for the role '{d}' of extent {roles[d]}"
                    for d, dd in zip(dims, r.shape.dims, strict=True) if d in roles and dd.size != roles[d]]
    if p.mask and p.mask[-1][0] != "c":
        out.append("has a mask that does not end with its constant (c:N)")
    if p.scale_den < 1 or p.block_rows < 1 or p.block_keys < 1:
        out.append("has a scale denominator, block_rows or block_keys below 1")
    return out


def _backward_problems(p: AttentionBackwardPlan, b: Block) -> list[str]:
    refs = {r.into: r for r in b.refs}
    out = [] if ATTENTION_TAG in b.tags else [f"needs the tag #{ATTENTION_TAG}"]
    writes = (p.dq,) if p.part == "dq" else (p.dk, p.dv)
    if p.part not in ("dq", "dkv") or not all(writes):
        out.append(f"has the part '{p.part}' (dq or dkv) without the outputs it writes")
    out += _missing((p.q, p.k, p.v, p.do, p.mx, p.z, p.dz, *writes), refs, "refinement")
    if b.idxs or b.constraints:
        out.append("is on a block with indexes or constraints (the chain runs once)")
    roles = p.extents
    dims = ((p.q, p.q_dims), (p.k, p.k_dims), (p.v, p.v_dims), (p.do, p.do_dims), (p.mx, p.stat_dims))
    for name, ds in dims:
        r = refs.get(name)
        out += [f"names the role '{d}' of no extent" for d in ds if d not in roles]
        if r is not None and [roles.get(d) for d in ds] != [dd.size for dd in r.shape.dims]:
            out.append(f"gives '{name}' the roles {list(ds)}, which its dims' sizes do not fit")
    children = {s.name for s in b.stmts if isinstance(s, Block)}
    out += _missing(p.scores + p.grad_scores, children, "score kernel")
    if p.scores and p.s not in refs or p.grad_scores and p.dp not in refs:
        out.append("names score kernels without the refinement they start from (s, dp)")
    if p.mask and p.mask[-1][0] != "c":
        out.append("has a mask that does not end with its constant (c:N)")
    if p.scale_num < 1 or p.scale_den < 1 or p.group < 1 or p.step < 1:
        out.append("has a scale that is not positive, or a group or step below 1")
    return out


def _combine_problems(p: CombinePlan, b: Block) -> list[str]:
    at = 2 if p.counter else 1  # a one-kernel combine's partial block comes first
    inner = b.stmts[at] if p.self_init and len(b.stmts) > at and isinstance(b.stmts[at], Block) else b
    ranges = {ix.name: ix.range for ix in inner.idxs}
    out = _missing([v for v, _ in p.lanes], ranges, "lane index")
    out += [f"gives the lane '{v}' the extent {n}, not its range"
            for v, n in p.lanes if ranges.get(v, n) != n]
    out += _missing((p.src, p.out), {r.into for r in b.refs}, "refinement")
    if p.agg not in AGGS:
        out.append(f"aggregates with '{p.agg}', not one of {', '.join(AGGS)}")
    if p.self_init and inner is b:
        out.append("is self-initialised but the block's second statement is not a block")
    return out + _counter_problems(p, b)


def _counter_problems(p: CombinePlan, b: Block) -> list[str]:
    if not p.counter:
        return []
    out = [] if p.one_kernel else ["names a counter but is not one_kernel"]
    counter = next((r for r in b.refs if r.into == p.counter), None)
    if counter is None:
        return [*out, f"names the counter '{p.counter}', which the block does not have"]
    if counter.shape.dtype is not DType.INT32 or counter.shape.elements != 1:
        out.append(f"has a counter '{p.counter}' that is not one int32")
    first = b.stmts[0] if b.stmts else None
    if not isinstance(first, Block) or not any(r.source == p.src for r in first.refs):
        out.append(f"is one kernel but its first statement is not a block writing '{p.src}'")
    return out


__all__ = [
    "ATTENTION_TAG", "KINDS", "ROW_TAG", "AttentionBackwardPlan", "AttentionPlan", "CombinePlan", "GemmPlan",
    "Plan", "RowPlan", "TransposePlan",
    "items", "kind", "make", "problems",
]
