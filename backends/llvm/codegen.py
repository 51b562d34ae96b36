"""Stripe kernels to one LLVM module: blocks become loop nests, refinements pointer offsets.

For kernel ``k`` the module defines ``void tile_k<k>_<name>(ptr bufs, i64 lo, i64 hi)``: ``bufs``
holds one pointer per ``KernelInfo.buffers`` entry, and the call runs the points whose *split*
index (``Schedule.split_index``, usually its outermost loop) lies in ``[lo, hi)`` — all points when
``lo, hi`` cover its range; a kernel without indexes runs its one point whatever ``lo, hi``. It
calls an internal function taking the buffers as ``noalias`` arguments (distinct buffers never
overlap; the executor checks it), which lets LLVM keep accumulators in registers and vectorize.

A block runs, per point (``stripe.ir`` semantics): index values ``start + counter`` with
``start`` the index's affine of the parent's values; constraints ``affine >= 0`` as guards placed
at the shallowest loop that binds their indexes; refinements as element offsets (``base`` = the
parent's base + Σ access_d * parent stride_d; at kernel level the parent is the buffer, whose
strides are the refinement's own and whose dtype comes from ``buffer_dtypes``); then
its statements in order. A refinement naming nothing of its parent (dir none, no ``from_``) is a
zero-filled stack allocation per point. Stores go through the refinement's ``agg_op`` in the
buffer's dtype, as the interpreter's ``ufunc.at`` does (float ``+``/``*`` marked reassociable
and float ``max``/``min`` as ``llvm.maximum``/``minimum`` unless strict, §8.3). A leaf block
that ``match.analyse`` recognizes as a contraction (the kernel, split over the schedule's first
index, or a nested tile) is emitted by ``microkernel`` instead; a fused GEMM nest's epilogue
(``epilogue``) runs on its final tiles.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from llvmlite import ir

from backends.hal import KernelInfo, kernel_symbol
from backends.llvm.intrinsics import binary, emit_intrinsic, unordered_minmax
from backends.llvm.loops import View, for_range
from backends.llvm.match import VectorConfig
from backends.llvm.microkernel import emit_microkernel
from backends.llvm.partials import Running, SumBlocks, chunked, plan_sums, sum_in_blocks
from backends.llvm.rowreduce import emit as emit_rows
from backends.llvm.rowreduce import plan as row_plan
from backends.llvm.scalars import F64, I64, PTR, VOID, Emitter, Scalar, i64, mem_type
from backends.llvm.schedule import Schedule
from backends.llvm.specials import emit_special
from backends.llvm.symbolic import is_slot
from stripe.ir import (
    AGG_OPS,
    Block,
    Constant,
    Intrinsic,
    Load,
    LoadIndex,
    RefDir,
    Refinement,
    Special,
    Store,
    block_error,
    dense_strides,
    where,
)
from stripe.scope import Scope, check_access_rank, missing_parent
from tile.affine import Affine
from tile.dtypes import DType
from tile.errors import TileRuntimeError

RUNTIME_LOCALS = 16 << 10  # bytes: a generic kernel's locals of run-time sizes, all together, at most


class KernelCodegen:
    """Generates one kernel's functions into ``em.module``."""

    row_bytes = 0  # a generic kernel's ``rowreduce`` vector bytes (``generic._build``; 0: plain loops)

    def __init__(
        self,
        em: Emitter,
        index: int,
        info: KernelInfo,
        schedule: Schedule,
        buffer_dtypes: dict[str, DType],
        vector: VectorConfig | None = None,
        fresh: int = 0,
        blocks: tuple[int, int] | None = None,
        epilogue=None,
        slots: int = 0,
    ):
        self.em = em
        self.slots = slots  # run-time integers (``symbolic``): a generic kernel's extents array
        self.extents: list[ir.Value] = []
        self.blocks = blocks  # the cache tiles of the optimizer's nest this kernel came from
        self.epilogue = epilogue  # the nest's fused epilogue (``tile_epilogue.Epilogue``), if any
        self.fresh = fresh  # the kernel before only zero-fills this one's output: its elements
        self.took_fresh = False  # the micro-kernel starts from zero instead: the fill is skipped
        self.vector = vector or VectorConfig()
        self.buffer_dtypes = buffer_dtypes
        self.info = info
        self.block: Block = info.block  # type: ignore[assignment]
        self.schedule = schedule
        self.symbol = kernel_symbol(index, info)
        self.ordered: list[ir.Value] = []  # partials (``partials.Running.slot``) added in order

    # ---------------------------------------------------------------------- functions
    def build(self) -> ir.Function:
        n = len(self.info.buffers)
        ext = 1 if self.slots else 0  # a generic kernel's extents array follows the buffers
        body_ty = ir.FunctionType(VOID, [PTR] * (n + ext) + [I64, I64])
        body = ir.Function(self.em.module, body_ty, f"{self.symbol}.body")
        body.linkage = "internal"
        body.attributes.add("noinline")
        body.attributes.add("nounwind")
        for a in body.args[:n]:
            a.add_attribute("noalias")
        self.em.alloca_block = body.append_basic_block("allocas")
        start = body.append_basic_block("entry")
        self.em.builder = ir.IRBuilder(start)
        self.ptrs = dict(zip(self.info.buffers, body.args[:n]))
        b = ir.IRBuilder(self.em.alloca_block)  # (first: a run-time local's size reads them there)
        self.extents = self.em.extents = [
            b.load(b.gep(body.args[n], [i64(k)], source_etype=I64), typ=I64) for k in range(self.slots)
        ]
        self.buf_dtypes = dict(self.buffer_dtypes)
        for r in self.block.refs:
            if r.source in self.ptrs:
                self.buf_dtypes.setdefault(r.source, r.shape.dtype)
        self.kernel_block(body.args[n + ext], body.args[n + ext + 1])
        self.em.builder.ret_void()
        ir.IRBuilder(self.em.alloca_block).branch(start)

        fn = ir.Function(self.em.module, ir.FunctionType(VOID, [PTR, I64, I64]), self.symbol)
        fn.attributes.add("nounwind")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        bufs, lo, hi = fn.args
        ptrs = [b.load(b.gep(bufs, [i64(k)], source_etype=PTR), typ=PTR) for k in range(n + ext)]
        b.call(body, [*ptrs, lo, hi])
        b.ret_void()
        return fn

    # ------------------------------------------------------------------------- blocks
    def num(self, n) -> ir.Value:
        """An integer of the kernel as an i64: a constant, or a generic kernel's run-time extent."""
        return self.em.num(n)

    def affine(self, aff: Affine, vals: dict[str, ir.Value], block: Block, what: str) -> ir.Value:
        known = [c for c in (aff.const, *(c for _, c in aff.terms)) if not is_slot(c)]
        if any(c.denominator != 1 for c in known):  # a slot holds an integer
            raise block_error(
                block, f"{what}: the affine '{aff}' has a non-integer coefficient", "defract first"
            )
        b = self.em.builder
        out: ir.Value = self.num(aff.const)
        for v, c in aff.terms:
            if v not in vals:
                known = ", ".join(vals) or "none"
                raise block_error(
                    block,
                    f"{what}: '{aff}' uses '{v}', not an index here (known: {known})",
                    "affines use the block's own indexes (an index's affine: its parent's)",
                )
            term = vals[v] if not is_slot(c) and c == 1 else b.mul(vals[v], self.num(c))
            out = term if isinstance(out, ir.Constant) and out.constant == 0 else b.add(out, term)
        return out

    def kernel_block(self, lo: ir.Value, hi: ir.Value) -> None:
        block = self.block
        starts = []
        for ix in block.idxs:
            if ix.affine is not None and not ix.affine.is_constant:
                raise block_error(
                    block, f"kernel index '{ix.name}' has the affine '{ix.affine}'", "kernels start at 0"
                )
            starts.append(self.num(ix.affine.const) if ix.affine is not None else i64(0))
        sched = self.schedule
        split = (sched.split_index, lo, hi) if sched.order else None
        args = (self.vector, self.fresh, self.blocks, self.epilogue)
        if split and emit_microkernel(self, block, starts, None, split, *args):
            return
        if self.epilogue is not None:  # ``epilogue.takes`` said the micro-kernel would run it
            why = "the micro-kernel refused a GEMM with an epilogue"
            raise block_error(block, why, "a code generator bug")
        self.loops(block, sched.order, starts, None, (lo, hi), sched.split_at)

    def loops(
        self,
        block: Block,
        order: Sequence[int],
        starts: list[ir.Value],
        parent_views: dict[str, View] | None,
        bounds: tuple[ir.Value, ir.Value] | None,
        bounded: int = 0,
    ) -> None:
        """The loop nest of ``block`` in ``order``, the loop at depth ``bounded`` over ``bounds`` if
        given (the schedule's split index)."""
        em = self.em
        idxs = block.idxs
        split = bounds is not None and self.schedule.split  # else [lo, hi) is the whole range
        sums = self.sum_plan(block, order, parent_views, bounded if split else -1)
        rows = None if sums is not None or self.slots and not self.row_bytes else row_plan(  # ``rowreduce``
            block, order, self.ref_dtypes(block, parent_views), self.row_bytes or self.vector.vector_bytes,
            self.vector.reassoc, order[bounded] if bounds is not None and bounded < len(order) else None,
        )
        if rows is not None and order[-1] != rows.k:  # its reduction index moves innermost
            at = list(order).index(rows.k)
            order, bounded = (*order[:at], *order[at + 1 :], rows.k), bounded - (at < bounded)
        level = {ix.name: order.index(k) for k, ix in enumerate(idxs)}
        guards: dict[int, list[Affine]] = {}
        for c in block.constraints:
            deepest = max((level.get(v, len(order) - 1) for v in c.vars), default=-1)
            guards.setdefault(deepest, []).append(c)

        def guarded(depth: int, vals: dict[str, ir.Value], then) -> None:
            conds = guards.get(depth, [])
            if not conds:
                then()
                return
            b = em.builder
            ok = None
            for c in conds:
                test = b.icmp_signed(">=", self.affine(c, vals, block, "a constraint"), i64(0))
                ok = test if ok is None else b.and_(ok, test)
            with b.if_then(ok):
                then()

        def nest(depth: int, vals: dict[str, ir.Value], run: Running | None = None) -> None:
            if rows is not None and depth == len(order) - 1:  # the innermost loop as vectors
                emit_rows(self, block, rows, vals, starts[order[depth]], parent_views)
                return
            if depth == len(order):
                self.point(block, vals, parent_views, run)
                return
            if sums is not None and depth == sums.start and run is None:  # one sum per element
                ref = block.ref(sums.out)
                names = [name for name, _ in sums.owned]
                first = self.view(block, ref, {**vals, **dict.fromkeys(names, i64(0))}, parent_views)

                def out_at(coords: list[ir.Value]) -> View:
                    return self.view(block, ref, {**vals, **dict(zip(names, coords))}, parent_views)

                def run_sums(r: Running) -> None:
                    if sums.ordered:  # type: ignore[union-attr]
                        self.ordered.append(r.slot)
                    nest(depth, vals, r)

                sum_in_blocks(em, sums, first, run_sums, out_at)
                return
            k = order[depth]
            ix = idxs[k]
            lo, hi = bounds if (depth == bounded and bounds is not None) else (i64(0), self.num(ix.range))

            def body(counter: ir.Value) -> None:
                value = counter if _is_zero(starts[k]) else em.builder.add(starts[k], counter)
                inner = {**vals, ix.name: value}
                guarded(depth, inner, lambda: nest(depth + 1, inner, run))

            if run is not None and depth == sums.chunked:  # type: ignore[union-attr]
                chunked(em, lo, hi, sums.chunk, run, body)  # type: ignore[union-attr]
            else:
                for_range(em, lo, hi, body)

        guarded(-1, {}, lambda: nest(0, {}))

    def sum_plan(self, block: Block, order, parent_views, after: int) -> SumBlocks | None:
        """How a long float ``+`` reduction of ``block`` sums in blocks (``partials``), outside
        strict mode; None: as written."""
        if not self.vector.reassoc or self.slots:  # a generic kernel sums as written (its blocks
            return None  # would depend on the run-time extents)
        sums = plan_sums(block, order, self.vector.sum_block, after, self.ref_dtypes(block, parent_views))
        owned = dict(sums.owned) if sums else {}
        if any(ix.name in owned and ix.affine not in (None, Affine.constant(0)) for ix in block.idxs):
            return None  # the partials are indexed by the owned loops' values, which must start at 0
        return sums

    def ref_dtypes(self, block: Block, parent_views) -> dict[str, DType]:
        """The buffer dtype of each refinement of ``block`` that reaches a buffer."""
        dts = {}
        for r in block.refs:
            if parent_views is None and r.source in self.ptrs:
                dts[r.into] = self.buf_dtypes[r.source]
            elif parent_views is not None and r.source in parent_views:
                dts[r.into] = parent_views[r.source].buf_dtype
        return dts

    def nested(self, block: Block, parent_vals: dict[str, ir.Value], views: dict[str, View]) -> None:
        starts = [
            i64(0) if ix.affine is None else self.affine(ix.affine, parent_vals, block, f"index '{ix.name}'")
            for ix in block.idxs
        ]
        if emit_microkernel(self, block, starts, views, None, self.vector):
            return
        self.loops(block, tuple(range(len(block.idxs))), starts, views, None)

    # -------------------------------------------------------------------------- views
    def view(self, block: Block, r: Refinement, vals, parent_views: dict[str, View] | None) -> View:
        em = self.em
        b = em.builder
        if parent_views is None and r.source in self.ptrs:
            ptr, buf_dt, base, pdims = self.ptrs[r.source], self.buf_dtypes[r.source], i64(0), r.shape.dims
        elif parent_views is not None and r.source in parent_views:
            p = parent_views[r.source]
            ptr, buf_dt, base, pdims = p.ptr, p.buf_dtype, p.base, p.dims
        elif r.dir is RefDir.NONE and r.from_ is None:
            return self.local(r)
        else:
            hint = "refine a refinement of the enclosing block (kernels: one of KernelInfo.buffers)"
            raise missing_parent(block, r, hint)
        check_access_rank(block, r, len(pdims))
        for a, d in zip(r.access, pdims):
            if a.is_constant and not is_slot(a.const) and a.const == 0:
                continue
            off = self.affine(a, vals, block, f"the access of '{r.into}'")
            unit = not is_slot(d.stride) and d.stride == 1
            base = b.add(base, off if unit else b.mul(off, self.num(d.stride)))
        return View(r.into, ptr, buf_dt, base, r.shape.dims, r.shape.dtype, r.agg_op)

    def local(self, r: Refinement) -> View:
        """A fresh zero-filled buffer for this point, on the stack."""
        em = self.em
        dims = r.shape.dims
        if any(is_slot(x) for d in dims for x in (d.size, d.stride)):
            return self.run_time_local(r)
        if any(d.stride < 0 for d in dims):
            raise TileRuntimeError(
                f"local buffer '{r.into}' has a negative stride", None, hint="allocations use strides >= 0"
            )
        extent = 0 if any(d.size == 0 for d in dims) else 1 + sum((d.size - 1) * d.stride for d in dims)
        typ = mem_type(r.shape.dtype)
        slot = em.alloca(typ, max(extent, 1))
        nbytes = max(extent, 1) * r.shape.dtype.numpy.itemsize
        memset = em.declare("llvm.memset.p0.i64", VOID, [PTR, ir.IntType(8), I64, ir.IntType(1)])
        em.builder.call(
            memset, [slot, ir.Constant(ir.IntType(8), 0), i64(nbytes), ir.Constant(ir.IntType(1), 0)]
        )
        return View(r.into, slot, r.shape.dtype, i64(0), dims, r.shape.dtype, r.agg_op)

    def run_time_local(self, r: Refinement) -> View:
        """``local`` for a generic kernel whose local's sizes come at run time: allocated once in
        the function's entry (``Emitter.alloca``'s block) at its run-time extent, counted on the
        stack as ``RUNTIME_LOCALS`` (``generic`` binds only kernels whose locals fit that)."""
        em = self.em
        b = ir.IRBuilder(em.alloca_block)
        extent: ir.Value = i64(1)
        for d in r.shape.dims:
            extent = b.add(extent, b.mul(b.sub(em.num(d.size), i64(1)), em.num(d.stride)))
        typ = mem_type(r.shape.dtype)
        slot = b.alloca(typ, size=extent)
        slot.type = PTR
        em.stack_bytes += RUNTIME_LOCALS
        nbytes = em.builder.mul(extent, i64(r.shape.dtype.numpy.itemsize))
        memset = em.declare("llvm.memset.p0.i64", VOID, [PTR, ir.IntType(8), I64, ir.IntType(1)])
        em.builder.call(memset, [slot, ir.Constant(ir.IntType(8), 0), nbytes, ir.Constant(ir.IntType(1), 0)])
        return View(r.into, slot, r.shape.dtype, i64(0), r.shape.dims, r.shape.dtype, r.agg_op)

    # ---------------------------------------------------------------------- statements
    def point(self, block: Block, vals: dict[str, ir.Value], parent_views: dict[str, View] | None,
              run: Running | None = None) -> None:
        """One point of ``block``; ``run``: its sum goes into that partial (``partials``)."""
        views = {
            r.into: run.partial(self.em, vals) if run is not None and r.into == run.sums.out
            else self.view(block, r, vals, parent_views)
            for r in block.refs
        }
        self.statements(block, vals, views)

    def statements(self, block: Block, vals: dict[str, ir.Value], views: dict[str, View]) -> None:
        """``block``'s statements at one point, its refinements seen as ``views`` (``point``'s, or
        an epilogue's around a micro-kernel's finished element: ``epilogue``)."""
        em = self.em
        scope: Scope[View, Scalar] = Scope(block, views)
        get, put, ref = scope.get, scope.put, scope.ref

        for stmt in block.stmts:
            if isinstance(stmt, Load):
                v = ref(stmt.from_, stmt)
                put(stmt.into, Scalar(v.read(em, v.base), v.dtype, v.dtype))
            elif isinstance(stmt, Store):
                self.store(block, ref(stmt.into, stmt), get(stmt.from_))
            elif isinstance(stmt, LoadIndex):
                value = self.affine(stmt.affine, vals, block, f"load_index into '{stmt.into}'")
                put(stmt.into, Scalar(value, DType.INT64, DType.INT64))
            elif isinstance(stmt, Constant):
                if stmt.dtype.is_float:
                    put(stmt.into, Scalar(ir.Constant(F64, float(stmt.value)), DType.FLOAT64, stmt.dtype))
                else:
                    put(stmt.into, Scalar(em.const(stmt.value, stmt.dtype), stmt.dtype, stmt.dtype))
            elif isinstance(stmt, Intrinsic):
                if len(stmt.outputs) != 1:
                    raise block_error(block, f"intrinsic '{stmt.name}' must have one output", "one scalar")
                args = [get(x) for x in stmt.inputs]
                value = emit_intrinsic(em, stmt.name, args, stmt.dtype, where(block))
                put(stmt.outputs[0], Scalar(value, stmt.dtype, stmt.dtype))
            elif isinstance(stmt, Special):
                emit_special(em, stmt, views, where(block))
            elif isinstance(stmt, Block):
                self.nested(stmt, vals, views)
            else:
                raise block_error(block, f"unknown statement {stmt!r}", "see stripe.ir.Statement")

    def store(self, block: Block, v: View, s: Scalar) -> None:
        em = self.em
        if v.agg_op not in AGG_OPS:
            raise block_error(
                block,
                f"refinement '{v.name}' has unknown agg_op '{v.agg_op}'",
                "agg_op is one of assign, add, mul, max, min",
            )
        value = em.convert(em.to(s, v.dtype), v.dtype, v.buf_dtype)
        if v.agg_op in ("", "assign"):
            em.store(value, v.ptr, v.base, v.buf_dtype)
            return
        current = em.load(v.ptr, v.base, v.buf_dtype)
        if self.vector.reassoc and v.agg_op in ("max", "min") and v.buf_dtype.is_float:
            out = unordered_minmax(em, v.agg_op, current, value)  # vectorizes (any order, §8.3)
        else:
            out = binary(em, v.agg_op, current, value, v.buf_dtype)
        reassoc = self.vector.reassoc and not any(v.ptr is slot for slot in self.ordered)  # ``partials``
        if reassoc and isinstance(out, ir.Instruction) and out.opname in ("fadd", "fmul"):
            out.flags.append("reassoc")  # any order of a float sum or product (§8.3): vectorizable
        em.store(out, v.ptr, v.base, v.buf_dtype)


