"""A ``gemm_tile`` nest on a matrix unit's warp-group products (NVIDIA Hopper's ``wgmma``,
``stripe.hardware.WarpGroup``): ``mma``'s kernel with the products issued by four warps together,
both operands read from ``__local`` memory by the unit itself.

* **The tile.** The plan's tile is the warp-group one (``gemm_tile`` ranks it first where the unit
  has it): ``tm x tn`` with ``tm / 16`` warps along M, each work-item of the nest a warp. Warp ``w``
  owns tile rows ``16·w .. 16·w + 15`` (``block_pos``: the hardware's rows, not the nest's
  interleaved ones; any one-to-one assignment of a tile's outputs computes the same tile), warp
  group ``w / 4`` the 64 rows one ``m64 x tn x k16`` product covers. Each warp's sums sit as the
  unit's accumulator fragment per 8 columns, so ``MmaEmitter.store_mma`` stores them (and runs the
  fused epilogue) unchanged.
* **Staging.** Every load is a 16-byte ``cp.async`` (``fits`` says when; otherwise ``emitter``
  hands the nest to ``mma.MmaEmitter``), into tiles laid out as the unit's swizzled canonical
  layouts, so that its reads of eight 16-byte rows hit distinct banks:
  - an operand whose K elements are contiguous (A of a row-major matrix) is staged K-major: rows of
    ``kt`` elements (32, 64 or 128 bytes), the 16-byte chunk ``c`` of row ``r`` stored at chunk
    ``c XOR ((r·row_bytes / 128) mod (row_bytes / 16))`` (the 32-, 64- or 128-byte swizzle);
  - otherwise M- (N-) major: panels of 64 elements (128 bytes) by ``kt`` rows of K, chunk ``c`` of
    K row ``k`` at chunk ``c XOR (k mod 8)`` (the 128-byte swizzle), read transposed.
  A descriptor (start address, the strides between 8-row groups and between panels, the swizzle)
  tells the unit where each K slice of 16 starts.
* **The K loop.** ``stages`` K steps in ``__local`` memory (as many as fit, up to 4); a step waits
  for its copies and fences them for the unit's (asynchronous) reads; after the barrier (where
  every warp has finished the previous step's products) it refills that step's buffer, issues
  its own products and waits for them. One barrier a step.
  Leaving a step's products running into the next step gave wrong sums on an H100: 8,000-16,000
  wrong elements of an integer 1024x4096x1024 float16 product in each of three runs, none when
  drained (a proxy fence after the wait made it rarer, not gone). It is not buffer reuse: a loop
  that awaited only the step before last and refilled buffers two or three steps back was as
  wrong, and awaiting the products before the next step's copy wait, fence and barrier made it
  exact (bench/RESULTS.md, "2026-11-28 (third)"). ``bench/wgmma_loop.py`` and
  tests/test_tensor_cores_gpu.py check such a product exactly. The buffer is refilled before the
  products are issued rather than after them and a second barrier: faster, and exact in every run
  (figures: bench/RESULTS.md, "Figures moved from docstrings").

* **Stores.** Where ``tile_store.plan`` takes the output (a plain product, a fused epilogue, a
  convolution), the K steps' buffers hold each warp's output rows after one barrier and the
  warps store whole 128-byte lines (``tile_store``;
  (figures: bench/RESULTS.md, "Figures moved from docstrings")). Otherwise
  ``store_mma`` stores each sum where it sits.

The instructions exist only for ``sm_90a``, which OpenCL C cannot target: they are written as PTX
comments starting with ``SM90A``, and the OpenCL compiler uncomments them in the program's PTX and
builds that for ``sm_90a`` (``backends.cuda.ptx``).
"""

from __future__ import annotations

from backends.clike.target import CTarget
from backends.clike.tiled import Tiles
from backends.cuda import mma_skips, tile_store
from backends.cuda.mma import COMMIT, MmaEmitter
from stripe.gemm import Gemm
from stripe.hardware import MatrixUnit, MmaShape
from tile.dtypes import DType

SM90A = "//sm_90a "  # marks PTX that builds only for sm_90a (backends.cuda.ptx uncomments it)
SWIZZLE = {128: 1, 64: 2, 32: 3}  # the descriptor's swizzle field, by row bytes


