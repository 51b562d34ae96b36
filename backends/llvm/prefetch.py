"""Software prefetch of the next panel while the row tiles read the current one.

A micro-kernel (``microkernel``) whose packed operand is read in place (``Packing.in_place``: an
importer's weight stored panel by panel, ``[P, K, NV*W]``) streams each panel once per row tile.
The first row tile finds it wherever the call before left it: after another program ran (the
ONNX benchmark alternates Tile's and onnxruntime's calls) that is L3, and the first tile then
runs at L3's bandwidth (``NV`` cache lines a reduction point, 12 cycles of arithmetic: about 70
GB/s wanted, about 30 served) while the later tiles, reading L2, leave that bandwidth unused.

``Prefetch`` spreads the next panel's lines over the later tiles: during row tile ``t >= 1``, with
``u = t - 1``, the reduction points ``l`` with ``l mod RATE == u mod RATE`` prefetch (into L2)
vector ``(u div RATE) mod NV`` of the same point of the next panel, so tiles ``1 .. RATE*NV`` of a
panel bring all of the next one (the arithmetic still bounds the loop); tile 0, itself bound by the
bandwidth of wherever its panel is, adds no traffic (its prefetches, and the other points', are of
the line being read: a hit). ``RATE`` is 2 where the rows make at least ``2*NV + 1`` tiles, else 1:
a prefetch every other point keeps fewer line fill buffers busy while the tile computes (the MLP's
lane after an onnxruntime call: 269 -> 257-260 us against one every point). The *next panel* is the
memory right after the current one (or after the current K block): the layout ``in_place`` reads
holds reduction points row-major, ``NV*W`` elements each, so a panel-major weight's next panel (or
next K block) starts there. Elsewhere it is whatever follows; a prefetch never faults and changes
no value.
"""

from __future__ import annotations

from llvmlite import ir

from backends.llvm.scalars import I32, PTR, i64

PREFETCH_L2 = 2  # llvm.prefetch's locality: 2 keeps the line in L2 (``prefetcht1`` on x86)


class Prefetch:
    """The next-panel prefetch of one micro-kernel ``mk`` (None where it does not apply: no
    in-place operand, or no row index, so one tile per panel)."""

    def __init__(self, mk, rate: int):
        self.mk, self.rate = mk, rate
        self.ahead: ir.Value | None = None  # per row tile: where its prefetches are, from each line
        self.parity: ir.Value | None = None  # per row tile: the reduction points that prefetch

    @staticmethod
    def of(mk) -> Prefetch | None:
        rows = mk.block.idxs[mk.s.r].range if mk.s.r is not None else 0
        if not mk.in_place_refs or not isinstance(rows, int) or rows < 2 * mk.mr:
            return None
        return Prefetch(mk, 2 if rows // mk.mr >= 2 * mk.nv + 1 else 1)

    def start_tile(self, r0: ir.Value) -> None:
        """Before row tile ``r0``'s reduction (``t = (r0 - lo) / MR``): where its prefetches go."""
        mk = self.mk
        b = mk.b()
        lo = mk.bounds[mk.s.r][0]
        t = b.udiv(b.sub(r0, lo), i64(mk.mr))
        u = b.sub(t, i64(1))
        vector = b.mul(b.urem(b.udiv(u, i64(self.rate)), i64(mk.nv)), i64(mk.width))
        self.parity = b.urem(u, i64(self.rate))
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
        ahead = self.ahead
        if self.rate > 1:  # the other points prefetch the line they read (a hit)
            on = b.icmp_unsigned("==", b.urem(line, i64(self.rate)), self.parity)
            ahead = b.select(on, ahead, i64(0))
        at = b.add(b.mul(line, i64(mk.nv * mk.width)), ahead)
        ptr = b.gep(slot, [at], source_etype=mk.scalar)  # (may pass the operand's end: no fault)
        fn = mk.em.declare("llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
        b.call(fn, [ptr, ir.Constant(I32, 0), ir.Constant(I32, PREFETCH_L2), ir.Constant(I32, 1)])


__all__ = ["Prefetch"]
