"""Software prefetch of the next panel while the row tiles read the current one.

A micro-kernel (``microkernel``) whose packed operand is read in place (``Packing.in_place``: an
importer's weight stored panel by panel, ``[P, K, NV*W]``) streams each panel once per row tile.
The first row tile finds it wherever the call before left it: after another program ran (the
ONNX benchmark alternates Tile's and onnxruntime's calls) that is L3, and the first tile then
runs at L3's bandwidth (``NV`` cache lines a reduction point, 12 cycles of arithmetic: about 70
GB/s wanted, about 30 served) while the later tiles, reading L2, leave that bandwidth unused.

``Prefetch`` spreads the next panel's lines over the later tiles: during row tile ``t >= 1`` every
reduction point prefetches (into L2) vector ``(t - 1) mod NV`` of the same point of the next panel,
so tiles ``1 .. NV`` of a panel bring all of the next one, one line per reduction point (the
arithmetic still bounds the loop); tile 0, itself bound by the bandwidth of wherever its panel
is, adds no traffic. The *next panel* is the memory right after the current one
(or after the current K block): the layout ``in_place`` reads holds reduction points row-major,
``NV*W`` elements each, so a panel-major weight's next panel (or next K block) starts there.
Elsewhere it is whatever follows; a prefetch never faults and changes no value.
"""

from __future__ import annotations

from llvmlite import ir

from backends.llvm.scalars import I32, PTR, i64

PREFETCH_L2 = 2  # llvm.prefetch's locality: 2 keeps the line in L2 (``prefetcht1`` on x86)


class Prefetch:
    """The next-panel prefetch of one micro-kernel ``mk`` (None where it does not apply: no
    in-place operand, or no row index, so one tile per panel)."""

    def __init__(self, mk):
        self.mk = mk
        self.ahead: ir.Value | None = None  # per row tile: where its prefetches are, from each line

    @staticmethod
    def of(mk) -> Prefetch | None:
        if not mk.in_place_refs or mk.s.r is None or mk.block.idxs[mk.s.r].range < 2 * mk.mr:
            return None
        return Prefetch(mk)

    def start_tile(self, r0: ir.Value) -> None:
        """Before row tile ``r0``'s reduction (``t = (r0 - lo) / MR``): where its prefetches go."""
        mk = self.mk
        b = mk.b()
        lo = mk.bounds[mk.s.r][0]
        t = b.udiv(b.sub(r0, lo), i64(mk.mr))
        vector = b.mul(b.urem(b.sub(t, i64(1)), i64(mk.nv)), i64(mk.width))
        # the first tile reads the panel from where the call before left it: it adds no traffic
        # (its prefetch is of the line it loads itself)
        self.ahead = b.select(b.icmp_unsigned("==", t, i64(0)), i64(0), b.add(vector, i64(self.span())))

    def span(self) -> int:
        """Elements of the panel (or K block) being read: the next one starts this far on."""
        mk = self.mk
        lines = mk.blocking[2] if mk.blocking else mk.red_points
        return lines * mk.nv * mk.width

    def point(self, slot: ir.Value, line: ir.Value) -> None:
        """At reduction point ``line`` of the panel at ``slot``: prefetch this tile's vector of the
        same point of the next panel."""
        if self.ahead is None:
            return
        mk = self.mk
        b = mk.b()
        at = b.add(b.mul(line, i64(mk.nv * mk.width)), self.ahead)
        ptr = b.gep(slot, [at], source_etype=mk.scalar)  # (may pass the operand's end: no fault)
        fn = mk.em.declare("llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
        b.call(fn, [ptr, ir.Constant(I32, 0), ir.Constant(I32, PREFETCH_L2), ir.Constant(I32, 1)])


__all__ = ["Prefetch"]
