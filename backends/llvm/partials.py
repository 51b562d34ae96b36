"""Long float sums in blocks: each element's ``+`` reduction summed as fresh partials of at most
``VectorConfig.sum_block`` points (4096) combined pairwise, so its rounding error grows like the log
of its length, not like its length (docs/semantics.md §8.3; never under ``strict``, which keeps the
interpreter's order).

A float32 running sum stalls once it reaches ``2**24`` times the values it adds (a sum of ones
stops at 16777216), and its error grows with every value before that. Numpy sums pairwise; the
code generator now does the same at no measurable cost:

* **Plain loops** (``plan_sums``, ``sum_in_blocks``, ``chunked``): a leaf block whose one store
  adds into a float32/float64 element runs the *reduction suffix* of ``schedule``'s order (the
  loops, innermost, that do not move the element: a global sum's chunk, a row sum's row,
  ``O[] = +(A[i] * B[j])``'s ``i, j``; up to ``MAX_OWNED`` elements of loops inside them, such as
  a split sum's lanes, keep one partial each) in blocks of at most ``sum_block`` points: the
  innermost loops whole, one loop cut into chunks (an innermost loop of up to ``WHOLE`` blocks
  stays whole). Each block sums into a fresh partial (LLVM's vectorizer splits it again into a few
  dozen lane sums and adds them as a tree), the partials go through ``Cascade``, a binary counter
  of pairwise sums, and the element gets their total once. Where no input is read contiguously
  along the innermost loop, or a constraint guards it, the partial is summed in order (no
  gathers; such loops do not vectorize) in ``ORDERED_SHORTER`` times shorter blocks. Left as
  written: a reduction of at most one block per element, and one read far apart along its
  innermost loop with output loops inside it (the lanes of a split sum of a few long columns:
  their in-order partials would be packed into gathers, four times slower).
* **The micro-kernel** (``microkernel_sums``): each lane of its register tile sums one element in
  order, so a tile's reduction runs in chunks of ``sum_block / MICRO_SHORTER`` points of its first
  reduction index, each into fresh accumulators, which go through a ``Cascade`` of vectors; a
  cache block of K (a GEMM's) is one such chunk, added to C after it, so C's error grows with the
  number of K blocks, not with K.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from llvmlite import ir

from backends.llvm.loops import View, counted_loop, for_range, smin
from backends.llvm.scalars import I64, Emitter, i64, reg_type
from backends.llvm.symbolic import is_slot
from stripe.ir import Block, Constant, Intrinsic, Load, LoadIndex, RefDir, Store
from tile.dtypes import DType

LEVELS = 64  # a binary counter of 64 levels holds any count of blocks an i64 index can reach
FLOATS = (DType.FLOAT32, DType.FLOAT64)
ORDERED_SHORTER = 16  # blocks of an ``ordered`` sum are this much shorter (256 points by default)
MICRO_SHORTER = 8  # the micro-kernel's chunks are this much shorter (512 reduction points)
WHOLE = 4  # an innermost reduction loop of up to 4 blocks is one block
RUNTIME_CHUNKS = 1 << 36  # a run-time K (generic kernels): chunks at most (a row of 2**36 points: 256 GiB)
MAX_OWNED = 64  # output elements of the innermost loops whose partials are kept apart (unrolled)


@dataclass(frozen=True)
class SumBlocks:
    """Where a plain loop nest's per-element sum starts and how it is cut (loop depths)."""

    out: str  # the refinement the sum adds into
    start: int  # the first loop of the reduction suffix: one sum per element from here
    chunked: int  # the loop run in chunks of ``chunk`` iterations (the loops inside it whole)
    chunk: int
    owned: tuple[tuple[str, int], ...] = ()  # innermost loops that move the output: (index, range)
    ordered: bool = False  # no input is read contiguously along the innermost reduction loop

    @property
    def width(self) -> int:
        """How many elements share the reduction suffix (one partial each)."""
        return math.prod(r for _, r in self.owned)


