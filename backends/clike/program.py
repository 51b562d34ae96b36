"""A program's kernels as C-like functions: the special emitter a kernel's plan names, else the
general one.

A pass that shaped a kernel for a special emitter attached a plan (``stripe.plans``); the plan's
type picks the emitter, which reads the kernel's roles from it. On a target with work-groups
(OpenCL): a ``GemmPlan`` (``gemm_tile``'s nest) whose operands have the GEMM's type as one tiled
kernel (``tiled``: work-group tiles in ``__local`` memory, register blocks, the fused epilogue
before the store; ``stripe.gemm_nest.read`` reads the nest through its plan; the setting
``tiled=False`` turns work-groups off), a ``CombinePlan`` (``split_reduction``'s combine) as a
work-group tree (``groupreduce``), or, with its partial block nested (``one_kernel``), as one
kernel whose last work-group combines (``lastgroup``), a ``RowPlan`` (``row_fusion``'s row
program) as a work-group per row (``rowkernel``), an ``AttentionPlan`` (``attention``'s chain) as
one fused kernel with an online softmax (``attention``), an ``AttentionBackwardPlan`` (a part of
its gradient) as one fused kernel recomputing the scores (``attention_backward``), a
``TransposePlan`` (``transpose``'s permuting copy) as tiles staged through ``__local`` memory
(``transpose``). Each emitter may still refuse what the target cannot do (a type it cannot keep
in a register); then, as for every kernel without a plan and every kernel of a target without
work-groups: work-items over its owned indexes (``kernel.KernelEmitter.general``).
"""

from __future__ import annotations

from backends.clike import (
    attention,
    attention_backward,
    groupreduce,
    lastgroup,
    numbers,
    rowkernel,
    transpose,
)
from backends.clike.kernel import KernelEmitter, KernelSource
from backends.clike.target import CTarget
from backends.clike.tiled import GemmEmitter, Tiles
from backends.hal import KernelInfo
from stripe.gemm_nest import read
from stripe.plans import AttentionBackwardPlan, AttentionPlan, CombinePlan, GemmPlan, RowPlan, TransposePlan
from tile.dtypes import DType


def kernel_source(t: CTarget, index: int, info: KernelInfo, buffer_dtypes: dict[str, DType]) -> KernelSource:
    """Kernel ``index`` of the program (module docstring)."""
    em = KernelEmitter(t, index, info, buffer_dtypes)
    em.begin()
    form = _FORMS.get(type(em.block.plan))
    got = form(em) if form is not None else None
    return got if got is not None else em.general()


def _tiled(em: KernelEmitter) -> KernelSource | None:
    """A ``gemm_tile`` nest on a target with work-groups: the tiled kernel (``tiled``), its tiles
    read from the nest (``stripe.gemm_nest``)."""
    if not em.t.workgroups:
        return None
    nest = read(em.block)
    if nest is None:
        return None
    g = nest.gemm
    ops = [o for o in (g.a, g.b, g.out) if o is not None]
    if any(em.buf_dtypes.get(o.ref.source) is not g.dtype for o in ops):
        return None
    tiles = Tiles.of(nest)
    epilogue = em.epilogue(g)
    emitter = None
    if nest.shape.unit and em.t.contract:  # the plan names a matrix unit: the dialect's kernel for it
        emitter = em.t.unit_emitter(g, em.ptrs, tiles, nest.shape.unit, epilogue)
    if emitter is None:
        emitter = GemmEmitter(em.t, g, em.ptrs, tiles, em.t.contract, epilogue)
    symbol = f"{em.symbol}_{nest.shape.suffix}"  # the name carries the tiles chosen here
    text, work, local = emitter.source(symbol, em.params)
    return KernelSource(symbol, text, work, (), local, getattr(emitter, "launch", None))


def _grouped(em: KernelEmitter) -> KernelSource | None:
    """A split reduction's combine on a target with work-groups: a tree in ``__local`` memory
    per output point (``groupreduce``); one with its partial block nested (``one_kernel``): the
    partials' work-groups, the last of which combines (``lastgroup``)."""
    if em.block.plan.counter:
        one = lastgroup.takes(em)
        if one is None:
            return None
        text, work, local = lastgroup.emit(em, one)
        return KernelSource(em.symbol, text, work, (), local)
    c = groupreduce.takes(em.block, tuple(em.info.buffers), em.t)
    if c is None:
        return None
    text, work, local = groupreduce.emit(em.t, c, em.symbol, em.params, em.ptrs)
    return KernelSource(em.symbol, text, work, (), local)


def rows(em: KernelEmitter) -> KernelSource | None:
    """A ``row_fusion`` row program on a target with work-groups: one work-group per row
    (``rowkernel``)."""
    if rowkernel.takes(em) is None:
        return None
    work, local = rowkernel.emit(em)
    em.depth = 0
    if em.values:  # a shape-generic template (``generic``): its integers are arguments
        text = em.t.group_kernel(em.symbol, em.params, local, em.lines, values=em.values)
        return KernelSource(em.symbol, numbers.named(text), work, (), local)
    return KernelSource(em.symbol, em.t.group_kernel(em.symbol, em.params, local, em.lines), work, (), local)



def _attention(em: KernelEmitter) -> KernelSource | None:
    """An ``attention`` chain on a target with work-groups: one fused kernel; a part of its
    gradient: one fused kernel too. The dialect's own (``CTarget.attention_kernel``), else the
    portable ``attention`` and ``attention_backward``."""
    own = em.t.attention_kernel(em)
    if own is not None:
        return own
    fused = attention_backward if isinstance(em.block.plan, AttentionBackwardPlan) else attention
    if fused.takes(em) is None:
        return None
    work, local = fused.emit(em)
    em.depth = 0
    return KernelSource(em.symbol, em.t.group_kernel(em.symbol, em.params, local, em.lines), work, (), local)


_FORMS = {GemmPlan: _tiled, CombinePlan: _grouped, RowPlan: rows, TransposePlan: transpose.source,
          AttentionPlan: _attention, AttentionBackwardPlan: _attention}


def generate(t: CTarget, kernels: list[KernelInfo], buffer_dtypes: dict, skip=()) -> list[KernelSource]:
    """Every kernel's source (``buffer_dtypes``: buffer name -> dtype, for kernels whose
    ``KernelInfo.buffer_dtypes`` is empty); None for the indexes in ``skip`` (kernels that run
    shape-generic functions built apart: ``generic``)."""
    return [None if k in skip else kernel_source(t, k, info, kernel_dtypes(info, buffer_dtypes))
            for k, info in enumerate(kernels)]


def kernel_dtypes(info: KernelInfo, buffer_dtypes: dict) -> dict[str, DType]:
    """The dtypes of kernel ``info``'s buffers: its own ``buffer_dtypes``, else the program's."""
    per = getattr(info, "buffer_dtypes", ())
    if per:
        return {b: DType(str(d)) for b, d in zip(info.buffers, per)}
    return {b: DType(str(buffer_dtypes[b])) for b in info.buffers if b in buffer_dtypes}


__all__ = ["generate", "kernel_dtypes", "kernel_source"]
