"""``split_reduction``: give a long reduction with few output points more parallelism, by splitting
one reduction index into lanes that aggregate partial results, and combining the partials after.

A kernel's parallelism is its owned (output) indexes (``backends.llvm.schedule``): ``O[] = >(A[i])``
runs on one thread or work-item, ``O[i: 4] = +(A[i, j])`` on four. This pass rewrites such a block

    O[out] = agg over (r, rest) of body          (r of range R, one of the reduction indexes)

into three blocks, with a new temporary buffer ``P`` of the output's view sizes plus a lane dim:

* an **init** special filling ``P`` with the aggregation's identity (``zero``, ``agg_init_<op>``),
  so lanes that receive nothing (constraints, a short last lane) never change the result; with
  ``self_init`` there is none: the partial block runs as an outer block over ``P``'s indexes that
  starts a one-element local accumulator at the identity, aggregates its points into it (an inner
  block holding every constraint) and assigns it to ``P`` (``self_initialised``), so every element
  of ``P`` is written once by its own lane. The same form serves a combine's own split, and the
  last combine when the output's identity fill comes just before the block and the combine writes
  every output element: the fill goes too (a global max: 3 kernels, not 6);
* the **partial** block, ``P[out, l] = agg over (t, rest) of body`` with ``r`` replaced by
  ``lanes * t + l`` (``interleave``: adjacent lanes read adjacent elements, coalesced on a GPU) or
  by ``chunk * l + t`` (each lane a contiguous chunk: a CPU thread's run of memory), plus the
  constraint ``R - 1 - r >= 0`` when the lanes overrun ``R``;
* the **combine** block, ``O[out] = agg over l of P[out, l]``, over the block's output indexes and
  the constraints that mention only them. Combining ``P`` where nothing was written adds the
  identity, which changes nothing.

``P``'s lane dim is last (stride 1, so on a GPU the lane is the fastest work-item index) unless
``interleave`` splits an index that no input reads contiguously (a column sum): then it is first,
and the output's own contiguous index stays fastest. A combine that is itself long is split again
(a 16M-element sum: 65536 partials, then 256, then 1); a partial block still short of lanes
because one index's range capped them splits another reduction index too, whose lanes join P's (a
global sum of a 64x64 matrix aiming at 1024 lanes: 64 over j and 16 over i, one ``P`` of 16x64 and
one combine over both; ``lanes`` caps the product).

Other outputs of the block (lowering's ``O_written`` mask of ``>``, ``<``, ``*``: ``=`` stores of a
constant) stay in the partial block, which runs exactly the original points; they move to the
combine block, so that the partial block writes ``P`` alone and its lanes are owned, when that
provably writes the same elements: the stored value is a constant, its access uses only output
indexes, and every constraint uses only output indexes (so every output point the combine runs
has at least one reduction point).

How many lanes: the target is ``parallelism`` (0: the hardware's ``Σ count x threads``) times
``oversubscribe`` points in all, so ``ceil(target / outputs)`` lanes per output point, at most
``lanes`` (0: no cap), at most ``R`` and at most ``reduction / min_chunk`` (each lane aggregates at
least ``min_chunk`` values); ``only_po2`` rounds down to a power of two, and contiguous chunks are
evened out so that no lane is empty. These thread lanes need fewer than ``max_outputs`` (0: the
target) output points and a reduction of at least ``min_reduction`` values.

**Vector lanes** (contiguous mode, ``vector`` V > 1): each chunk is itself interleaved,
``r = chunk * l + V * t + v`` with ``v`` a lane dim of ``P`` (last, stride 1), so the innermost
loop adds V contiguous elements into V contiguous partials, which a CPU code generator vectorizes
(a serial float sum cannot be: its order is fixed). They apply, whatever the output count, when
an input reads ``r`` with stride 1, no output index already does (else the outputs vectorize),
``R >= 8 V``, and ``P`` has at most an eighth of the elements the block's inputs hold (a block
that reads each element many times, like ``A * transpose(B)``, would need a ``P`` of its output
times the lanes).

A block is split when it carries ``reqs``; is a leaf over views of its parent (loads, stores,
intrinsics, constants, ``load_index``; indexes without affines) whose enclosing blocks have no
indexes (each new block must run once, as a kernel: per point of an enclosing block, the init and
the partials of one ``P`` could race); has one ``add|mul|max|min`` output, stored once and never
loaded (``=`` is never split: its one writer must stay one), one of ``aggs`` (a target whose code
generator vectorizes float sums itself, reassociating them, may leave ``add`` out); and gets at
least two lanes. The index split is the one giving the most lanes; among equals, with
``interleave`` one an input reads with stride 1, else the one of the largest stride (whole rows
per lane); then the first.

The blocks carrying ``combine_set`` (the combines, and the partials of a combine split again) get
a ``stripe.plans.CombinePlan`` (its lanes, aggregation, refinements, self-initialised or not) when
a work-group tree can run them (``stripe.passes.combine_plans``): the hand-off to the code generator
(``backends.clike.groupreduce``).

``one_kernel`` (a target whose kernel launches cost more than a global reduction's combines: an
OpenCL GPU): a global reduction (no output index) whose partial block is self-initialised keeps
one combine over all its lanes, not split again, tagged ``partial_set`` too (so fusion leaves it
alone) and planned with ``one_kernel``; the pass ``one_kernel`` later nests the partial block into
it, and the code generator runs both as one kernel whose last work-group combines
(``backends.clike.lastgroup``).

Reorders: an element receives its values lane by lane, so float results may differ in rounding
(``settings={"strict": True}`` skips the pass).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from stripe.gemm import match as gemm_match
from stripe.hardware import Hardware
from stripe.ir import (
    Block,
    Constant,
    Index,
    Intrinsic,
    Load,
    RefDir,
    Refinement,
    Special,
    Statement,
    Store,
    TensorShape,
    walk,
)
from stripe.passes.combine_plans import planned
from stripe.passes.one_kernel import NO_REGISTER
from stripe.passes.registry import register
from stripe.passes.rewrite import Context, fresh, matches, rename_refs, substitute_indexes
from stripe.passes.self_init import (
    AGGREGATIONS,
    access_indexes,
    accumulator,
    fills_for,
    only_output,
    self_initialised,
    without_fill,
)
from stripe.passes.tiling import parent_sizes, tables_of, views_of
from stripe.specials import fill_name
from tile.affine import Affine
from tile.dtypes import DType


@dataclass(frozen=True)
class SplitReductionConfig:
    reqs: tuple[str, ...]
    interleave: bool = False  # r = lanes*t + l (GPU, coalesced) instead of r = chunk*l + t (CPU)
    parallelism: int = 0  # points to aim for in all (0: Σ count x threads of the exec units)
    oversubscribe: int = 1  # times parallelism (CPU: a few partials per thread balance the load)
    max_outputs: int = 0  # split only blocks with fewer output points (0: the target)
    min_reduction: int = 1024  # split only reductions of at least this many values
    min_chunk: int = 16  # each lane aggregates at least this many values
    lanes: int = 0  # at most this many lanes per output point (0: no cap)
    vector: int = 0  # contiguous mode: this many interleaved lanes inside each chunk (SIMD)
    aggs: tuple[str, ...] = AGGREGATIONS  # the aggregations split (of add, mul, max, min)
    only_po2: bool = False  # lanes a power of two
    self_init: bool = False  # partials start from the identity themselves (no fill kernels)
    partial_set: tuple[str, ...] = ()  # tags added to the partial block
    combine_set: tuple[str, ...] = ()  # tags added to the combine block
    one_kernel: bool = False  # a global reduction's partials and its one combine: one kernel
    # leave alone a GEMM of float16 or bfloat16 operands whose M and N each have at least this many
    # points (a matrix unit's: ``stripe.gemm.match``; 0: split those too)
    min_free: int = 0

    def invalid(self) -> tuple[str, str, str] | None:
        """``(key, message, hint)`` for a value no split can use (``stripe.config`` locates it)."""
        for key, low in (("min_chunk", 2), ("min_reduction", 2), ("oversubscribe", 1)):
            if getattr(self, key) < low:
                return key, f"{key} must be at least {low}", f"write {low} or more"
        for key in ("parallelism", "max_outputs", "lanes", "vector", "min_free"):
            if getattr(self, key) < 0:
                return key, f"{key} must not be negative", "write 0 for the default, or a positive count"
        unknown = [a for a in self.aggs if a not in AGGREGATIONS]
        if unknown:
            hint = f"name some of {', '.join(AGGREGATIONS)} (= is never split)"
            return "aggs", f"'{unknown[0]}' is not an aggregation this pass splits", hint
        return None


@dataclass(frozen=True)
class _Part:
    """One new index replacing the split one: ``r = Σ coeff * part`` over the parts."""

    suffix: str  # the new index is named ``<r>_<suffix>``
    range: int
    coeff: int
    lane: bool  # a dim of P (partials kept apart), else a step that a lane loops over


@dataclass(frozen=True)
class _Split:
    """One chosen split: the reduction index, its parts (in index order) and the lane dims' place
    in ``P`` (last, or first)."""

    index: Index
    parts: tuple[_Part, ...]
    lane_first: bool

    @property
    def lanes(self) -> int:
        return math.prod(p.range for p in self.parts if p.lane)


@register("split_reduction", SplitReductionConfig, reorders=True)
def split_reduction(program: Block, cfg: SplitReductionConfig, hw: Hardware) -> Block:
    """Splits every matching block as the module docstring says; declares each new ``P`` as a
    ``#tmp`` buffer of the root and an ``inout`` view in every block between. Every point of the
    original block runs once with the same accesses (in the partial block), so the only change in
    meaning is the order in which an output element aggregates its values."""
    target = (cfg.parallelism or sum(u.count * u.threads for u in hw.exec_units.values())) * cfg.oversubscribe
    taken = {r.into for b in walk(program) for r in b.refs}
    out, declared = _Splitter(cfg, max(1, target), taken).visit(program, ())
    assert not declared, "the root declares every new buffer"
    return out


class _Splitter:
    def __init__(self, cfg: SplitReductionConfig, target: int, taken: set[str]):
        self.cfg = cfg
        self.target = target
        self.max_outputs = cfg.max_outputs or target
        self.taken = taken

    def visit(self, block: Block, parents: tuple[Block, ...]) -> tuple[Block, list[tuple[str, TensorShape]]]:
        """``block`` with its matching children split, and the new buffers it must pass up to be
        declared (none at the root, which declares them)."""
        stmts: list[Statement] = []
        declared: list[tuple[str, TensorShape]] = []
        inner = (*parents, block)
        changed = False
        for s in block.stmts:
            if not isinstance(s, Block):
                stmts.append(s)
                continue
            whole = self.cfg.one_kernel and _global(s, block)
            got = self.split(s, inner, one=whole) if matches(s, self.cfg.reqs) else None
            if got is None:
                child, bufs = self.visit(s, inner)
                stmts.append(child)
                changed = changed or child is not s
            else:
                new, bufs = got
                shown = _showing(block, bufs)
                acc = fills_for(stmts[-1], new[-1], shown) if self.cfg.self_init and stmts else None
                if acc is not None:
                    # the output's own identity fill goes: its last combine starts from the identity
                    stmts.pop()
                    # (float32 partials: their combine sums in float32 and rounds once, at the store)
                    new = [*new[:-1], without_fill(new[-1], acc, shown, dtype=acc.shape.dtype)]
                # The last combine into a float16 or bfloat16 output (``one_kernel.NO_REGISTER``)
                # sums its float32 partials in float32: no plan, as a work-group tree or the last
                # group would store the float32 register as the output's element.
                narrow = _output_dtype(s, inner) in NO_REGISTER
                one = whole and len(new) == 2 and not narrow  # a self-initialised partial, its combine
                if one:  # fusion leaves the combine alone too: the two become one kernel
                    new[-1] = replace(new[-1], tags=new[-1].tags | frozenset(self.cfg.partial_set))
                marks = self.cfg.combine_set
                stmts.extend(b if narrow and b is new[-1] else planned(b, marks, one and b is new[-1])
                             for b in new)
                changed = True
            declared.extend(bufs)
        if not declared:
            return (replace(block, stmts=tuple(stmts)) if changed else block), []
        zeros = [tuple(Affine() for _ in shape.dims) for _, shape in declared]
        if parents:
            refs = [Refinement(RefDir.INOUT, n, z, shape) for (n, shape), z in zip(declared, zeros)]
        else:
            refs = [
                Refinement(RefDir.NONE, n, z, shape, tags=frozenset({"tmp"}))
                for (n, shape), z in zip(declared, zeros)
            ]
            declared = []
        return replace(block, refs=block.refs + tuple(refs), stmts=tuple(stmts)), declared

    # ------------------------------------------------------------------------------ one block
    def split(
        self, block: Block, parents: tuple[Block, ...], cap: int = -1, one: bool = False
    ) -> tuple[list[Block], list[tuple[str, TensorShape]]] | None:
        """The init, partial and combine blocks replacing ``block`` (the partial and the combine
        split again while they qualify) and the buffers they need, or None when the block does not
        qualify. ``cap``: the most thread lanes per output point (0: none; -1: ``cfg.lanes``).
        ``one``: a self-initialised partial's combine is not split again (``one_kernel``)."""
        cap = self.cfg.lanes if cap < 0 else cap
        # The new blocks must run once each, in order: inside an indexed block they would run per
        # point, and the points of one P (its init, its partials) could race.
        if any(p.idxs for p in parents):
            return None
        acc = accumulator(block, parents[-1])
        if acc is None or acc.agg_op not in self.cfg.aggs:
            return None
        outs = access_indexes(acc)
        choice = self.choose(block, parents[-1], acc, outs, cap)
        if choice is None:
            return None
        view = parents[-1].ref(acc.source).shape
        dtype = partial_dtype(acc.agg_op, Context(parents).ref_chain(block, acc.into)[-1].shape.dtype)
        pname = fresh(f"{acc.source}_part", self.taken)
        self.taken.add(pname)
        # A partial still short of lanes (one index's range capped them: a global sum of a matrix)
        # splits another of its reduction indexes, whose lanes join P's: one combine over all.
        partial, pacc, sizes, paccess = block, acc, view.sizes, acc.access
        lanes: list[tuple[str, int]] = []
        moved: list | None = None
        owned = set(outs)
        while True:
            taken = {i.name for i in partial.idxs}
            names = []
            for part in choice.parts:
                names.append(fresh(f"{choice.index.name}_{part.suffix}", taken))
                taken.add(names[-1])
            new = [(n, p.range) for n, p in zip(names, choice.parts) if p.lane]
            at, extent = tuple(Affine.var(n) for n, _ in new), tuple(r for _, r in new)
            sizes = extent + sizes if choice.lane_first else sizes + extent
            paccess = at + paccess if choice.lane_first else paccess + at
            lanes = new + lanes if choice.lane_first else lanes + new
            pshape = TensorShape.dense(dtype, sizes)
            pview = Refinement(RefDir.OUT, pname, paccess, pshape.scalar_view(), agg_op=acc.agg_op)
            partial, got = self.partial(partial, pacc, choice, names, pview, owned)
            moved = got if moved is None else moved
            pacc = next(r for r in partial.refs if r.into == pname)
            owned |= {n for n, _ in new}
            count = math.prod(r for _, r in lanes)
            rest = max(cap // count, 1) if cap else 0
            choice = self.choose(partial, parents[-1], pacc, owned, rest)
            if choice is None:
                break
        partial = replace(partial, name=f"{block.name}_partial" if block.name else "")
        combine = self.combine(block, acc, lanes, pview, outs, moved)
        bufs = [(pname, pshape)]
        # The combine uses P, which the parent declares once this walk returns: show it now. A
        # long combine splits again.
        whole = Refinement(RefDir.INOUT, pname, tuple(Affine() for _ in sizes), pshape)
        declared = (*parents[:-1], replace(parents[-1], refs=(*parents[-1].refs, whole)))
        if self.cfg.self_init and only_output(partial, pacc):
            blocks = [self_initialised(partial, pacc, dtype, parent_sizes(partial, declared[-1]))]
        else:
            blocks = [_init(block, acc.agg_op, pname, pshape), partial]
        # one kernel (``one_kernel``) where the code generator keeps the partials in registers
        one = one and len(blocks) == 1 and dtype not in NO_REGISTER
        again = None if one else self.split(combine, declared, -1)
        blocks.extend([combine] if again is None else again[0])
        bufs.extend([] if again is None else again[1])
        return blocks, bufs

    def choose(
        self, block: Block, parent: Block, acc: Refinement, outs: set[str], cap: int
    ) -> _Split | None:
        """The split giving the most lanes (see the module docstring), or None."""
        cfg = self.cfg
        ins = [r for r in block.refs if r.dir is RefDir.IN]
        outputs = math.prod(i.range for i in block.idxs if i.name in outs)
        reduction = math.prod(i.range for i in block.idxs if i.name not in outs)
        threaded = outputs < self.max_outputs and reduction >= cfg.min_reduction
        if cfg.min_free and _free_sides(block, parent) >= cfg.min_free:
            return None  # (the matrix unit's: M = 16 whole took 0.047 ms on an H100, split 0.162)
        # Vector lanes pay only where no output index already walks an input contiguously, and
        # only while P stays small next to what the block reads (a matmul-like block, reading
        # each element many times, would need its output times the lanes).
        views = views_of(parent)
        reads = sum(views[r.source].shape.elements for r in ins)
        vectorizable = (
            not cfg.interleave
            and cfg.vector > 1
            and outputs * cfg.vector * 8 <= reads
            and not any(abs(_flat_stride(r, v)) == 1 for r in ins for v in outs)
        )
        best, best_key = None, None
        for pos, ix in enumerate(block.idxs):
            if ix.name in outs:
                continue
            strides = [abs(_flat_stride(r, ix.name)) for r in ins]
            contiguous = 1 in strides
            vector = cfg.vector if vectorizable and contiguous and ix.range >= 8 * cfg.vector else 1
            lanes = 1
            if threaded:
                lanes = min(-(-self.target // outputs), ix.range // vector, reduction // cfg.min_chunk)
                if cap:
                    lanes = min(lanes, cap)
                if cfg.only_po2 and lanes >= 1:
                    lanes = 1 << (lanes.bit_length() - 1)
                lanes = max(lanes, 1)
            if lanes * vector < 2:
                continue
            prefer = contiguous if cfg.interleave else max(strides, default=0)
            key = (lanes * vector, prefer, -pos)
            if best_key is None or key > best_key:
                best, best_key = (ix, lanes, vector, contiguous), key
        if best is None:
            return None
        ix, lanes, vector, contiguous = best
        if cfg.interleave:
            steps = -(-ix.range // lanes)
            parts = (_Part("l", lanes, 1, True), _Part("t", steps, lanes, False))
            return _Split(ix, tuple(p for p in parts if p.range > 1), lane_first=not contiguous)
        chunk = vector * -(-ix.range // (lanes * vector))  # a whole number of vector steps
        parts = (
            _Part("l", -(-ix.range // chunk), chunk, True),
            _Part("t", chunk // vector, vector, False),
            _Part("v", vector, 1, True),
        )
        return _Split(ix, tuple(p for p in parts if p.range > 1), lane_first=False)

    def partial(
        self,
        block: Block,
        acc: Refinement,
        choice: _Split,
        names: list[str],
        pview: Refinement,
        outs: set[str],
    ) -> tuple[Block, list[Statement]]:
        """The block over the parts in place of the split index, storing into ``P``; and the
        statements of other outputs moved to the combine block (with their refs, first)."""
        r = choice.index
        whole = Affine()
        for name, part in zip(names, choice.parts):
            whole = whole + Affine.var(name) * part.coeff
        out = substitute_indexes(block, {r.name: whole})
        constraints = out.constraints
        if math.prod(p.range for p in choice.parts) != r.range:  # the parts are a mixed radix
            constraints += (Affine.constant(r.range - 1) - whole,)
        idxs: list[Index] = []
        for ix in block.idxs:
            new = tuple(Index(n, p.range) for n, p in zip(names, choice.parts))
            idxs.extend(new if ix is r else (ix,))
        moved = _movable(block, acc, outs)
        kept_refs = tuple(ref for ref in out.refs if ref.into not in moved)
        out = replace(out, idxs=tuple(idxs), constraints=constraints, refs=kept_refs)
        out = _drop_stores(out, moved)
        out = rename_refs(out, {acc.into: pview.into})
        wide = partial_dtype(acc.agg_op, acc.shape.dtype)
        pref = replace(pview, shape=replace(pview.shape, dtype=wide), location=acc.location)
        if wide is not acc.shape.dtype and acc.agg_op == "add":
            out = _exact_products(out, acc.shape.dtype, pview.into)
        partial = replace(
            out,
            name=f"{block.name}_partial" if block.name else "",
            refs=tuple(pref if ref.into == pview.into else ref for ref in out.refs),
            tags=block.tags | frozenset(self.cfg.partial_set),
        )
        carried = [ref for ref in block.refs if ref.into in moved]
        return partial, [*carried, *_stores_of(block, moved)]

    def combine(
        self,
        block: Block,
        acc: Refinement,
        lanes: list[tuple[str, int]],
        pview: Refinement,
        outs: set[str],
        moved: list,
    ) -> Block:
        """``O[out] = agg over lanes of P[out, lanes]`` over the output indexes, with the moved
        outputs."""
        carried = [m for m in moved if isinstance(m, Refinement)]
        stmts = [m for m in moved if not isinstance(m, Refinement)]
        refs = (
            replace(pview, dir=RefDir.IN, agg_op="", location=acc.location),
            replace(acc, shape=replace(acc.shape, dtype=pview.shape.dtype)),
            *carried,
        )
        value = fresh("$partial", {s.into for s in stmts if isinstance(s, (Constant, Load))})
        tags = {t for t in block.tags if not t.startswith("comb_op_")}
        if tags != set(block.tags):
            tags.add("comb_op_none")
        count = math.prod(n for _, n in lanes)
        return Block(
            f"{block.name}_combine" if block.name else "",
            tuple(ix for ix in block.idxs if ix.name in outs) + tuple(Index(n, r) for n, r in lanes),
            tuple(c for c in block.constraints if set(c.vars) <= outs),
            refs,
            (Load(pview.into, value), Store(value, acc.into), *stmts),
            frozenset(tags) | frozenset(self.cfg.combine_set),
            (f"{acc.into} combines the {count} partials of {pview.into}",),
            block.location,
        )


def _output_dtype(block: Block, parents: tuple[Block, ...]) -> DType | None:
    """The element type of the buffer ``block`` aggregates into (None: no one accumulator)."""
    acc = accumulator(block, parents[-1])
    return None if acc is None else Context(parents).ref_chain(block, acc.into)[-1].shape.dtype


def _global(block: Block, parent: Block) -> bool:
    """``block`` aggregates into one element (no output index): the reduction ``one_kernel``
    runs as one kernel."""
    acc = accumulator(block, parent)
    return acc is not None and not access_indexes(acc)


def _showing(block: Block, bufs: list[tuple[str, TensorShape]]) -> Block:
    """``block`` with views of the new buffers ``bufs``, as it will declare them."""
    views = (Refinement(RefDir.INOUT, n, tuple(Affine() for _ in sh.dims), sh) for n, sh in bufs)
    return replace(block, refs=(*block.refs, *views))


# ------------------------------------------------------------------------------ helpers
def _movable(block: Block, acc: Refinement, outs: set[str]) -> set[str]:
    """Outputs other than ``acc`` that the combine block writes exactly as the block does (see the
    module docstring); none unless every constraint uses only output indexes."""
    if any(not set(c.vars) <= outs for c in block.constraints):
        return set()
    constants = {s.into for s in block.stmts if isinstance(s, Constant)}
    moved = set()
    for ref in block.refs:
        if ref is acc or ref.dir is RefDir.IN:
            continue
        stores = [s for s in block.stmts if isinstance(s, Store) and s.into == ref.into]
        loads = [s for s in block.stmts if isinstance(s, Load) and s.from_ == ref.into]
        if stores and not loads and access_indexes(ref) <= outs and all(s.from_ in constants for s in stores):
            moved.add(ref.into)
    return moved


def _stores_of(block: Block, moved: set[str]) -> list[Statement]:
    """The moved outputs' stores, each after the constant it stores."""
    out: list[Statement] = []
    for s in block.stmts:
        if isinstance(s, Store) and s.into in moved:
            const = next(c for c in block.stmts if isinstance(c, Constant) and c.into == s.from_)
            if const not in out:
                out.append(const)
            out.append(s)
    return out


def _drop_stores(block: Block, moved: set[str]) -> Block:
    """``block`` without the moved outputs' stores, nor constants only they used."""
    stmts = [s for s in block.stmts if not (isinstance(s, Store) and s.into in moved)]
    used = {s.from_ for s in stmts if isinstance(s, Store)}
    used |= {x for s in stmts if isinstance(s, Intrinsic) for x in s.inputs}
    stmts = [s for s in stmts if not isinstance(s, Constant) or s.into in used]
    return replace(block, stmts=tuple(stmts))


def _free_sides(block: Block, parent: Block) -> int:
    """For a GEMM of float16 or bfloat16 operands (``stripe.gemm.match``, as ``tensorize`` reads
    one), the fewer of its M and N points; 0 for any other block."""
    views = tables_of(parent)
    g = gemm_match(block, views.names, views.dtypes, reorder=False, halves=True)
    return min(g.m.total, g.n.total) if g is not None and g.dtype.is_narrow_float else 0


def _flat_stride(ref: Refinement, idx: str) -> int:
    """``idx``'s step in elements of ``ref``'s buffer."""
    return sum(int(a.coeff(idx)) * d.stride for a, d in zip(ref.access, ref.shape.dims))


def _init(block: Block, agg: str, pname: str, pshape: TensorShape) -> Block:
    """The special filling ``P`` with ``agg``'s identity, as lowering starts its accumulators."""
    fn = fill_name(agg)
    ref = Refinement(RefDir.OUT, pname, tuple(Affine() for _ in pshape.dims), pshape, agg_op="assign")
    tags = {"special", fn} | ({"kernel"} & block.tags)
    return Block(
        f"{block.name}_init" if block.name else "",
        refs=(ref,),
        stmts=(Special(fn, (), (pname,)),),
        tags=frozenset(tags),
        location=block.location,
    )


def _exact_products(block: Block, narrow: DType, into: str) -> Block:
    """``block`` (a partial summing into float32 ``P``, ``into``) with each product of two
    ``narrow`` (float16 or bfloat16) loads that it stores into ``P`` computed in float32: exact
    there (11 x 11 or 8 x 8 significant bits fit 24), as docs/semantics.md 8.1.1 has a matrix
    product of these types (rounded to ``narrow`` it erred up to 2^-11 a product: the M = 16
    GEMM of issue 41)."""
    loads = {s.into for s in block.stmts if isinstance(s, Load) and block.ref(s.from_).shape.dtype is narrow}
    stored = {s.from_ for s in block.stmts if isinstance(s, Store) and s.into == into}
    stmts = tuple(
        replace(s, dtype=DType.FLOAT32)
        if isinstance(s, Intrinsic) and s.name == "mul" and s.dtype is narrow and len(s.inputs) == 2
        and set(s.inputs) <= loads and set(s.outputs) <= stored else s
        for s in block.stmts
    )
    return replace(block, stmts=stmts)


def partial_dtype(agg_op: str, dtype: DType) -> DType:
    """The element type of the partials of an aggregation into ``dtype``: float32 for sums and
    products of float16 and bfloat16 (each partial a long sum of its own: rounded to 11 or 8 bits
    after every addition, the M = 16 GEMM's split sums erred 15x cuBLAS's), else ``dtype``. The
    combine rounds once more, into the output."""
    if agg_op in ("add", "mul") and dtype in (DType.FLOAT16, DType.BFLOAT16):
        return DType.FLOAT32
    return dtype
