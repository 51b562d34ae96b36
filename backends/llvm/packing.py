"""Packed operand panels of the CPU micro-kernel (``microkernel.MicroKernel``'s part).

An operand whose vector index is gathered (``A @ B.T``'s B), or whose panel the row tiles would read
across cache sets and pages, is copied once per panel (and K block) into contiguous scratch: its
reduction points row-major, ``NV * W`` elements each, which every row tile then streams. The copy
and the reads address the scratch by the reduction point's row-major position (``red_linear``),
counted from a K block's first point when the kernel runs in K blocks (``kbase``).

An operand already laid out as those panels (``in_place``: contiguous along the vector index,
``NV * W`` elements a reduction point, the reduction points row-major; an importer's weights
stored panel by panel, ``tile.onnx``'s ``Gemm``) is not copied: the tiles read it where it is.
"""

from __future__ import annotations

from llvmlite import ir

from backends.llvm.loops import counted_loop, for_range
from backends.llvm.scalars import F64, I32, i64


class Packing:
    """``MicroKernel``'s packing: scratch slots, the copy, and the scratch's addresses."""

    in_place_refs: frozenset[str] = frozenset()  # the ``pack_refs`` read where they are (none here)

    def pack_slot(self, ref: str, count: int) -> ir.Value:
        slot = self.pack_slots.get(ref)
        if slot is None:
            slot = self.pack_slots[ref] = self.em.alloca(self.scalar, count)
        return slot

    def in_place(self, ref: str) -> bool:
        """Whether ``ref`` is already laid out as its packed panels: coefficient 1 along the
        vector index, and along the reduction indexes those of their row-major position times
        ``NV * W`` (``red_linear``; each reduction counts from 0, or from ``kbase``)."""
        s, coefs = self.s, self.s.coefs[ref]
        stride = self.nv * self.width
        if coefs[s.v] != 1 or self.block.ref(ref).shape.dtype is not s.dtype:  # a half operand is packed
            return False
        for k in reversed(s.red):
            if coefs[k] != stride:
                return False
            stride *= self.block.idxs[k].range
        return True

    def panel_at(self, ref: str, counters, v0: ir.Value) -> ir.Value:
        """The address of an ``in_place`` operand's panel at ``v0`` (from the K block's first
        point, ``kbase``): what the tiles read in place of packed scratch."""
        at = {**counters, self.s.v: v0}
        if self.kbase is not None:
            at[self.s.red[0]] = self.kbase
        view = self.views[ref]
        return self.b().gep(view.ptr, [self.pos(ref, at)], inbounds=True, source_etype=self.scalar)

    def pack(self, counters, v0: ir.Value) -> None:
        """Copy the ``NV*W``-wide panel of every ``pack_refs`` operand at ``v0`` over all
        reduction points into contiguous scratch (reduction points row-major, ``NR`` floats
        each): the rows of the tiles then stream it without cache-set conflicts or TLB misses.
        An ``in_place`` operand is read where it is."""
        s = self.s
        for ref in self.pack_refs:
            if ref in self.in_place_refs:
                self.packed[ref] = self.panel_at(ref, counters, v0)
                continue
            slot = self.packed.get(ref) or self.pack_slot(ref, self.red_points * self.nv * self.width)
            base = {**counters, s.v: v0}

            def copy(red: dict[int, ir.Value], ref=ref, slot=slot, base=base) -> None:
                at = {**base, **red}
                line = self.red_linear(red)
                for n in range(self.nv):
                    value = self.vector(ref, self.elem(ref, at, 0, n), None)
                    self.store_packed(slot, line, n, value)

            def group(red: dict[int, ir.Value], ref=ref, slot=slot, base=base) -> None:
                self.pack_transposed(ref, slot, {**base, **red}, self.red_linear(red))

            self.over_reductions(0, {}, copy, group if self.transposable(ref) else None)
            self.packed[ref] = slot

    def transposable(self, ref: str) -> bool:
        """Whether ``ref`` is gathered along the vector index but contiguous along the innermost
        reduction index (``A @ B.T``'s B): then ``W`` reduction points at a time are packed as
        ``W`` contiguous vectors transposed in registers (``pack_transposed``), not ``W * W``
        scalar loads."""
        s, coefs = self.s, self.s.coefs[ref]
        step, inner = coefs[s.v], coefs[s.red[-1]] if s.red else 0
        return not (isinstance(step, int) and step in (0, 1)) and isinstance(inner, int) and inner == 1

    def pack_transposed(self, ref: str, slot: ir.Value, at: dict[int, ir.Value], line: ir.Value) -> None:
        """The packed lines ``line .. line + W - 1`` (reduction points ``at`` on along the innermost
        reduction index) of ``transposable`` ``ref``: per vector of the panel, the ``W`` elements
        of each lane loaded as one vector along the reduction index, the ``W x W`` block
        transposed (``transpose``), each row stored as a line."""
        b, width, v = self.b(), self.width, self.s.v
        view = self.views[ref]
        for n in range(self.nv):
            # each lane's first element through ``pos`` (a generic kernel's strides are run-time)
            rows = [self.vload(view, self.pos(ref, {**at, v: b.add(at[v], i64(n * width + lane))}), None)
                    for lane in range(width)]
            for t, row in enumerate(transpose(b, rows)):
                self.store_packed(slot, b.add(line, i64(t)) if t else line, n, row)

    def over_reductions(self, level: int, red: dict[int, ir.Value], body, group=None) -> None:
        """``body(red)`` at every reduction point, or, with ``group``, ``group(red)`` at every
        ``W``-th point of the innermost reduction index for the whole groups of ``W`` there (the
        points left to ``body``)."""
        if level == len(self.s.red):
            body(red)
            return
        k = self.s.red[level]
        lo, hi = self.bounds[k]
        if group is not None and level == len(self.s.red) - 1:
            end = counted_loop(self.b(), lo, hi, lambda c: group({**red, k: c}), self.width, whole=True)
            for_range(self.em, end, hi, lambda c: body({**red, k: c}))
            return
        for_range(self.em, lo, hi, lambda c: self.over_reductions(level + 1, {**red, k: c}, body, group))

    def red_linear(self, counters: dict[int, ir.Value]) -> ir.Value:
        """The row-major position of the reduction point ``counters`` among all of them."""
        b = self.b()
        out: ir.Value = i64(0)
        for j, k in enumerate(self.s.red):
            c = counters[k]
            if j == 0 and self.kbase is not None:  # a K block's scratch starts at its first point
                c = b.sub(c, self.kbase)
            out = c if j == 0 else b.add(b.mul(out, self.em.num(self.block.idxs[k].range)), c)
        return out

    def packed_at(self, slot: ir.Value, line: ir.Value, n: int) -> ir.Value:
        b = self.b()
        pos = b.add(b.mul(line, i64(self.nv * self.width)), i64(n * self.width))
        return b.gep(slot, [pos], inbounds=True, source_etype=self.scalar)

    def store_packed(self, slot: ir.Value, line: ir.Value, n: int, value: ir.Value) -> None:
        self.b().store(value, self.packed_at(slot, line, n), align=self.scalar is F64 and 8 or 4)


def transpose(b: ir.IRBuilder, rows: list[ir.Value]) -> list[ir.Value]:
    """The ``W x W`` transpose of ``rows`` (``W`` vectors of ``W`` lanes, ``W`` a power of two):
    for each bit ``h`` of a lane's position, rows ``r`` and ``r + h`` (``r & h == 0``) swap their
    off-diagonal ``h``-wide blocks, one shuffle each (log2 W stages of W shuffles)."""
    width = len(rows)
    rows = list(rows)
    h = width // 2
    while h:
        lo = ir.Constant(ir.VectorType(I32, width), [c if not c & h else width + c - h for c in range(width)])
        hi = ir.Constant(ir.VectorType(I32, width), [c + h if not c & h else width + c for c in range(width)])
        for r in range(width):
            if not r & h:
                rows[r], rows[r + h] = b.shuffle_vector(rows[r], rows[r + h], lo), \
                    b.shuffle_vector(rows[r], rows[r + h], hi)
        h //= 2
    return rows


__all__ = ["Packing", "transpose"]
