"""A tensor-core GEMM kernel's schedule: what the kernel does, decided once, as plain data.

``plan`` reads a ``gemm_tile`` nest on the matrix unit (its ``Gemm``, its ``Tiles``, the unit and
precision mode its plan names) and the target (local memory, memory a launched kernel gets,
compute units), and decides every choice the kernel's text follows:

* **which kernel** (``kernel``): ``tma`` where the GEMM streams on a launched tile (``tma_fits``;
  a loading warp feeds the tensor memory accelerator's copies), else ``wgmma`` where the tile is
  the warp-group products' (``wgmma_fits``), else ``mma`` (warp-level products);
* **warps** (``Warps``): how many multiply and how many only load, and which tile rows a warp owns
  (``rows``: the nest's interleaved rows for ``mma``, 16-row blocks of the unit for the others);
* **staging** per operand (``Staging``): K-major or M/N-major, the elements per copy, the staged
  row (padded, or swizzled the unit's way), ``ldmatrix`` or element reads for ``mma``'s fragments;
* **the K loop** (``loads``: through registers or asynchronous copies or the tensor memory
  accelerator; ``stages`` K steps in flight);
* **A's skipped points** (``skips``: a padded convolution's input, ``mma_skips``), the 3xtf32
  fold (``fold``);
* **tiles** (``TileOrder``: a launched kernel's work-groups loop over the tiles down bands);
* **epilogue** (``lines``: the output stored whole lines at a time through ``__local`` memory,
  ``tile_store.Staged``, or each sum where it sits) and a launched kernel's ``launch`` record
  (dynamic local memory, tensor maps).

``render.Render`` prints a schedule and decides nothing. The figures behind these rules are in
bench/RESULTS.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.clike.gemm_writer import Tiles, count, flagged, int_type, k_fastest
from backends.clike.target import CTarget
from backends.cuda import launched, tile_store
from backends.cuda.mma import LDMATRIX
from backends.cuda.tma import BAND, PERSISTENT, STAGES
from backends.cuda.wgmma import SWIZZLE
from stripe.gemm import Gemm, Group, Operand
from stripe.hardware import MatrixUnit, MmaShape
from tile.dtypes import DType


@dataclass(frozen=True)
class LaneTiles(Tiles):
    """``Tiles`` of a nest whose work-items are warps of ``lanes`` work-items each."""

    lanes: int = 32

    @property
    def warps(self) -> int:
        return (self.tm // self.rm) * (self.tn // self.rn)

    @property
    def threads(self) -> int:
        return self.warps * self.lanes


@dataclass(frozen=True)
class Staging:
    """How one operand's K step sits in ``__local`` memory: ``kfast`` rows along K (else along M or
    N), ``width`` elements per copy, ``elements`` per K step's buffer; ``row`` elements per staged
    row, padding included (0 where the rows are ``swizzle`` bytes, the unit's swizzled layout);
    ``fragments`` how ``mma`` reads them: ``ldmatrix`` as stored (``""``), transposed
    (``".trans"``), or element by element (None)."""

    kfast: bool
    width: int
    elements: int
    row: int = 0
    swizzle: int = 0
    fragments: str | None = None


@dataclass(frozen=True)
class Warps:
    """``multiplying`` warps issue the products (four a warp group for ``wgmma``/``tma``), ``loading``
    warps only copy (``tma``: one); ``rows``: ``nest`` (warp ``wy`` owns the nest's interleaved rows)
    or ``unit`` (warp ``wy`` owns tile rows ``16·wy ..``, every column)."""

    multiplying: int
    loading: int = 0
    rows: str = "nest"


@dataclass(frozen=True)
class TileOrder:
    """A launched kernel's tiles: ``tiles`` output tiles (``rows`` x ``cols``), ``launched``
    work-groups each looping over every ``launched``-th tile from its own, numbered down bands of
    ``band`` tile rows (so the work-groups running at once share rows of A and columns of B)."""

    rows: int
    cols: int
    launched: int
    band: int


@dataclass(frozen=True)
class TensorMap:
    """One operand's tensor map: the kernel parameter of its buffer, dims innermost first, the row
    stride in bytes, the box one copy moves, the element type the copy delivers."""

    param: int
    dims: tuple[int, int]
    row_bytes: int
    box: tuple[int, int]
    dtype: str


@dataclass(frozen=True)
class GemmSchedule:
    """Everything a tensor-core GEMM kernel's text follows (module docstring), for one nest."""

    kernel: str  # "mma", "wgmma" or "tma" (module docstring)
    mode: str  # the precision mode: f16, bf16, tf32, 3xtf32
    op: MmaShape  # the unit's operation
    lanes: int  # work-items issuing one operation
    group: int  # lanes sharing a fragment row
    tiles: LaneTiles
    int_type: str  # of the index arithmetic
    element_bytes: int  # of an operand element
    a: Staging
    b: Staging
    loads: str  # "registers" (two buffers), "async" (copies in flight) or "tensor" (TMA)
    stages: int  # K steps in ``__local`` memory
    skips: bool  # A's skipped points kept out (``mma_skips``)
    fragments: tuple[int, int]  # operations per warp along M and N
    warps: Warps
    k_steps: int
    groups: int  # work-groups of one tile each (a launched kernel: its tiles)
    fold: bool  # 3xtf32: each K step's sums kept apart and added to the running ones
    edges: tuple[str, ...]  # the indexes whose last tile overhangs their range (guarded bands)
    epilogue: bool  # a fused epilogue finishes each output element (else the sums are added)
    lines: tile_store.Staged | None = None  # the output stored whole lines at a time
    order: TileOrder | None = None  # a launched kernel's tiles
    local_bytes: int = 0  # a launched kernel's dynamic local memory
    out_bytes: int = 0  # of which the multiplying warps' output rows (``lines``), after the stages
    maps: tuple[TensorMap, ...] = ()  # a launched kernel's tensor maps

    @property
    def threads(self) -> int:
        return (self.warps.multiplying + self.warps.loading) * self.lanes

    @property
    def launch(self) -> dict | None:
        """The launch record a launched kernel's ``KernelSource`` carries (``backends.cuda.launch``)."""
        if self.kernel != "tma":
            return None
        maps = [(m.param, m.dims, m.row_bytes, m.box, m.dtype) for m in self.maps]
        return {"local_bytes": self.local_bytes, "maps": maps}


def operation(units: dict[str, MatrixUnit], unit: str) -> tuple[MatrixUnit, MmaShape, str] | None:
    """The unit, operation and mode a plan's ``unit`` (``name.mode``) names, or None."""
    name, _, mode = unit.rpartition(".")
    u = units.get(name)
    op = u.operation(mode) if u is not None else None
    return (u, op, mode) if op is not None else None


def copy_width(g: Gemm, op: Operand, grp: Group, tile: int, kfast: bool, tl: LaneTiles, size: int) -> int:
    """The most elements (up to 16 bytes) of one aligned, contiguous run of the operand's fastest
    group that the same guards keep or drop, and whose copies the work-items share evenly."""
    fast = g.k if kfast else grp
    if not fast.idxs:
        return 1
    inner, off = fast.idxs[-1], op.offset
    if off.coeff(inner.name) != 1 or any(inner.name in c.vars for c in op.guards):
        return 1
    for w in (16 // size, 4, 2):
        rest = [int(c) for v, c in off.terms if v != inner.name] + [int(off.const)]
        aligned = all(c % w == 0 for c in rest)
        if aligned and inner.range % w == 0 and tl.per[inner.name] % w == 0 \
                and (tile * tl.kt) % (w * tl.threads) == 0:
            return w
    return 1


def _ldmatrix(name: str, frag, kfast: bool, size: int, fn: int) -> str | None:
    """How ``mma`` reads operand ``name``'s fragments with ``ldmatrix`` (four 8x8 matrices of 16-byte
    rows): ``""`` as stored, ``".trans"`` transposed, None when it cannot (the fragment is not the
    layout ``ldmatrix`` delivers, B's fragments do not pair up, or 32-bit values would need a
    transpose)."""
    if (frag.per_register, frag.elements) not in LDMATRIX[name]:
        return None
    if name == "b" and fn % 2:
        return None  # B's fragments load in pairs
    if kfast:
        return ""
    return ".trans" if size == 2 else None


def _common(g: Gemm, tiles: Tiles, unit: MatrixUnit) -> tuple[LaneTiles, int, tuple[bool, bool]]:
    lt = LaneTiles(tiles.tm, tiles.tn, tiles.rm, tiles.rn, tiles.kt, tiles.per, unit.lanes)
    size = 2 if g.dtype.bits == 16 else 4
    return lt, size, (k_fastest(g, g.a, g.m), k_fastest(g, g.b, g.n))


def _widths(g: Gemm, lt: LaneTiles, size: int, kf: tuple[bool, bool]) -> tuple[int, int]:
    return (copy_width(g, g.a, g.m, lt.tm, kf[0], lt, size), copy_width(g, g.b, g.n, lt.tn, kf[1], lt, size))


def wgmma_fits(g: Gemm, tiles: Tiles, unit: MatrixUnit, mode: str) -> bool:
    """Whether the nest takes warp-group products: the unit has them for this mode, the plan's
    tiles are theirs, B has no skipped points (``tensorize`` keeps those off the unit), and every
    load is one 16-byte copy whose work-items divide the tile."""
    lt, size, kf = _common(g, tiles, unit)
    wg = unit.warpgroup
    if wg is None or mode not in wg.modes or size != 2:
        return False
    if lt.rm != 16 or lt.rn != lt.tn or lt.tm % 64 or lt.tn % 64 or lt.tn > 256:
        return False
    if lt.kt * size not in SWIZZLE or lt.kt % 16:
        return False
    if flagged(g.b, g.n):
        return False
    for w, tile in zip(_widths(g, lt, size, kf), (lt.tm, lt.tn)):
        if w * size != 16 or (tile * lt.kt // w) % lt.threads:
            return False
    return True


def tma_fits(t: CTarget, g: Gemm, tiles: Tiles, unit: MatrixUnit, mode: str) -> bool:
    """Whether the nest is the launched kernel's: the target launches with more local memory, the
    mode is one the unit launches, the plan's tiles and K step are the launched ones (a warp per
    16 rows, every column), two K steps fit, and the copies feed the GEMM (``launched.feeds``:
    16-bit operands also in overhanging last tiles)."""
    facts, size = launched.of(unit), 2 if g.dtype.bits == 16 else 4
    launch_bytes = getattr(t, "launch_bytes", 0)
    if not launch_bytes or facts is None:
        return False
    if (tiles.tm, tiles.tn) not in facts.launched(mode) or tiles.rm != 16 or tiles.rn != tiles.tn:
        return False
    if tiles.kt * size != facts.k_bytes or tiles.kt * size != 128:
        return False
    if launch_bytes < 2 * ((tiles.tm + tiles.tn) * tiles.kt * size + 16):  # two stages at least
        return False
    return launched.feeds(g, tiles.tm, tiles.tn, tiles.kt, size)


def plan(t: CTarget, g: Gemm, ptrs: dict[str, str], params: list[tuple[str, DType]], tiles: Tiles,
         unit: MatrixUnit, op: MmaShape, mode: str) -> GemmSchedule:
    """The kernel's schedule (module docstring): ``tma`` where it fits, else ``wgmma``, else
    ``mma``."""
    if tma_fits(t, g, tiles, unit, mode):
        return _tma(t, g, ptrs, params, tiles, unit, op, mode)
    if wgmma_fits(g, tiles, unit, mode):
        return _wgmma(t, g, ptrs, params, tiles, unit, op, mode)
    return _mma(t, g, tiles, unit, op, mode)


def _base(g: Gemm, tiles: Tiles, unit: MatrixUnit, op: MmaShape, mode: str) -> dict:
    lt, size, _ = _common(g, tiles, unit)
    return dict(
        mode=mode, op=op, lanes=unit.lanes, group=unit.group, tiles=lt,
        int_type=int_type(g, lt, lt.threads), element_bytes=size,
        k_steps=count(g.k, lt.per), groups=count(g.m, lt.per) * count(g.n, lt.per) * g.batch.total,
        fold=mode == "3xtf32",
        edges=tuple(ix.name for grp in (g.m, g.n, g.k) for ix in grp.idxs if ix.range % lt.per[ix.name]),
        epilogue=g.out is None,
    )


def _mma(t: CTarget, g: Gemm, tiles: Tiles, unit: MatrixUnit, op: MmaShape, mode: str) -> GemmSchedule:
    """Warp-level products (``backends.cuda.mma``)."""
    assert not flagged(g.b, g.n), "tensorize leaves a B with guards on N to the SIMT kernel"
    lt, size, (a_kf, b_kf) = _common(g, tiles, unit)
    aw, bw = _widths(g, lt, size, (a_kf, b_kf))
    skips = flagged(g.a, g.m)
    pad_k = 16 // size
    # the staged layouts: K-major rows padded by 16 bytes, else M- (N-) major rows padded by 8
    a_row = lt.kt + pad_k if a_kf else lt.tm + 8
    b_row = lt.kt + pad_k if b_kf else lt.tn + 8
    sa = lt.tm * a_row if a_kf else lt.kt * a_row
    sb = lt.tn * b_row if b_kf else lt.kt * b_row
    # copies straight from global to __local memory (cp.async, no registers in between) when
    # every load is 4, 8 or 16 bytes: as many K steps in flight as fit (up to 4)
    copy = all(w * size in (4, 8, 16) for w in (aw, bw))
    stage = (sa + sb) * size + (sa // aw + 4 if skips else 0)
    fm, fn = lt.rm // op.m, lt.rn // op.n
    return GemmSchedule(
        kernel="mma",
        a=Staging(a_kf, aw, sa, a_row, fragments=_ldmatrix("a", op.a, a_kf, size, fn)),
        b=Staging(b_kf, bw, sb, b_row, fragments=_ldmatrix("b", op.b, b_kf, size, fn)),
        loads="async" if copy else "registers",
        stages=max(2, min(4, t.local_bytes // stage)) if copy else 2,
        skips=skips, fragments=(fm, fn), warps=Warps(lt.warps),
        **_base(g, tiles, unit, op, mode),
    )


def _swizzled(kfast: bool, width: int, elements: int, kt: int, size: int) -> Staging:
    """The unit's swizzled layout: K-major rows of ``kt`` elements, else 128-byte panels."""
    return Staging(kfast, width, elements, swizzle=kt * size if kfast else 128)


def _wgmma(t: CTarget, g: Gemm, ptrs: dict[str, str], params, tiles: Tiles, unit: MatrixUnit, op: MmaShape,
           mode: str) -> GemmSchedule:
    """Warp-group products from hand-staged swizzled tiles (``backends.cuda.wgmma``)."""
    lt, size, kf = _common(g, tiles, unit)
    aw, bw = _widths(g, lt, size, kf)
    skips = flagged(g.a, g.m)  # A's skipped points: the tile summed again where tainted
    sa, sb = lt.tm * lt.kt, lt.tn * lt.kt  # elements of one K step's tile
    flags = sa // aw + 64 if skips else 0  # one step's flags of A's chunks, and ``tainted``
    stages = max(2, min(4, (t.local_bytes - flags) // ((sa + sb) * size)))
    lines = tile_store.plan(g, op.c, lt, ptrs, params)
    if lines and tile_store.WARP_BYTES * lt.warps > stages * (sa + sb) * size:
        lines = None  # (the K steps' buffers cannot hold every warp's rows)
    return GemmSchedule(
        kernel="wgmma",
        a=_swizzled(kf[0], aw, sa, lt.kt, size), b=_swizzled(kf[1], bw, sb, lt.kt, size),
        loads="async", stages=stages, skips=skips, fragments=(1, lt.tn // op.n),
        warps=Warps(lt.warps, rows="unit"), lines=lines,
        **_base(g, tiles, unit, op, mode),
    )


def _tma(t: CTarget, g: Gemm, ptrs: dict[str, str], params, tiles: Tiles, unit: MatrixUnit, op: MmaShape,
         mode: str) -> GemmSchedule:
    """Warp-group products from tiles the tensor memory accelerator copies (``backends.cuda.tma``)."""
    lt, size, kf = _common(g, tiles, unit)
    aw, bw = _widths(g, lt, size, kf)
    base = _base(g, tiles, unit, op, mode)
    (i,), (j,), (k,) = g.m.idxs, g.n.idxs, g.k.idxs
    sa, sb = lt.tm * lt.kt * size, lt.tn * lt.kt * size  # bytes of one step's tiles
    warps = lt.tm // 16  # multiplying; one more loads
    stages = min(STAGES, t.launch_bytes // (sa + sb + 16))  # (``tma_fits``: two at least)
    lines = tile_store.plan(g, op.c, lt, ptrs, params)
    staging = tile_store.WARP_BYTES * warps if lines else 0
    if (t.launch_bytes - staging) // (sa + sb + 16) < stages:
        lines, staging = None, 0  # where it would cost a K step in flight
    groups = base["groups"]
    launched = min(groups, t.compute_units) if PERSISTENT and t.compute_units else groups
    ntm, ntn = -(-i.range // lt.tm), -(-j.range // lt.tn)  # (the last may overhang: ``launched.feeds``)
    pos = {name: n for n, (name, _) in enumerate(params)}
    # (float32 operands of ``tf32``: the copies round them to TF32, to nearest, ties to even;
    # ``3xtf32``'s split parts are TF32 values already)
    dtype = "tfloat32" if size == 4 else g.dtype.value
    a_map = TensorMap(pos[ptrs[g.a.ref.source]], (k.range, i.range), int(g.a.offset.coeff(i.name)) * size,
                      (lt.kt, lt.tm), dtype)  # A[i, k]: K innermost, box kt x tm
    if kf[1]:  # B[j, k] (K-major, 32-bit): K innermost, box kt x tn
        b_dims, b_row, b_box = (k.range, j.range), int(g.b.offset.coeff(j.name)) * size, (lt.kt, lt.tn)
    else:  # B[k, j]: N innermost, box 64 x kt
        b_dims, b_row, b_box = (j.range, k.range), int(g.b.offset.coeff(k.name)) * size, (64, lt.kt)
    b_map = TensorMap(pos[ptrs[g.b.ref.source]], b_dims, b_row, b_box, dtype)
    return GemmSchedule(
        kernel="tma",
        a=_swizzled(kf[0], aw, lt.tm * lt.kt, lt.kt, size),
        b=_swizzled(kf[1], bw, lt.tn * lt.kt, lt.kt, size),
        loads="tensor", stages=stages, skips=False, fragments=(1, lt.tn // op.n),
        warps=Warps(warps, 1, rows="unit"), lines=lines,
        order=TileOrder(ntm, ntn, launched, min(BAND, ntm) or ntm),
        local_bytes=stages * (sa + sb + 16) + staging, out_bytes=staging, maps=(a_map, b_map),
        **base,
    )
