"""Reductions along a contiguous axis as vector loops: softmax's row maximum and row sum, a layer
norm's sums, any ``O[i] = +(X[i, j])`` whose innermost loop ``j`` reads memory in order.

The plain loop nest (``codegen``) re-loads and re-stores the output element at every point of
such a loop; LLVM then unrolls a short ``j`` loop whole and vectorizes the loop *outside* it, with
gathers (a row of 64 floats ran at 1.2-2 GFLOP/s). ``plan`` matches a leaf block whose innermost
loop (in the schedule's order) is a reduction index of range ``>= W`` that every input reads at
stride 1 or not at all, and whose statements are loads, float ``add``/``sub``/``mul`` and one
``Store`` aggregating with ``add``, ``max`` or ``min``, every value and buffer of one float type
(float32 or float64), no constraint on ``j``. ``emit`` then runs that loop in ``U`` independent
vector accumulators of ``W`` lanes (a masked last vector), combines them lane-wise, reduces the
lanes as a tree and aggregates the result into the element once.

This reorders the element's aggregation, which docs/semantics.md §8.3 allows for float sums
(reassociated) and for max/min (any order; a tie of zeros may give either zero, NaN still wins):
only when ``VectorConfig.reassoc`` (never under ``strict``). Sums long enough to go through
``partials`` (past ``sum_block`` points) are left to it.

In a shape-generic kernel (``generic``) the plan reads no run-time integer (``symbolic.Slot``) as a
number: a slot range counts as longer than one point, and any other slot it would read (a stride,
say) leaves the block to the plain loops. A reduction index of run-time range ``n`` runs the same
vector loop to ``n`` and its masked last vector only when ``n`` is not a multiple of ``W``.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from backends.llvm.intrinsics import unordered_minmax
from backends.llvm.loops import View, counted_loop
from backends.llvm.scalars import F32, F64, I32, I64, PTR, i64
from backends.llvm.symbolic import SlotUsed, is_slot
from stripe.ir import Block, Intrinsic, Load, RefDir, Store
from tile.dtypes import DType

UNROLL = 4  # independent accumulators (vectors) of the main loop
OPS = {"add": "fadd", "sub": "fsub", "mul": "fmul", "assign": ""}
IDENTITY = {"add": -0.0, "max": float("-inf"), "min": float("inf")}


@dataclass(frozen=True)
class RowPlan:
    """A matched block: the innermost loop's index position ``k``, its name, the output, the
    element type, each input's stride along ``k`` (0 or 1), and the lanes of a vector."""

    k: int
    name: str
    out: str
    agg: str
    dtype: DType
    strides: tuple[tuple[str, int], ...]
    width: int


def plan(
    block: Block, order, dtypes: dict[str, DType], vector_bytes: int, reassoc: bool, fixed: int | None = None
) -> RowPlan | None:
    """The row reduction of ``block`` whose loops run in ``order`` (``dtypes``: buffer dtype by
    refinement), or None when the block is not one (see the module docstring). Its index is the
    innermost loop when that is a reduction index, else the block's one reduction index, which
    the caller then moves innermost (unless it is ``fixed``, the thread-split index: refused)."""
    if not reassoc or not vector_bytes or not order:
        return None
    try:
        return _plan(block, order, dtypes, vector_bytes, fixed)
    except SlotUsed:  # a generic kernel's run-time integer would decide it: plain loops
        return None


def _longer(n, than: int) -> bool:
    """Whether a range ``n`` (a run-time slot counts as long) is above ``than``."""
    return is_slot(n) or n > than