def emitter(t: CTarget, g: Gemm, ptrs: dict[str, str], tiles: Tiles, unit: MatrixUnit, op: MmaShape,
            mode: str, epilogue=None) -> MmaEmitter:
    """The emitter for a nest on the unit: warp-group products where ``WgmmaEmitter.fits``, else
    ``mma.MmaEmitter``'s warp-level ones."""
    wg = WgmmaEmitter(t, g, ptrs, tiles, unit, op, mode, epilogue)
    return wg if wg.fits() else MmaEmitter(t, g, ptrs, tiles, unit, op, mode, epilogue)


def descriptor(lbo: int, sbo: int, swizzle: int) -> str:
    """The constant part of a shared-memory matrix descriptor: leading and stride byte offsets
    (16-byte units, bits 16-29 and 32-45) and the swizzle mode (bits 62-63); the start address
    (16-byte units, bits 0-13) is or-ed in per K slice."""
    return f"0x{((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (swizzle << 62):x}UL"


class WgmmaEmitter(MmaEmitter):
    MARK = SM90A  # (for ``tile_store``'s instructions)
    staged: tile_store.Staged | None = None  # set by ``source``: the output stored whole lines at a time

    def fits(self) -> bool:
        """Whether the nest takes warp-group products: the unit has them for this mode, the plan's
        tiles are theirs, B has no skipped points (``tensorize`` keeps those off the unit), and
        every load is one 16-byte copy whose work-items divide the tile."""
        g, tl, wg = self.g, self.tl, self.unit.warpgroup
        if wg is None or self.mode not in wg.modes or self.size != 2:
            return False
        if tl.rm != 16 or tl.rn != tl.tn or tl.tm % 64 or tl.tn % 64 or tl.tn > 256:
            return False
        if tl.kt * self.size not in SWIZZLE or tl.kt % 16:
            return False
        if self.flagged(g.b, g.n):
            return False
        for op, grp, tile in ((g.a, g.m, tl.tm), (g.b, g.n, tl.tn)):
            w = self.vector_width(op, grp, tile, self.k_fastest(op, grp))
            if w * self.size != 16 or (tile * tl.kt // w) % tl.threads:
                return False
        return True

    def block_pos(self, frag_pos: str, side: str) -> str:
        """Warp ``wy`` owns tile rows ``16·wy ..`` (the unit's layout) and every column."""
        return f"(wy * {self.tl.rm} + ({frag_pos}))" if side == "m" else f"({frag_pos})"

    def byte_at(self, mm: str, kk: str, kfast: bool) -> str:
        """The swizzled byte offset in a K step's tile of the element at row (column) ``mm`` and K
        position ``kk`` (module docstring)."""
        kt, width = self.tl.kt, 2 * self.tl.kt
        if kfast:
            chunk = f"((({kk}) >> 3) ^ (((({mm}) * {width}) >> 7) & {width // 16 - 1}))"
            return f"({mm}) * {width} + ({chunk} << 4) + ((({kk}) & 7) << 1)"
        chunk = f"(((({mm}) & 63) >> 3) ^ (({kk}) & 7))"
        return f"(({mm}) >> 6) * {kt * 128} + ({kk}) * 128 + ({chunk} << 4) + ((({mm}) & 7) << 1)"

    def destination(self, arr: str, p: str, stage: str, size: int, kfast: bool, row: int) -> str:
        """The ``__local`` address element ``p`` of a K step is copied to."""
        return f"{arr}_at + {stage} * {size * self.size} + {self.byte_at(f'{p}_mm', f'{p}_kk', kfast)}"

    def flag_index(self, p: str, stage: str, size: int, kfast: bool, row: int) -> str:
        return f"{stage} * {size} + ({self.byte_at(f'{p}_mm', f'{p}_kk', kfast)}) / 2"

    def staged_index(self, name: str, pos: str, k: str, size: int) -> str:
        return f"buf * {size} + ({self.byte_at(pos, k, self.kf[name])}) / 2"

    def layout(self, kfast: bool) -> tuple[str, int]:
        """An operand's descriptor constant and the bytes from one K slice (32 bytes: 16 16-bit or
        8 32-bit values) to the next."""
        if kfast:
            width = self.size * self.tl.kt
            return descriptor(16, 8 * width, SWIZZLE[width]), 32
        return descriptor(self.tl.kt * 128, 1024, SWIZZLE[128]), 16 * 128

    # --------------------------------------------------------------- kernel
    def source(self, symbol: str, params: list[tuple[str, DType]]) -> tuple[str, int, int]:
        g, tl, it = self.g, self.tl, self.int
        self.skips = self.flagged(g.a, g.m)  # A's skipped points: ``tainted`` below
        self.stage_flags = False
        nks, groups, (a_items, a_kf, aw), (b_items, b_kf, bw) = self.plans()
        self.kf = {"a": a_kf, "b": b_kf}
        sa, sb = tl.tm * tl.kt, tl.tn * tl.kt  # elements of one K step's tile
        flags = sa // aw + 64 if self.skips else 0  # one step's flags of A's chunks, and ``tainted``
        stages = max(2, min(4, (self.t.local_bytes - flags) // ((sa + sb) * self.size)))
        for name, size in (("A", sa), ("B", sb)):  # 1024-aligned: the swizzle reads address bits
            words = stages * size * self.size // 16
            self.line(f"__local uint4 {name}s4[{words}] __attribute__((aligned(1024)));")
            self.line(f"const uint {name}s_at = (uint)(ulong){name}s4;")
            self.line(f"__local {self.U}* {name}s = (__local {self.U}*){name}s4;")
        if self.skips:
            self.line(f"__local uchar Am[{sa // aw}];")
            self.line("__local int tainted;")
            self.line("if (lid == 0) tainted = 0;")
            self.line("barrier(CLK_LOCAL_MEM_FENCE);")
        self.lanes()
        fn = tl.tn // self.op.n
        for j in range(fn):
            zeros = ", ".join(f"c0_{j}_{e} = 0.0f" for e in range(len(self.op.c.elements)))
            self.line(f"float {zeros};")
        if g.k.idxs:
            self.line(f"{it} " + ", ".join(f"ko_{ix.name} = 0" for ix in g.k.idxs) + ";")
        ops = ((g.a, a_items, "As", sa, aw, a_kf, 0), (g.b, b_items, "Bs", sb, bw, b_kf, 0))
        self.k_loop(ops, stages, nks, a_kf, b_kf)
        if self.skips:
            sums = [f"c0_{j}_{e}" for j in range(fn) for e in range(len(self.op.c.elements))]
            mma_skips.note_nonfinite_sums(self, sums, 1)
            self.tainted_tile(ops, nks, sa, sb, fn, aw)
        self.staged = tile_store.plan(self, params)
        warps = tl.threads // self.unit.lanes
        if self.staged and tile_store.WARP_BYTES * warps > stages * (sa + sb) * self.size:
            self.staged = None  # (the K steps' buffers cannot hold every warp's rows)
        if self.staged:
            self.line("barrier(CLK_LOCAL_MEM_FENCE);")  # every warp's products are done: the K
            self.line("const uint Cs_at = As_at;")  # steps' buffers hold the output rows
        self.store_tile(fn, 1)
        return self.t.group_kernel(symbol, params, tl.threads, self.lines), groups * tl.threads, tl.threads

    def store_tile(self, fn: int, depth: int) -> None:
        """The warp's sums to the output: whole lines through ``Cs_at`` where ``staged``
        (``tile_store``), else each where it sits (``store_mma``)."""
        if self.staged:
            tile_store.emit(self, self.staged, fn, depth)
        else:
            self.store_mma(1, fn)

    def k_loop(self, ops, stages: int, nks: int, a_kf: bool, b_kf: bool) -> None:
        """The K loop (module docstring): copies ``stages - 1`` steps ahead of the products."""
        it = self.int
        self.prefetch(ops, stages, nks)
        self.line(f"for ({it} ks = 0; ks < {nks}; ks++) {{")
        self.line(f"const uint buf = ks % {stages};", 2)
        self.line(f'asm volatile("cp.async.wait_group {stages - 2};" ::: "memory");', 2)
        self.async_line("fence.proxy.async.shared::cta;", 2)  # the copies, visible to the unit
        self.line("barrier(CLK_LOCAL_MEM_FENCE);", 2)
        self.refill(ops, stages, nks, 2)  # every warp has finished the previous step's products
        self.products(a_kf, b_kf, 2)
        self.async_line("wgmma.wait_group.sync.aligned 0;", 2)  # this step's products done
        self.line("}")

    def products(self, a_kf: bool, b_kf: bool, depth: int, acc: str = "c", fresh: bool = False) -> None:
        """The warp group's products of the K step in buffer ``buf``, issued as one group, into the
        accumulators ``acc`` (``fresh``: the first product overwrites them)."""
        tl = self.tl
        self.async_line("wgmma.fence.sync.aligned;", depth)
        (a_desc, a_step), (b_desc, b_step) = self.layout(a_kf), self.layout(b_kf)
        a_at = f"As_at + buf * {tl.tm * tl.kt * self.size} + (wy >> 2) * {64 * tl.kt * self.size}"
        b_at = f"Bs_at + buf * {tl.tn * tl.kt * self.size}"
        for kk in range(tl.kt * self.size // 32):
            self.line("{", depth)
            for d, at, step, desc in (("ad", a_at, a_step, a_desc), ("bd", b_at, b_step, b_desc)):
                start = f"(({at} + {kk * step}) & 0x3FFFF) >> 4"
                self.line(f"const ulong {d} = (ulong)({start}) | {desc};", depth + 1)
            self.product(int(not a_kf), int(not b_kf), depth + 1, acc, fresh and kk == 0)
            self.line("}", depth)
        self.async_line("wgmma.commit_group.sync.aligned;", depth)

    def tainted_tile(self, ops, nks: int, sa: int, sb: int, fn: int, aw: int) -> None:
        """A's skipped points (a padded convolution's input) were copied as zeros, so the unit
        added ``0 x b`` for each: nothing, unless ``b`` is infinite or NaN. When a work-item's
        sums came out infinite or NaN (``tainted``, uniform after the barrier; checked once per
        tile, not per step: a check per step cost a measurable share of the kernel) the tile is
        summed again without the unit, after its last products: each step restaged with A's
        flags (``Am``) and multiplied in ``mma_skips``'s plain loop, which leaves the skipped
        points out."""
        self.line("barrier(CLK_LOCAL_MEM_FENCE);")
        self.line("if (tainted) {")
        for j in range(fn):
            for e in range(len(self.op.c.elements)):
                self.line(f"c0_{j}_{e} = 0.0f;", 2)
        self.line("const uint buf = 0;", 2)
        self.line(f"for ({self.int} ks = 0; ks < {nks}; ks++) {{", 2)
        self.stage_flags = True
        self.k_origins("ks", 3)
        self.copies(ops, "0", 3)
        self.stage_flags = False
        self.line(COMMIT, 3)
        self.line('asm volatile("cp.async.wait_group 0;" ::: "memory");', 3)
        self.line("barrier(CLK_LOCAL_MEM_FENCE);", 3)
        mma_skips.slow_step(self, sa, sb, 1, fn, aw, 3)
        self.line("barrier(CLK_LOCAL_MEM_FENCE);", 3)
        self.line("}", 2)
        self.line("}")

    def async_line(self, text: str, depth: int) -> None:
        self.line(f'asm volatile("{SM90A}{text}" ::: "memory");', depth)

    def product(self, trans_a: int, trans_b: int, depth: int, acc: str = "c", fresh: bool = False) -> None:
        """One ``m64 x tn x k16`` product (``k8`` of 32-bit operands, ``tf32``: both read K-major,
        so no transposition flags) of the warp group into its accumulators (``{acc}0_j_e``, the
        ``e``-th element of columns ``8j ..``; ``fresh``: replacing their values), from the
        descriptors ``ad`` and ``bd``."""
        tn = self.tl.tn
        kind = {"f16": "f16", "bf16": "bf16"}.get(self.mode, "tf32")
        sums = [f"{acc}0_{j}_{e}" for j in range(tn // self.op.n) for e in range(len(self.op.c.elements))]
        n = len(sums)
        regs = ",".join(f"%{x}" for x in range(n))
        if kind == "tf32":
            assert not trans_a and not trans_b, "the unit reads 32-bit operands K-major only"
        flags = "" if kind == "tf32" else f", {trans_a}, {trans_b}"
        text = (
            f"{SM90A}{{ .reg .pred p; setp.ne.b32 p, %{n + 2}, 0; "
            f"wgmma.mma_async.sync.aligned.m64n{tn}k{32 // self.size}.f32.{kind}.{kind} "
            f"{{{regs}}}, %{n}, %{n + 1}, p, 1, 1{flags}; }}"
        )
        outs = ", ".join(f'"+f"({v})' for v in sums)
        self.line(f'asm volatile("{text}" : {outs} : "l"(ad), "l"(bd), "r"({int(not fresh)}));', depth)
