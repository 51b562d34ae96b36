"""Row programs (``stripe.passes.row_fusion``, planned with a ``RowPlan``) as one work-group per row.

The block runs over the rows; its statements are fills of per-row locals and inner blocks over the
row's other indexes. Here each row is a work-group of ``W`` work-items (a power of two, at most
the plan's ``group``, which ``row_fusion`` sets within the device's work-group size; at most the
longest inner block's points; the group sizes were measured, bench/RESULTS.md): work-item ``w``
takes the points ``w, w + W, ...`` of each inner block (adjacent work-items, adjacent points). An
inner block aggregating into a per-row local starts a private partial at the aggregation's
identity, the ``W`` partials meet in a tree in ``__local`` memory, and every work-item aggregates
the tree's result into its own copy of the local (so all hold the row's value for the blocks
after). An inner block assigning a per-row local (a row value computed from earlier ones, a
layernorm's mean) and the row block's own statements (such a block once ``inline`` flattened it)
run in every work-item, each on its own copy; a store of the row block's own into a buffer is
work-item 0's. Other inner blocks (the elementwise ones, whose points write distinct elements) run
their points in the same stride. The row's later passes over its inputs then find them in the
caches: a softmax reads ``X`` from DRAM once. The tree regroups each row's aggregation: the
reordering ``row_fusion`` declares (strict mode does not run it).

Taken: a block whose ``RowPlan`` says what it is (its row indexes, its row values: the
one-element locals the inner blocks aggregate into), on a target with work-groups that keeps each
row value in a register of its type (no bool, no float16: ``takes``). Otherwise the general kernel
runs the block (one work-item per row, the same results). Nothing here recognises the block's
shape: ``row_fusion`` declared it, and a pass that rewrites a planned block keeps the plan valid or
drops it.
"""

from __future__ import annotations

from backends.clike import numbers
from backends.clike.kernel import KernelEmitter
from backends.clike.ops import binary
from backends.clike.specials import emit_special
from backends.clike.target import Value
from backends.clike.views import View
from stripe.ir import Block, Refinement, Special, Store, where
from stripe.plans import RowPlan
from stripe.scope import Scope
from stripe.specials import identity
from tile.dtypes import DType


def _into_local(b: Block, locals_: set[str]) -> Refinement | None:
    """The one refinement of a row value ``b`` stores into (aggregating: a reduction; assigning:
    a value computed from earlier ones); None when it stores only into buffers (the row plan's
    inner blocks are one or the other)."""
    refs = {r.into: r for r in b.refs}
    into_locals = [refs[s.into] for s in b.stmts if isinstance(s, Store) and refs[s.into].source in locals_]
    return into_locals[0] if into_locals else None


def _aggregates(r: Refinement | None) -> bool:
    return r is not None and r.agg_op not in ("", "assign")


def takes(em: KernelEmitter) -> RowPlan | None:
    """The kernel's ``RowPlan`` when this target runs it as work-groups: it has work-groups and
    keeps each row value in a register of its type (no bool, no float16); else None (the general
    kernel runs the block, one work-item per row, the same results)."""
    return planned(em.block, em.t)


def planned(b: Block, t) -> RowPlan | None:
    """``takes`` for block ``b`` on target ``t``."""
    if not t.workgroups or not isinstance(b.plan, RowPlan):
        return None
    for name in b.plan.values:
        dt = b.ref(name).shape.dtype
        if dt in (DType.BOOL, DType.FLOAT16) or t.mem(dt) != t.reg(dt):
            return None
    return b.plan


def width(b: Block) -> int:
    """A planned row block's work-group size ``W``: the largest power of two at most the plan's
    group and the longest inner block's points (a shape-generic row kernel's bucket has one)."""
    inner = [s for s in b.stmts if isinstance(s, Block)]
    w = min(b.plan.group, max(s.index_space for s in inner) if inner else 1)
    return 1 << (max(int(w), 1).bit_length() - 1)