def _plan(block: Block, order, dtypes: dict[str, DType], vector_bytes: int, fixed) -> RowPlan | None:
    stores = [s for s in block.stmts if isinstance(s, Store)]
    if len(stores) != 1 or any(not isinstance(s, (Load, Store, Intrinsic)) for s in block.stmts):
        return None
    out = block.ref(stores[0].into)
    dtype = dtypes.get(out.into)
    if dtype not in (DType.FLOAT32, DType.FLOAT64) or out.agg_op not in IDENTITY:
        return None
    if out.dir is RefDir.NONE and out.from_ is None or any(
        isinstance(s, Load) and s.from_ == out.into for s in block.stmts
    ):
        return None
    for s in block.stmts:
        if isinstance(s, Intrinsic) and (s.name not in OPS or s.dtype is not dtype):
            return None
    if any(dtypes.get(r.into) is not dtype or r.shape.dtype is not dtype for r in block.refs):
        return None
    if any(len(r.access) != len(r.shape.dims) for r in block.refs):
        return None

    def stride(r, name: str) -> int:  # (a dimension the index does not move reads no stride)
        moves = [(int(a.coeff(name)), d) for a, d in zip(r.access, r.shape.dims) if a.coeff(name) != 0]
        return sum((c * d.stride for c, d in moves), start=0)

    ixs = block.idxs
    reductions = [k for k in order if stride(out, ixs[k].name) == 0 and _longer(ixs[k].range, 1)]
    if reductions and reductions[-1] == order[-1]:
        k = order[-1]
    elif len(reductions) == 1:
        k = reductions[0]
    else:
        return None
    if k == fixed:
        return None
    ix = block.idxs[k]
    width = vector_bytes // dtype.numpy.itemsize
    if not _longer(ix.range, width - 1) or ix.affine is not None and not ix.affine.is_constant:
        return None
    if any(ix.name in c.vars for c in block.constraints):
        return None
    loads = {s.from_ for s in block.stmts if isinstance(s, Load)}
    strides = tuple((r.into, stride(r, ix.name)) for r in block.refs if r.into in loads)
    if any(st not in (0, 1) for _, st in strides):
        return None
    return RowPlan(k, ix.name, out.into, out.agg_op, dtype, strides, width)


class RowEmitter:
    """``emit``'s state: the emitter, the vector type, the plan."""

    def __init__(self, em, p: RowPlan, width: int):
        self.em, self.p, self.width = em, p, width
        self.scalar = F64 if p.dtype is DType.FLOAT64 else F32
        self.vt = ir.VectorType(self.scalar, width)
        self.align = p.dtype.numpy.itemsize
        self.identity = ir.Constant(self.vt, [IDENTITY[p.agg]] * width)

    def suffix(self) -> str:
        return f"v{self.width}f{64 if self.scalar is F64 else 32}"

    def splat(self, x: ir.Value, vt: ir.VectorType | None = None) -> ir.Value:
        b = self.em.builder
        undef = ir.Constant(vt or self.vt, ir.Undefined)
        one = b.insert_element(undef, x, ir.Constant(I32, 0))
        return b.shuffle_vector(one, undef, ir.Constant(ir.VectorType(I32, self.width), [0] * self.width))

    def splat_i64(self, x: ir.Value) -> ir.Value:
        if isinstance(x, ir.Constant):
            return ir.Constant(ir.VectorType(I64, self.width), [x.constant] * self.width)
        return self.splat(x, ir.VectorType(I64, self.width))

    def load(self, view: View, pos: ir.Value, mask: ir.Value | None) -> ir.Value:
        b = self.em.builder
        ptr = b.gep(view.ptr, [pos], inbounds=True, source_etype=self.scalar)
        if mask is None:
            return b.load(ptr, typ=self.vt, align=self.align)
        fn = self.em.declare(f"llvm.masked.load.{self.suffix()}.p0", self.vt, [PTR, I32, mask.type, self.vt])
        return b.call(fn, [ptr, ir.Constant(I32, self.align), mask, self.identity])

    def combine(self, x: ir.Value, y: ir.Value) -> ir.Value:
        if self.p.agg == "add":
            return reassoc(self.em.builder.fadd(x, y))
        fn = self.em.declare(f"llvm.{self.p.agg}imum.{self.suffix()}", self.vt, [self.vt, self.vt])
        return self.em.builder.call(fn, [x, y], fastmath=("nsz",))

    def value(self, block: Block, views: dict[str, View], j: ir.Value, mask: ir.Value | None) -> ir.Value:
        """The stored value at ``W`` consecutive points from ``j`` (an offset from the loop's
        start), lanes off the mask holding the aggregation's identity."""
        b = self.em.builder
        strides = dict(self.p.strides)
        regs: dict[str, ir.Value] = {}
        for s in block.stmts:
            if isinstance(s, Load):
                view = views[s.from_]
                if strides[s.from_] == 0:
                    regs[s.into] = self.splat(view.read(self.em, view.base))
                else:
                    regs[s.into] = self.load(view, b.add(view.base, j), mask)
            elif isinstance(s, Intrinsic):
                args = [regs[n] for n in s.inputs]
                regs[s.outputs[0]] = getattr(b, OPS[s.name])(*args) if OPS[s.name] else args[0]
            else:
                out = regs[s.from_]
        if mask is not None:  # a computed value's lanes past the row: the identity
            out = b.select(mask, out, self.identity)
        return out

    def horizontal(self, v: ir.Value) -> ir.Value:
        b = self.em.builder
        if self.p.agg == "add":
            name = f"llvm.vector.reduce.fadd.{self.suffix()}"
            fn = self.em.declare(name, self.scalar, [self.scalar, self.vt])
            return b.call(fn, [ir.Constant(self.scalar, -0.0), v], fastmath=("reassoc",))
        name = "fmaximum" if self.p.agg == "max" else "fminimum"
        fn = self.em.declare(f"llvm.vector.reduce.{name}.{self.suffix()}", self.scalar, [self.vt])
        return b.call(fn, [v], fastmath=("nsz",))


