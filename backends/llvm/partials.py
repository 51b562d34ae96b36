"""Long float sums in blocks: each element's ``+`` reduction summed as fresh partials of at most
``VectorConfig.sum_block`` points, so its rounding error grows like the log of its length, not
like its length (docs/semantics.md §8.3; never under ``strict``, which keeps the interpreter's order).

A float32 running sum stalls once it reaches ``2**24`` times the values it adds (a sum of ones
stops at 16777216), and its error grows with every value before that. Numpy sums pairwise; the
code generator does the same at no measurable cost:

* **Plain loops** (``plan_sums``, ``sum_in_blocks``, ``chunked``): a leaf block whose one store
  adds into a float32/float64 element that its innermost loops do not move (the *reduction
  suffix* of ``schedule``'s order: a global sum's chunk, a row sum's row, ``O[] = +(A[i] * B[j])``'s
  ``i, j``) runs that suffix, per element, in blocks of at most ``sum_block`` points (the
  innermost loops whole, one loop cut into chunks), each summed into a fresh partial (LLVM's
  vectorizer splits it again into a few dozen lane sums and adds them as a tree). The blocks'
  partials go through ``Cascade``, a binary counter of pairwise sums (block 2k + 1 is added to
  block 2k, their sum to the pair before, ...), and the element gets their total once. A
  reduction of at most ``sum_block`` points per element is left as it was.
* **The micro-kernel** (``microkernel_sums``): a tile whose reduction has more than ``sum_block``
  points runs its first reduction index in chunks, each into fresh zero accumulators added to the
  tile's running ones after it (error like ``n / sum_block``: a column sum of 2**24 rows in
  float32 is exact). Its cache-blocked path (a GEMM's K blocks) is left as it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from backends.llvm.loops import View, counted_loop, for_range, smin
from backends.llvm.scalars import I64, Emitter, i64, reg_type
from stripe.ir import Block, Constant, Intrinsic, Load, LoadIndex, RefDir, Store
from tile.dtypes import DType

LEVELS = 64  # a binary counter of 64 levels holds any count of blocks an i64 index can reach
FLOATS = (DType.FLOAT32, DType.FLOAT64)


@dataclass(frozen=True)
class SumBlocks:
    """Where a plain loop nest's per-element sum starts and how it is cut (loop depths)."""

    out: str  # the refinement the sum adds into
    start: int  # the first loop of the reduction suffix: one sum per element from here
    chunked: int  # the loop run in chunks of ``chunk`` iterations (the loops inside it whole)
    chunk: int


