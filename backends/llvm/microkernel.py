"""Register-blocked vector code for contraction leaf blocks: the CPU micro-kernel.

``codegen`` loops over a block's points one by one, so a contraction re-loads and re-stores its
output element for every reduction point and LLVM cannot vectorize the float sum without
reordering it. ``emit`` replaces those loops, for the blocks it recognizes (``analyse``), by the
classic micro-kernel: an ``MR x NV`` tile of output vectors (``W`` lanes each, the host's vector
width) held in registers across the whole reduction, each reduction point adding
``broadcast(a) * vector(b)`` to every accumulator.

**What it matches.** A leaf block (the kernel itself, or the one-tile block ``autotile`` made)
whose statements are loads, float ``mul``/``add``/``assign`` intrinsics and one ``Store`` into a
refinement aggregating with ``add`` (or ``max``/``min``, the scalar code's NaN-wins select applied
lane-wise), every value and buffer of one float type (float32 or float64), except that a float32
product may read float16 or bfloat16 operands (a widened half product, ``backends.driver.widened``:
their vectors converted exactly as they load, ``half_vload``, and packed as float32). Its
indexes of range > 1 split into the *owned* ones (a non-zero coefficient in the output's element
offset, distinct points of them writing distinct elements: each coefficient exceeds the spread of
the smaller ones) and the *reductions* (coefficient 0). The *vector index* ``v`` is the owned
index of output coefficient 1; no constraint may use it. An operand of coefficient 0 along it is
broadcast, 1 loaded as a contiguous vector, any other gathered lane by lane (once per panel when
it is packed: ``A @ B.T``'s B). The *row index* ``r`` is another owned index (not the thread-split
one, preferring one no constraint uses, the largest range).

**Order of writes.** Every output element still receives its reduction points in the order of
the reduction indexes as listed, and the owned indexes move freely (``schedule``'s rule), so
without fused multiply-add the results are bit-identical to the scalar loops'. ``fma=True``
(not under ``strict``, §8.3 of docs/semantics.md) computes ``acc + a*b`` with one rounding.

**Cache blocks.** With the caches' sizes (``VectorConfig``) and a reduction or columns past one
block (``match.cache_blocks``), the whole panels run in blocks of ``NC`` columns and ``KC``
reduction points: a block's panels are packed together, then every row tile runs against each
of them (its rows of A stay in L1), loading and storing its C tile once per block. Each element
still gets its reduction points in order. When the output's zero fill is folded in (``fresh``),
the tiles start from zero instead of loading C (in the first K block only).

**Edges and guards.** Full tiles run the fast path; the rows past the last full ``MR`` run one at
a time, the columns past the last full ``NV*W`` one vector at a time, the last partial vector with
a lane mask (masked loads and stores never touch memory outside the block). A constraint that
uses the row index becomes, at the loop where its last index binds, a test of the tile's first
and last row (an affine half-space holds between them when it holds at both): all rows pass ->
the fast path, else every accumulator update is a ``select`` on its row's condition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from llvmlite import ir

from backends.llvm.hoist import hoisted, over
from backends.llvm.inline_blocks import inline_blocks
from backends.llvm.intrinsics import binary
from backends.llvm.loops import View, counted_loop, for_range, remainder, smin
from backends.llvm.match import (
    PACK_LIMIT,
    Shape,
    VectorConfig,
    analyse,
    cache_blocks,
    covers,
    panel,
    row_tile,
)
from backends.llvm.packing import Packing
from backends.llvm.partials import microkernel_sums
from backends.llvm.prefetch import Prefetch
from backends.llvm.scalars import F32, F64, I16, I32, I64, PTR, i64
from backends.llvm.tile_epilogue import TileEpilogue
from stripe.ir import Block, Dim, Intrinsic, Load, Store
from tile.affine import Affine
from tile.dtypes import DType

ACC_BUDGET = {64: 24, 32: 12, 16: 12}  # accumulators that leave room for operands, by vector bytes


class MicroKernel(Packing):
    """Emits one matched block (``emit`` below builds it)."""

    def __init__(
        self, cg, block: Block, shape: Shape, views: dict[str, View], cfg: VectorConfig, blocks,
        k_blocks: bool = True,
    ):
        """``k_blocks``: whether the output may hold partial sums between K blocks (not under an
        epilogue that stores another type: ``epilogue.partials``)."""
        self.cg, self.em, self.block, self.s, self.views = cg, getattr(cg, "em", None), block, shape, views
        self.scalar = F64 if shape.dtype is DType.FLOAT64 else F32
        self.width, nv_max = panel(block.idxs[shape.v].range, cfg, shape.dtype)
        self.vt = ir.VectorType(self.scalar, self.width)
        self.fma = cfg.fma
        budget = ACC_BUDGET.get(cfg.vector_bytes, 12)
        self.nv = nv_max
        rr = block.idxs[shape.r].range if shape.r is not None else 1
        self.mr = row_tile(rr, nv_max, budget)  # (``match.row_tile``)
        # operands worth packing: vectors shared by the rows, in a block without constraints
        # (a guard might protect their reads), whose panel fits the scratch limit
        self.red_points = 1
        for k in shape.red:
            self.red_points *= block.idxs[k].range
        self.blocking = cache_blocks(block, shape, self.mr, self.nv * self.width, cfg, blocks)
        chunk = self.blocking[2] if self.blocking else self.red_points
        panel_bytes = chunk * self.nv * self.width * shape.dtype.numpy.itemsize
        packable = not block.constraints and shape.red and panel_bytes <= PACK_LIMIT and rr >= 2 * self.mr
        self.pack_refs = [
            n for n, c in shape.coefs.items()
            if packable and n != shape.out and c[shape.v] != 0 and (shape.r is None or c[shape.r] == 0)
        ]
        self.in_place_refs = frozenset(n for n in self.pack_refs if self.in_place(n))  # (``packing``)
        if not self.pack_refs:
            self.blocking = None
        elif k_blocks:
            nr = self.nv * self.width
            self.blocking = inline_blocks(self.blocking, block, shape, nr, len(self.pack_refs))
        self.prefetch = Prefetch.of(self)  # the next in-place panel, over the row tiles (``prefetch``)
        # True: the output's elements start at zero (its zero fill, the kernel before, is
        # skipped: ``emit_microkernel``'s ``fresh``); during a K block, whether it is the first
        self.fresh: bool | ir.Value = False
        self.kbase: ir.Value | None = None  # the first reduction point of the packed K block
        self.pack_slots: dict[str, ir.Value] = {}
        self.packed: dict[str, ir.Value] = {}
        self.epilogue = None  # a ``tile_epilogue.TileEpilogue``: finished tiles go through it
        self.last: bool | ir.Value = True  # during a K block, whether it is the last one
        self.tail: ir.Value | None = None  # the lanes of the last partial vector

    # ------------------------------------------------------------------ small helpers
    def b(self) -> ir.IRBuilder:
        return self.em.builder

    def splat(self, x: ir.Value) -> ir.Value:
        b = self.b()
        undef = ir.Constant(self.vt, ir.Undefined)
        one = b.insert_element(undef, x, ir.Constant(I32, 0))
        return b.shuffle_vector(one, undef, ir.Constant(ir.VectorType(I32, self.width), [0] * self.width))

    def _suffix(self) -> str:
        return f"v{self.width}f{self.scalar is F64 and 64 or 32}"

    def vload(self, view: View, pos: ir.Value, mask: ir.Value | None) -> ir.Value:
        if view.buf_dtype.is_narrow_float:
            return self.half_vload(view, pos, mask)
        b = self.b()
        ptr = b.gep(view.ptr, [pos], inbounds=True, source_etype=self.scalar)
        if mask is None:
            return b.load(ptr, typ=self.vt, align=self.scalar is F64 and 8 or 4)
        fn = self.em.declare(f"llvm.masked.load.{self._suffix()}.p0", self.vt, [PTR, I32, mask.type, self.vt])
        align = ir.Constant(I32, self.scalar is F64 and 8 or 4)
        return b.call(fn, [ptr, align, mask, ir.Constant(self.vt, None)])

    def half_vload(self, view: View, pos: ir.Value, mask: ir.Value | None) -> ir.Value:
        """``W`` float16 or bfloat16 elements of a half operand as float32 lanes (exact)."""
        b = self.b()
        ht = ir.VectorType(I16, self.width)
        ptr = b.gep(view.ptr, [pos], inbounds=True, source_etype=I16)
        if mask is None:
            bits = b.load(ptr, typ=ht, align=2)
        else:
            fn = self.em.declare(f"llvm.masked.load.v{self.width}i16.p0", ht, [PTR, I32, mask.type, ht])
            bits = b.call(fn, [ptr, ir.Constant(I32, 2), mask, ir.Constant(ht, None)])
        if view.buf_dtype is DType.FLOAT16:
            return b.fpext(b.bitcast(bits, ir.VectorType(ir.HalfType(), self.width)), self.vt)
        wide = ir.VectorType(I32, self.width)  # bfloat16: the float's high half
        return b.bitcast(b.shl(b.zext(bits, wide), ir.Constant(wide, [16] * self.width)), self.vt)

    def vstore(self, view: View, pos: ir.Value, value: ir.Value, mask: ir.Value | None) -> None:
        b = self.b()
        ptr = b.gep(view.ptr, [pos], inbounds=True, source_etype=self.scalar)
        if mask is None:
            b.store(value, ptr, align=self.scalar is F64 and 8 or 4)
            return
        fn = self.em.declare(
            f"llvm.masked.store.{self._suffix()}.p0", ir.VoidType(), [self.vt, PTR, I32, mask.type]
        )
        b.call(fn, [value, ptr, ir.Constant(I32, self.scalar is F64 and 8 or 4), mask])

    def lane_mask(self, count: ir.Value) -> ir.Value:
        """Lanes ``< count`` (``count`` in ``[1, width)``)."""
        b = self.b()
        lanes = ir.Constant(ir.VectorType(I64, self.width), list(range(self.width)))
        undef = ir.Constant(ir.VectorType(I64, self.width), ir.Undefined)
        one = b.insert_element(undef, count, ir.Constant(I32, 0))
        splat = b.shuffle_vector(one, undef, ir.Constant(ir.VectorType(I32, self.width), [0] * self.width))
        return b.icmp_unsigned("<", lanes, splat)

    def pos(self, ref: str, counters: dict[int, ir.Value]) -> ir.Value:
        """``ref``'s element position at ``counters`` (index position -> counter value)."""
        b = self.b()
        out = self.views[ref].base
        for k, c in counters.items():
            coef = self.s.coefs[ref][k]
            if coef:
                out = b.add(out, c if coef == 1 else b.mul(c, i64(coef)))
        return out

    def cond(self, c: Affine, c0: ir.Value, counters: dict[int, ir.Value]) -> ir.Value:
        b = self.b()
        value = c0
        for k, cnt in counters.items():
            coef = c.coeff(self.block.idxs[k].name)
            if coef:
                value = b.add(value, b.mul(cnt, self.em.num(coef)))
        return b.icmp_signed(">=", value, i64(0))

    # -------------------------------------------------------------------- the nests
    def run(self, bounds: dict[int, tuple[ir.Value, ir.Value]]) -> None:
        s, block = self.s, self.block
        origin = self.origin
        self.c0 = [self.cg.affine(c, origin, block, "a constraint") for c in block.constraints]
        moving = (s.v, *([s.r] if s.r is not None else []), *s.outer, *s.red)  # every index of range > 1
        self.bounds = {k: bounds.get(k, (i64(0), self.em.num(block.idxs[k].range))) for k in moving}
        self.hoisted = hoisted(self)  # outer loops run inside the packing (``hoist``)
        free = set(self.bounds)
        rowset = {s.r} if s.r is not None else set()
        # each constraint's level: outer loop position, or reduction level (row ones apart)
        self.outer_guards: dict[int, list[int]] = {}
        self.red_guards: dict[int, list[int]] = {}
        self.row_guards: dict[int, list[int]] = {}
        for j, c in enumerate(block.constraints):
            ks = {k for k in free if c.coeff(block.idxs[k].name)}
            reds = [s.red.index(k) + 1 for k in ks if k in s.red]
            if ks & rowset:
                self.row_guards.setdefault(max(reds, default=0), []).append(j)
            elif reds:
                self.red_guards.setdefault(max(reds), []).append(j)
            else:
                level = max((s.outer.index(k) for k in ks), default=-1)
                self.outer_guards.setdefault(level, []).append(j)
        self.outer_level(-1, {})

    def guard(self, idx: list[int], counters: dict[int, ir.Value], then: Callable[[], None]) -> None:
        if not idx:
            then()
            return
        b = self.b()
        ok = None
        for j in idx:
            t = self.cond(self.block.constraints[j], self.c0[j], counters)
            ok = t if ok is None else b.and_(ok, t)
        with b.if_then(ok):
            then()

    def outer_level(self, depth: int, counters: dict[int, ir.Value]) -> None:
        def inner() -> None:
            if depth + 1 == len(self.s.outer):
                self.columns(counters)
                return
            k = self.s.outer[depth + 1]
            if k in self.hoisted:
                return self.outer_level(depth + 1, counters)
            lo, hi = self.bounds[k]
            for_range(self.em, lo, hi, lambda c: self.outer_level(depth + 1, {**counters, k: c}))

        self.guard(self.outer_guards.get(depth, []), counters, inner)

    def columns(self, counters: dict[int, ir.Value]) -> None:
        lo, hi = self.bounds[self.s.v]
        step = self.nv * self.width
        b = self.em.builder
        if self.blocking:
            end = self.blocked(counters, lo, hi)
        else:
            end = counted_loop(b, lo, hi, lambda v0: self.rows(counters, v0, self.nv, None), step, whole=True)
        if self.nv > 1:
            width = self.width
            end = counted_loop(b, end, hi, lambda v0: self.rows(counters, v0, 1, None), width, whole=True)
        b = self.b()
        with b.if_then(b.icmp_signed("<", end, hi)):
            self.tail = b.sub(hi, end)
            self.rows(counters, end, 1, self.lane_mask(self.tail))

    def blocked(self, counters: dict[int, ir.Value], lo: ir.Value, hi: ir.Value) -> ir.Value:
        """The whole panels of ``[lo, hi)`` in cache blocks (``cache_blocks``): per block of
        ``NC`` columns and ``KC`` reduction points, its panels packed together, then each row tile
        against every panel (its rows of A stay in L1 across them), C's tile loaded and stored
        once per block. Returns where the whole panels end."""
        b = self.b()
        step0, nc, chunk = self.blocking  # type: ignore[misc]
        nr = self.nv * self.width
        full = b.add(lo, b.mul(b.sdiv(b.sub(hi, lo), i64(nr)), i64(nr)))
        k0 = self.s.red[0]
        klo, khi = self.bounds[k0]

        def columns(c0: ir.Value) -> None:
            c1 = smin(self.b(), self.b().add(c0, i64(nc)), full)
            counted_loop(self.b(), klo, khi, lambda q0: reductions(c0, c1, q0), step0)

        def reductions(c0: ir.Value, c1: ir.Value, q0: ir.Value) -> None:
            saved, fresh = self.bounds[k0], self.fresh
            self.bounds[k0] = (q0, smin(self.b(), self.b().add(q0, i64(step0)), khi))
            self.kbase = q0
            if fresh is True:
                self.fresh = self.b().icmp_signed("==", q0, klo)
            self.last = self.b().icmp_signed(">=", self.b().add(q0, i64(step0)), khi)

            def panels(v0: ir.Value, body) -> None:  # each panel at its packed scratch
                self.packed = {}
                for ref in self.pack_refs:
                    if ref in self.in_place_refs:
                        self.packed[ref] = self.panel_at(ref, counters, v0)
                        continue
                    slot = self.pack_slot(ref, nc * chunk)
                    at = self.b().mul(self.b().sub(v0, c0), i64(chunk))
                    self.packed[ref] = self.b().gep(slot, [at], inbounds=True, source_etype=self.scalar)
                body(v0)

            def row_tile(r0: ir.Value, mr: int) -> None:  # this row tile against every panel
                def one(v0: ir.Value) -> None:
                    panels(v0, lambda v: self.tile(counters, v, self.nv, None, r0, mr))

                counted_loop(self.b(), c0, c1, one, nr)

            counted_loop(self.b(), c0, c1, lambda v0: panels(v0, lambda v: self.pack(counters, v)), nr)
            over(self, counters, lambda: self.over_rows(row_tile))
            self.bounds[k0], self.fresh, self.last, self.kbase = saved, fresh, True, None

        counted_loop(b, lo, full, columns, nc)
        self.packed = {}
        return full

    def over_rows(self, tile: Callable[[ir.Value, int], None]) -> None:
        """``tile(r0, mr)`` over the row index's bounds: whole ``MR`` tiles, then the rows left
        (fewer than ``MR``) as at most one tile of each power of two below ``MR`` (``remainder``):
        64 rows in tiles of 6 end with one tile of 4 rows, not 4 single rows, which reload every
        vector of B for each row."""
        lo, hi = self.bounds[self.s.r]
        if self.mr == 1:
            for_range(self.em, lo, hi, lambda r0: tile(r0, 1))
            return
        end = counted_loop(self.em.builder, lo, hi, lambda r0: tile(r0, self.mr), self.mr, whole=True)
        if isinstance(lo, ir.Constant) and isinstance(hi, ir.Constant):
            first, last = int(lo.constant), int(hi.constant)
            end = i64(first + (last - first) // self.mr * self.mr)
        remainder(self.b(), end, hi, self.mr, tile)

    def rows(self, counters, v0: ir.Value, nv: int, lanes: ir.Value | None) -> None:
        self.packed = {}
        if nv == self.nv and lanes is None and self.pack_refs:
            self.pack(counters, v0)
        if self.s.r is None:
            self.tile(counters, v0, nv, lanes, None, 1)
            return
        over(self, counters, lambda: self.over_rows(lambda r0, m: self.tile(counters, v0, nv, lanes, r0, m)))

    def tile(self, counters, v0, nv: int, lanes, r0, mr: int) -> None:
        s, b, em = self.s, self.b(), self.em
        base = {**counters, s.v: v0}
        if s.r is not None:
            base[s.r] = r0
        self.cur = (v0, nv, lanes, r0, mr)
        if self.prefetch is not None and r0 is not None:
            self.prefetch.start_tile(r0)
        out = self.views[s.out]
        slots = [[em.alloca(self.vt) for _ in range(nv)] for _ in range(mr)]
        zero = ir.Constant(self.vt, None)
        for m in range(mr):
            for n in range(nv):
                p = self.out_pos(base, m, n)
                mask = lanes if n == nv - 1 else None
                if self.fresh is True:  # the output's zero fill, folded in: start from zero
                    start = zero
                else:
                    start = self.vload(out, p, mask)
                    if self.fresh is not False:  # the first K block starts from zero
                        start = b.select(self.fresh, zero, start)
                b.store(start, slots[m][n])
        self.slots = slots
        microkernel_sums(self, base)  # red_level(0, ...), a long sum in fresh chunks (partials)
        if self.epilogue is not None:  # the final tile through the epilogue, a partial one stored
            self.epilogue.finish(self, base)
            return
        self.store_tile(base)

    def store_tile(self, base: dict[int, ir.Value]) -> None:
        """The accumulators of the current tile into the output."""
        _, nv, lanes, _, mr = self.cur
        out = self.views[self.s.out]
        b = self.b()
        for m in range(mr):
            for n in range(nv):
                p = self.out_pos(base, m, n)
                value = b.load(self.slots[m][n], typ=self.vt)
                self.vstore(out, p, value, lanes if n == nv - 1 else None)

    def out_pos(self, base: dict[int, ir.Value], m: int, n: int) -> ir.Value:
        return self.elem(self.s.out, base, m, n)

    def elem(self, ref: str, base: dict[int, ir.Value], m: int, n: int) -> ir.Value:
        """``ref``'s element at row ``m`` and vector ``n`` of the tile at ``base``."""
        b = self.b()
        p = self.pos(ref, base)
        coefs = self.s.coefs[ref]
        off = coefs[self.s.r] * m if self.s.r is not None else 0
        off += coefs[self.s.v] * n * self.width
        return b.add(p, i64(off)) if off else p

    def row_conds(self, idx: list[int], counters, mr: int) -> list[ir.Value]:
        """Per row, whether every constraint of ``idx`` holds."""
        b = self.b()
        r0 = counters[self.s.r]
        out = []
        for m in range(mr):
            here = {**counters, self.s.r: b.add(r0, i64(m)) if m else r0}
            ok = None
            for j in idx:
                t = self.cond(self.block.constraints[j], self.c0[j], here)
                ok = t if ok is None else b.and_(ok, t)
            out.append(ok)
        return out

    def red_level(self, level: int, counters, masks: list[ir.Value] | None) -> None:
        mr = self.cur[4]

        def after_rows(ms: list[ir.Value] | None) -> None:
            if level == len(self.s.red):
                self.body(counters, ms)
                return
            k = self.s.red[level]
            lo, hi = self.bounds[k]
            for_range(self.em, lo, hi, lambda c: self.red_level(level + 1, {**counters, k: c}, ms))

        def after_guards() -> None:
            rows = self.row_guards.get(level)
            if not rows:
                after_rows(masks)
                return
            conds = self.row_conds(rows, counters, mr)
            b = self.b()
            if mr == 1:
                with b.if_then(conds[0]):
                    after_rows(masks)
                return
            if masks is not None:
                after_rows([b.and_(a, c) for a, c in zip(masks, conds)])
                return
            with b.if_else(b.and_(conds[0], conds[-1])) as (fast, slow):
                with fast:
                    after_rows(None)
                with slow:
                    after_rows(conds)

        self.guard(self.red_guards.get(level, []), counters, after_guards)

    def body(self, counters, masks: list[ir.Value] | None) -> None:
        """One reduction point for every accumulator of the tile."""
        b = self.b()
        _, nv, lanes, _, mr = self.cur
        grids: dict[str, list[list[ir.Value]]] = {}
        made_by: dict[str, Intrinsic] = {}
        for st in self.block.stmts:
            if isinstance(st, Load):
                grids[st.into] = self.load_grid(st.from_, counters, mr, nv, lanes)
            elif isinstance(st, Intrinsic) and st.name == "assign":
                grids[st.outputs[0]] = grids[st.inputs[0]]
            elif isinstance(st, Intrinsic):
                x, y = grids[st.inputs[0]], grids[st.inputs[1]]
                op = b.fmul if st.name == "mul" else b.fadd
                grids[st.outputs[0]] = _combine(op, x, y)
                made_by[st.outputs[0]] = st
            elif isinstance(st, Store):
                prod = made_by.get(st.from_)
                fused = self.fma and prod is not None and prod.name == "mul" and self.s.agg == "add"
                for m in range(mr):
                    for n in range(nv):
                        acc = b.load(self.slots[m][n], typ=self.vt)
                        if fused:
                            fn = self.em.declare(f"llvm.fma.{self._suffix()}", self.vt, [self.vt] * 3)
                            xa, ya = grids[prod.inputs[0]], grids[prod.inputs[1]]
                            new = b.call(fn, [xa[m][n], ya[m][n], acc])
                        elif self.s.agg == "add":
                            new = b.fadd(acc, grids[st.from_][m][n])
                        else:  # the same select as the scalar aggregation, on every lane
                            new = binary(self.em, self.s.agg, acc, grids[st.from_][m][n], self.s.dtype)
                        if masks is not None:
                            new = b.select(masks[m], new, acc)
                        b.store(new, self.slots[m][n])

    def load_grid(self, ref: str, counters, mr: int, nv: int, lanes) -> list[list[ir.Value]]:
        s = self.s
        if ref in self.packed and nv == self.nv and lanes is None:
            line = self.red_linear(counters)
            b = self.b()
            align = self.scalar is F64 and 8 or 4
            slot = self.packed[ref]
            row = [b.load(self.packed_at(slot, line, n), typ=self.vt, align=align) for n in range(nv)]
            if ref in self.in_place_refs and self.prefetch is not None:
                self.prefetch.point(slot, line)
            return [row] * mr
        coefs = s.coefs[ref]
        per_row = s.r is not None and coefs[s.r] != 0
        view = self.views[ref]
        rows = []
        for m in range(mr if per_row else 1):
            if coefs[s.v] == 0:
                x = view.read(self.em, self.elem(ref, counters, m, 0))
                rows.append([self.splat(x)] * nv)
            else:
                rows.append(
                    [
                        self.vector(ref, self.elem(ref, counters, m, n), lanes if n == nv - 1 else None)
                        for n in range(nv)
                    ]
                )
        return rows if per_row else rows * mr

    def vector(self, ref: str, pos: ir.Value, mask: ir.Value | None) -> ir.Value:
        """``W`` elements of ``ref`` along the vector index from ``pos``: one (masked) load when
        they are contiguous, else a gather of scalar loads (a lane the mask turns off reads
        lane 0's element, which is in the block, and is never stored)."""
        view = self.views[ref]
        step = self.s.coefs[ref][self.s.v]
        if step == 1:
            return self.vload(view, pos, mask)
        b = self.b()
        out = ir.Constant(self.vt, ir.Undefined)
        for lane in range(self.width):
            at: ir.Value = i64(lane * step)
            if mask is not None and lane:
                on = b.extract_element(mask, ir.Constant(I32, lane))
                at = b.select(on, at, i64(0))
            x = view.read(self.em, b.add(pos, at) if lane else pos)
            out = b.insert_element(out, x, ir.Constant(I32, lane))
        return out


def _combine(op, x: list[list[ir.Value]], y: list[list[ir.Value]]) -> list[list[ir.Value]]:
    """``op`` lane-wise over two grids; rows that are the same objects are computed once."""
    out, seen = [], {}
    for xr, yr in zip(x, y):
        key = (id(xr), id(yr))
        if key not in seen:
            seen[key] = [op(a, c) for a, c in zip(xr, yr)]
        out.append(seen[key])
    return out


def emit_microkernel(
    cg,
    block: Block,
    starts: list[ir.Value],
    parent_views: dict[str, View] | None,
    bounded,
    cfg: VectorConfig,
    fresh: int = 0,
    blocks: tuple[int, int] | None = None,
    epilogue=None,
) -> bool:
    """Emit ``block`` (all its points; ``bounded``: ``(index position, lo, hi)`` restricting one
    kernel index to a chunk, or None) as a micro-kernel when ``analyse`` matches it; False (and
    nothing emitted) otherwise. ``cg`` is the ``KernelCodegen`` (views, affines, the builder).
    ``fresh``: the output buffer's element count when it holds garbage that a zero fill would
    clear (else 0); when the kernel writes every element of it (``covers``), its tiles start from
    zero and ``cg.took_fresh`` is set (the caller then skips the fill), else the output is read
    as usual. ``blocks``: the cache tiles ``(KC, NC)`` to block by (an optimizer nest's), instead
    of those ``cache_blocks`` sizes from the caches. ``epilogue``: a ``tile_epilogue.Epilogue`` that
    stores the final elements (tiles start from zero; no zero fill is taken)."""
    if not cfg.vector_bytes:
        return False
    dims: dict[str, tuple[Dim, ...]] = {}
    dts: dict[str, DType] = {}
    for r in block.refs:
        if parent_views is None and r.source in cg.ptrs:
            dims[r.into], dts[r.into] = r.shape.dims, cg.buf_dtypes[r.source]
        elif parent_views is not None and r.source in parent_views:
            p = parent_views[r.source]
            dims[r.into], dts[r.into] = p.dims, p.buf_dtype
    pos = bounded[0] if bounded is not None else None
    mk = kernel_match(cg, block, dims, dts, pos, cfg, blocks, epilogue)
    if mk is None:
        return False
    shape, origin = mk.s, {ix.name: st for ix, st in zip(block.idxs, starts)}
    mk.views = {r.into: cg.view(block, r, origin, parent_views) for r in block.refs}
    mk.origin = origin
    if epilogue is not None:
        mk.fresh, mk.epilogue = True, TileEpilogue(epilogue)
    elif fresh and parent_views is None and covers(block, shape, fresh):
        mk.fresh = cg.took_fresh = True
    bounds = {}
    if pos is not None and block.idxs[pos].range > 1:
        bounds[pos] = (bounded[1], bounded[2])
    mk.run(bounds)
    return True


def kernel_match(cg, block: Block, dims, dts, pos, cfg: VectorConfig, blocks, epilogue) -> MicroKernel | None:
    """The micro-kernel of ``block`` (``analyse``'s arguments; ``pos``: the index a chunk bounds,
    or None; ``cg`` None for the test alone), or None: no match, or a gather at every point."""
    if epilogue is not None:
        dts = epilogue.analysed(dts, block)
        if not epilogue.partials:
            cfg, blocks = replace(cfg, l1_bytes=0), None  # one pass over K: no partials in the output
    shape = analyse(block, dims, dts, pos if pos is not None and block.idxs[pos].range > 1 else None)
    if shape is None:
        return None
    mk = MicroKernel(cg, block, shape, {}, cfg, blocks, epilogue is None or epilogue.partials)
    strided = [n for n, c in shape.coefs.items() if n != shape.out and c[shape.v] not in (0, 1)]
    if any(n not in mk.pack_refs for n in strided):
        return None  # the plain loops do better
    return mk


__all__ = ["emit_microkernel", "kernel_match"]