def _is_zero(v: ir.Value) -> bool:
    return isinstance(v, ir.Constant) and v.constant == 0


def buffer_dtypes(info: KernelInfo, given: dict) -> dict[str, DType]:
    """Each buffer's element type: ``info.buffer_dtypes`` (one per buffer) if the runner set it,
    else the ``buffer_dtypes`` setting (name -> dtype), else (in ``KernelCodegen``) the dtype of the
    kernel's first refinement of it."""
    per_kernel = getattr(info, "buffer_dtypes", ())
    if per_kernel:
        return {b: DType(str(d)) for b, d in zip(info.buffers, per_kernel)}
    return {b: DType(str(given[b])) for b in info.buffers if b in given}


def generate(
    kernels: Sequence[KernelInfo],
    schedules: Sequence[Schedule],
    f16c: bool,
    triple: str,
    layout: str,
    dtypes: dict | None = None,
    vector: VectorConfig | None = None,
    stack: list[int] | None = None,
    blocks: Sequence[tuple[int, int] | None] = (),
    epilogues: Sequence = (),
    only: Collection[int] | None = None,
    emptied: set[int] | None = None,
    plain: Collection[int] = (),
) -> str:
    """The LLVM IR text of the module holding every kernel (``dtypes``: buffer name -> dtype;
    ``vector``: the host's vector width and whether fused multiply-add is allowed, for the
    micro-kernels of ``microkernel``; None keeps every block as plain loops). ``stack`` gets each
    kernel's stack allocations in bytes (packed panels, local buffers); ``blocks`` each kernel's
    cache tiles from an optimizer nest (``match.from_nest``), or None; ``epilogues`` each kernel's
    fused epilogue (``epilogue.read_fused``), or None; ``only``: the first kernels of the
    ``units`` to build (the others get no function and no stack figure: 0), None: all; ``emptied``
    gets the zero fills built empty (a micro-kernel took them over: ``fills``); ``plain``: kernels
    built as plain loops whatever ``vector`` says (``generic.assign``'s short first products)."""
    module = ir.Module(name="tile")
    module.triple = triple
    module.data_layout = layout
    em = Emitter(module, f16c)
    em.inline_math = vector is not None and vector.reassoc  # vmath's exp/tanh/log, not strict
    em.strict = not em.inline_math  # reassoc is off exactly in strict mode (device.LlvmCompiler)
    stacks: dict[int, int] = {}
    skipped: set[int] = set()  # zero fills a micro-kernel took over (their kernels do nothing)
    for unit in units(kernels):
        k = unit[0]
        if only is not None and k not in only:
            continue
        fill = _zero_fill_of(kernels[k], kernels[k + 1]) if len(unit) == 2 else 0
        order = [k + 1, k] if fill else [k]
        for j in order:  # the contraction first: whether it took the fill decides the fill's body
            em.stack_bytes = 0
            dts = buffer_dtypes(kernels[j], dtypes or {})
            given = blocks[j] if j < len(blocks) else None
            epi = epilogues[j] if j < len(epilogues) else None
            fresh = fill if j != k else 0
            vec = replace(vector, vector_bytes=0) if j in plain and vector is not None else vector
            cg = KernelCodegen(em, j, kernels[j], schedules[j], dts, vec, fresh, given, epi)
            if j in skipped:
                cg.block = replace(cg.block, stmts=())
            cg.build()
            if cg.took_fresh:
                skipped.add(k)
            stacks[j] = em.stack_bytes
    if stack is not None:
        stack.extend(stacks.get(k, 0) for k in range(len(kernels)))
    if emptied is not None:
        emptied.update(skipped)
    return str(module)


