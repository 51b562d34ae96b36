"""``kmajor``: the operand copies a GEMM whose launched kernel reads 32-bit operands takes.

Hopper's warp-group products read 32-bit (``tf32``) operands from ``__local`` memory K-major only:
both tiles as rows of K. A row-major ``B[K, N]`` is N-major, and transposing it inside the GEMM
costs more than the products save (bench/RESULTS.md, "TF32 on ``wgmma``: tried, measured, not
kept"). So, where the matrix unit's launched kernel takes such GEMMs on the device
(``backends.cuda.launched``: its modes, the device's ``local_KiB``, ``launched.tiles``),
this pass gives a kernel ``tensorize`` marked for a 32-bit mode a copy of B as ``Bt[N, K]``, made
by a kernel of its own just before it:

    Bt[n, k : N, K] = =(B[k, n]);      // its own kernel, every element written once
    C[m, n : M, N] = +(A[m, k] * Bt[n, k]);

It does so only for a plain matrix product of whole buffers (``A[M, K]`` and ``B[K, N]`` read at
``[m, k]`` and ``[k, n]``) that then streams (``stripe.gemm.streams`` with ``b_kmajor``) on one
of the launched tiles, so ``gemm_tile`` ranks those first. The copy moves B's bytes twice more
(a tenth of the product's time, bench/RESULTS.md); other GEMMs are left as they are.
Values are copied unchanged; the kernel's tensor maps round both operands to TF32
(docs/semantics.md). A kernel-tiling step: ``tiled=False`` leaves it out, with ``gemm_tile``.
Two GEMMs reading the same B get a copy each.

**3xtf32** (float32-level accuracy from TF32 products) launches only through this pass: it splits
each operand ``x`` into TF32 parts, ``hi = round_tf32(x)`` and ``lo = round_tf32(x - hi)`` (0 where
``x`` is infinite, as ``tile.precision.split_3xtf32``), laid along a K three times as long, so
that one GEMM of TF32 operands sums ``lo·hi + hi·lo + hi·hi`` (the dropped ``lo·lo`` is within
2^-22 of the product):

    A3[m, k : M, 3K]: [lo(A) | hi(A) | hi(A)]    // one kernel over A's elements, three stores each
    B3[n, k : N, 3K]: [hi(B) | lo(B) | hi(B)]    // K-major (from B[K, N] or B[N, K])
    C[m, n : M, N] = +(A3[m, k] * B3[n, k]);     // tagged ``split_3xtf32``

Every part is exact in TF32, so the unit multiplies them exactly; the kernel folds each K step's
sums into running float32 sums with a float32 addition (``backends.cuda.tma``: the unit's own
additions round toward zero). The copies hold three times their operand's bytes, and only a
``split_3xtf32`` GEMM takes the launched tiles in 3xtf32 (``gemm_tile.ranking``), so a GEMM this
pass leaves alone keeps the ``mma.sync`` kernel, which splits its operands itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from backends.cuda import launched
from stripe.gemm import Gemm, streams
from stripe.gemm_model import GemmModel
from stripe.hardware import Hardware, MatrixUnit
from stripe.ir import (
    Block,
    Constant,
    Dim,
    Index,
    Intrinsic,
    Load,
    LoadIndex,
    RefDir,
    Refinement,
    Store,
    TensorShape,
)
from stripe.passes.gemm_tile import SPLIT_TAG, GemmTileConfig, analyze, marked
from stripe.passes.registry import register
from stripe.passes.rewrite import fresh
from tile.affine import Affine
from tile.dtypes import DType

COPY_TAG = "kmajor_copy"  # the copy kernels' tag (besides ``kernel``)
THREE = ("lo", "hi", "hi"), ("hi", "lo", "hi")  # A's and B's parts along the 3K of a split GEMM


@dataclass(frozen=True)
class KMajorConfig:
    reqs: tuple[str, ...] = ("contraction", "kernel")
    unit: str = "tensor_core"  # the hardware's matrix unit
    skip: tuple[str, ...] = ("split_partial",)


@register("kmajor", KMajorConfig, kernel_tiling=True)
def kmajor(program: Block, cfg: KMajorConfig, hw: Hardware) -> Block:
    """Each launched 32-bit GEMM reading B N-major preceded by a K-major copy, each launched
    3xtf32 GEMM by its operands' split copies (module docstring)."""
    unit = hw.matrix_units.get(cfg.unit)
    facts = launched.of(unit)
    if facts is None or not facts.local_KiB:
        return program
    taken = {r.into for r in program.refs}
    new_bufs: list[Refinement] = []
    mains = []
    for s in program.stmts:
        if not (isinstance(s, Block) and "main" in s.tags):
            mains.append(s)
            continue
        stmts, views = [], []
        for k in s.stmts:
            got = _rewritten(k, s, unit, cfg, hw, taken) if isinstance(k, Block) else None
            if got is None:
                stmts.append(k)
                continue
            copies, gemm, bufs = got
            taken.update(b.into for b in bufs)
            stmts += [*copies, gemm]
            new_bufs += bufs
            views += [_view(b) for b in bufs]
        mains.append(replace(s, refs=s.refs + tuple(views), stmts=tuple(stmts)) if views else s)
    if not new_bufs:
        return program
    return replace(program, refs=program.refs + tuple(new_bufs), stmts=tuple(mains))


