"""One Stripe kernel as a C-like function body: work-items over the owned indexes, loops over the rest.

A kernel's work-item ``gid`` (``0 <= gid < work_items``) fixes the values of its *owned* indexes
(``stripe.ownership``: every written element belongs to exactly one value of them, so work-items
never race), the one of smallest output stride varying fastest. Inside, the other indexes loop
in Stripe order, so every element receives its writes in the interpreter's (row-major) order; a
kernel owning no index is one work-item running every point in order.

A block runs, per point (``stripe.ir`` semantics): index values ``start + counter``; constraints
``affine >= 0`` as guards at the shallowest loop that binds their indexes; refinements as element
offsets (the parent's offset + Σ access_d * parent stride_d; at kernel level the parent is the
buffer, whose element type comes from ``KernelInfo.buffer_dtypes``); then its statements in order.
A refinement naming nothing of its parent (dir none, no ``from_``) is a zero-filled private array
per point (holding registers). Stores go through the refinement's ``agg_op`` in the buffer's type.
An output element that only the owned indexes choose is accumulated in a register (``hoistable``).
A kernel that is one ``Special`` runs it in parallel where it can (``specials``). The other forms
a kernel may take on a target with work-groups emit their statements through this emitter too
(``program`` chooses).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from backends.clike import numbers
from backends.clike.ops import binary, intrinsic
from backends.clike.specials import emit_special
from backends.clike.target import CTarget, Value, wrap
from backends.clike.views import View
from backends.clike.writer import CodeWriter
from backends.hal import KernelInfo, kernel_symbol
from backends.symbolic import is_slot
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
    where,
)
from stripe.ownership import owned_indexes
from stripe.scope import Scope, check_access_rank, missing_parent
from tile.affine import Affine
from tile.dtypes import DType
from tile.errors import TileRuntimeError


@dataclass
class KernelSource:
    name: str
    text: str
    work_items: int
    owned: tuple[str, ...]
    local: int = 0  # the work-group size the kernel needs (0: any)
    launch: dict | None = None  # a kernel its target launches its own way: the record of how
    # (a shape-generic template's ``work_items`` may be ``numbers.times`` factors with slots, its
    # ``local`` then decided per instance: ``wide_local``)


def wide_local(workgroups: bool, work: int) -> int:
    """The work-group size of a general kernel of ``work`` work-items: a wide kernel in groups of
    256 (faster than the local_size default, 64, for 1M work-items and more: bench/RESULTS.md);
    smaller ones keep more, smaller groups (0: the launch's default)."""
    return 256 if workgroups and work >= 1 << 20 else 0


def work_order(block: Block, owned) -> tuple[str, ...]:
    """The owned indexes of ``block`` from the one of largest output stride to the smallest (which
    varies fastest over ``gid``: neighbouring work-items write neighbouring elements)."""

    def stride(name: str) -> int:
        out = 0
        for r in block.refs:
            if r.dir in (RefDir.OUT, RefDir.INOUT) and len(r.access) == len(r.shape.dims):
                s = sum(int(a.coeff(name)) * d.stride for a, d in zip(r.access, r.shape.dims))
                out = max(out, abs(s))
        return out

    ixs = [ix.name for ix in block.idxs if ix.name in owned]
    return tuple(sorted(ixs, key=lambda n: -stride(n)))


class KernelEmitter(CodeWriter):
    """Emits one kernel's blocks and statements; ``general()`` gives the kernel as work-items over
    its owned indexes (``program`` picks the form a kernel takes)."""

    def __init__(self, t: CTarget, index: int, info: KernelInfo, buffer_dtypes: dict[str, DType]):
        super().__init__(t)
        self.info = info
        self.block: Block = info.block  # type: ignore[assignment]
        self.symbol = kernel_symbol(index, info)
        self.params: list[tuple[str, DType]] = []
        self.ptrs: dict[str, str] = {}
        self.buf_dtypes = dict(buffer_dtypes)
        for r in self.block.refs:
            if r.source in info.buffers:
                self.buf_dtypes.setdefault(r.source, r.shape.dtype)
        for k, b in enumerate(info.buffers):
            if b not in self.buf_dtypes:
                raise block_error(
                    self.block, f"buffer '{b}' has no refinement and no dtype", "set buffer_dtypes"
                )
            self.ptrs[b] = self.fresh(f"b{k}_{b}")
            self.params.append((self.ptrs[b], self.buf_dtypes[b]))
        self.products: dict[str, tuple[str, str, DType]] = {}  # fast_math: $v = a * b
        self.accs: dict[str, tuple[View, str]] = {}  # hoisted outputs: refinement -> (view, register)
        # a shape-generic template (``generic``): its run-time integers, and the owned indexes and
        # their order as an instance's analysis gave them (both read sizes the template lacks)
        self.values = 0
        self.owned: tuple[str, ...] | None = None
        self.order: tuple[str, ...] | None = None
        self.row_width: int | None = None  # a row program's work-group size (``rowkernel.width``)

    # ------------------------------------------------------------------ affines
    def affine(self, aff: Affine, vals: dict[str, str], block: Block, what: str) -> str:
        if not all(is_slot(c) or c.denominator == 1 for c in (aff.const, *(c for _, c in aff.terms))):
            raise block_error(
                block, f"{what}: the affine '{aff}' has a non-integer coefficient", "defract first"
            )
        parts = [numbers.text(aff.const)] if not numbers.zero(aff.const) else []
        for v, c in aff.terms:
            if v not in vals:
                known = ", ".join(vals) or "none"
                raise block_error(
                    block,
                    f"{what}: '{aff}' uses '{v}', not an index here (known: {known})",
                    "affines use the block's own indexes (an index's affine: its parent's)",
                )
            parts.append(vals[v] if numbers.one(c) else f"{numbers.text(c)} * {vals[v]}")
        if len(parts) == 1 and re.fullmatch(r"[A-Za-z_0-9]+", parts[0]):
            return parts[0]
        return "(" + " + ".join(parts) + ")" if parts else "0"

    # ------------------------------------------------------------------ kernel
    def begin(self) -> None:
        """Checks that every kernel index starts at a constant; the body's lines go one deep."""
        block = self.block
        self.t.where = f"kernel '{self.info.name}'"
        for ix in block.idxs:
            if ix.affine is not None and not ix.affine.is_constant:
                raise block_error(
                    block, f"kernel index '{ix.name}' has the affine '{ix.affine}'", "kernels start at 0"
                )
        self.depth = 1

    def general(self) -> KernelSource:
        """The kernel as work-items over its owned indexes and loops over the rest, or a kernel
        that is one ``Special`` spread over work-items where it can be (``specials``)."""
        block = self.block
        owned: tuple[str, ...] = ()
        if self.is_special_kernel():
            views = {r.into: self.view(block, r, {}, None) for r in block.refs}
            work = emit_special(self, block.stmts[0], views, where(block), parallel=True)
        else:
            owned = self.owned if self.owned is not None else owned_indexes(block, tuple(self.info.buffers))
            vals, work = self.work_items(owned)
            hoist = self.hoistable(owned)
            around = (lambda: self.open_accumulators(hoist, vals), self.close_accumulators)
            self.loops(block, vals, None, around=around if hoist else None)
        self.depth = 0
        body = [ln[4:] for ln in self.lines]
        if self.values:  # a template: its integers are arguments, its size and groups per instance
            text = self.t.kernel(self.symbol, self.params, body, numbers.expr(work), values=self.values)
            return KernelSource(self.symbol, numbers.named(text), work, owned, 0)
        text = self.t.kernel(self.symbol, self.params, body, work)
        return KernelSource(self.symbol, text, work, owned, wide_local(self.t.workgroups, work))

    def epilogue(self, g):
        """For a fused kernel: emits its statements after the contraction for one output element,
        the accumulator local holding the element's sum (``acc``), through ``point``. ``into``
        (a buffer's name, a register array's) stores what the statements store to that buffer
        into the register instead (``tile_store``: the caller stores it)."""
        if g.epilogue is None:
            return None
        block, local = g.epilogue
        rest = replace(block, idxs=(), constraints=(), stmts=block.stmts[1:])

        def in_register(r: Refinement, reg: str) -> View:  # ``r``'s one element, as register ``reg[0]``
            flat = tuple(replace(d, stride=0) for d in r.shape.dims)
            return View(r.into, reg, r.shape.dtype, "0", flat, r.shape.dtype, r.agg_op, True)

        def emit(lines: list[str], vals: dict[str, str], acc: str, depth: int,
                 into: tuple[str, str] | None = None) -> None:
            saved, self.lines, self.depth = self.lines, lines, depth
            try:
                reg = self.fresh(f"local_{local.into}")
                dt = local.shape.dtype
                self.line(f"{self.t.reg(dt)} {reg}[1] = {{{acc}}};")
                parents = {
                    r.source: View(
                        r.into,
                        self.ptrs[r.source],
                        self.buf_dtypes[r.source],
                        "0",
                        r.shape.dims,
                        r.shape.dtype,
                        r.agg_op,
                    )
                    for r in block.refs
                    if r.source in self.ptrs
                }
                parents[local.into] = in_register(local, reg)
                for r in block.refs if into else ():
                    if r.source == into[0]:
                        parents[r.source] = in_register(r, into[1])
                self.point(rest, vals, parents)
            finally:
                self.lines = saved

        return emit

    def is_special_kernel(self) -> bool:
        b = self.block
        return (
            not b.idxs
            and not b.constraints
            and len(b.stmts) == 1
            and isinstance(b.stmts[0], Special)
            and all(r.source in self.ptrs for r in b.refs)
        )

    def work_items(self, owned: tuple[str, ...]) -> tuple[dict[str, str], int]:
        """Bind the owned indexes from ``gid``, the one of smallest output stride fastest."""
        block = self.block
        ixs = [ix for ix in block.idxs if ix.name in owned]

        order = self.order if self.order is not None else work_order(block, owned)
        ixs.sort(key=lambda ix: order.index(ix.name))  # (a template's: its instance's; any is as right)
        vals: dict[str, str] = {}
        inner, work = 1, 1
        for ix in ixs:
            work = numbers.times(work, ix.range)
        for k, ix in enumerate(reversed(ixs)):
            var = self.fresh(ix.name)
            first = numbers.known(inner) and inner == 1
            at = "gid" if first else f"gid / {numbers.expr(inner)}"
            if k != len(ixs) - 1:
                at = f"({at}) % {numbers.text(ix.range)}" if not first else f"gid % {numbers.text(ix.range)}"
            start = int(ix.affine.const) if ix.affine is not None else 0
            self.line(f"const {self.long} {var} = {at}{f' + {start}' if start else ''};")
            vals[ix.name] = var
            inner = numbers.times(inner, ix.range)
        return vals, work

    def hoistable(self, owned: tuple[str, ...]) -> list[Refinement]:
        """Outputs a work-item can accumulate in a register: written (never read) at an element
        that only the owned indexes choose, through the kernel's only view of that buffer. The
        element then gets the same operations in the same order; it is read before the loops and
        written once after them (by this work-item alone: no other one writes it)."""
        b = self.block
        if all(ix.name in owned for ix in b.idxs) or any(isinstance(s, (Block, Special)) for s in b.stmts):
            return []
        out = []
        for r in b.refs:
            if (
                r.source in self.ptrs
                and r.agg_op in AGG_OPS
                and any(isinstance(s, Store) and s.into == r.into for s in b.stmts)
                and not any(isinstance(s, Load) and s.from_ == r.into for s in b.stmts)
                and not any(o is not r and o.source == r.source for o in b.refs)
                and len(r.access) == len(r.shape.dims)
                and all(set(a.vars) <= set(owned) for a in r.access)
            ):
                out.append(r)
        return out

    def open_accumulators(self, refs: list[Refinement], vals: dict[str, str]) -> None:
        for r in refs:
            v = self.view(self.block, r, vals, None)
            var = self.fresh(f"acc_{r.into}")
            self.line(f"{self.t.reg(v.buf_dtype)} {var} = {v.load_raw(self.t, v.base)};")
            self.accs[r.into] = (v, var)

    def close_accumulators(self) -> None:
        for v, var in self.accs.values():
            self.line(v.store_raw(self.t, v.base, var))

    # ------------------------------------------------------------------ blocks
    def loops(
        self,
        block: Block,
        vals: dict[str, str],
        parent_views: dict[str, View] | None,
        starts=None,
        around=None,
    ) -> None:
        """The loop nest over the indexes of ``block`` not already in ``vals``, in Stripe order
        (``around``: code to emit before and after the loops, inside the outermost guard)."""
        free = [ix for ix in block.idxs if ix.name not in vals]
        level = {ix.name: k for k, ix in enumerate(free)}
        names = {ix.name for ix in block.idxs}
        guards: dict[int, list[Affine]] = {}
        for c in block.constraints:
            for v in c.vars:
                if v not in names:
                    raise block_error(
                        block, f"a constraint uses '{v}', not an index of the block", "use its indexes"
                    )
            guards.setdefault(max((level.get(v, -1) for v in c.vars), default=-1), []).append(c)
        starts = starts or {}

        def guarded(depth: int, env: dict[str, str], then) -> None:
            conds = [f"{self.affine(c, env, block, 'a constraint')} >= 0" for c in guards.get(depth, [])]
            if not conds:
                then()
                return
            with self.scope(f"if ({' && '.join(conds)})"):
                then()

        def nest(depth: int, env: dict[str, str]) -> None:
            if depth == len(free):
                self.point(block, env, parent_views)
                return
            ix = free[depth]
            var = self.fresh(ix.name)
            lo = starts.get(ix.name, str(int(ix.affine.const)) if ix.affine is not None else "0")
            hi = numbers.text(ix.range) if lo == "0" else f"{lo} + {numbers.text(ix.range)}"
            inner = {**env, ix.name: var}
            with self.scope(f"for ({self.long} {var} = {lo}; {var} < {hi}; {var}++)"):
                guarded(depth, inner, lambda: nest(depth + 1, inner))

        def whole() -> None:
            if around:
                around[0]()
            nest(0, dict(vals))
            if around:
                around[1]()

        guarded(-1, vals, whole)

    def nested(self, block: Block, parent_vals: dict[str, str], views: dict[str, View]) -> None:
        starts = {}
        for ix in block.idxs:
            if ix.affine is not None:
                expr = self.affine(ix.affine, parent_vals, block, f"index '{ix.name}'")
                starts[ix.name] = self.declare(DType.INT64, expr, f"start_{ix.name}")
        with self.scope(""):
            self.loops(block, {}, views, starts)

    # ------------------------------------------------------------------- views
    def view(
        self, block: Block, r: Refinement, vals: dict[str, str], parents: dict[str, View] | None
    ) -> View:
        local = False
        if parents is None and r.source in self.ptrs:
            ptr, buf_dt, base, pdims = self.ptrs[r.source], self.buf_dtypes[r.source], "0", r.shape.dims
        elif parents is not None and r.source in parents:
            p = parents[r.source]
            ptr, buf_dt, base, pdims, local = p.ptr, p.buf_dtype, p.base, p.dims, p.local
        elif r.dir is RefDir.NONE and r.from_ is None:
            return self.local(r)
        else:
            hint = "refine a refinement of the enclosing block (kernels: one of KernelInfo.buffers)"
            raise missing_parent(block, r, hint)
        check_access_rank(block, r, len(pdims))
        terms = [] if base == "0" else [base]
        for a, d in zip(r.access, pdims):
            if (a.is_constant and numbers.zero(a.const)) or numbers.zero(d.stride):
                continue
            off = self.affine(a, vals, block, f"the access of '{r.into}'")
            terms.append(off if numbers.one(d.stride) else f"{off} * {numbers.text(d.stride)}")
        if terms and terms != [base]:
            base = self.declare(DType.INT64, " + ".join(terms), f"at_{r.into}")
        return View(r.into, ptr, buf_dt, base, r.shape.dims, r.shape.dtype, r.agg_op, local)

    def local(self, r: Refinement) -> View:
        """A fresh zero-filled private array for this point (registers of the refinement's dtype)."""
        dims = r.shape.dims
        if any(d.stride < 0 for d in dims):
            raise TileRuntimeError(
                f"local buffer '{r.into}' has a negative stride", None, hint="allocations use strides >= 0"
            )
        extent = 0 if any(d.size == 0 for d in dims) else 1 + sum((d.size - 1) * d.stride for d in dims)
        dt = r.shape.dtype
        name = self.fresh(f"local_{r.into}")
        self.line(f"{self.t.reg(dt)} {name}[{max(extent, 1)}];")
        k = self.fresh("z")
        zero = self.t.literal(0, dt)
        self.line(f"for ({self.long} {k} = 0; {k} < {max(extent, 1)}; {k}++) {name}[{k}] = {zero};")
        return View(r.into, name, dt, "0", dims, dt, r.agg_op, True)

    # -------------------------------------------------------------- statements
    def point(self, block: Block, vals: dict[str, str], parents: dict[str, View] | None) -> None:
        hoisted = self.accs if parents is None else {}
        views = {r.into: self.view(block, r, vals, parents) for r in block.refs if r.into not in hoisted}

        scope: Scope[View, Value] = Scope(block, views)
        for stmt in block.stmts:
            self.statement(block, stmt, scope, vals, hoisted)

    def statement(
        self, block: Block, stmt, scope: Scope[View, Value], vals: dict[str, str], hoisted: dict | None = None
    ) -> None:
        """One statement of ``block`` at the point ``vals``, its views and earlier scalars in
        ``scope`` (``rowkernel`` runs a row block's own statements through this)."""
        t, views, hoisted = self.t, scope.views, hoisted or {}
        get, put, ref = scope.get, scope.put, scope.ref
        if isinstance(stmt, Load):
            v = ref(stmt.from_, stmt)
            var = self.declare(v.dtype, v.read(t, v.base), f"s_{stmt.into[1:]}")
            put(stmt.into, Value(var, v.dtype, v.dtype))
        elif isinstance(stmt, Store):
            if stmt.into in hoisted:
                self.store(block, hoisted[stmt.into][0], get(stmt.from_), hoisted[stmt.into][1])
            else:
                self.store(block, ref(stmt.into, stmt), get(stmt.from_))
        elif isinstance(stmt, LoadIndex):
            expr = self.affine(stmt.affine, vals, block, f"load_index into '{stmt.into}'")
            put(
                stmt.into,
                Value(self.declare(DType.INT64, expr, f"s_{stmt.into[1:]}"), DType.INT64, DType.INT64),
            )
        elif isinstance(stmt, Constant):
            if stmt.dtype.is_float:
                put(stmt.into, Value("<const>", DType.FLOAT64, stmt.dtype, float(stmt.value)))
            else:
                value = (
                    bool(stmt.value) if stmt.dtype is DType.BOOL else wrap(int(stmt.value), stmt.dtype)
                )
                put(stmt.into, Value("<const>", stmt.dtype, stmt.dtype, value))
        elif isinstance(stmt, Intrinsic):
            if len(stmt.outputs) != 1:
                raise block_error(block, f"intrinsic '{stmt.name}' must have one output", "one scalar")
            args = [get(x) for x in stmt.inputs]
            expr = intrinsic(t, self.tmp, stmt.name, args, stmt.dtype, where(block))
            var = self.declare(stmt.dtype, expr, f"s_{stmt.outputs[0][1:]}")
            if (
                stmt.name == "mul"
                and stmt.dtype is DType.FLOAT32
                and all(a.dtype is stmt.dtype for a in args)
            ):
                self.products[var] = (args[0].expr, args[1].expr, stmt.dtype)
            put(stmt.outputs[0], Value(var, stmt.dtype, stmt.dtype))
        elif isinstance(stmt, Special):
            emit_special(self, stmt, views, where(block), parallel=False)
        elif isinstance(stmt, Block):
            self.nested(stmt, vals, views)
        else:
            raise block_error(block, f"unknown statement {stmt!r}", "see stripe.ir.Statement")

    def store(self, block: Block, v: View, s: Value, acc: str | None = None) -> None:
        """Store ``s`` through ``v``'s agg_op, into memory or into the register ``acc``."""
        t = self.t
        if v.agg_op not in AGG_OPS:
            raise block_error(
                block,
                f"refinement '{v.name}' has unknown agg_op '{v.agg_op}'",
                "agg_op is one of assign, add, mul, max, min",
            )
        value = t.convert(t.to(s, v.dtype), v.dtype, v.buf_dtype)
        if v.agg_op in ("", "assign"):
            self.line(f"{acc} = {value};" if acc else v.store_raw(t, v.base, value))
            return
        cur = acc or self.declare(v.buf_dtype, v.load_raw(t, v.base), f"cur_{v.name}")
        fused = None
        if t.fast_math and v.agg_op == "add" and s.expr in self.products and v.buf_dtype is v.dtype:
            a, b, dt = self.products[s.expr]
            fused = t.mad(a, b, cur, dt) if dt is v.dtype else None
        if fused is None:
            value = value if s.const is not None or value == s.expr else self.tmp(value, v.buf_dtype)
            fused = binary(t, v.agg_op, cur, value, v.buf_dtype)
        self.line(f"{acc} = {fused};" if acc else v.store_raw(t, v.base, fused))