def units(kernels: Sequence[KernelInfo]) -> list[tuple[int, ...]]:
    """The kernels ``generate`` builds together, in order: a zero fill the next kernel's
    micro-kernel may take over (``_zero_fill_of``) with that kernel, every other kernel alone."""
    out: list[tuple[int, ...]] = []
    k = 0
    while k < len(kernels):
        pair = k + 1 < len(kernels) and _zero_fill_of(kernels[k], kernels[k + 1])
        out.append((k, k + 1) if pair else (k,))
        k += 2 if pair else 1
    return out


def _zero_fill_of(fill: KernelInfo, kernel: KernelInfo) -> int:
    """The element count of the buffer when kernel ``fill`` only zero-fills all of one buffer
    that ``kernel`` (the next one) adds into (a micro-kernel that writes all of it may start from
    zero instead), else 0."""
    zb, kb = fill.block, kernel.block
    if not isinstance(zb, Block) or not isinstance(kb, Block) or zb.idxs or len(zb.stmts) != 1:
        return 0
    st = zb.stmts[0]
    if not isinstance(st, Special) or st.name != "zero" or len(st.outputs) != 1 or len(zb.refs) != 1:
        return 0
    ref = zb.refs[0]
    if ref.into != st.outputs[0] or any(a.const != 0 or a.terms for a in ref.access):
        return 0
    if tuple(d.stride for d in ref.shape.dims) != dense_strides(ref.shape.sizes):
        return 0  # the fill's elements are [0, elements) of the buffer
    stores = [s for s in kb.stmts if isinstance(s, Store)]
    adds = len(stores) == 1 and any(
        r.into == stores[0].into and r.source == ref.source and r.agg_op == "add" for r in kb.refs
    )
    return ref.shape.elements if adds else 0
