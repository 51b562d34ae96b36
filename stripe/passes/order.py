"""``order_indexes``: put a block's indexes in the order its loops should run.

Stripe leaves the order of a block's points open, and code generators loop over a nested block's
indexes in their listed order. This pass lists, in each selected block, the indexes the written
refinements use by decreasing element stride, except the one of smallest stride; then the
indexes no written refinement uses (reductions), in their original order; then that smallest-
stride output index. So a reduction runs over a contiguous row of outputs that stays in registers
(``i, k, j`` for a matmul tile), and the innermost loop walks the output contiguously, which the
LLVM backend vectorizes. Passthrough indexes stay last. Meaning is unchanged; the order in which
one element receives its values can change when an index both indexes the output and repeats an
element (``O[i + k]``), so the pass is registered as reordering.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stripe.hardware import Hardware
from stripe.ir import Block, RefDir
from stripe.passes.registry import register
from stripe.passes.rewrite import Context, rewrite


@dataclass(frozen=True)
class OrderConfig:
    reqs: tuple[str, ...]


@register("order_indexes", OrderConfig, reorders=True)
def order_indexes(program: Block, cfg: OrderConfig, hw: Hardware) -> Block:
    """Matches blocks with every tag in ``reqs``; reorders their index list (see the module
    docstring). Guarantees: the same indexes, ranges and affines, only listed in another order."""

    def fn(block: Block, ctx: Context) -> Block | None:
        stride: dict[str, int] = {}
        for r in block.refs:
            if r.dir in (RefDir.OUT, RefDir.INOUT):
                for a, d in zip(r.access, r.shape.dims):
                    for v, c in a.terms:
                        stride[v] = max(stride.get(v, 0), abs(int(c)) * d.stride)
        free = [i for i in block.idxs if i.affine is None]
        through = [i for i in block.idxs if i.affine is not None]
        reductions = [i for i in free if i.name not in stride]
        outputs = sorted((i for i in free if i.name in stride), key=lambda i: -stride[i.name])
        idxs = (*outputs[:-1], *reductions, *outputs[-1:], *through)
        return None if idxs == block.idxs else replace(block, idxs=idxs)

    return rewrite(program, fn, cfg.reqs, nested=True)
