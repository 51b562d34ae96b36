"""Fused elementwise epilogues on the CPU micro-kernel.

After ``fuse_contraction_eltwise`` and ``gemm_tile``, a kernel is a nest whose contraction sums
into an accumulator local and whose other statements (the *epilogue*: a bias, a relu, a scale, a
residual, ...) compute and store the final element from it. ``read_fused`` reads such a nest back
(``stripe.gemm_nest``) as the flat GEMM it computes (``Nest.flat``: its output the refinement the
epilogue stores first), its cache tiles and an ``Epilogue``; ``takes`` says whether the
micro-kernel will run that flat GEMM under the kernel's schedule (else the device runs the nest
as it is, as plain loops).

The micro-kernel (``microkernel.MicroKernel``) then starts every tile from zero and, when a tile
is final (after the last K block), hands it to ``TileEpilogue``: the accumulators go to a small
scratch (``MR x NR`` floats, in L1), and for each element of it the epilogue's statements run
through the code generator's scalar path (``KernelCodegen.statements``), the accumulator local
read from the scratch element and the other refinements at the element's indexes; LLVM vectorizes
that loop over the tile's columns. Each element is computed exactly as the interpreter computes
it (its sum in K order, then the same scalar operations), so ``strict`` stays bit-identical.

Between K blocks the partial sums live in the output buffer itself (``Epilogue.partials``): only
when the output is overwritten (``=``), has the accumulator's type (``match.analyse`` checks it)
and the epilogue never reads it; otherwise the micro-kernel makes one pass over K (no K blocks),
and no partial sum is ever stored. The accumulator never goes to memory as a temporary buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llvmlite import ir

from backends.llvm.loops import View, for_range
from backends.llvm.match import VectorConfig
from backends.llvm.scalars import F64, i64
from backends.llvm.schedule import Schedule
from stripe.gemm_nest import read as read_nest
from stripe.ir import Block, Load, Refinement, Store
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


def read_fused(kernel: Block) -> tuple[Block, tuple[int, int], Epilogue] | None:
    """A ``gemm_tile`` nest with a fused epilogue as ``(flat GEMM, (KC, NC), Epilogue)``, or None
    (no nest, no epilogue, or one this module does not run: a guard that skips output points, an
    epilogue reading an operand of the product or an index of the reduction)."""
    nest = read_nest(kernel)
    if nest is None or nest.gemm.epilogue is None or nest.gemm.store_guards:
        return None
    g = nest.gemm
    kb, acc = g.epilogue
    operands = {g.a.ref.into, g.b.ref.into}
    refs = tuple(r for r in kb.refs if r.into not in operands and r.into != acc.into)
    stmts = kb.stmts[1:]
    if any(isinstance(s, Load) and s.from_ in operands for s in stmts):
        return None
    owned = {ix.name for grp in (g.m, g.n, g.batch) for ix in grp.idxs}
    if any(not set(a.vars) <= owned for r in refs for a in r.access):
        return None
    flat = nest.flat(kernel.name, kernel.tags)
    out = flat.ref("$out")
    stored = next(r for r in refs if r.into == next(s.into for s in stmts if isinstance(s, Store)))
    same = {r.into for r in refs if r.source == out.source}
    partials = stored.agg_op in ("", "assign") and stored.shape.dtype is g.dtype
    partials = partials and not any(isinstance(s, Load) and s.from_ in same for s in stmts)
    if out.shape.dtype is not g.dtype:  # the sum's type, as analysed (``Epilogue.analysed``)
        typed = replace(out, shape=replace(out.shape, dtype=g.dtype))
        flat = replace(flat, refs=tuple(typed if r.into == "$out" else r for r in flat.refs))
    block = Block(kernel.name, (), (), (acc, *refs), stmts, kernel.tags)
    return flat, (nest.shape.kt, nest.shape.tn), Epilogue(block, acc, partials)


def takes(fused: tuple[Block, tuple[int, int], Epilogue], sched: Schedule, buf_dtypes, cfg: VectorConfig):
    """Whether ``emit_microkernel`` runs the flat GEMM of ``fused`` (``read_fused``) under
    ``sched`` (its kernel-level match): then its epilogue runs on the micro-kernel's tiles."""
    from backends.llvm.microkernel import kernel_match  # it imports this module

    flat, tiles, epilogue = fused
    if not cfg.vector_bytes or not sched.order or not flat.idxs:
        return False
    dims = {r.into: r.shape.dims for r in flat.refs}
    dts = {r.into: buf_dtypes.get(r.source, r.shape.dtype) for r in flat.refs}
    return kernel_match(None, flat, dims, dts, sched.split_index, cfg, tiles, epilogue) is not None


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


__all__ = ["Epilogue", "TileEpilogue", "read_fused", "takes"]
