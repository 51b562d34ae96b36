"""Fused elementwise epilogues on the CPU micro-kernel: which nests have one, and whether it runs.

After ``fuse_contraction_eltwise`` and ``gemm_tile``, a kernel is a nest whose contraction sums
into an accumulator local and whose other statements (the *epilogue*: a bias, a relu, a scale, a
residual, ...) compute and store the final element from it (its ``GemmPlan`` says ``epilogue``).
``read_fused`` reads such a nest through its plan (``stripe.gemm_nest``) as the flat GEMM it
computes (``Nest.flat``: its output the refinement the epilogue stores first), its cache tiles and
an ``Epilogue`` (``tile_epilogue``); ``takes`` says whether the micro-kernel will run that flat
GEMM under the kernel's schedule (else the device runs the nest as it is, as plain loops). The
micro-kernel then runs the epilogue on each final tile (``tile_epilogue.TileEpilogue``).

Between K blocks the partial sums live in the output buffer itself (``Epilogue.partials``): only
when the output is overwritten (``=``), has the accumulator's type (``match.analyse`` checks it)
and the epilogue never reads it; otherwise the micro-kernel makes one pass over K (no K blocks),
and no partial sum is ever stored. The accumulator never goes to memory as a temporary buffer.
"""

from __future__ import annotations

from dataclasses import replace

from backends.llvm.match import VectorConfig
from backends.llvm.microkernel import kernel_match
from backends.llvm.schedule import Schedule
from backends.llvm.tile_epilogue import Epilogue
from stripe.gemm_nest import read as read_nest
from stripe.ir import Block, Load, Store


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
    flat, tiles, epilogue = fused
    if not cfg.vector_bytes or not sched.order or not flat.idxs:
        return False
    dims = {r.into: r.shape.dims for r in flat.refs}
    dts = {r.into: buf_dtypes.get(r.source, r.shape.dtype) for r in flat.refs}
    return kernel_match(None, flat, dims, dts, sched.split_index, cfg, tiles, epilogue) is not None


__all__ = ["Epilogue", "read_fused", "takes"]