def _rewritten(block: Block, main: Block, unit: MatrixUnit, cfg: KMajorConfig, hw: Hardware,
               taken: set[str]) -> tuple[list[Block], Block, list[Refinement]] | None:
    """The copy kernels, ``block`` reading the copies, and the copies' buffers; None where the
    pass leaves ``block`` alone (also where the rewritten GEMM would not take a launched tile)."""
    mode = marked(block)
    if mode is None or not set(cfg.reqs) <= block.tags:
        return None
    op = unit.operation(mode)
    facts = launched.of(unit)
    tiles = facts.launched(mode) if facts is not None else ()
    if op is None or op.input_bytes != 4 or not tiles:
        return None
    gcfg = GemmTileConfig(reqs=cfg.reqs, skip=cfg.skip, matrix_unit=cfg.unit)
    g = analyze(block, main, gcfg)
    if g is None:
        return None
    kt = facts.k_bytes // 4
    got = (_split if mode == "3xtf32" else _transposed)(block, g, main, tiles, kt, taken)
    if got is None:
        return None
    copies, gemm, bufs = got
    g2 = analyze(gemm, replace(main, refs=(*main.refs, *map(_view, bufs))), gcfg)
    model = GemmModel(g2, hw, gcfg) if g2 is not None else None
    if model is None or not launched.tiles(model, unit, f"{cfg.unit}.{mode}", mode):
        return None
    return copies, gemm, bufs


def _transposed(block: Block, g: Gemm, main: Block, tiles, kt: int, taken: set[str]):
    """tf32: B's K-major copy (module docstring), where B is a whole ``[K, N]`` buffer and the
    GEMM streams as it is (B's rows along N)."""
    if not any(streams(g, tm, tn, kt, 4) for tm, tn in tiles):
        return None
    (k,), (j,) = g.k.idxs, g.n.idxs
    b = g.b.ref
    src = _whole(main, b.source, (k.range, j.range))
    if src is None:
        return None
    size_k, size_n = k.range, j.range
    name = fresh(f"{b.source}_kmajor", taken)
    dtype = src.shape.dtype
    buf = _buffer(name, dtype, (size_n, size_k))
    kv, nv = Affine.var("k"), Affine.var("n")
    scalar = (Dim(1, size_k), Dim(1, 1))
    copy = Block(
        name=f"{block.name}_{name}",
        idxs=(Index("n", size_n), Index("k", size_k)),
        refs=(
            Refinement(RefDir.IN, "B", (kv, nv), src.shape.scalar_view(), from_=b.source),
            Refinement(RefDir.OUT, "Bt", (nv, kv), TensorShape(dtype, scalar), from_=name, agg_op="assign"),
        ),
        stmts=(Load("B", "$B"), Intrinsic("assign", ("$B",), ("$v",), dtype), Store("$v", "Bt")),
        tags=frozenset({"kernel", "contraction", "comb_op_none", "agg_op_assign", COPY_TAG}),
        comments=(f"{name}[n, k: {size_n}, {size_k}] = =({b.source}[k, n]);  (backends.cuda.kmajor)",),
    )
    return [copy], _reading(block, {b.source: (name, True, size_k)}), [buf]


def _split(block: Block, g: Gemm, main: Block, tiles, kt: int, taken: set[str]):
    """3xtf32: A's and B's split copies along 3K (module docstring), where both are whole buffers
    (A ``[M, K]``; B ``[K, N]`` or ``[N, K]``) and the GEMM streams with either B (a convolution,
    whose groups hold several indexes, is neither)."""
    if not len(g.m.idxs) == len(g.n.idxs) == len(g.k.idxs) == 1:
        return None
    (i,), (j,), (k,) = g.m.idxs, g.n.idxs, g.k.idxs
    for b_kmajor in (False, True):
        if any(streams(g, tm, tn, kt, 4, b_kmajor=b_kmajor) for tm, tn in tiles):
            break
    else:
        return None
    b_dims = (j.range, k.range) if b_kmajor else (k.range, j.range)
    srcs = [_whole(main, g.a.ref.source, (i.range, k.range)), _whole(main, g.b.ref.source, b_dims)]
    if None in srcs or g.a.ref.source == g.b.ref.source:
        return None
    copies, bufs, views = [], [], {}
    for src, rows, parts, swap in zip(srcs, (i.range, j.range), THREE, (False, not b_kmajor)):
        name = fresh(f"{src.into}_3xtf32", taken | {b.into for b in bufs})
        bufs.append(_buffer(name, src.shape.dtype, (rows, 3 * k.range)))
        copies.append(_split_kernel(f"{block.name}_{name}", src, name, rows, k.range, parts, swap))
        views[src.into] = (name, swap, 3 * k.range)
    gemm = _reading(block, views, k)
    note = f"reads {' and '.join(b.into for b in bufs)} along K = {3 * k.range} (backends.cuda.kmajor)"
    return copies, replace(gemm, tags=gemm.tags | {SPLIT_TAG}, comments=gemm.comments + (note,)), bufs


