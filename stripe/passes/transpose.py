"""``transpose``: a kernel that permutes a tensor's elements declares itself a tiled transpose.

A copy kernel whose input and output are contiguous along different indexes (``D[n, m] =
C[m, n]``; ``kmajor``'s K-major copy of B) run one work-item per point reads or writes with a
stride on a GPU: one of its sides moves a whole memory line per element. A square tile staged
through ``__local`` memory reads rows of the input and writes rows of the output, both
contiguous (``backends.clike.transpose``). This pass finds such kernels and attaches their
``TransposePlan`` (``stripe.plans``): the index along which the input is contiguous (the tile's
columns), the one along which the output is (its rows), the two refinements and the tile edge.

Taken: a block carrying every tag of ``reqs`` and no plan yet, without constraints or index
affines, with exactly two refinements of different buffers: an ``in`` one, read by the first
statement (``$x = load(src)``), and an ``out`` one assigning (``assign`` or no aggregation), into
which the last statement stores; between them only one-input conversions of the value before
(``assign``, ``ident``, ``as_*``). The output covers its whole buffer once (every view up to the
root is the whole buffer, and the access numbers every element once: ``stripe.lower.
writes_every_element``, with as many points as elements); the input's element offset differs at
every point (``stripe.roles.one_to_one``). In the input's offset one index has coefficient 1, in
the output's another one does, and both have at least ``min_extent`` points (a small transpose is
as fast one work-item per point). The other indexes are batch indexes. The block is otherwise
unchanged, so its meaning is; a code generator without work-groups runs it as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stripe.hardware import Hardware
from stripe.ir import Block, Intrinsic, Load, RefDir, Store, evolve
from stripe.lower import writes_every_element
from stripe.passes.registry import register
from stripe.passes.rewrite import Context, rewrite
from stripe.plans import TransposePlan
from stripe.roles import element_offset, one_to_one
from stripe.specials import CASTS


@dataclass(frozen=True)
class TransposeConfig:
    reqs: tuple[str, ...] = ("kernel",)
    min_extent: int = 64  # the rows and the columns each have at least this many points
    tile: int = 32  # the tile's edge (a power of two)

    def invalid(self) -> tuple[str, str, str] | None:
        """``(key, message, hint)`` for a value no rewrite can use (``stripe.config`` locates it)."""
        if self.tile < 4 or self.tile & (self.tile - 1):
            return "tile", f"tile {self.tile} is not a power of two of at least 4", "write 16, 32 or 64"
        if self.min_extent < 1:
            return "min_extent", "min_extent must be at least 1", "write 1 or more"
        return None


@register("transpose", TransposeConfig, kernel_tiling=True)
def transpose(program: Block, cfg: TransposeConfig, hw: Hardware) -> Block:
    """Each permuting copy kernel with its ``TransposePlan`` (module docstring)."""

    def visit(block: Block, ctx: Context) -> Block | None:
        plan = planned(block, ctx, cfg)
        return None if plan is None else evolve(block, plan=plan)

    return rewrite(program, visit, cfg.reqs)


def planned(block: Block, ctx: Context, cfg: TransposeConfig) -> TransposePlan | None:
    """The plan of ``block`` (in ``ctx``) when it is a permuting copy worth tiling, else None."""
    if block.plan is not None or block.constraints or any(ix.affine is not None for ix in block.idxs):
        return None
    roles = copy_of(block)
    if roles is None:
        return None
    src, out = (block.ref(name) for name in roles)
    if src.dir is not RefDir.IN or out.dir is not RefDir.OUT or out.agg_op not in ("", "assign"):
        return None
    if src.source == out.source:  # in place: a tile's writes would race with another's reads
        return None
    sizes = _whole(block, ctx, out.into)
    if sizes is None or math.prod(sizes) != block.index_space:
        return None
    if not writes_every_element(out.access, block.idxs, sizes):
        return None
    src_at, out_at = element_offset(src), element_offset(out)
    if src_at is None or out_at is None or not one_to_one(src_at, block.idxs):
        return None
    ranges = {ix.name: ix.range for ix in block.idxs}
    cols, rows = _unit(src_at, ranges), _unit(out_at, ranges)
    if cols is None or rows is None or cols == rows:
        return None
    if min(ranges[cols], ranges[rows]) < cfg.min_extent:
        return None
    return TransposePlan(rows, cols, src.into, out.into, cfg.tile)


def copy_of(block: Block) -> tuple[str, str] | None:
    """``(src, out)`` when the block's statements load ``src``, convert the value only, and store
    it into ``out``, and the block has no other refinement."""
    stmts = block.stmts
    if len(stmts) < 2 or not isinstance(stmts[0], Load) or not isinstance(stmts[-1], Store):
        return None
    value = stmts[0].into
    for s in stmts[1:-1]:
        if not (isinstance(s, Intrinsic) and s.name in CASTS and s.inputs == (value,)):
            return None
        value = s.outputs[0]
    src, out = stmts[0].from_, stmts[-1].into
    if stmts[-1].from_ != value or src == out or {r.into for r in block.refs} != {src, out}:
        return None
    return src, out


def _whole(block: Block, ctx: Context, name: str) -> tuple[int, ...] | None:
    """The sizes of the buffer that ``block``'s refinement ``name`` refines, when every view of it
    between the block and the root is the whole buffer; else None."""
    chain = ctx.ref_chain(block, name)
    above = chain[1:]
    if not above or len(above) != len(ctx.parents):
        return None
    sizes = above[-1].shape.sizes
    for r in above:
        if r.shape.sizes != sizes or any(not a.is_constant or a.const != 0 for a in r.access):
            return None
    return sizes


def _unit(offset, ranges: dict[str, int]) -> str | None:
    """The one index of coefficient 1 in the element offset ``offset``, if there is exactly one."""
    ones = [v for v, c in offset.terms if c == 1 and ranges.get(v, 1) > 1]
    return ones[0] if len(ones) == 1 else None


__all__ = ["TransposeConfig", "copy_of", "planned", "transpose"]
