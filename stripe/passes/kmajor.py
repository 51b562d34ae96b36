"""``kmajor``: a K-major copy of B for a GEMM whose launched kernel reads 32-bit operands.

Hopper's warp-group products read 32-bit (``tf32``) operands from ``__local`` memory K-major only:
both tiles as rows of K. A row-major ``B[K, N]`` is N-major, and transposing it inside the GEMM
costs more than the products save (bench/RESULTS.md, "TF32 on ``wgmma``: tried, measured, not
kept"). So, where the hardware model's matrix unit launches such GEMMs
(``WarpGroup.launch_modes`` and ``launch_local_KiB``, ``stripe.gemm_model.GemmModel.launch_ranking``),
this pass gives a kernel ``tensorize`` marked for a 32-bit mode a copy of B as ``Bt[N, K]``, made
by a kernel of its own just before it:

    Bt[n, k : N, K] = =(B[k, n]);      // its own kernel, every element written once
    C[m, n : M, N] = +(A[m, k] * Bt[n, k]);

It does so only for a plain matrix product of whole buffers (``A[M, K]`` and ``B[K, N]`` read at
``[m, k]`` and ``[k, n]``) that then streams (``stripe.gemm.streams`` with ``b_kmajor``) on one
of the launched tiles, so ``gemm_tile`` ranks those first. The copy moves B's bytes twice more
(an H100, 4096²: 128 MiB, about 10% of the product's time); other GEMMs are left as they are.
Values are copied unchanged; the kernel's tensor maps round both operands to TF32
(docs/semantics.md). A kernel-tiling step: ``tiled=False`` leaves it out, with ``gemm_tile``.
Two GEMMs reading the same B get a copy each.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stripe.gemm import Gemm, streams
from stripe.gemm_model import GemmModel
from stripe.hardware import Hardware, MatrixUnit
from stripe.ir import Block, Dim, Index, Intrinsic, Load, RefDir, Refinement, Store, TensorShape
from stripe.passes.gemm_tile import GemmTileConfig, analyze, marked
from stripe.passes.registry import register
from stripe.passes.rewrite import fresh
from tile.affine import Affine

COPY_TAG = "kmajor_copy"  # the copy kernel's tag (besides ``kernel``)


@dataclass(frozen=True)
class KMajorConfig:
    reqs: tuple[str, ...] = ("contraction", "kernel")
    unit: str = "tensor_core"  # the hardware's matrix unit
    skip: tuple[str, ...] = ("split_partial",)


@register("kmajor", KMajorConfig, kernel_tiling=True)
def kmajor(program: Block, cfg: KMajorConfig, hw: Hardware) -> Block:
    """Each launched 32-bit GEMM reading B N-major, preceded by a K-major copy (module docstring)."""
    unit = hw.matrix_units.get(cfg.unit)
    wg = unit.warpgroup if unit is not None else None
    if wg is None or not wg.launch_local_KiB:
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
            got = _transposed(k, s, unit, cfg, hw, taken) if isinstance(k, Block) else None
            if got is None:
                stmts.append(k)
                continue
            copy, gemm, buf = got
            taken.add(buf.into)
            stmts += [copy, gemm]
            new_bufs.append(buf)
            views.append(_view(buf))
        mains.append(replace(s, refs=s.refs + tuple(views), stmts=tuple(stmts)) if views else s)
    if not new_bufs:
        return program
    return replace(program, refs=program.refs + tuple(new_bufs), stmts=tuple(mains))


def _transposed(block: Block, main: Block, unit: MatrixUnit, cfg: KMajorConfig, hw: Hardware,
                taken: set[str]) -> tuple[Block, Block, Refinement] | None:
    """The copy kernel, ``block`` reading the copy, and the copy's buffer; None where the pass
    leaves ``block`` alone."""
    mode = marked(block)
    if mode is None or not set(cfg.reqs) <= block.tags:
        return None
    op = unit.operation(mode)
    if op is None or op.input_bytes != 4 or mode not in unit.warpgroup.launch_modes:
        return None
    gcfg = GemmTileConfig(reqs=cfg.reqs, skip=cfg.skip, matrix_unit=cfg.unit)
    g = analyze(block, main, gcfg)
    if g is None or not _plain(g, main, unit.warpgroup):
        return None
    b = g.b.ref
    src = main.ref(b.source)
    size_k, size_n = (d.size for d in src.shape.dims)
    name = fresh(f"{b.source}_kmajor", taken)
    dtype = src.shape.dtype
    buf = Refinement(RefDir.NONE, name, (Affine(), Affine()), TensorShape.dense(dtype, (size_n, size_k)),
                     tags=frozenset({"tmp"}))
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
        comments=(f"{name}[n, k: {size_n}, {size_k}] = =({b.source}[k, n]);  (stripe.passes.kmajor)",),
    )
    gemm = _reading(block, b.source, name, size_k)
    g2 = analyze(gemm, replace(main, refs=(*main.refs, _view(buf))), gcfg)
    model = GemmModel(g2, hw, gcfg) if g2 is not None else None
    if model is None or not model.launch_ranking(unit, f"{cfg.unit}.{mode}", mode):
        return None
    return copy, gemm, buf


def _plain(g: Gemm, main: Block, wg) -> bool:
    """``g`` streams as it is (``stripe.gemm.streams``: a plain matrix product, B's rows along N)
    on one of the launched tiles, and B is a whole dense ``[K, N]`` buffer."""
    kt = wg.launch_k_bytes // 4
    if not any(streams(g, tm, tn, kt, 4) for tm, tn in wg.launch_tiles):
        return False
    (k,), (j,) = g.k.idxs, g.n.idxs
    try:
        src = main.ref(g.b.ref.source)
    except KeyError:
        return False
    dims = src.shape.dims
    if len(dims) != 2 or any(a.vars or a.const for a in src.access):
        return False
    return [(d.size, d.stride) for d in dims] == [(k.range, j.range), (j.range, 1)]


def _reading(block: Block, source: str, name: str, size_k: int) -> Block:
    """``block`` reading ``name`` (``[N, K]``, dense) where it read ``source`` (``[K, N]``): every
    view of it, at any depth, with its two dimensions swapped."""

    def swap(r: Refinement) -> Refinement:
        (d0, d1), (a0, a1) = r.shape.dims, r.access
        dims = (Dim(d1.size, size_k), Dim(d0.size, 1))
        return replace(r, access=(a1, a0), shape=TensorShape(r.shape.dtype, dims))

    def visit(b: Block, names: set[str], top: bool) -> Block:
        refs, inner = [], set()
        for r in b.refs:
            if (r.source == source) if top else (r.source in names):
                r = swap(replace(r, from_=name) if top else r)
                inner.add(r.into)
            refs.append(r)
        stmts = tuple(visit(s, inner, False) if isinstance(s, Block) else s for s in b.stmts)
        return replace(b, refs=tuple(refs), stmts=stmts)

    return visit(block, set(), True)


def _view(buf: Refinement) -> Refinement:
    """``main``'s view of the new buffer ``buf`` (``analyze`` reads the copy's shape from it)."""
    return replace(buf, dir=RefDir.INOUT, tags=frozenset())
