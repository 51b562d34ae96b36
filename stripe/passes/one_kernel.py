"""``one_kernel``: a global reduction's partial block and its combine become one kernel.

``split_reduction`` with ``one_kernel`` leaves a global reduction as two kernels of ``#main``: the
self-initialised partial block ``K0`` (an outer block over the lanes, each lane's partial assigned
to its element of the ``#tmp`` buffer ``P``) and one combine ``Kc`` over all of ``P``'s lanes,
whose ``CombinePlan`` says ``one_kernel``. This pass, last in a pipeline (no later pass sees the
nest), nests ``K0`` into ``Kc`` as its first statement: one kernel block whose refinements are
``Kc``'s (``P`` now ``inout``), whole views of the other buffers ``K0`` uses, and a new counter:
a one-element int32 ``#tmp`` root buffer tagged ``counter`` (declared ``inout`` in ``#main``), named
in the plan (``counter``). Its statements run ``K0`` and then ``Kc``'s own, so the meaning is the
two kernels' in order; nothing in the program's statements touches the counter, which the code
generator's kernel leaves at zero after every run (``backends.clike.lastgroup``: the last
work-group to finish combines the groups' partials; the runner zeroes a ``counter`` buffer once,
when it allocates it).

Taken when ``K0`` comes just before ``Kc`` and is the only other statement of ``#main`` naming
``P``; it has no constraints and no index affines; its one view of ``P`` is ``out`` and assigns, at
an access of one index per dimension (coefficient 1, each index once, all of ``K0``'s indexes, each
range the dimension's size, so lane ``l`` of the flat numbering is ``P``'s element ``l``), and only
its own top-level statements store into it (no load, no nested view); ``P`` is dense and of a type
a register holds as it is stored (no bool, float16 or bfloat16). Otherwise both stay as they are
(the combine then runs as a work-group tree).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from stripe.hardware import Hardware
from stripe.ir import Block, Load, RefDir, Refinement, Store, TensorShape, dense_strides, evolve, walk
from stripe.passes.registry import register
from stripe.passes.rewrite import fresh
from stripe.plans import CombinePlan
from tile.affine import Affine
from tile.dtypes import DType

COUNTER = "counter"  # the tag of the counter buffer (``backends.zeroing``: zeroed once)
NO_REGISTER = (DType.BOOL, DType.FLOAT16, DType.BFLOAT16)  # no one kernel: the partials not in registers


@dataclass(frozen=True)
class OneKernelConfig:
    reqs: tuple[str, ...] = ("main",)


@register("one_kernel", OneKernelConfig)
def one_kernel(program: Block, cfg: OneKernelConfig, hw: Hardware) -> Block:
    """Nests each planned global reduction's partial block into its combine (module docstring);
    declares each counter as a ``#tmp`` root buffer and an ``inout`` view of ``#main``."""
    main = program.stmts[0] if program.stmts else None
    if not isinstance(main, Block) or not set(cfg.reqs) <= main.tags:
        return program
    taken = {r.into for b in walk(program) for r in b.refs}
    stmts = list(main.stmts)
    counters: list[str] = []
    k = 1
    while k < len(stmts):
        kc, k0 = stmts[k], stmts[k - 1]
        plan = kc.plan if isinstance(kc, Block) else None
        if isinstance(plan, CombinePlan) and plan.one_kernel and not plan.counter and isinstance(k0, Block):
            if _takes(main, stmts, k0, kc, plan):
                name = fresh(f"{plan.src}_count", taken)
                taken.add(name)
                counters.append(name)
                stmts[k - 1 : k + 1] = [_nest(main, k0, kc, plan, name)]
                continue
        k += 1
    if not counters:
        return program
    shape = TensorShape.dense(DType.INT32, (1,))
    zero = (Affine(),)
    main = replace(main, refs=(*main.refs, *(Refinement(RefDir.INOUT, n, zero, shape) for n in counters)),
                   stmts=tuple(stmts))
    roots = tuple(Refinement(RefDir.NONE, n, zero, shape, tags=frozenset({"tmp", COUNTER})) for n in counters)
    return replace(program, refs=(*program.refs, *roots), stmts=(main, *program.stmts[1:]))


def _takes(main: Block, stmts: list, k0: Block, kc: Block, plan: CombinePlan) -> bool:
    """``k0`` and ``kc`` qualify (module docstring)."""
    src = kc.ref(plan.src).source
    users = [s for s in stmts if isinstance(s, Block) and any(r.source == src for r in s.refs)]
    if len(users) != 2 or users[0] is not k0 or users[1] is not kc:
        return False
    view = main.ref(src)
    if view.shape.dtype in NO_REGISTER or [d.stride for d in view.shape.dims] != list(
        dense_strides(view.shape.sizes)
    ):
        return False
    if k0.constraints or any(ix.affine is not None for ix in k0.idxs):
        return False
    mine = [r for r in k0.refs if r.source == src]
    if len(mine) != 1 or mine[0].dir is not RefDir.OUT or mine[0].agg_op not in ("", "assign"):
        return False
    p = mine[0]
    ranges = {ix.name: ix.range for ix in k0.idxs}
    names = []
    for a, size in zip(p.access, view.shape.sizes):
        if len(a.terms) != 1 or a.const != 0 or a.terms[0][1] != 1 or ranges.get(a.terms[0][0]) != size:
            return False
        names.append(a.terms[0][0])
    if sorted(names) != sorted(ranges) or math.prod(view.shape.sizes) != plan.lane_count:
        return False
    for s in k0.stmts:
        if isinstance(s, Load) and s.from_ == p.into:
            return False
        if isinstance(s, Block) and any(r.source == p.into for b in walk(s) for r in b.refs):
            return False
    return any(isinstance(s, Store) and s.into == p.into for s in k0.stmts)


def _nest(main: Block, k0: Block, kc: Block, plan: CombinePlan, counter: str) -> Block:
    """``kc`` with ``k0`` as its first statement, the views ``k0`` needs and the counter's."""
    src = kc.ref(plan.src).source
    refs = [replace(r, dir=RefDir.INOUT) if r.source == src else r for r in kc.refs]
    have = {r.into for r in refs}
    for r in k0.refs:
        source = r.source
        if r.dir is RefDir.NONE and r.from_ is None or source in have:
            continue
        whole = main.ref(source)
        refs.append(Refinement(r.dir, source, tuple(Affine() for _ in whole.access), whole.shape))
        have.add(source)
    shape = TensorShape.dense(DType.INT32, (1,))
    refs.append(Refinement(RefDir.INOUT, counter, (Affine(),), shape))
    inner = replace(k0, tags=k0.tags - {"kernel"})
    note = f"after its partials, in one kernel (the last work-group combines; counter {counter})"
    return evolve(
        kc,
        refs=tuple(refs),
        stmts=(inner, *kc.stmts),
        tags=kc.tags | {"one_kernel"},
        comments=(*kc.comments, note),
        plan=replace(plan, counter=counter),
    )


__all__ = ["COUNTER", "NO_REGISTER", "OneKernelConfig", "one_kernel"]
