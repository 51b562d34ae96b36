"""Permuting copies (``stripe.passes.transpose``, planned with a ``TransposePlan``) as tiles staged
through ``__local`` memory.

One work-item per point would read or write with a stride: the input is contiguous along the
plan's ``cols``, the output along its ``rows``. Here each work-group moves one ``T x T`` tile
(``T`` the plan's edge, 32) at one point of the batch indexes, with ``T x T/4`` work-items (32 x 8)
each moving 4 elements: work-item ``(tx, ty)`` reads the input at rows ``ty, ty + T/4, ...`` and
column ``tx`` of the tile (adjacent work-items, adjacent input elements) into a ``__local`` tile
of ``T`` rows padded to ``T + 1`` columns (so the column reads that follow hit distinct banks),
then, after a barrier, writes the output at column ``ty, ty + T/4, ...`` and row ``tx`` (adjacent
work-items, adjacent output elements). Edge tiles guard each element: extents need not be
multiples of ``T``. Work-groups go row-tile-major with the column tiles fastest, batch outermost.

The tile holds the loaded value in its register type (a bool as a ``uchar``); the statements
after the load (the conversions, the store through the output's view) run as the general kernel
runs them (``KernelEmitter.statement``), so every element gets exactly the general kernel's
value. Taken: a block whose ``TransposePlan`` says what it is, on a target with work-groups, whose
two refinements view the kernel's buffers (``takes``); otherwise the general kernel runs it (one
work-item per point, the same results).
"""

from __future__ import annotations

from backends.clike.groupreduce import decode
from backends.clike.kernel import KernelEmitter, KernelSource
from backends.clike.target import Value
from stripe.ir import Index, Load
from stripe.plans import TransposePlan
from stripe.scope import Scope
from tile.dtypes import DType

PER_ITEM = 4  # elements each work-item moves: a work-group is T x T/4 work-items


def takes(em: KernelEmitter) -> TransposePlan | None:
    """The kernel's ``TransposePlan`` when this target runs it as tiles: it has work-groups and
    the plan's refinements view the kernel's buffers; else None."""
    b, plan = em.block, em.block.plan
    if not em.t.workgroups or not isinstance(plan, TransposePlan):
        return None
    if any(b.ref(name).source not in em.ptrs for name in (plan.src, plan.out)):
        return None
    return plan


def source(em: KernelEmitter) -> KernelSource | None:
    """The kernel as work-groups of tiles (module docstring), or None where ``takes`` refuses it."""
    plan = takes(em)
    if plan is None:
        return None
    work, local = emit(em, plan)
    em.depth = 0
    return KernelSource(em.symbol, em.t.group_kernel(em.symbol, em.params, local, em.lines), work, (), local)


def emit(em: KernelEmitter, plan: TransposePlan) -> tuple[int, int]:
    """Emits the kernel's body through ``em``; returns its work-items and its work-group size."""
    b, t, T = em.block, em.t, plan.tile
    step = T // PER_ITEM
    ranges = {ix.name: ix.range for ix in b.idxs}
    n_rows, n_cols = ranges[plan.rows], ranges[plan.cols]
    load = b.stmts[0]
    assert isinstance(load, Load) and load.from_ == plan.src, "a planned transpose loads its src first"
    dt = b.ref(plan.src).shape.dtype
    cell = t.mem(DType.BOOL) if dt is DType.BOOL else t.reg(dt)
    tile = em.fresh("tile")
    em.line(f"__local {cell} {tile}[{T}][{T + 1}];")
    tx = em.declare(DType.INT64, f"(long)get_local_id(0) % {T}", "tx")
    ty = em.declare(DType.INT64, f"(long)get_local_id(0) / {T}", "ty")
    tiles = (Index("tile_r", -(-n_rows // T)), Index("tile_c", -(-n_cols // T)))
    batch = tuple(ix for ix in b.idxs if ix.name not in (plan.rows, plan.cols))
    grp = em.declare(DType.INT64, "(long)get_group_id(0)", "grp")
    lines: list[str] = []
    vals = decode(lines, grp, batch + tiles, "g_")
    for ln in lines:
        em.line(ln)
    em.names.update(vals.values())
    tr, tc = vals.pop("tile_r"), vals.pop("tile_c")
    src = b.ref(plan.src)
    for k in range(0, T, step):  # the input's rows of the tile, a row read by adjacent work-items
        with em.scope(""):
            at = {**vals, plan.rows: em.declare(DType.INT64, f"{tr} * {T} + {ty} + {k}", plan.rows),
                  plan.cols: em.declare(DType.INT64, f"{tc} * {T} + {tx}", plan.cols)}
            with em.scope(f"if ({at[plan.rows]} < {n_rows} && {at[plan.cols]} < {n_cols})"):
                v = em.view(b, src, at, None)
                value = v.read(t, v.base)
                value = f"({cell})({value})" if dt is DType.BOOL else value
                em.line(f"{tile}[{ty} + {k}][{tx}] = {value};")
    em.line("barrier(CLK_LOCAL_MEM_FENCE);")
    for k in range(0, T, step):  # the output's rows, a row written by adjacent work-items
        with em.scope(""):
            at = {**vals, plan.rows: em.declare(DType.INT64, f"{tr} * {T} + {tx}", plan.rows),
                  plan.cols: em.declare(DType.INT64, f"{tc} * {T} + {ty} + {k}", plan.cols)}
            with em.scope(f"if ({at[plan.rows]} < {n_rows} && {at[plan.cols]} < {n_cols})"):
                held = f"{tile}[{tx}][{ty} + {k}]"
                held = f"({held} != 0)" if dt is DType.BOOL else held
                views = {r.into: em.view(b, r, at, None) for r in b.refs if r.into != plan.src}
                scope: Scope = Scope(b, views)
                scope.put(load.into, Value(em.declare(dt, held, f"s_{load.into[1:]}"), dt, dt))
                for s in b.stmts[1:]:
                    em.statement(b, s, scope, at)
    groups = len(range(0, n_rows, T)) * len(range(0, n_cols, T))
    for ix in batch:
        groups *= ix.range
    return groups * T * step, T * step


__all__ = ["PER_ITEM", "emit", "source", "takes"]
