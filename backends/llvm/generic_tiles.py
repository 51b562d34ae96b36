"""Shape-generic micro-kernels: a product's register tiles with its extents read at run time.

``generic`` (the ``generic`` setting) builds one kernel per bucket of shapes; a product the CPU
micro-kernel (``microkernel``) takes has decisions that read its extents: the vector width and
vectors per tile row (``NV``), the rows per tile (``MR``), whether a panel of B is packed, and the
cache blocks of K and N. Here those are fixed per bucket by a rule that reads only the integers the
bucket's template holds fixed (``Tiles``, from ``plan``): a varying N gets ``NV = 4`` (2 with 16
vector registers: ``match.nv_max``), a varying M ``MR = ACC_BUDGET // NV``, a varying K blocks of at
most ``INLINE_SCRATCH`` packed bytes, a whole multiple of ``K_ROUND`` points (the same at every
length); a known one is decided as ``microkernel`` decides it. Everything else comes at run time:
the count of whole row tiles and panels, the rows past the last whole tile (one tile per power of
two of their count), the columns past the last whole panel (masked vectors, the last one partial:
``GenericMicroKernel.columns``), the K blocks and the last partial one (the column tail runs in the
same blocks), the strides of every operand. The thread split is the kernel's own (``generic``: a
form per split index).

**What is structural.** Which index is the vector, the row, the other owned ones and the
reductions, and whether each operand's coefficient along an index is 0, 1 or another value
(contiguous, broadcast or gathered) come from the *concrete* kernels (``match.analyse``): the
``signature``. The bucket's template is built only when its two kernels have the same signature,
and a later kernel binds to it only with that signature (``generic.assign``); the coefficients'
values are computed at run time from the template's strides (``Slot``s).

**Exactness.** Each output element gets its reduction points in order within a K block, and K is
cut in blocks that depend only on the bucket: a generic kernel gives the same bits at a length
whichever lengths built its template, sums of integers exactly, float sums within
docs/semantics.md §8.3 (a run-time K without K blocks sums in chunks of ``sum_block / 8`` points
into fresh partials, ``partials.microkernel_sums``); ``strict`` sums every element in order.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from backends.llvm.codegen import KernelCodegen
from backends.llvm.inline_blocks import INLINE_SCRATCH
from backends.llvm.loops import counted_loop, smin
from backends.llvm.match import PACK_LIMIT, Shape, VectorConfig, analyse, covers, nv_max, panel
from backends.llvm.microkernel import ACC_BUDGET, MicroKernel
from backends.llvm.scalars import F32, F64, I32, i64
from backends.llvm.symbolic import SlotUsed, is_slot
from backends.llvm.tile_epilogue import TileEpilogue
from stripe.ir import Block
from tile.dtypes import DType

K_ROUND = 64  # a run-time K's blocks are whole multiples of this many points


def _pattern(c) -> int:
    return 0 if c == 0 else 1 if c == 1 else 2


def signature(
    block: Block, dts: dict, pos: int | None, fill: int = 0, epilogue=None
) -> tuple[Shape, tuple] | None:
    """The micro-kernel's view of the concrete kernel ``block`` (``dts``: buffer name -> dtype;
    ``pos``: the thread-split index; ``fill``: the element count of the zero fill before it, 0 for
    none) and what of it a generic kernel fixes: its indexes' roles, each operand's coefficient
    pattern (0, 1, other), and whether it writes every element of the fill's buffer
    (``match.covers``: its tiles then start from zero and the fill is not run). None: the
    micro-kernel does not take it. ``epilogue``: the fused one (``epilogue.read_fused``), if any."""
    dims = {r.into: r.shape.dims for r in block.refs}
    ref_dts = {r.into: dts.get(r.source, r.shape.dtype) for r in block.refs}
    if epilogue is not None:
        ref_dts = epilogue.analysed(ref_dts, block)
    bounded = pos if pos is not None and block.idxs[pos].range > 1 else None
    shape = analyse(block, dims, ref_dts, bounded)
    if shape is None:
        return None
    pattern = tuple((n, tuple(_pattern(c) for c in cs)) for n, cs in sorted(shape.coefs.items()))
    fresh = bool(fill) and covers(block, shape, fill)
    key = (shape.dtype, shape.v, shape.r, shape.outer, shape.red, shape.out, shape.agg, pattern, bounded,
           fresh)
    return shape, key


@dataclass(frozen=True)
class Tiles:
    """A bucket's fixed micro-kernel decisions (``plan``)."""

    width: int  # lanes of a vector
    nv: int  # vectors per tile row
    mr: int  # rows per tile
    pack: tuple[str, ...]  # operands packed into panels
    blocking: tuple[int, int, int] | None  # (KC0, NC, KC) as ``match.cache_blocks``, or whole K


def _known(x) -> int | None:
    return None if is_slot(x) else int(x)


