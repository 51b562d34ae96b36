"""Which blocks the CPU micro-kernel (``microkernel``) takes, and how it sees them.

``analyse`` is pure: it reads a leaf block and the dims and buffer types of what its refinements
refine, and names the vector index, the row index, the other owned indexes and the reductions
(see ``microkernel``'s docstring for the rule): the output and reduction indexes are those of
``stripe.roles``, the analysis the GEMM view (``stripe.gemm``) builds on; what is its own here is
the form of the statements it takes and the choice of the vector and row indexes.
``VectorConfig`` is what the host and the precision policy allow. Also pure, for the code
generator around it: ``panel_split`` (threads over a matmul's panels rather than its rows),
``cache_blocks`` (the K and N blocks that fit L1 and L2) and ``covers`` (whether a kernel writes
every element of its output, so that its zero fill may be skipped) and ``from_nest`` (an
optimizer's ``gemm_tile`` nest, known by the ``GemmPlan`` the pass attached, as a flat GEMM and its
cache tiles).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from backends.llvm.schedule import Schedule
from stripe.gemm import match
from stripe.gemm_nest import read as read_nest
from stripe.ir import Block, Dim, Intrinsic, Load, RefDir, Store
from stripe.roles import roles
from tile.dtypes import DType

AGGS = ("add", "max", "min")  # max/min: the scalar code's NaN-wins select, lane-wise
_OPS = ("mul", "add", "assign")  # assign: a conversion to the same type, a copy
PACK_LIMIT = 2 * 1024 * 1024  # bytes of stack scratch for one packed panel (or cache block)


@dataclass(frozen=True)
class VectorConfig:
    """What the host and the precision policy allow: ``vector_bytes`` (64 AVX-512, 32 AVX2, 16
    SSE/NEON; 0 turns the micro-kernel off), whether fused multiply-add may contract ``acc + a*b``,
    and whether the plain loops' float ``+`` aggregations may be reassociated (so that LLVM
    vectorizes a sum over a contiguous reduction index; §8.3, never under ``strict``); the
    sizes of a core's L1 and L2 data caches, which the micro-kernel's cache blocks fit; with
    ``reassoc``, how many points a long float sum adds into one fresh partial (``partials``; 0:
    one running sum per element)."""

    vector_bytes: int = 0
    fma: bool = False
    reassoc: bool = False
    sum_block: int = 4096
    l1_bytes: int = 0  # one core's data caches (0: unknown: no cache blocks, whole reductions)
    l2_bytes: int = 0


def host_vector_bytes(features: str) -> int:
    """The widest float vector the host's LLVM feature string (``+avx512f,...``) supports."""
    have = set(features.split(","))
    if "+avx512f" in have:
        return 64
    if "+avx" in have or "+avx2" in have:
        return 32
    if "+sse2" in have or "+neon" in have or "+simd128" in have:
        return 16
    return 16


@dataclass(frozen=True)
class Shape:
    """What ``analyse`` found: positions into ``block.idxs``."""

    dtype: DType
    v: int
    r: int | None
    outer: tuple[int, ...]  # the other owned indexes, in listed order
    red: tuple[int, ...]  # reduction indexes, in listed order
    coefs: dict[str, tuple[int, ...]]  # refinement -> element-offset coefficient per index
    out: str
    agg: str = "add"  # the output's aggregation: add, max or min


def analyse(
    block: Block, parent_dims: dict[str, tuple[Dim, ...]], buf_dtypes: dict[str, DType], bounded: int | None
) -> Shape | None:
    """The micro-kernel's view of ``block``, or None when it does not match (see the module
    docstring). ``parent_dims``/``buf_dtypes``: what each refinement's source is, by refinement
    name; ``bounded``: a kernel index the caller restricts to a chunk (it must be owned)."""
    if any(isinstance(s, Block) for s in block.stmts) or not block.idxs:
        return None
    stores = [s for s in block.stmts if isinstance(s, Store)]
    if len(stores) != 1:
        return None
    out = stores[0].into
    dtype: DType | None = None
    produced: set[str] = set()
    for s in block.stmts:
        if isinstance(s, Load):
            if s.from_ == out:
                return None
            produced.add(s.into)
        elif isinstance(s, Intrinsic):
            if s.name not in _OPS or len(s.outputs) != 1 or not set(s.inputs) <= produced:
                return None
            if len(s.inputs) != (1 if s.name == "assign" else 2):
                return None
            if dtype is not None and s.dtype is not dtype:
                return None
            dtype = s.dtype
            produced.add(s.outputs[0])
        elif isinstance(s, Store):
            if s.from_ not in produced:
                return None
        else:
            return None
    for r in block.refs:
        if r.into not in parent_dims or (r.dir is RefDir.NONE and r.from_ is None):
            return None
        if buf_dtypes.get(r.into) is not r.shape.dtype:
            return None
        dtype = dtype or r.shape.dtype
        if r.dir is RefDir.IN and r.shape.dtype.is_narrow_float and dtype is DType.FLOAT32:
            continue  # a half operand of a float32 product (a widened one: read converted, exact)
        if r.shape.dtype is not dtype or dtype not in (DType.FLOAT32, DType.FLOAT64):
            return None
    rl = roles(block, out, parent_dims)  # None too when two output points might write one element
    if rl is None or block.ref(out).agg_op not in AGGS:
        return None
    names = [ix.name for ix in block.idxs]
    coefs = rl.coefs(block.idxs)
    oc = coefs[out]
    owned = [names.index(ix.name) for ix in rl.outputs if ix.range > 1]
    red = tuple(names.index(ix.name) for ix in rl.reductions if ix.range > 1)
    in_cons = {v for c in block.constraints for v in c.vars}
    vs = [k for k in owned if oc[k] == 1 and names[k] not in in_cons]
    if not vs or (bounded is not None and bounded in red):
        return None
    v = vs[0]
    # the row index: not the thread-split one (its chunk may be a few rows), free of
    # constraints if possible, long
    rows = sorted(
        (k for k in owned if k != v),
        key=lambda k: (k == bounded, names[k] in in_cons, -block.idxs[k].range),
    )
    r = rows[0] if rows else None
    outer = tuple(k for k in owned if k not in (v, r))
    return Shape(dtype, v, r, outer, red, coefs, out, block.ref(out).agg_op)


