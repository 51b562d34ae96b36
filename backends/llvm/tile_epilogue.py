"""A fused elementwise epilogue as the CPU micro-kernel runs it, on each of its final tiles.

An ``Epilogue`` (which ``epilogue.read_fused`` reads from a fused ``gemm_tile`` nest) holds the
epilogue's statements and whether the output may hold partial sums between K blocks.

The micro-kernel (``microkernel.MicroKernel``) starts every tile of a fused kernel from zero and,
when a tile is final (after the last K block), hands it to ``TileEpilogue``: the accumulators go
to a small scratch (``MR x NR`` floats, in L1), and for each element of it the epilogue's
statements run through the code generator's scalar path (``KernelCodegen.statements``), the
accumulator local read from the scratch element and the other refinements at the element's
indexes; LLVM vectorizes that loop over the tile's columns. Each element is computed exactly as
the interpreter computes it (its sum in K order, then the same scalar operations), so ``strict``
stays bit-identical. A tile that is not final is stored as partial sums (``Epilogue.partials``).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from backends.llvm.loops import View, for_range
from backends.llvm.scalars import F64, i64
from stripe.ir import Block, Refinement
from tile.dtypes import DType


@dataclass(frozen=True)
class Epilogue:
    """``block``: the epilogue's statements and refinements (the accumulator local ``acc``, then
    the kernel's others, their accesses over the flat GEMM's index names); ``partials``: whether
    the flat output may hold a K block's partial sums (module docstring)."""

    block: Block
    acc: Refinement
    partials: bool

    def analysed(self, dts: dict[str, DType], flat: Block) -> dict[str, DType]:
        """``dts`` (refinement -> its buffer's type) as ``match.analyse`` sees the flat GEMM:
        without partials the micro-kernel never reads or writes the output itself, which may
        then be of another type than the sum (the epilogue converts, ``as_float(C, 16)``)."""
        return dts if self.partials else {**dts, "$out": flat.ref("$out").shape.dtype}


class TileEpilogue:
    """The epilogue around one micro-kernel (``MicroKernel.epilogue``)."""

    def __init__(self, epilogue: Epilogue):
        self.epi = epilogue
        self.scratch: ir.Value | None = None

    def finish(self, mk, base: dict[int, ir.Value]) -> None:
        """The current tile, its reduction done: through the epilogue when its K block is the
        last, else stored as partial sums."""
        if mk.last is True:
            self.final(mk, base)
            return
        with mk.b().if_else(mk.last) as (then, other):
            with then:
                self.final(mk, base)
            with other:
                mk.store_tile(base)

    def final(self, mk, base: dict[int, ir.Value]) -> None:
        _, nv, lanes, _, mr = mk.cur
        b, w = mk.b(), mk.width
        nr = mk.nv * w
        if self.scratch is None:
            self.scratch = mk.em.alloca(mk.scalar, mk.mr * nr)
        align = 8 if mk.scalar is F64 else 4
        for m in range(mr):
            for n in range(nv):
                at = b.gep(self.scratch, [i64(m * nr + n * w)], inbounds=True, source_etype=mk.scalar)
                b.store(b.load(mk.slots[m][n], typ=mk.vt), at, align=align)
        count = i64(nv * w) if lanes is None else b.add(i64((nv - 1) * w), mk.tail)
        for m in range(mr):
            for_range(mk.em, i64(0), count, lambda j, m=m: self.element(mk, base, m, j, nr))

    def element(self, mk, base: dict[int, ir.Value], m: int, j: ir.Value, nr: int) -> None:
        """The epilogue at the tile's row ``m``, column ``j``."""
        b, s = mk.b(), mk.s
        vals: dict[str, ir.Value] = {}
        for k, ix in enumerate(mk.block.idxs):
            if k in s.red:
                continue
            c = base.get(k, i64(0))
            if k == s.v:
                c = b.add(c, j)
            elif k == s.r and m:
                c = b.add(c, i64(m))
            start = mk.origin[ix.name]
            vals[ix.name] = c if isinstance(start, ir.Constant) and start.constant == 0 else b.add(start, c)
        block, acc = self.epi.block, self.epi.acc
        views = {r.into: mk.cg.view(block, r, vals, None) for r in block.refs if r.into != acc.into}
        pos = b.add(i64(m * nr), j) if m else j
        views[acc.into] = View(acc.into, self.scratch, s.dtype, pos, acc.shape.dims, s.dtype, "")
        mk.cg.statements(block, vals, views)


__all__ = ["Epilogue", "TileEpilogue"]
