"""What a kernel is, in its name and its work: ``matmul_4096x4096x4096_t64x64x4096``.

Profilers, ``TILE_DEBUG=1`` and generated source show kernel symbols; a name that says the
operation, its full index extents and its tile sizes tells which kernel is slow without reading
Stripe. ``label`` derives it from the kernel block's tags, its index ranges through the nest (an
index tiled into an outer and an inner block of the same name counts once, at its full extent)
and, for tiled kernels, the ranges inside the outermost block. A code generator that tiles a kernel
itself adds its tiles to the symbol (``backends.clike.tiled``: ``..._t128x128r8x8k8``; profiles
and ``TILE_DEBUG=1`` show that name). ``work`` gives the flops and bytes ``TILE_DEBUG=1`` divides
by the kernel's time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from stripe.gemm_nest import read
from stripe.ir import Block, Intrinsic, Load, RefDir, Special, TensorShape
from stripe.plans import AttentionPlan, RowPlan

_AGG_NAMES = {"add": "sum", "mul": "prod", "max": "max", "min": "min", "assign": "assign"}


def _chain(block: Block) -> list[Block]:
    """The block and its first nested block at each level, down to the leaf."""
    out = [block]
    while True:
        inner = [s for s in out[-1].stmts if isinstance(s, Block)]
        if not inner:
            return out
        out.append(inner[0])


def _extents(chain: list[Block]) -> tuple[dict[str, int], dict[str, int]]:
    """Each index's full extent (its ranges multiplied through the nest) and its extent inside
    the outermost block, in order of first appearance."""
    full: dict[str, int] = {}
    inner: dict[str, int] = {}
    for depth, b in enumerate(chain):
        for ix in b.idxs:
            if ix.affine is not None:
                continue
            full[ix.name] = full.get(ix.name, 1) * ix.range
            if depth:
                inner[ix.name] = inner.get(ix.name, 1) * ix.range
    return full, inner


def _kind(block: Block, leaf: Block) -> str:
    tags = block.tags
    if isinstance(block.plan, RowPlan):  # stripe.passes.row_fusion: per-row reductions and their readers
        return "rows"
    if isinstance(block.plan, AttentionPlan):  # stripe.passes.attention: a softmax attention chain
        return "attention"
    if "special" in tags or ("contraction" not in tags and any(isinstance(s, Special) for s in block.stmts)):
        names = [s.name for s in leaf.stmts if isinstance(s, Special)]
        return names[0] if names else "special"
    if "contraction" in tags:
        agg = next((t[len("agg_op_") :] for t in tags if t.startswith("agg_op_")), "")
        comb = next((t[len("comb_op_") :] for t in tags if t.startswith("comb_op_")), "")
        if agg == "add" and comb == "mul":
            ins = [r for r in leaf.refs if any(isinstance(s, Load) and s.from_ == r.into for s in leaf.stmts)]
            if any(len(a.terms) > 1 for r in ins for a in r.access):
                return "conv"
            out_rank = max((len(r.access) for r in leaf.refs if r.agg_op), default=0)
            return "matmul" if len(ins) == 2 and out_rank == 2 and len(leaf.idxs) <= 3 else "contract"
        return _AGG_NAMES.get(agg, "contract")
    ops = sorted({s.name for s in leaf.stmts if isinstance(s, Intrinsic) and s.name != "assign"})
    return "_".join(["ew", *ops[:3]]) if ops else "ew_copy"


def _plain(block: Block) -> Block:
    """A ``gemm_tile`` nest (a block with a ``GemmPlan``) is named and counted as the kernel it
    computes (``Nest.flat``)."""
    nest = read(block)
    return nest.flat(block.name, block.tags) if nest is not None else block


def label(block: Block) -> str:
    """``kind_extents[_ttiles]``, e.g. ``matmul_64x48x32_t1x16x32``, ``sum_4096x4096``,
    ``ew_exp_mul_1024x1024``, ``zero`` (a valid identifier after ``kernel_symbol`` sanitises)."""
    chain = _chain(_plain(block))
    full, inner = _extents(chain)
    first = [v for b in chain for r in b.refs if r.dir is RefDir.OUT for a in r.access for v in a.vars]
    order = sorted(full, key=lambda v: first.index(v) if v in first else len(first))
    full = {v: full[v] for v in order}  # the output's indexes first, in its order (M x N x K)
    name = _kind(block, chain[-1])
    if full:
        name += "_" + "x".join(str(n) for n in full.values())
    if len(chain) > 1 and inner:
        name += "_t" + "x".join(str(inner.get(k, 1)) for k in full)
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def points(block: Block) -> int:
    """Index points the nest runs (constraints ignored: an upper bound)."""
    block = _plain(block)
    inner = sum(points(s) for s in block.stmts if isinstance(s, Block))
    return block.index_space * max(1, inner)


def work(block: Block, buffers: Mapping[str, TensorShape], names: tuple[str, ...]) -> tuple[int, int]:
    """(flops, bytes) of one kernel: two flops per point of a contraction (multiply and add), one
    per point otherwise; every buffer it names moved once (the least traffic it can have)."""
    flops = points(block) * (2 if "contraction" in block.tags else 1)
    nbytes = sum(buffers[n].elements * buffers[n].dtype.numpy.itemsize for n in names)
    return flops, nbytes