def plan(template: Block, shape: Shape, cfg: VectorConfig, k_blocks: bool = True) -> Tiles:
    """The micro-kernel's decisions for ``template`` (``shape``: its kernels' ``signature``),
    reading only the integers the template fixes. Raises ``SlotUsed`` when a decision needs a
    run-time one (a varying inner reduction, a varying K under a guard that keeps B unpacked).
    ``k_blocks``: whether the output may hold partial sums (not under an epilogue that stores
    another type, ``tile_epilogue.Epilogue.partials``): else one pass over K."""
    ranges = [ix.range for ix in template.idxs]
    item = shape.dtype.numpy.itemsize
    v_range = _known(ranges[shape.v])
    width = cfg.vector_bytes // item
    # a varying N: ``panel``'s most vectors a tile row
    nv = panel(v_range, cfg, shape.dtype)[1] if v_range is not None else nv_max(cfg)
    budget = ACC_BUDGET.get(cfg.vector_bytes, 12)
    rr = _known(ranges[shape.r]) if shape.r is not None else 1
    mr = max(1, min(rr if rr is not None else budget, budget // nv, 12))
    nr = nv * width
    coefs = shape.coefs
    candidates = tuple(
        n for n, c in sorted(coefs.items())
        if n != shape.out and c[shape.v] != 0 and (shape.r is None or c[shape.r] == 0)
    )
    inner = 1
    for k in shape.red[1:]:
        if is_slot(ranges[k]):
            raise SlotUsed("a run-time inner reduction: the packed panel's size would vary")
        inner *= ranges[k]
    k0 = _known(ranges[shape.red[0]]) if shape.red else None
    blocking = None
    if shape.red and candidates and shape.r is not None and k_blocks:
        refs = len(candidates)
        whole = k0 * inner * nr * item * refs if k0 is not None else None
        if whole is None or whole > INLINE_SCRATCH:  # K blocks of at most INLINE_SCRATCH packed bytes
            step = max(1, INLINE_SCRATCH // (nr * item * refs * inner))
            if k0 is not None:
                step = -(-k0 // -(-k0 // step))  # even blocks (a known K: as ``inline_blocks``)
            elif step > K_ROUND:  # a run-time K: whole multiples of K_ROUND points (the panel
                step = step // K_ROUND * K_ROUND  # and a tile's rows of A stay in L1 together)
            blocking = (step, nr, step * inner)
    chunk = blocking[2] if blocking else (k0 * inner if k0 is not None else None)
    packable = (
        not template.constraints and bool(shape.red) and chunk is not None
        and chunk * nr * item <= PACK_LIMIT and (rr is None or rr >= 2 * mr)
    )
    pack = candidates if packable else ()
    if not pack:
        blocking = None
    strided = [n for n, c in coefs.items() if n != shape.out and c[shape.v] not in (0, 1)]
    if any(n not in pack for n in strided):
        raise SlotUsed("a gathered operand left unpacked: plain loops do better")
    return Tiles(width, nv, mr, pack, blocking)


class GenericMicroKernel(MicroKernel):
    """``MicroKernel`` over a template: the decisions of ``Tiles``, the coefficients computed at
    run time where the template has slots (``pos``, ``elem``, ``vector``)."""

    def __init__(self, cg, template: Block, shape: Shape, tiles: Tiles, cfg: VectorConfig, fresh: bool):
        self.cg, self.em, self.block, self.s, self.views = cg, cg.em, template, shape, {}
        self.scalar = F64 if shape.dtype is DType.FLOAT64 else F32
        self.width, self.nv, self.mr = tiles.width, tiles.nv, tiles.mr
        self.vt = ir.VectorType(self.scalar, self.width)
        self.fma = cfg.fma
        self.pack_refs, self.blocking = list(tiles.pack), tiles.blocking
        self.red_points = 1
        for k in shape.red:  # a run-time K always runs in K blocks when packed (``plan``)
            r = template.idxs[k].range
            self.red_points = None if self.red_points is None or is_slot(r) else self.red_points * r
        self.fresh, self.kbase, self.epilogue, self.last, self.tail = fresh, None, None, True, None
        self.prefetch = None  # no in-place operand here (``MicroKernel``'s next-panel prefetch)
        self.pack_slots, self.packed = {}, {}
        self.rt: dict[str, list] = {}

    def coefficients(self) -> None:
        """Each operand's element-offset coefficient per index: an int, or an i64 computed once
        from the template's run-time strides and access coefficients."""
        b = self.b()
        for r in self.block.refs:
            row = []
            for ix in self.block.idxs:
                total, value = 0, None
                for a, d in zip(r.access, r.shape.dims):
                    c = a.coeff(ix.name)
                    if not is_slot(c) and c == 0:
                        continue
                    if not is_slot(c) and not is_slot(d.stride):
                        total += int(c) * int(d.stride)
                        continue
                    term = b.mul(self.em.num(c), self.em.num(d.stride))
                    value = term if value is None else b.add(value, term)
                if value is not None and total:
                    value = b.add(value, i64(total))
                row.append(total if value is None else value)
            self.rt[r.into] = row

    def run(self, bounds) -> None:
        self.coefficients()
        super().run(bounds)

    def scaled(self, x: ir.Value, coef) -> ir.Value | None:
        """``x * coef`` (None for a known zero)."""
        if isinstance(coef, int):
            if coef == 0:
                return None
            return x if coef == 1 else self.b().mul(x, i64(coef))
        return self.b().mul(x, coef)

    def pos(self, ref: str, counters: dict[int, ir.Value]) -> ir.Value:
        out = self.views[ref].base
        for k, c in counters.items():
            term = self.scaled(c, self.rt[ref][k])
            if term is not None:
                out = self.b().add(out, term)
        return out

    def elem(self, ref: str, base: dict[int, ir.Value], m: int, n: int) -> ir.Value:
        p = self.pos(ref, base)
        s = self.s
        for k, count in ((s.r, m), (s.v, n * self.width)):
            if k is not None and count:
                term = self.scaled(i64(count), self.rt[ref][k])
                if term is not None:
                    p = self.b().add(p, term)
        return p

    def vector(self, ref: str, pos: ir.Value, mask: ir.Value | None) -> ir.Value:
        if self.s.coefs[ref][self.s.v] == 1:  # contiguous in every kernel of the bucket (``signature``)
            return self.vload(self.views[ref], pos, mask)
        b, view, step = self.b(), self.views[ref], self.rt[ref][self.s.v]
        out = ir.Constant(self.vt, ir.Undefined)
        for lane in range(self.width):
            at = self.scaled(i64(lane), step) or i64(0)
            if mask is not None and lane:
                at = b.select(b.extract_element(mask, ir.Constant(I32, lane)), at, i64(0))
            x = view.read(self.em, b.add(pos, at) if lane else pos)
            out = b.insert_element(out, x, ir.Constant(I32, lane))
        return out


    def columns(self, counters: dict[int, ir.Value]) -> None:
        """``MicroKernel.columns`` with the columns past the whole panels as masked vectors only
        (the last one partial): one tail path, not a path of whole single vectors and a masked
        one (a generic kernel keeps every path; on AVX-512 a masked vector moves as fast)."""
        lo, hi = self.bounds[self.s.v]
        if self.blocking:
            end = self.blocked(counters, lo, hi)
        else:
            body = lambda v0: self.rows(counters, v0, self.nv, None)  # noqa: E731
            end = counted_loop(self.b(), lo, hi, body, self.nv * self.width, whole=True)

        def vector(v0: ir.Value) -> None:
            b = self.b()
            self.tail = smin(b, b.sub(hi, v0), i64(self.width))
            self.rows(counters, v0, 1, self.lane_mask(self.tail))

        counted_loop(self.b(), end, hi, vector, self.width)

    def rows(self, counters, v0: ir.Value, nv: int, lanes: ir.Value | None) -> None:
        """The columns past the whole panels (``MicroKernel.columns``' single and masked vectors)
        in the K blocks of the panels too, so that every element gets its sum block by block (its
        bits do not depend on whether it fell in a whole panel at this length) and no cascade
        over a run-time K is kept on the stack."""
        if not self.blocking or self.kbase is not None:
            super().rows(counters, v0, nv, lanes)
            return
        k0, step = self.s.red[0], self.blocking[0]
        lo, hi = self.bounds[k0]

        def block(q0: ir.Value) -> None:
            fresh, b = self.fresh, self.b()
            self.bounds[k0], self.kbase = (q0, smin(b, b.add(q0, i64(step)), hi)), q0
            if fresh is True:  # the first K block starts from zero (``MicroKernel.blocked``)
                self.fresh = b.icmp_signed("==", q0, lo)
            self.last = b.icmp_signed(">=", b.add(q0, i64(step)), hi)  # an epilogue's: the last block
            super(GenericMicroKernel, self).rows(counters, v0, nv, lanes)
            self.bounds[k0], self.kbase, self.fresh, self.last = (lo, hi), None, fresh, True

        counted_loop(self.b(), lo, hi, block, step)


class GenericProductCodegen(KernelCodegen):
    """A kernel function whose one block is a product run by ``GenericMicroKernel``."""

    def __init__(self, *args, shape: Shape, tiles: Tiles, fresh: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.shape, self.tiles, self.fresh_tiles = shape, tiles, fresh

    def kernel_block(self, lo: ir.Value, hi: ir.Value) -> None:
        block, s = self.block, self.shape
        origin = {}
        for ix in block.idxs:
            if ix.affine is not None and not ix.affine.is_constant:
                raise SlotUsed(f"kernel index '{ix.name}' has an affine")
            origin[ix.name] = self.num(ix.affine.const) if ix.affine is not None else i64(0)
        mk = GenericMicroKernel(self, block, s, self.tiles, self.vector, self.fresh_tiles)
        if self.epilogue is not None:  # tiles from zero, each final one through the epilogue
            mk.fresh, mk.epilogue = True, TileEpilogue(self.epilogue)
        mk.views = {r.into: self.view(block, r, origin, None) for r in block.refs}
        mk.origin = origin
        pos = self.schedule.split_index
        moving = {s.v, s.r, *s.outer, *s.red}
        mk.run({pos: (lo, hi)} if pos in moving else {})


__all__ = ["GenericMicroKernel", "GenericProductCodegen", "Tiles", "plan", "signature"]