def _split_kernel(name: str, src: Refinement, buf: str, rows: int, size_k: int, parts: tuple[str, ...],
                  swap: bool) -> Block:
    """``buf[r, p·K + k] = parts[p](src[r, k])`` (``src[k, r]`` with ``swap``): one work-item per
    element of ``buf`` (each writes one: ``stripe.ownership`` sees every index owned)."""
    dtype = src.shape.dtype
    rv, pv, kv = Affine.var("r"), Affine.var("p"), Affine.var("k")
    scalar = TensorShape(dtype, (Dim(1, 3 * size_k), Dim(1, 1)))
    stmts = (
        Load("X", "$x"),
        Intrinsic("round_tf32", ("$x",), ("$hi",), dtype),
        Intrinsic("sub", ("$x", "$hi"), ("$d",), dtype),
        Intrinsic("round_tf32", ("$d",), ("$r",), dtype),
        Intrinsic("cmp_eq", ("$x", "$hi"), ("$e",), DType.BOOL),  # x exact in TF32, or infinite
        Constant("$z", 0.0, dtype),
        Intrinsic("cond", ("$e", "$z", "$r"), ("$lo",), dtype),
        LoadIndex(pv, "$p"),
        Constant("$at_lo", parts.index("lo"), DType.INT64),
        Intrinsic("cmp_eq", ("$p", "$at_lo"), ("$is_lo",), DType.BOOL),
        Intrinsic("cond", ("$is_lo", "$lo", "$hi"), ("$v",), dtype),
        Store("$v", "P"),
    )
    order = " | ".join(f"{part}({src.into})" for part in parts)
    return Block(
        name=name,
        idxs=(Index("r", rows), Index("p", len(parts)), Index("k", size_k)),
        refs=(
            Refinement(RefDir.IN, "X", (kv, rv) if swap else (rv, kv), src.shape.scalar_view(),
                       from_=src.into),
            Refinement(RefDir.OUT, "P", (rv, kv + pv * size_k), scalar, from_=buf, agg_op="assign"),
        ),
        stmts=stmts,
        tags=frozenset({"kernel", "contraction", "comb_op_none", "agg_op_assign", COPY_TAG}),
        comments=(f"{buf}[r, k: {rows}, {3 * size_k}] = [{order}]  (backends.cuda.kmajor, 3xtf32)",),
    )


def _whole(main: Block, source: str, sizes: tuple[int, int]) -> Refinement | None:
    """``main``'s view of ``source`` where it is a whole dense buffer of ``sizes``, else None."""
    try:
        src = main.ref(source)
    except KeyError:
        return None
    dims = src.shape.dims
    if len(dims) != 2 or any(a.vars or a.const for a in src.access):
        return None
    return src if [(d.size, d.stride) for d in dims] == [(sizes[0], sizes[1]), (sizes[1], 1)] else None


def _buffer(name: str, dtype: DType, sizes: tuple[int, int]) -> Refinement:
    """A new dense temporary of the program."""
    return Refinement(RefDir.NONE, name, (Affine(), Affine()), TensorShape.dense(dtype, sizes),
                      tags=frozenset({"tmp"}))


def _reading(block: Block, views: dict[str, tuple[str, bool, int]], k: Index | None = None) -> Block:
    """``block`` reading each source in ``views`` from its copy (the copy's name, whether the two
    dimensions swap, the copy's row length): every view of it, at any depth. With ``k`` (the
    GEMM's K index), K three times as long: that index, and views spanning all of K."""

    def moved(r: Refinement, swap: bool, row: int) -> Refinement:
        (d0, d1), (a0, a1) = r.shape.dims, r.access
        if swap:
            d0, d1, a0, a1 = d1, d0, a1, a0
        along_k = 3 * d1.size if k is not None and d1.size == k.range else d1.size
        dims = (Dim(d0.size, row), Dim(along_k, 1))
        return replace(r, access=(a0, a1), shape=TensorShape(r.shape.dtype, dims))

    def visit(b: Block, by_source: dict[str, tuple[str, bool, int]], top: bool) -> Block:
        refs, deeper = [], {}
        for r in b.refs:
            got = by_source.get(r.source)
            if got is not None:
                r = moved(replace(r, from_=got[0]) if top else r, got[1], got[2])
                deeper[r.into] = got
            refs.append(r)
        idxs = b.idxs if k is None else tuple(replace(i, range=3 * k.range) if i == k else i for i in b.idxs)
        stmts = tuple(visit(s, deeper, False) if isinstance(s, Block) else s for s in b.stmts)
        return replace(b, idxs=idxs, refs=tuple(refs), stmts=stmts)

    return visit(block, views, True)


def _view(buf: Refinement) -> Refinement:
    """``main``'s view of the new buffer ``buf`` (``analyze`` reads the copy's shape from it)."""
    return replace(buf, dir=RefDir.INOUT, tags=frozenset())