def plan_sums(block: Block, order, limit: int, after: int, dtypes: dict[str, DType]) -> SumBlocks | None:
    """How ``block``'s loops (in ``order``, ``after`` the depth of a thread-bounded loop or -1)
    sum in blocks of at most ``limit`` points, or None when they need not or may not: not a leaf
    of loads, intrinsics, constants and one ``+`` store into a float32/float64 buffer element
    (``dtypes``: buffer dtype by refinement) that nothing reads, more than ``MAX_OWNED`` elements
    in the innermost loops that move the output, or at most ``limit`` points per element."""
    if limit <= 0 or not order:
        return None
    if any(not isinstance(s, (Load, Store, Intrinsic, Constant, LoadIndex)) for s in block.stmts):
        return None
    stores = [s for s in block.stmts if isinstance(s, Store)]
    if len(stores) != 1:
        return None
    out = block.ref(stores[0].into)
    if out.agg_op != "add" or dtypes.get(out.into) not in FLOATS:
        return None
    if out.dir is RefDir.NONE and out.from_ is None:
        return None  # a per-point local
    if any(isinstance(s, Load) and s.from_ == out.into for s in block.stmts):
        return None
    moving = {v for a in out.access for v in a.vars}
    names = [block.idxs[k].name for k in order]
    end = len(order)
    while end > after + 1 and names[end - 1] in moving:
        end -= 1
    owned = tuple((names[j], block.idxs[order[j]].range) for j in range(end, len(order)))
    start = end
    while start > after + 1 and names[start - 1] not in moving:
        start -= 1
    ranges = [block.idxs[k].range for k in order[start:end]]
    # an innermost loop of up to WHOLE blocks runs whole (cutting it costs more than a block gains)
    limit = max(limit, min(ranges[-1] if ranges else 0, WHOLE * limit))
    if start == end or math.prod(r for _, r in owned) > MAX_OWNED or math.prod(ranges) <= limit:
        return None
    ordered = not any(
        abs(sum((a.coeff(names[end - 1]) * d.stride for a, d in zip(r.access, r.shape.dims)), start=0)) == 1
        for r in block.refs
        if r.dir in (RefDir.IN, RefDir.INOUT) and len(r.access) == len(r.shape.dims)
    )
    if ordered and owned:
        return None  # the elements' in-order partials would become gathers (SLP): kept as written
    guarded = any(set(c.vars) & set(names[end - 1 :]) for c in block.constraints)  # its innermost loops
    if ordered or guarded:  # a partial summed in order, one lane (a vectorized one would gather,
        # a guarded loop does not vectorize): shorter blocks
        limit = max(1, limit // ORDERED_SHORTER)
    inner, chunked = 1, end - 1
    while chunked > start and inner * ranges[chunked - start] <= limit:
        inner *= ranges[chunked - start]
        chunked -= 1
    return SumBlocks(out.into, start, chunked, max(1, limit // inner), owned, ordered and not guarded)


class Cascade:
    """Pairwise sums of a sequence of partials (``width`` elements each, summed apart) in
    ``LEVELS`` stack slots: level ``j`` holds the sum of ``2**j`` consecutive partials while bit
    ``j`` of the count is set (a binary counter whose carries are the pairwise additions)."""

    def __init__(self, em: Emitter, typ: ir.Type, width: int = 1, most: int = 0):
        """``typ``: a float, or a vector of floats (the micro-kernel's accumulators); ``most``: at
        most that many partials come (0: any count), so fewer levels are kept (a 512-point sum in
        3 K blocks: 2 levels, not 64; the micro-kernel's stack stays small)."""
        self.em, self.typ, self.width = em, typ, width
        lanes = getattr(typ, "count", None)
        self.identity = ir.Constant(typ, -0.0 if lanes is None else [-0.0] * lanes)
        levels = max(1, most.bit_length()) if most > 0 else LEVELS
        self.levels = em.alloca(self.typ, levels * width)
        self.count = em.alloca(I64)

    def reset(self) -> None:
        self.em.builder.store(i64(0), self.count)

    def at(self, b: ir.IRBuilder, slot: ir.Value, pos: ir.Value) -> ir.Value:
        return b.gep(slot, [pos], inbounds=True, source_etype=self.typ)

    def level(self, b: ir.IRBuilder, j: ir.Value, e: int) -> ir.Value:
        return self.at(b, self.levels, b.add(b.mul(j, i64(self.width)), i64(e)) if self.width > 1 else j)

    def push(self, partial: ir.Value) -> None:
        """Adds the ``width`` values at ``partial`` (a stack slot, left changed) as the next one."""
        b = self.em.builder
        k = b.load(self.count, typ=I64)
        b.store(b.add(k, i64(1)), self.count)
        fn = b.block.function
        head, carry, done = (fn.append_basic_block() for _ in range(3))
        entry = b.block
        b.branch(head)
        b.position_at_end(head)
        lvl, bits = b.phi(I64), b.phi(I64)
        lvl.add_incoming(i64(0), entry)
        bits.add_incoming(k, entry)
        b.cbranch(b.icmp_unsigned("!=", b.and_(bits, i64(1)), i64(0)), carry, done)
        b.position_at_end(carry)  # the level's earlier sum, then this one: their order kept
        for e in range(self.width):
            here = self.at(b, partial, i64(e))
            earlier = b.load(self.level(b, lvl, e), typ=self.typ)
            b.store(b.fadd(earlier, b.load(here, typ=self.typ)), here)
        lvl.add_incoming(b.add(lvl, i64(1)), carry)
        bits.add_incoming(b.lshr(bits, i64(1)), carry)
        b.branch(head)
        b.position_at_end(done)
        for e in range(self.width):
            b.store(b.load(self.at(b, partial, i64(e)), typ=self.typ), self.level(b, lvl, e))

    def total(self, e: int = 0) -> ir.Value:
        """Element ``e``'s sum of the levels in use, the smallest (latest) first; ``-0.0`` for none."""
        b = self.em.builder
        fn = b.block.function
        head, body, done = (fn.append_basic_block() for _ in range(3))
        count = b.load(self.count, typ=I64)
        entry = b.block
        b.branch(head)
        b.position_at_end(head)
        lvl, bits, acc = b.phi(I64), b.phi(I64), b.phi(self.typ)
        lvl.add_incoming(i64(0), entry)
        bits.add_incoming(count, entry)
        acc.add_incoming(self.identity, entry)
        b.cbranch(b.icmp_unsigned("!=", bits, i64(0)), body, done)
        b.position_at_end(body)
        used = b.icmp_unsigned("!=", b.and_(bits, i64(1)), i64(0))
        added = b.fadd(acc, b.load(self.level(b, lvl, e), typ=self.typ))
        lvl.add_incoming(b.add(lvl, i64(1)), body)
        bits.add_incoming(b.lshr(bits, i64(1)), body)
        acc.add_incoming(b.select(used, added, acc), body)
        b.branch(head)
        b.position_at_end(done)
        return acc


@dataclass
class Running:
    """The sums in progress over one reduction suffix: ``slot`` holds one partial per element of
    ``sums.owned`` (row-major), which the block's store adds into, and the cascade its blocks go to."""

    sums: SumBlocks
    slot: ir.Value
    dtype: DType  # the buffer's
    declared: DType  # the output refinement's
    cascade: Cascade

    def partial(self, em: Emitter, vals: dict[str, ir.Value]) -> View:
        """The partial of the element at ``vals`` (the owned loops' index values, from 0)."""
        pos: ir.Value = i64(0)
        for name, size in self.sums.owned:
            pos = em.builder.add(em.builder.mul(pos, i64(size)), vals[name])
        return View(self.sums.out, self.slot, self.dtype, pos, (), self.declared, "add")

    def clear(self, em: Emitter) -> None:
        zero = ir.Constant(reg_type(self.dtype), -0.0)  # -0.0: x + -0.0 is x, also for x = -0.0
        for e in range(self.sums.width):
            em.builder.store(zero, self.cascade.at(em.builder, self.slot, i64(e)))


def sum_in_blocks(em: Emitter, sums: SumBlocks, out: View, run, out_at) -> None:
    """Runs ``run(running)`` (the reduction suffix of the elements of ``sums.owned``; its chunked
    loop goes through ``chunked``) and adds each element's pairwise total to it once, at
    ``out_at(coords)`` (its view, ``out`` being the first's)."""
    dt = out.buf_dtype
    slot = em.alloca(reg_type(dt), sums.width)
    running = Running(sums, slot, dt, out.dtype, Cascade(em, reg_type(dt), sums.width))
    running.cascade.reset()
    running.clear(em)  # a guard may skip every block
    run(running)
    e = 0

    def add(coords: list[ir.Value]) -> None:
        nonlocal e
        view = out_at(coords) if coords else out
        b = em.builder
        total = running.cascade.total(e)
        current = em.load(view.ptr, view.base, dt)
        em.store(b.fadd(current, total, flags=("reassoc",)), view.ptr, view.base, dt)
        e += 1

    _unrolled(em, [size for _, size in sums.owned], add)


def _unrolled(em: Emitter, sizes: list[int], body) -> None:
    """``body(coords)`` at every point of ``sizes``, row-major, unrolled (constant coordinates)."""
    for point in itertools.product(*(range(n) for n in sizes)):
        body([i64(c) for c in point])


def chunked(em: Emitter, lo: ir.Value, hi: ir.Value, step: int, running: Running, body) -> None:
    """``for_range(lo, hi, body)`` in chunks of ``step``, each summed into fresh partials that
    then go to the cascade: the whole chunks as loops of a constant ``step`` iterations (LLVM
    vectorizes them without remainder loops or trip-count checks), then the rest."""
    b = em.builder
    whole = b.add(lo, b.mul(b.sdiv(b.sub(hi, lo), i64(step)), i64(step)))

    def chunk(q0: ir.Value) -> None:
        running.clear(em)
        for_range(em, i64(0), i64(step), lambda x: body(em.builder.add(q0, x)))
        running.cascade.push(running.slot)

    counted_loop(b, lo, whole, chunk, step)
    b = em.builder
    with b.if_then(b.icmp_signed("<", whole, hi)):
        running.clear(em)
        for_range(em, whole, hi, body)
        running.cascade.push(running.slot)


def microkernel_sums(mk, base: dict) -> None:
    """``mk.red_level(0, base, None)`` (a ``microkernel.MicroKernel``'s reduction for its current
    tile), in chunks of its first reduction index when the tile's reduction is longer than
    ``sum_block / MICRO_SHORTER`` points (each lane sums one element, in order): each chunk into
    fresh accumulators that go through a ``Cascade``, whose totals are added to the tile's; a
    cache block of K (``mk.blocking``) as one such chunk, added to the tile (which the blocks
    before it summed)."""
    cfg, s = mk.cg.vector, mk.s
    ranges = [mk.block.idxs[k].range for k in s.red]
    if not (cfg.reassoc and cfg.sum_block > 0 and s.agg == "add" and ranges):
        mk.red_level(0, base, None)
        return
    inner = math.prod(ranges[1:])  # (a generic kernel's inner reductions are known: ``generic_tiles``)
    k0, em = s.red[0], mk.em
    lo, hi = mk.bounds[k0]
    known = not is_slot(ranges[0])  # a generic kernel's K may come at run time: always in chunks
    if mk.blocking:  # a cache block of K (at most a few thousand points): one fresh chunk
        step = mk.blocking[0]
    elif not known or inner * ranges[0] > cfg.sum_block // MICRO_SHORTER:  # each lane: one element in order
        step = max(1, cfg.sum_block // MICRO_SHORTER // inner)
    else:
        mk.red_level(0, base, None)
        return
    # the chunks one tile pushes: within a K block (``kbase`` set) one; over a run-time K, any count
    most = -(-ranges[0] // step) if known else 1 if mk.kbase is not None else RUNTIME_CHUNKS
    saved = mk.slots
    width = sum(len(row) for row in saved)
    if most == 1 and not known:  # a generic kernel's K block: its one chunk added as it is (the
        _one_chunk(mk, base, saved, width)  # cascade's total of one partial is that partial)
        return
    cascade = Cascade(em, mk.vt, width, most)  # (bounds within the range)
    cascade.reset()
    partials = em.alloca(mk.vt, width)  # one array: SROA keeps its constant-index elements in registers
    fresh, e = [], 0
    for row in saved:
        fresh.append([cascade.at(em.builder, partials, i64(e + n)) for n in range(len(row))])
        e += len(row)

    def chunk(q0: ir.Value) -> None:
        b = em.builder
        for e in range(width):
            b.store(cascade.identity, cascade.at(b, partials, i64(e)))
        mk.slots, mk.bounds[k0] = fresh, (q0, smin(b, b.add(q0, i64(step)), hi))
        mk.red_level(0, base, None)
        mk.slots, mk.bounds[k0] = saved, (lo, hi)
        cascade.push(partials)

    counted_loop(em.builder, lo, hi, chunk, step)
    b = em.builder
    for e, acc in enumerate(slot for row in saved for slot in row):
        total = cascade.total(e)
        b = em.builder
        b.store(b.fadd(b.load(acc, typ=mk.vt), total, flags=("reassoc",)), acc)


def _one_chunk(mk, base: dict, saved, width: int) -> None:
    """``mk``'s reduction (its bounds one K block) into fresh accumulators, then added to the
    tile's: what a ``Cascade`` of one partial adds (``-0.0 + p`` is ``p``), without its loops."""
    em = mk.em
    zero = ir.Constant(mk.vt, [-0.0] * mk.width)
    partials = em.alloca(mk.vt, width)  # one array: SROA keeps its constant-index elements in registers
    fresh, e = [], 0
    for row in saved:
        fresh.append([em.builder.gep(partials, [i64(e + n)], inbounds=True, source_etype=mk.vt)
                      for n in range(len(row))])
        e += len(row)
    for slot in (s for row in fresh for s in row):
        em.builder.store(zero, slot)
    mk.slots = fresh
    mk.red_level(0, base, None)
    mk.slots = saved
    b = em.builder
    for acc, part in zip((s for row in saved for s in row), (s for row in fresh for s in row)):
        b.store(b.fadd(b.load(acc, typ=mk.vt), b.load(part, typ=mk.vt), flags=("reassoc",)), acc)


__all__ = ["Cascade", "SumBlocks", "chunked", "microkernel_sums", "plan_sums", "sum_in_blocks"]