# vectors per tile row at most, by vector bytes: a tile of MR rows keeps MR x NV accumulators, NV
# vectors of B and a broadcast of A live at once. AVX-512's 32 registers hold 6 x 4 (29); AVX2's
# and SSE's 16 hold 6 x 2 (15), not 3 x 4 (17: the accumulators spill; 256^3 on one znver3 core:
# 38 GFLOP/s, 77 at 6 x 2)
NV_MAX = {64: 4}


def nv_max(cfg: VectorConfig) -> int:
    return NV_MAX.get(cfg.vector_bytes, 2)


def panel(v_range: int, cfg: VectorConfig, dtype: DType) -> tuple[int, int]:
    """The micro-kernel's vector width ``W`` (lanes) and vectors per tile row ``NV`` for a vector
    index of ``v_range``: its panels of B are ``NR = NV * W`` wide."""
    width = cfg.vector_bytes // dtype.numpy.itemsize
    return width, max(1, min(nv_max(cfg), -(-v_range // width)))


LATENCY_FMAS = 8  # independent accumulators that keep two FMA pipes of 4 cycles' latency busy
ROWS_CAP = 12  # the register tile's rows at most (16 with one vector a row: its FMAs read A from memory)


def row_tile(rows: int, nv: int, budget: int) -> int:
    """The micro-kernel's rows a tile ``MR`` for ``rows`` rows of ``nv`` vectors and ``budget``
    accumulators: of the heights that fit, the one whose tiles (whole ones, then the remainder's
    one tile per power of two, ``MicroKernel.over_rows``) take the fewest FMA cycles a reduction
    point, a tile of ``r`` rows taking ``max(r * nv, LATENCY_FMAS) / 2`` (fewer accumulators
    than that wait on the FMA latency); the tallest height unless another takes fewer cycles.
    64 rows of one vector: 16 rows a tile (4 tiles), not 12 (5, then 4 rows at half speed)."""
    cap = ROWS_CAP + 4 if nv == 1 else ROWS_CAP
    base = max(1, min(rows, budget // nv, ROWS_CAP))
    if not isinstance(rows, int) or rows <= base:
        return base

    def cycles(m: int) -> int:
        rest = rows % m
        parts = [m] * (rows // m) + [1 << b for b in range(rest.bit_length()) if rest >> b & 1]
        return sum(max(r * nv, LATENCY_FMAS) for r in parts)

    tops = range(1, max(1, min(rows, budget // nv, cap)) + 1)
    best = min(cycles(m) for m in tops)
    if cycles(base) == best:
        return base
    return max(m for m in tops if cycles(m) == best)


def from_nest(kernel: Block) -> tuple[Block, tuple[int, int]] | None:
    """A ``gemm_tile`` nest read back (``stripe.gemm_nest``) as the flat GEMM it computes and its
    cache tiles ``(KC, NC)`` (the flat K tile, the N tile), which the micro-kernel blocks by
    (``cache_blocks``) and the threads divide (``panel_split``); None for any other kernel, and
    for a nest with a fused epilogue (its flat form leaves the epilogue out: ``epilogue.read_fused``
    reads those)."""
    nest = read_nest(kernel)
    if nest is None or nest.gemm.epilogue is not None:
        return None
    return nest.flat(kernel.name, kernel.tags), (nest.shape.kt, nest.shape.tn)


def panel_split(
    kernel: Block,
    sched: Schedule,
    threads: int,
    cfg: VectorConfig,
    buf_dtypes: dict[str, DType],
    tiles: tuple[int, int] | None = None,
) -> Schedule:
    """``sched``, or a schedule that divides the micro-kernel's panels among the threads instead
    of its rows. Split over rows (``plan``'s choice for ``C[i, j]``: the output's largest
    stride), every thread packs every panel of B for its few rows: with 16 threads the packing is
    done 16 times and outweighs a thread's share of the work at 1024. Split over the vector index
    in whole panels, each thread packs only its own panels, once, and streams every row of A
    past them. Taken when the kernel is a GEMM (``stripe.gemm.match``) that the micro-kernel
    matches at kernel level, ``plan`` split an M index and the panels run along N, and there are
    at least ``threads`` panels, a multiple of ``threads`` or at least four each (else the last
    panels leave threads idle). With a nest's ``tiles`` whose N tile is whole panels and gives
    every thread one, the chunks are whole N tiles."""
    if threads < 2 or not cfg.vector_bytes or not sched.split or not kernel.idxs:
        return sched
    dims = {r.into: r.shape.dims for r in kernel.refs}
    dts = {r.into: buf_dtypes.get(r.source, r.shape.dtype) for r in kernel.refs}
    shape = analyse(kernel, dims, dts, None)
    if shape is None or shape.r is None:
        return sched
    # the GEMM view (stripe.gemm): the split index must be in M, the panels' index in N, and
    # so the second operand (N and K), the one packed, read alike by every row
    sources = {r.source: dts[r.into] for r in kernel.refs}
    gemm = match(kernel, tuple(sources), sources, reorder=False)
    v = kernel.idxs[shape.v]
    split = kernel.idxs[sched.split_index].name
    if gemm is None or split not in gemm.m.names or v.name not in gemm.n.names:
        return sched
    width, nv = panel(v.range, cfg, shape.dtype)
    panels = -(-v.range // (width * nv))
    if panels < threads or (panels % threads and panels < 4 * threads):
        return sched
    grain = width * nv
    if tiles and tiles[1] % grain == 0 and -(-v.range // tiles[1]) >= threads:
        grain = tiles[1]
    order = (*(k for k in sched.order if k != shape.v), shape.v)
    why = f"split over '{v.name}' in panels of {grain} (micro-kernel)"
    return replace(sched, order=order, split_at=len(order) - 1, grain=grain, reason=why)


def covers(block: Block, shape: Shape, elements: int) -> bool:
    """Whether the kernel ``block`` stores every element of its output buffer (of ``elements``):
    no constraint skips a point, and its owned indexes (one point per element, ``analyse``)
    write as many elements as the buffer has, from element 0 to the last."""
    out = block.ref(shape.out)
    if block.constraints or any(a.const != 0 for a in out.access):
        return False
    coefs = shape.coefs[shape.out]
    points, last = 1, 0
    for k, ix in enumerate(block.idxs):
        if coefs[k] < 0:
            return False
        if coefs[k] and ix.range > 1:
            points *= ix.range
            last += coefs[k] * (ix.range - 1)
    return points == elements and last == elements - 1  # distinct offsets: all of [0, elements)


def cache_blocks(block: Block, shape: Shape, mr: int, nr: int, cfg: VectorConfig, given=None):
    """``(KC0, NC, KC)`` for the cache-blocked path (``MicroKernel.blocked``), or None without
    cache sizes: ``KC`` reduction points (``KC0`` of the first reduction index, the others
    whole) so that a tile's ``MR`` rows of A take a quarter of L1, and ``NC`` columns (whole
    panels) so that the packed ``KC x NC`` block of B takes half of L2; or ``given``'s ``(KC,
    NC)``, the tiles of the optimizer's ``gemm_tile`` nest (``from_nest``)."""
    if not ((given or (cfg.l1_bytes and cfg.l2_bytes)) and shape.red and shape.r is not None):
        return None
    item = shape.dtype.numpy.itemsize
    inner = 1
    for k in shape.red[1:]:
        inner *= block.idxs[k].range
    want = given[0] if given else max(64, cfg.l1_bytes // (4 * mr * item) // 64 * 64)
    step0 = max(1, min(block.idxs[shape.red[0]].range, want // inner))
    chunk = step0 * inner
    nc = given[1] if given else cfg.l2_bytes // 2 // (chunk * item)
    nc = max(nr, nc // nr * nr)
    columns = -(-block.idxs[shape.v].range // nr) * nr
    if step0 == block.idxs[shape.red[0]].range and nc >= columns:
        return None  # one block: the whole-reduction tiles do the same with less scratch
    nc = min(nc, columns)  # no more scratch than the columns need
    if nc * chunk * item > PACK_LIMIT:
        return None
    return step0, nc, chunk


__all__ = [
    "PACK_LIMIT",
    "Shape",
    "VectorConfig",
    "analyse",
    "cache_blocks",
    "covers",
    "from_nest",
    "host_vector_bytes",
    "panel",
    "panel_split",
    "row_tile",
]
