"""``attention_backward``: the kernels of a softmax attention chain's gradient, as ``tile.grad``
derives it (``stripe.passes.attention_backward_match`` reads them), become two blocks tagged
``attention`` and planned (``stripe.plans.AttentionBackwardPlan``), which a code generator that
knows the plan runs as two fused kernels (``backends.clike.attention_backward``) that recompute the
scores blockwise, as FlashAttention's backward does: S, E, DE and DS are never written to memory.

* part ``dq``: every kernel but those of ``DK`` and ``DV``. It writes the chain's row statistics
  ``Mx`` (the row max), ``Z`` (the row sum) and ``DZ_1`` (``-rowsum(DO * O) / Z``, the cotangent
  of ``Z``), each a value per row, and ``DQ``. Fused: a work-group of query rows takes an online
  softmax over the keys (the forward's), then a second pass over the keys for ``DQ``.
* part ``dkv``: the kernels ``DK`` and ``DV`` need, less those of the statistics, which it reads.
  Fused: a work-group of keys passes over the query rows, recomputing each row's weights from its
  statistics.

Two kernels, one over query blocks and one over key blocks, so that no gradient is summed by
two work-groups (no atomics). Each block's statements are the derived program's kernels unchanged
(tags dropped), so the Stripe interpreter runs the plain semantics, both blocks recomputing the
scores; the chain's temporaries other than the three statistics become each block's local
allocations. The fused kernels take the tie term ``DP_1`` (``P == Mx ? DMx_1``: ``DMx_1`` is a
row sum whose real value is 0, the softmax being invariant under a shift) as 0, and round
differently from the chain (``docs/semantics.md`` §8.7 gives the tolerance), so the pass is
registered as reordering and strict mode skips it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stripe.hardware import Hardware
from stripe.ir import Block, RefDir
from stripe.passes.attention import flat_mask, fuse_runs, local_memory, run_refs
from stripe.passes.attention_backward_match import Backward, backward_at
from stripe.passes.registry import register
from stripe.plans import ATTENTION_TAG, AttentionBackwardPlan


@dataclass(frozen=True)
class AttentionBackwardConfig:
    reqs: tuple[str, ...]  # the blocks (``main``) whose child kernels are searched
    group: int = 64  # work-items per work-group: query rows (part dq), keys (part dkv)
    step: int = 32  # keys (dq) or query rows (dkv) staged in local memory per step
    max_depth: int = 256  # the widest head a work-item keeps in registers


@register("attention_backward", AttentionBackwardConfig, reorders=True)
def attention_backward(program: Block, cfg: AttentionBackwardConfig, hw: Hardware) -> Block:
    """Makes every attention gradient of the module docstring two planned blocks."""
    local_bytes = local_memory(hw)
    return fuse_runs(
        program, cfg.reqs, lambda stmts, k, block, tmps: backward_at(stmts, k, block, tmps, cfg.max_depth),
        lambda bw, run, block: (_blocks(bw, run, block, cfg, local_bytes), bw.temps - _stats(bw)),
    )


def _stats(bw: Backward) -> set[str]:
    return {bw.bufs["Mx"], bw.bufs["Z"], bw.bufs["DZ_1"]}


def _needed(run, roots: set[str], stop: set[str]) -> list[Block]:
    """The kernels of ``run`` that write ``roots`` or, transitively, what those read, not
    following the buffers ``stop`` (read, not recomputed), in the run's order."""
    writers: dict[str, list[int]] = {}
    for n, s in enumerate(run):
        for r in s.refs:
            if r.dir is not RefDir.IN:
                writers.setdefault(r.source, []).append(n)
    keep: set[int] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        for n in writers.get(name, ()):
            if n in keep:
                continue
            keep.add(n)
            todo += [r.source for r in run[n].refs if r.dir is RefDir.IN and r.source not in stop]
    return [s for n, s in enumerate(run) if n in keep]


def _blocks(bw: Backward, run, parent: Block, cfg: AttentionBackwardConfig, local_bytes: int) -> list[Block]:
    ch, stats = bw.ch, _stats(bw)
    parts = (("dq", _needed(run, {bw.bufs["DQ"]} | stats, set())),
             ("dkv", _needed(run, {bw.bufs["DK"], bw.bufs["DV"]}, stats)))
    out = []
    for part, kernels in parts:
        group = cfg.group
        span = ch.rows if part == "dq" else ch.keys
        while group > 8 and group // 2 >= span:
            group //= 2
        step = cfg.step
        while step > 4 and step * (ch.depth + ch.width + 3) * 4 > local_bytes // 2:
            step //= 2
        plan = AttentionBackwardPlan(
            part=part, q=ch.q, k=ch.k, v=ch.v, do=bw.bufs["DO"],
            dq=bw.bufs["DQ"] if part == "dq" else "", dk=bw.bufs["DK"] if part == "dkv" else "",
            dv=bw.bufs["DV"] if part == "dkv" else "", mx=ch.mx, z=ch.z, dz=bw.bufs["DZ_1"],
            batch=tuple(ch.batch), rows=ch.rows, keys=ch.keys, depth=ch.depth, width=ch.width,
            q_dims=ch.q_dims, k_dims=ch.k_dims, v_dims=ch.v_dims, do_dims=bw.dims("o"),
            stat_dims=ch.dims[ch.mx], mask=flat_mask(ch.mask), scale_num=ch.scale.numerator,
            scale_den=ch.scale.denominator, group=group, step=step,
            s=ch.s if ch.scores else "", s_dims=ch.dims[ch.s] if ch.scores or bw.grad_scores else (),
            scores=tuple(ch.scores), dp=bw.bufs["DP"] if bw.grad_scores else "",
            grad_scores=tuple(bw.grad_scores),
        )
        out.append(Block(
            name=f"attention_backward_{part}_{bw.bufs['DQ' if part == 'dq' else 'DK']}",
            refs=tuple(run_refs(kernels, parent, bw.temps - stats)),
            stmts=tuple(replace(s, tags=frozenset()) for s in kernels),
            tags=frozenset({"kernel", ATTENTION_TAG}),
            comments=tuple(c for s in kernels for c in s.comments),
            plan=plan,
        ))
    return out
