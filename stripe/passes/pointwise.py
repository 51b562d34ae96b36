"""``pointwise``: a contraction that gives each output element exactly one point is elementwise.

``T[i, j: M, N] = +(A[i, j] * B[i, j])`` sums nothing: every index picks the output element, the
output access numbers every element once (``stripe.lower.writes_every_element``), and there are
no constraints. Lowered, it is a fill of ``T`` with the aggregation's identity followed by a
contraction block aggregating one value into each element. This pass makes the pair one
``#eltwise`` kernel that assigns ``identity ⊕ value`` to each element: for ``+`` on floats it
adds the 0 (so ``-0`` becomes ``+0`` as in the interpreter), for ``* > <`` and on integers the
identity changes no value and the value is stored as it is. Each element gets the same value as
before, so meaning is kept to the bit (not a reordering pass; strict mode keeps it).

Why: the fill and the contraction were two kernels that the elementwise fusion passes would not
join with their neighbours; a long program alternating elementwise statements and such
contractions compiled one kernel per statement (5,000 statements: 5,000 kernels, 100 s of LLVM).
As elementwise kernels they fuse like any other.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stripe.hardware import Hardware
from stripe.ir import Block, Constant, Intrinsic, Statement, Store
from stripe.passes.registry import register
from stripe.passes.rewrite import Context, fresh, matches, rewrite
from stripe.passes.self_init import access_indexes, fills_for
from stripe.passes.tiling import views_of


@dataclass(frozen=True)
class PointwiseConfig:
    reqs: tuple[str, ...] = ("contraction",)  # the contraction blocks considered
    parent_reqs: tuple[str, ...] = ("main",)  # the blocks whose statements are looked at


@register("pointwise", PointwiseConfig)
def pointwise(program: Block, cfg: PointwiseConfig, hw: Hardware) -> Block:
    """Each fill-and-contraction pair of a ``parent_reqs`` block, where the contraction sums no
    index (see the module docstring), replaced by one elementwise kernel."""

    def fn(parent: Block, ctx: Context) -> Block | None:
        stmts: list[Statement] = []
        changed = False
        for s in parent.stmts:
            prev = stmts[-1] if stmts else None
            if isinstance(s, Block) and prev is not None and matches(s, cfg.reqs):
                made = _elementwise(s, prev, parent)
                if made is not None:
                    stmts[-1] = made  # the fill goes
                    changed = True
                    continue
            stmts.append(s)
        return replace(parent, stmts=tuple(stmts)) if changed else None

    return rewrite(program, fn, cfg.parent_reqs)


def _elementwise(block: Block, prev: Statement, parent: Block) -> Block | None:
    """``block`` as an elementwise kernel when ``prev`` is its fill and it sums no index, else None."""
    acc = fills_for(prev, block, parent)
    if acc is None:
        return None
    owned = access_indexes(acc)
    if any(ix.range > 1 and ix.name not in owned for ix in block.idxs):
        return None  # a summed index: a real reduction
    stores = [k for k, s in enumerate(block.stmts) if isinstance(s, Store) and s.into == acc.into]
    (at,) = stores  # fills_for's accumulator is stored exactly once
    store = block.stmts[at]
    assert isinstance(store, Store)
    dtype = views_of(parent)[acc.source].shape.dtype
    body = list(block.stmts)
    if acc.agg_op == "add" and dtype.is_float:
        taken = {n for s in block.stmts for n in _scalars(s)}
        zero, total = fresh("$zero", taken), fresh("$pointwise", taken)
        body[at : at + 1] = [
            Constant(zero, 0.0, dtype),
            Intrinsic("add", (zero, store.from_), (total,), dtype),
            Store(total, acc.into),
        ]
    kept = (t for t in block.tags if t != "contraction" and not t.startswith(("agg_op_", "comb_op_")))
    tags = frozenset(kept)
    refs = tuple(replace(r, agg_op="assign") if r is acc else r for r in block.refs)
    return replace(block, refs=refs, stmts=tuple(body), tags=tags | {"eltwise", "pointwise"})


def _scalars(s: Statement) -> tuple[str, ...]:
    """The ``$scalars`` a statement defines."""
    if isinstance(s, Intrinsic):
        return s.outputs
    into = getattr(s, "into", None)
    return (into,) if isinstance(into, str) and into.startswith("$") else ()
