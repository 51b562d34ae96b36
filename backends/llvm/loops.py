"""Views of buffers and the loop helpers the code generator and the specials share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llvmlite import ir

from backends.llvm.scalars import I64, Emitter, i64
from stripe.ir import Dim, Shaped
from tile.dtypes import DType


@dataclass(frozen=True)
class View(Shaped):
    """A refinement at the current point: element ``base + Σ k_d * stride_d`` of buffer ``ptr``.

    ``buf_dtype`` is how the buffer's memory holds elements, ``dtype`` the refinement's type:
    reads convert from the first to the second, writes back.
    """

    name: str
    ptr: ir.Value
    buf_dtype: DType
    base: ir.Value  # i64 element offset
    dims: tuple[Dim, ...]
    dtype: DType
    agg_op: str

    def at(self, em: Emitter, coords: Sequence[ir.Value]) -> ir.Value:
        """The buffer position of the element at ``coords`` (i64 values, one per dimension)."""
        pos = self.base
        for c, d in zip(coords, self.dims):
            if type(d.stride).__name__ == "Slot" or d.stride:  # a generic kernel's stride: run time
                pos = em.builder.add(pos, em.builder.mul(c, em.num(d.stride)))
        return pos

    def read(self, em: Emitter, pos: ir.Value) -> ir.Value:
        return em.convert(em.load(self.ptr, pos, self.buf_dtype), self.buf_dtype, self.dtype)

    def write(self, em: Emitter, pos: ir.Value, value: ir.Value) -> None:
        """Overwrite one element with ``value`` (a register of the view's dtype)."""
        em.store(em.convert(value, self.dtype, self.buf_dtype), self.ptr, pos, self.buf_dtype)


def counted_loop(
    b: ir.IRBuilder, lo: ir.Value, hi: ir.Value, body: Callable[[ir.Value], None], step=1, whole=False
) -> ir.Value:
    """``for (x = lo; x < hi; x += step) body(x)`` (``whole``: only while ``x + step <= hi``, so
    every step run is whole), the builder left after the loop. Returns the counter, which at the
    exit is the first ``x`` not run (where a remainder loop starts)."""
    step_v = i64(step) if isinstance(step, int) else step
    fn = b.block.function
    head, loop, done = (fn.append_basic_block() for _ in range(3))
    entry = b.block
    b.branch(head)
    b.position_at_end(head)
    x = b.phi(I64)
    x.add_incoming(lo, entry)
    b.cbranch(b.icmp_signed("<=", b.add(x, step_v), hi) if whole else b.icmp_signed("<", x, hi), loop, done)
    b.position_at_end(loop)
    body(x)
    x.add_incoming(b.add(x, step_v, flags=["nsw"]), b.block)
    b.branch(head)
    b.position_at_end(done)
    return x


def remainder(
    b: ir.IRBuilder, lo: ir.Value, hi: ir.Value, mr: int, tile: Callable[[ir.Value, int], None]
) -> None:
    """``tile(r0, p)`` over the fewer than ``mr`` rows ``[lo, hi)``: a tile of ``p`` rows for each
    power of two ``p < mr`` whose bit the count has, largest first (only those needed when both
    bounds are constants, else each behind a test of its bit)."""
    sizes = [1 << j for j in range(mr.bit_length()) if 1 << j < mr][::-1]
    if isinstance(lo, ir.Constant) and isinstance(hi, ir.Constant):
        r0, left = int(lo.constant), int(hi.constant) - int(lo.constant)
        for p in sizes:
            if left & p:
                tile(i64(r0), p)
                r0 += p
        return
    left = b.sub(hi, lo)
    r0 = lo
    for p in sizes:
        bit = b.and_(left, i64(p))
        with b.if_then(b.icmp_signed("!=", bit, i64(0))):
            tile(r0, p)
        r0 = b.add(r0, bit)


def smin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """The smaller of two i64 values (signed)."""
    return b.select(b.icmp_signed("<", x, y), x, y)


def for_range(em: Emitter, lo: ir.Value, hi: ir.Value, body: Callable[[ir.Value], None]) -> None:
    """``for (i = lo; i < hi; i++) body(i)`` with the builder left after the loop."""
    counted_loop(em.builder, lo, hi, body)


def for_box(em: Emitter, sizes: Sequence[int], body: Callable[[list[ir.Value]], None]) -> None:
    """Nested loops over ``sizes`` (row-major: the first size outermost)."""

    def level(k: int, coords: list[ir.Value]) -> None:
        if k == len(sizes):
            body(coords)
            return
        for_range(em, i64(0), em.num(sizes[k]), lambda c: level(k + 1, [*coords, c]))

    level(0, [])


def unravel(em: Emitter, flat: ir.Value, sizes: Sequence[int]) -> list[ir.Value]:
    """Row-major coordinates of the flat position ``flat`` in a box of ``sizes``."""
    b = em.builder
    coords = []
    inner = 1
    for s in reversed(sizes):
        c = b.udiv(flat, i64(inner)) if inner != 1 else flat
        coords.append(b.urem(c, i64(s)) if s else i64(0))
        inner *= max(s, 1)
    return list(reversed(coords))
