"""``attention``: the kernels of a softmax attention become one block, tagged ``attention`` and
planned (``stripe.plans.AttentionPlan``), which a code generator that knows the tag runs as one
fused kernel with an online softmax (``backends.clike.attention``): S is never written to memory.

The chain, as lowering writes ``S = Q·K; P = f(S); Mx = max_j P; E = exp(c·(P - Mx));
Z = sum_j E; O1 = E·V; O = O1 / Z`` (issue 41), is a contiguous run of ``#main``'s kernels:

* fills (one ``zero``/``agg_init_max`` special of a whole buffer) of the chain's temporaries, each
  before the kernel aggregating into it;
* the **scores** ``S[batch.., i, j] = +(Q[..] * K[..])``: one reduced index ``d`` (the depth),
  every access dim one index alone (coefficient 1) or 0; the indexes of S are batch indexes (in
  both operands), the rows ``i`` (Q's alone) and the keys ``j`` (K's alone);
* any number of elementwise **score kernels**, each writing a temporary with S's shape point by
  point from the previous one (a scale, a bias added, a ``cond`` on ``index`` masking: anything
  elementwise; they may read other buffers);
* the **row max** of the last score ``P`` over the keys (``>``), into ``Mx`` with the batch and row
  dims (and dims of size 1); a masked max (constraints) writes an accumulator and a written-flag
  and a ``cond`` kernel makes ``Mx`` of them, as lowering does for §6.5's unwritten elements;
* ``E = exp(c * (P - Mx))`` (or ``(P - Mx) * c``, ``(P - Mx) / c``, ``P - Mx``): ``c`` a constant;
* the **row sum** ``Z = +(E)`` over the keys and ``O1[batch.., i, e] = +(E[.., i, j] * V[.., j,
  e])``, in either order, then ``O = O1 / Z`` point by point; or (softmax first) the row sum, the
  weights ``A = E / Z`` point by point, and ``O = +(A[.., i, j] * V[.., j, e])``.

The max, the sum and the product with V must carry the same constraints (a mask written as constraints, say
causal ``i - j >= 0``), read as affines of the roles. Every temporary is a ``tmp`` buffer no kernel
outside the run uses (a second reader of S, which needs it materialized, keeps the chain apart).

The run becomes one block over no indexes whose statements are the run's kernels unchanged (the
Stripe interpreter still runs the plain semantics), their tags dropped so later passes keyed on
them (splitting, fusion, tiling) leave them alone; the temporaries become its local allocations
(never program buffers: a fused kernel allocates none). Its plan names the roles (see
``stripe.plans``). The fused kernel's result differs from the chain's by rounding only: the online
softmax rescales partial sums (``docs/semantics.md`` §8.7 gives the tolerance), so the pass is
registered as reordering and strict mode skips it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stripe.hardware import Hardware
from stripe.ir import (
    Block,
    Dim,
    RefDir,
    Refinement,
    TensorShape,
    dense_strides,
)
from stripe.passes.attention_access import Chain
from stripe.passes.attention_match import chain_at
from stripe.passes.registry import register
from stripe.passes.rewrite import Context, rewrite
from stripe.plans import ATTENTION_TAG, AttentionPlan
from tile.affine import Affine


@dataclass(frozen=True)
class AttentionConfig:
    reqs: tuple[str, ...]  # the blocks (``main``) whose child kernels are searched
    block_rows: int = 64  # query rows per work-group (one work-item each)
    block_keys: int = 32  # keys staged in local memory per step (fewer when the heads are wide)
    max_depth: int = 256  # the widest head (Q·K depth or V width) a work-item keeps in registers


@register("attention", AttentionConfig, reorders=True)
def attention(program: Block, cfg: AttentionConfig, hw: Hardware) -> Block:
    """Makes every attention chain of the module docstring one planned ``attention`` block."""
    local_bytes = local_memory(hw)
    return fuse_runs(
        program, cfg.reqs, lambda stmts, k, block, tmps: chain_at(stmts, k, block, tmps, cfg.max_depth),
        lambda ch, run, block: ([_container(ch, run, block, cfg, local_bytes)], ch.temps),
    )


def local_memory(hw: Hardware) -> int:
    """The bytes of local memory a work-group may use (48 KiB where the hardware says none)."""
    return hw.mem_bytes("LOCAL") if "LOCAL" in hw.mem_units else 48 * 1024


def fuse_runs(program: Block, reqs, find, make) -> Block:
    """``program`` with each run of kernels in ``reqs``' blocks that ``find(stmts, k, block, tmps)``
    matches from ``k`` (``(match, end)``, or None; ``tmps``: the program's temporaries) replaced by
    the blocks of ``make(match, run, block)`` (``(blocks, names)``), the temporaries ``names`` no
    longer declared: the attention passes' walk."""
    tmps = {r.into for r in program.refs if "tmp" in r.tags and not {"input", "output"} & r.tags}
    gone: set[str] = set()

    def visit(block: Block, ctx: Context) -> Block | None:
        stmts, out, k, changed = block.stmts, [], 0, False
        while k < len(stmts):
            got = find(stmts, k, block, tmps)
            if got is None:
                out.append(stmts[k])
                k += 1
                continue
            match, end = got
            blocks, names = make(match, stmts[k:end], block)
            out.extend(blocks)
            gone.update(names)
            k, changed = end, True
        if not changed:
            return None
        return replace(block, stmts=tuple(out), refs=tuple(r for r in block.refs if r.into not in gone))

    out = rewrite(program, visit, reqs)
    if out is program:
        return program
    return replace(out, refs=tuple(r for r in out.refs if r.into not in gone))


def _container(ch: Chain, run, parent: Block, cfg: AttentionConfig, local_bytes: int) -> Block:
    """The run as one planned block over no indexes, its temporaries local allocations."""
    refs = run_refs(run, parent, ch.temps)
    widest = max(ch.depth, ch.width)
    bc = cfg.block_keys
    while bc > 4 and 2 * bc * widest * 4 > local_bytes // 2:
        bc //= 2
    br = cfg.block_rows
    while br > 8 and br // 2 >= ch.rows:
        br //= 2
    plan = AttentionPlan(
        q=ch.q, k=ch.k, v=ch.v, out=ch.o, scores=tuple(ch.scores), s=ch.s,
        batch=tuple(ch.batch), rows=ch.rows, keys=ch.keys, depth=ch.depth, width=ch.width,
        q_dims=ch.q_dims, k_dims=ch.k_dims, v_dims=ch.v_dims, out_dims=ch.o_dims, s_dims=ch.dims[ch.s],
        mask=flat_mask(ch.mask), scale_num=ch.scale.numerator, scale_den=ch.scale.denominator,
        block_rows=br, block_keys=bc,
    )
    comments = tuple(c for s in run for c in s.comments)
    return Block(
        name=f"attention_{ch.o}",
        refs=tuple(refs),
        stmts=tuple(replace(s, tags=frozenset()) for s in run),
        tags=frozenset({"kernel", ATTENTION_TAG}),
        comments=comments,
        plan=plan,
    )


def run_refs(run, parent: Block, temps: set[str]) -> list[Refinement]:
    """The refinements of a block holding the kernels ``run`` of ``parent``: each buffer they use,
    whole, read or written as they do; the ``temps`` as the block's own (dense) allocations."""
    reads: dict[str, bool] = {}
    writes: dict[str, bool] = {}
    for s in run:
        for r in s.refs:
            (writes if r.dir is not RefDir.IN else reads)[r.source] = True
    refs = []
    for name in dict.fromkeys([*reads, *writes]):
        whole = parent.ref(name)
        zeros = tuple(Affine.constant(0) for _ in whole.access)
        if name in temps:
            sizes = whole.shape.sizes
            dims = tuple(Dim(n, st) for n, st in zip(sizes, dense_strides(sizes), strict=True))
            shape = TensorShape(whole.shape.dtype, dims)
            refs.append(Refinement(RefDir.NONE, name, zeros, shape))
            continue
        d = RefDir.INOUT if name in reads and name in writes else RefDir.OUT if name in writes else RefDir.IN
        refs.append(replace(whole, dir=d, access=zeros, from_=None))
    return refs


def flat_mask(mask) -> tuple[tuple[str, int], ...]:
    """The constraints as one list: each its ``(role, coefficient)`` terms, then ``(c, constant)``."""
    out: list[tuple[str, int]] = []
    for terms, const in sorted(mask or ()):
        out.extend(terms)
        out.append(("c", const))
    return tuple(out)