def emit(em: KernelEmitter) -> tuple[int, int]:
    """Emits the kernel's body through ``em`` (its lines); returns its work-items and its
    work-group size."""
    b, t = em.block, em.t
    plan = b.plan
    assert isinstance(plan, RowPlan), "rowkernel.emit runs planned row programs (takes)"
    inner = [s for s in b.stmts if isinstance(s, Block)]
    W = em.row_width if em.row_width is not None else width(b)  # (a template's: its bucket's)
    locals_ = set(plan.values)
    reductions = {id(s): _into_local(s, locals_) for s in inner}
    trees: dict[int, str] = {}
    for s in inner:
        r = reductions[id(s)]
        if _aggregates(r):
            dt = b.ref(r.source).shape.dtype
            trees[id(s)] = em.fresh("red")
            em.line(f"__local {t.reg(dt)} {trees[id(s)]}[{W}];")
    em.line("const long lid = (long)get_local_id(0);")
    em.line("const long grp = (long)get_group_id(0);")
    vals = _decode(em, "grp", b.idxs)
    views: dict[str, View] = {}
    for r in b.refs:
        if r.into in locals_:
            dt = r.shape.dtype
            name = em.fresh(f"row_{r.into}")
            em.line(f"{t.reg(dt)} {name}[1] = {{{t.literal(0, dt)}}};")
            views[r.into] = View(r.into, name, dt, "0", r.shape.dims, dt, r.agg_op, True)
        else:
            views[r.into] = em.view(b, r, vals, None)
    scope: Scope[View, Value] = Scope(b, views)
    for s in b.stmts:
        if isinstance(s, Special):
            emit_special(em, s, views, where(b), parallel=False)
            continue
        if not isinstance(s, Block):  # the row's own statements: every work-item runs them
            _row_statement(em, b, s, scope, vals)
            continue
        r = reductions[id(s)]
        if r is not None and not _aggregates(r):  # a row value from earlier ones: in every work-item
            _stride(em, s, views, 1, "0")
            continue
        if r is None:
            _stride(em, s, views, W)
            continue
        loc = views[r.source]
        dt, op = loc.buf_dtype, r.agg_op
        part = em.fresh(f"part_{r.source}")
        em.line(f"{t.reg(dt)} {part}[1] = {{{t.literal(identity(op, dt), dt)}}};")
        _stride(em, s, {**views, r.source: View(loc.name, part, dt, "0", loc.dims, dt, loc.agg_op, True)}, W)
        red = trees[id(s)]
        em.line(f"{red}[lid] = {part}[0];")
        em.line("barrier(CLK_LOCAL_MEM_FENCE);")
        with em.scope(f"for (long s = {W // 2}; s > 0; s >>= 1)"):
            with em.scope("if (lid < s)"):
                a, c = em.fresh("a"), em.fresh("b")
                em.line(f"const {t.reg(dt)} {a} = {red}[lid];")
                em.line(f"const {t.reg(dt)} {c} = {red}[lid + s];")
                em.line(f"{red}[lid] = {binary(t, op, a, c, dt)};")
            em.line("barrier(CLK_LOCAL_MEM_FENCE);")
        got = em.declare(dt, f"{red}[0]", f"got_{r.source}")
        em.line(f"{loc.ptr}[0] = {binary(t, op, f'{loc.ptr}[0]', got, dt)};")
    groups = 1
    for ix in b.idxs:
        groups = numbers.times(groups, ix.range)
    return numbers.times(groups, W), W


def _row_statement(em: KernelEmitter, b: Block, s, scope: Scope[View, Value], vals: dict[str, str]) -> None:
    """A statement of the row block itself (a pass inlined a one-point inner block): every
    work-item runs it, so each holds the row values it assigns; a store into a buffer is made by
    work-item 0 alone (an aggregation must reach the buffer once per row)."""
    if isinstance(s, Store) and not scope.ref(s.into, s).local:
        with em.scope("if (lid == 0)"):
            em.statement(b, s, scope, vals)
        return
    em.statement(b, s, scope, vals)


def _stride(em: KernelEmitter, s: Block, views: dict[str, View], W: int, first: str = "lid") -> None:
    """The points of ``s`` in this work-item's stride: ``first, first + W, ...``."""
    p = em.fresh("p")
    space = 1
    for ix in s.idxs:
        space = numbers.times(space, ix.range)
    with em.scope(f"for (long {p} = {first}; {p} < {numbers.expr(space)}; {p} += {W})"):
        vals = _decode(em, p, s.idxs)
        conds = [f"{em.affine(c, vals, s, 'a constraint')} >= 0" for c in s.constraints]
        if conds:
            with em.scope(f"if ({' && '.join(conds)})"):
                em.point(s, vals, views)
        else:
            em.point(s, vals, views)


def _decode(em: KernelEmitter, var: str, idxs) -> dict[str, str]:
    """Each index's value from the flat number ``var`` (row-major: the last fastest)."""
    vals: dict[str, str] = {}
    inner = 1
    for k, ix in enumerate(reversed(idxs)):
        expr = var if numbers.known(inner) and inner == 1 else f"({var} / {numbers.expr(inner)})"
        if k != len(idxs) - 1:
            expr = f"{expr} % {numbers.text(ix.range)}"
        vals[ix.name] = em.declare(DType.INT64, expr, ix.name)
        inner = numbers.times(inner, ix.range)
    return vals


__all__ = ["emit", "planned", "takes", "width"]