def plan_sums(block: Block, order, limit: int, after: int, dtypes: dict[str, DType]) -> SumBlocks | None:
    """How ``block``'s loops (in ``order``, ``after`` the depth of a thread-bounded loop or -1)
    sum in blocks of at most ``limit`` points, or None when they need not or may not: not a leaf
    of loads, intrinsics, constants and one ``+`` store into a float32/float64 buffer element
    (``dtypes``: buffer dtype by refinement) that nothing reads, or at most ``limit`` points per
    element."""
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
    start = len(order)
    while start > after + 1 and names[start - 1] not in moving:
        start -= 1
    ranges = [block.idxs[k].range for k in order[start:]]
    if math.prod(ranges) <= limit:
        return None
    inner, chunked = 1, len(order) - 1
    while chunked > start and inner * ranges[chunked - start] <= limit:
        inner *= ranges[chunked - start]
        chunked -= 1
    return SumBlocks(out.into, start, chunked, max(1, limit // inner))


class Cascade:
    """Pairwise sums of a sequence of partials in ``LEVELS`` stack slots: level ``j`` holds the sum
    of ``2**j`` consecutive partials while bit ``j`` of the count is set (a binary counter whose
    carries are the pairwise additions)."""

    def __init__(self, em: Emitter, dt: DType):
        self.em, self.typ = em, reg_type(dt)
        self.levels = em.alloca(self.typ, LEVELS)
        self.count = em.alloca(I64)

    def reset(self) -> None:
        self.em.builder.store(i64(0), self.count)

    def level(self, b: ir.IRBuilder, j: ir.Value) -> ir.Value:
        return b.gep(self.levels, [j], inbounds=True, source_etype=self.typ)

    def push(self, value: ir.Value) -> None:
        b = self.em.builder
        k = b.load(self.count, typ=I64)
        b.store(b.add(k, i64(1)), self.count)
        fn = b.block.function
        head, carry, done = (fn.append_basic_block() for _ in range(3))
        entry = b.block
        b.branch(head)
        b.position_at_end(head)
        lvl, bits, acc = b.phi(I64), b.phi(I64), b.phi(self.typ)
        lvl.add_incoming(i64(0), entry)
        bits.add_incoming(k, entry)
        acc.add_incoming(value, entry)
        b.cbranch(b.icmp_unsigned("!=", b.and_(bits, i64(1)), i64(0)), carry, done)
        b.position_at_end(carry)  # the level's earlier sum, then this one: their order kept
        lvl.add_incoming(b.add(lvl, i64(1)), carry)
        bits.add_incoming(b.lshr(bits, i64(1)), carry)
        acc.add_incoming(b.fadd(b.load(self.level(b, lvl), typ=self.typ), acc), carry)
        b.branch(head)
        b.position_at_end(done)
        b.store(acc, self.level(b, lvl))

    def total(self) -> ir.Value:
        """The sum of the levels in use, the smallest (latest) first; ``-0.0`` for none."""
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
        acc.add_incoming(ir.Constant(self.typ, -0.0), entry)
        b.cbranch(b.icmp_unsigned("!=", bits, i64(0)), body, done)
        b.position_at_end(body)
        used = b.icmp_unsigned("!=", b.and_(bits, i64(1)), i64(0))
        added = b.fadd(acc, b.load(self.level(b, lvl), typ=self.typ))
        lvl.add_incoming(b.add(lvl, i64(1)), body)
        bits.add_incoming(b.lshr(bits, i64(1)), body)
        acc.add_incoming(b.select(used, added, acc), body)
        b.branch(head)
        b.position_at_end(done)
        return acc


@dataclass
class Running:
    """The sum in progress at one element: ``partial`` (what the block's store adds into) and
    the cascade its blocks go to."""

    partial: View
    cascade: Cascade


def sum_in_blocks(em: Emitter, out: View, run) -> None:
    """Runs ``run(running)`` (the reduction suffix for one element of ``out``; its chunked loop
    goes through ``chunked``) and adds the blocks' pairwise total to the element once."""
    dt = out.buf_dtype
    slot = em.alloca(reg_type(dt))
    cascade = Cascade(em, dt)
    cascade.reset()
    em.builder.store(ir.Constant(reg_type(dt), -0.0), slot)  # a guard may skip every block
    run(Running(View(out.name, slot, dt, i64(0), (), out.dtype, "add"), cascade))
    total = cascade.total()
    b = em.builder
    current = em.load(out.ptr, out.base, dt)
    em.store(b.fadd(current, total, flags=("reassoc",)), out.ptr, out.base, dt)


def chunked(em: Emitter, lo: ir.Value, hi: ir.Value, step: int, running: Running, body) -> None:
    """``for_range(lo, hi, body)`` in chunks of ``step``, each summed into a fresh partial that
    then goes to the cascade."""
    slot, typ = running.partial.ptr, reg_type(running.partial.buf_dtype)

    def chunk(q0: ir.Value) -> None:
        b = em.builder
        b.store(ir.Constant(typ, -0.0), slot)  # -0.0: x + -0.0 is x, also for x = -0.0
        for_range(em, q0, smin(b, b.add(q0, i64(step)), hi), body)
        running.cascade.push(em.builder.load(slot, typ=typ))

    counted_loop(em.builder, lo, hi, chunk, step)


def microkernel_sums(mk, base: dict) -> None:
    """``mk.red_level(0, base, None)`` (a ``microkernel.MicroKernel``'s reduction for its current
    tile), in chunks of the first reduction index when the tile's reduction is longer than the
    code generator's ``sum_block``: each chunk into fresh accumulators, added to the tile's after."""
    cfg, s = mk.cg.vector, mk.s
    ranges = [mk.block.idxs[k].range for k in s.red]
    if not (cfg.reassoc and cfg.sum_block > 0 and s.agg == "add" and ranges):
        mk.red_level(0, base, None)
        return
    inner = math.prod(ranges[1:])
    k0, em = s.red[0], mk.em
    lo, hi = mk.bounds[k0]
    if mk.blocking:  # a cache block of K (at most a few thousand points): one fresh chunk
        step = mk.blocking[0]
    elif inner * ranges[0] > cfg.sum_block:
        step = max(1, cfg.sum_block // inner)
    else:
        mk.red_level(0, base, None)
        return
    saved = mk.slots
    fresh = [[em.alloca(mk.vt) for _ in row] for row in saved]
    zero = ir.Constant(mk.vt, [-0.0] * mk.width)

    def chunk(q0: ir.Value) -> None:
        b = em.builder
        for row in fresh:
            for slot in row:
                b.store(zero, slot)
        mk.slots, mk.bounds[k0] = fresh, (q0, smin(b, b.add(q0, i64(step)), hi))
        mk.red_level(0, base, None)
        mk.slots, mk.bounds[k0] = saved, (lo, hi)
        b = em.builder
        for row, new in zip(saved, fresh):
            for acc, part in zip(row, new):
                total = b.fadd(b.load(acc, typ=mk.vt), b.load(part, typ=mk.vt), flags=("reassoc",))
                b.store(total, acc)

    counted_loop(em.builder, lo, hi, chunk, step)


__all__ = ["Cascade", "SumBlocks", "chunked", "microkernel_sums", "plan_sums", "sum_in_blocks"]