def reassoc(x: ir.Instruction) -> ir.Instruction:
    x.flags.append("reassoc")
    return x


def emit(cg, block: Block, p: RowPlan, vals: dict[str, ir.Value], start: ir.Value, parent_views) -> None:
    """The innermost loop of ``p`` at the point ``vals`` (every other index bound) as vector code;
    ``start``: the index's first value. ``cg`` is the ``KernelCodegen`` (views, the emitter)."""
    em = cg.em
    width = p.width
    r = RowEmitter(em, p, width)
    views = {ref.into: cg.view(block, ref, {**vals, p.name: start}, parent_views) for ref in block.refs}
    n = block.idxs[p.k].range
    known = not is_slot(n)
    unroll = max(1, min(UNROLL, n // width)) if known else UNROLL
    accs = [em.alloca(r.vt) for _ in range(unroll)]
    for a in accs:
        em.builder.store(r.identity, a)

    def step(j: ir.Value) -> None:
        for u, a in enumerate(accs):
            at = em.builder.add(j, i64(u * width)) if u else j
            em.builder.store(r.combine(em.builder.load(a, typ=r.vt), r.value(block, views, at, None)), a)

    def single(j: ir.Value) -> None:
        acc = em.builder.load(accs[0], typ=r.vt)
        em.builder.store(r.combine(acc, r.value(block, views, j, None)), accs[0])

    def tail(full: ir.Value, left: ir.Value) -> None:  # the masked last vector: ``left`` lanes
        b = em.builder
        lanes = ir.Constant(ir.VectorType(I64, width), list(range(width)))
        mask = b.icmp_unsigned("<", lanes, r.splat_i64(left))
        b.store(r.combine(b.load(accs[0], typ=r.vt), r.value(block, views, full, mask)), accs[0])

    if known:
        end = counted_loop(em.builder, i64(0), i64(n), step, unroll * width, whole=True)
        full = n // width * width
        if unroll > 1 and full > n // (unroll * width) * unroll * width:
            end = counted_loop(em.builder, end, i64(full), single, width)
        if n > full:
            tail(i64(full), i64(n - full))
    else:  # a run-time range: the same loops to it, the masked vector only where lanes are left
        length = cg.num(n)
        end = counted_loop(em.builder, i64(0), length, step, unroll * width, whole=True)
        full = em.builder.and_(length, i64(-width))  # (``width`` is a power of two)
        counted_loop(em.builder, end, full, single, width)
        left = em.builder.sub(length, full)
        with em.builder.if_then(em.builder.icmp_signed("!=", left, i64(0)), likely=False):
            tail(full, left)
    b = em.builder
    total = [b.load(a, typ=r.vt) for a in accs]
    while len(total) > 1:
        total = [r.combine(total[i], total[i + 1]) if i + 1 < len(total) else total[i]
                 for i in range(0, len(total), 2)]
    partial = r.horizontal(total[0])
    out = views[p.out]
    current = out.read(em, out.base)
    if p.agg == "add":
        value = reassoc(b.fadd(current, partial))
    else:
        value = unordered_minmax(em, p.agg, current, partial)
    out.write(em, out.base, value)


__all__ = ["RowPlan", "emit", "plan"]
