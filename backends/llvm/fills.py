"""Zero fills the micro-kernel takes over, known before any code is generated.

A GEMM-shaped contraction's lowering zero-fills its output in a kernel of its own just before it
(``codegen._zero_fill_of``). When the next kernel runs as a micro-kernel that stores every element
of that output (``match.covers``), its tiles start from zero in the first K block (``microkernel``:
``fresh``; every later K block, thread chunk and partial sum adds to what that block stored), and
``codegen.generate`` builds the fill as an empty function. Such a fill need not run at all: the
device lists it in ``Library.extra["skipped"]`` and the runner launches nothing for it, which saves
a call's launch of a no-op (a resident 64x64 matmul: about a fifth of its time).

The list must be known on an object-cache hit and on ``restore`` too, where nothing is generated,
so it is worked out from the build plan alone (``taken_fills``), asking the same questions
``KernelCodegen.kernel_block`` and ``emit_microkernel`` ask; a build that generates code checks it
against what ``generate`` really emptied.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from backends.hal import KernelInfo
from backends.llvm.codegen import _zero_fill_of, buffer_dtypes, units
from backends.llvm.match import VectorConfig, covers
from backends.llvm.microkernel import kernel_match
from backends.llvm.schedule import Schedule
from stripe.ir import Block


def takes_fill(info: KernelInfo, sched: Schedule, dtypes: dict, vector: VectorConfig, blocks, epilogue,
               elements: int) -> bool:
    """Whether ``generate`` builds kernel ``info`` (its buffers' ``dtypes``, as ``buffer_dtypes``
    gives them) as a micro-kernel starting from zero, taking over the zero fill of its ``elements``
    output elements just before it: the micro-kernel matches at the kernel's level, with no fused
    epilogue (which starts from zero without taking a fill), and writes every element."""
    block = info.block
    if not elements or epilogue is not None or not sched.order or not vector.vector_bytes:
        return False
    assert isinstance(block, Block)
    own = set(info.buffers)
    dts = dict(dtypes)
    for r in block.refs:  # as ``KernelCodegen.build``: else the first refinement's dtype
        if r.source in own:
            dts.setdefault(r.source, r.shape.dtype)
    dims = {r.into: r.shape.dims for r in block.refs if r.source in own}
    ref_dts = {r.into: dts[r.source] for r in block.refs if r.source in own}
    mk = kernel_match(None, block, dims, ref_dts, sched.split_index, vector, blocks, None)
    return mk is not None and covers(block, mk.s, elements)


def taken_fills(code: Sequence[KernelInfo], schedules: Sequence[Schedule], dtypes: dict,
                vector: VectorConfig, blocks: Sequence, epilogues: Sequence,
                only: Collection[int] | None) -> frozenset[int]:
    """The fill kernels (positions in ``code``) that ``generate(code, schedules, ..., only=only)``
    builds empty: each the first of a two-kernel unit it builds (``units``) whose second kernel
    ``takes_fill``."""
    out = set()
    for unit in units(code):
        if len(unit) != 2 or (only is not None and unit[0] not in only):
            continue
        k, j = unit
        elements = _zero_fill_of(code[k], code[j])
        given = blocks[j] if j < len(blocks) else None
        epi = epilogues[j] if j < len(epilogues) else None
        if takes_fill(code[j], schedules[j], buffer_dtypes(code[j], dtypes), vector, given, epi, elements):
            out.add(k)
    return frozenset(out)


__all__ = ["taken_fills", "takes_fill"]
