"""A GEMM on Hopper's warp-group products whose tiles the tensor memory accelerator (TMA) loads:
the kernel ``gemm_tile`` plans where the device launches kernels through CUDA's driver API with
more local memory than OpenCL gives (``stripe.hardware.WarpGroup.launch_tiles``) and the GEMM
streams (``stripe.gemm.streams``).

* **Warps.** ``tm / 16`` warps multiply (``wgmma``'s warp groups, as ``WgmmaEmitter``: warp group
  ``w`` owns 64 rows, every column) and one more warp loads: its first lane issues, per K step,
  one ``cp.async.bulk.tensor`` of A's ``tm x kt`` tile and one per 64 columns of B's. The copies
  land in the unit's swizzled canonical layouts (128-byte swizzle: K steps of 128 bytes), the
  layouts ``WgmmaEmitter`` stages by hand, so its descriptors read them unchanged.
* **Hand-over.** ``STAGES`` K steps in one block of dynamic local memory, each with two
  ``mbarrier``s: *full* (the loader announces the step's bytes; the copies complete it) and
  *empty* (one arrival per multiplying warp once the products that read it are done). The
  multiplying warps leave each step's products running while they wait for the next step's
  tiles, and release a step when the products after it have been issued and the older ones awaited
  (``wgmma.wait_group 1``). No barrier in the K loop.
* **Tiles.** Where the target knows its compute units (``PERSISTENT``), the kernel launches one
  work-group per unit (at most one per tile), and each loops over every ``units``-th tile from
  its own: the loading warp runs on into the next tile's K steps while the multiplying warps store
  the last one, and the stages' barrier phases run on over the tiles (``it``: K steps so far).
  Tiles are numbered down bands of ``BAND`` tile rows, so the work-groups running at once read
  fewer rows of A and columns of B, which stay in the L2 cache
  (figures: bench/RESULTS.md, "Figures moved from docstrings").
* **Stores.** Where ``tile_store.plan`` takes the output, each multiplying warp passes its rows
  through a ``__local`` region of its own after the stages (``Cs_at``; only where it costs no
  stage) and stores whole lines. Two teams of multiplying warps on alternate 128 x 128 tiles (a
  ping-pong, so one team's stores overlap the other's products) were slower than one team on
  256 x 128 (figures: bench/RESULTS.md, "Figures moved from docstrings").
* **3xtf32** (operands already split along 3K by ``backends.cuda.kmajor``, ``fits`` only then:
  ``gemm_tile`` ranks launched tiles for such GEMMs only): each K step's products go into sums
  of their own (the first replacing them), which are awaited and added to the running sums with
  a float32 addition before the step's buffer is released: the unit's own additions round toward
  zero (``mma.sync``, 1024³: 1.0e-5 max relative error summed in the unit, 3.4e-7 folded). The two
  sets of sums need ``launch_fold_tiles`` (128 x 128, two multiplying warp groups).
* **Tensor maps.** The kernel takes two more arguments after the buffers, ``tmap_a`` and
  ``tmap_b``: global addresses of the ``CUtensorMap``s the launcher encodes from the buffers'
  addresses (``launch["maps"]``: per map its buffer's parameter, dims innermost first, row
  stride in bytes, box, element type). ``launch["local_bytes"]`` is the dynamic local memory to
  launch with; the kernel reads its base from the PTX name ``DYNAMIC``, which
  ``backends.cuda.ptx`` declares.
"""

from __future__ import annotations

from backends.clike.target import CTarget
from backends.clike.tiled import Tiles
from backends.cuda import tile_store, wgmma
from backends.cuda.mma import MmaEmitter, operation
from backends.cuda.wgmma import SM90A, WgmmaEmitter
from stripe.gemm import Gemm, streams
from stripe.hardware import MatrixUnit, MmaShape
from tile.dtypes import DType

DYNAMIC = "tile_dynamic_local"  # the PTX name of a launched kernel's dynamic local memory
STAGES = 4  # K steps in flight at most (4 measured faster than 3: bench/RESULTS.md)
MAPS = ("tmap_a", "tmap_b")  # the tensor-map arguments, after the buffers
PERSISTENT = True  # one work-group per compute unit, each looping over tiles (``tiles``)
BAND = 4  # tile rows per band of the tile order (``tiles``)


def unit_emitter(t: CTarget, g: Gemm, ptrs: dict[str, str], tiles: Tiles, unit: str, epilogue=None):
    """The emitter for a nest whose plan names ``unit`` (``name.mode``), where the target has that
    unit and mode (``mma.operation``), else None (``CTarget.unit_emitter``)."""
    found = operation(t.matrix_units, unit)
    return emitter(t, g, ptrs, tiles, *found, epilogue) if found is not None else None


def emitter(t: CTarget, g: Gemm, ptrs: dict[str, str], tiles: Tiles, unit: MatrixUnit, op: MmaShape,
            mode: str, epilogue=None) -> MmaEmitter:
    """The emitter for a nest on the unit: this module's kernel where ``TmaEmitter.fits``, else
    ``wgmma.emitter``'s."""
    streamed = TmaEmitter(t, g, ptrs, tiles, unit, op, mode, epilogue)
    return streamed if streamed.fits() else wgmma.emitter(t, g, ptrs, tiles, unit, op, mode, epilogue)


class TmaEmitter(WgmmaEmitter):
    launch: dict | None = None  # set by ``source``

    def fits(self) -> bool:
        """Whether the nest is the launched kernel's: the target launches with more local memory,
        the mode is one the unit launches, the plan's tiles and K step are the launched ones (a
        warp per 16 rows, every column), and the GEMM streams (32-bit operands: with B K-major,
        ``backends.cuda.kmajor``'s copy)."""
        wg, tl = self.unit.warpgroup, self.tl
        if not self.t.launch_bytes or wg is None:
            return False
        if (tl.tm, tl.tn) not in wg.launched(self.mode) or tl.rm != 16 or tl.rn != tl.tn:
            return False
        if tl.kt * self.size != wg.launch_k_bytes or tl.kt * self.size != 128:
            return False
        if self.t.launch_bytes < 2 * (self.stage_bytes() + 16):  # two stages at least
            return False
        return streams(self.g, tl.tm, tl.tn, tl.kt, self.size, b_kmajor=self.size == 4)

    def stage_bytes(self) -> int:
        """Bytes of one K step's tiles of A and B."""
        return (self.tl.tm + self.tl.tn) * self.tl.kt * self.size

    def source(self, symbol: str, params: list[tuple[str, DType]]) -> tuple[str, int, int]:
        g, tl = self.g, self.tl
        self.skips = False
        nks, groups, (_, a_kf, _), (_, b_kf, _) = self.plans()
        (i,), (j,), (k,) = g.m.idxs, g.n.idxs, g.k.idxs
        sa, sb = tl.tm * tl.kt * self.size, tl.tn * tl.kt * self.size  # bytes of one step's tiles
        warps = tl.tm // 16  # multiplying; warp ``warps`` loads
        stages = min(STAGES, self.t.launch_bytes // (self.stage_bytes() + 16))  # (``fits``: two at least)
        self.staged = tile_store.plan(self, params)
        staging = tile_store.WARP_BYTES * warps if self.staged else 0
        if (self.t.launch_bytes - staging) // (self.stage_bytes() + 16) < stages:
            self.staged, staging = None, 0  # where it would cost a K step in flight
        self.line("uint Ds_at;")
        self.line(f'asm("{SM90A}mov.u32 %0, {DYNAMIC};" : "=r"(Ds_at));')
        self.line("const uint As_at = Ds_at;")
        self.line(f"const uint Bs_at = Ds_at + {stages * sa};")
        self.line(f"const uint Cs_at = Ds_at + {stages * (sa + sb)};")  # the warps' output rows
        self.line(f"const uint Mb_at = Cs_at + {staging};")  # full[s], then empty[s]
        self.line("if (lid == 0) {")
        for s in range(stages):
            self.ptx("mbarrier.init.shared::cta.b64 [%0], 1;", f'"r"(Mb_at + {8 * s})', 2)
            self.ptx(f"mbarrier.init.shared::cta.b64 [%0], {warps};", f'"r"(Mb_at + {8 * (stages + s)})', 2)
        self.async_line("fence.mbarrier_init.release.cluster;", 2)
        self.async_line("fence.proxy.async.shared::cta;", 2)
        self.line("}")
        self.line("barrier(CLK_LOCAL_MEM_FENCE);")
        self.lanes()
        ntm, ntn = i.range // tl.tm, j.range // tl.tn
        launched = min(groups, self.t.compute_units) if PERSISTENT and self.t.compute_units else groups
        self.line(f"if (warp == {warps}) {{")
        self.line("if (lane == 0) {", 2)
        self.line("uint it = 0;  /* K steps so far, over this work-group's tiles */", 3)
        self.tiles(ntm, ntn, launched, 3)
        self.loader(nks, stages, sa, sb, self.m0[i.name], self.n0[j.name], b_kf, 4)
        self.line("}", 2)
        self.line("} else {")
        self.line("uint it = 0;", 2)
        self.tiles(ntm, ntn, launched, 2)
        self.multiply(nks, stages, a_kf, b_kf, 3)
        self.line("}")
        threads = (warps + 1) * self.unit.lanes
        pos = {name: n for n, (name, _) in enumerate(params)}
        row_a = int(g.a.offset.coeff(i.name)) * self.size
        if b_kf:  # B[j, k] (K-major, 32-bit): K innermost, box kt x tn
            b_map = ((k.range, j.range), int(g.b.offset.coeff(j.name)) * self.size, (tl.kt, tl.tn))
        else:  # B[k, j]: N innermost, box 64 x kt
            b_map = ((j.range, k.range), int(g.b.offset.coeff(k.name)) * self.size, (64, tl.kt))
        # (float32 operands of ``tf32``: the copies round them to TF32, to nearest, ties to even;
        # ``3xtf32``'s split parts are TF32 values already)
        dtype = "tfloat32" if self.size == 4 else g.dtype.value
        self.launch = {
            "local_bytes": stages * (sa + sb + 16) + staging,
            "maps": [  # A[i, k]: K innermost, box kt x tm
                (pos[self.ptrs[g.a.ref.source]], (k.range, i.range), row_a, (tl.kt, tl.tm), dtype),
                (pos[self.ptrs[g.b.ref.source]], *b_map, dtype),
            ],
        }
        args = list(params) + [(m, DType.UINT8) for m in MAPS]
        return self.t.group_kernel(symbol, args, threads, self.lines), launched * threads, threads

    def tiles(self, ntm: int, ntn: int, launched: int, depth: int) -> None:
        """Open the loop over this work-group's tiles (every ``launched``-th from its own; one when
        each tile has a work-group) and bind the tile's origins, ``m0``/``n0`` (shadowing
        ``plans``'s): tiles numbered down bands of ``BAND`` tile rows, so the work-groups running
        at once share rows of A and columns of B in the L2 cache."""
        (i,), (j,) = self.g.m.idxs, self.g.n.idxs
        it, band = self.int, min(BAND, ntm) or ntm
        self.line(f"for ({it} tile = grp; tile < {ntm * ntn}; tile += {launched}) {{", depth)
        self.line(f"const {it} first = tile / {band * ntn} * {band};", depth + 1)
        self.line(f"const {it} rows = min(({it}){ntm} - first, ({it}){band});", depth + 1)
        self.line(f"const {it} {self.m0[i.name]} = (first + tile % {band * ntn} % rows) * {self.tl.tm};",
                  depth + 1)
        self.line(f"const {it} {self.n0[j.name]} = (tile % {band * ntn} / rows) * {self.tl.tn};", depth + 1)

    def multiply(self, nks: int, stages: int, a_kf: bool, b_kf: bool, depth: int) -> None:
        """The multiplying warps' products of one tile, each K step's buffer released once its
        products are done (``3xtf32``: each step's sums added to the running ones), then the store
        (and epilogue); closes the tile loop."""
        it, d = self.int, depth
        fn = self.tl.tn // self.op.n
        fold = self.mode == "3xtf32"
        sums = [(f"c0_{jj}_{e}", f"s0_{jj}_{e}") for jj in range(fn) for e in range(len(self.op.c.elements))]
        for acc in (0, 1) if fold else (0,):
            self.line(f"float {', '.join(f'{v[acc]} = 0.0f' for v in sums)};", d)
        self.line(f"for ({it} ks = 0; ks < {nks}; ks++, it++) {{", d)
        self.line(f"const uint buf = it % {stages};", d + 1)
        self.wait("Mb_at + 8 * buf", f"(it / {stages}) & 1", d + 1)
        if fold:  # the step's sums on their own, then added to the running ones rounding to nearest
            self.products(a_kf, b_kf, d + 1, "s", fresh=True)
            self.async_line("wgmma.wait_group.sync.aligned 0;", d + 1)
            for c, sv in sums:
                self.line(f"{c} += {sv};", d + 1)
            self.release(stages, "buf", "lane == 0", d + 1)
        else:  # the step's products left running while the next step's tiles arrive
            self.products(a_kf, b_kf, d + 1)
            self.async_line("wgmma.wait_group.sync.aligned 1;", d + 1)  # the step before's are done
            self.release(stages, f"(it - 1) % {stages}", "ks > 0 && lane == 0", d + 1)
        self.line("}", d)
        self.async_line("wgmma.wait_group.sync.aligned 0;", d)
        if not fold:  # the tile's last step (the next tile's copies may wait for it)
            self.release(stages, f"(it - 1) % {stages}", "lane == 0", d)
        self.store_tile(fn, d)
        self.line("}", d - 1)

    def release(self, stages: int, buf: str, when: str, depth: int) -> None:
        """One multiplying warp's arrival at buffer ``buf``'s *empty* barrier (after the ``stages``
        *full* ones), where ``when``."""
        self.line(f"if ({when}) {{", depth)
        empty = f'"r"(Mb_at + 8 * ({stages} + {buf}))'
        self.ptx("mbarrier.arrive.shared::cta.b64 _, [%0];", empty, depth + 1)
        self.line("}", depth)

    def loader(self, nks: int, stages: int, sa: int, sb: int, m0: str, n0: str, b_kf: bool, d: int) -> None:
        """The loading warp's first lane, per K step of the tile: once its buffer is empty, the
        step's bytes announced to its *full* barrier and the copies issued (B: one ``tn``-row copy
        when it is K-major, else one per 64 columns); closes the tile loop."""
        tl, it = self.tl, self.int
        self.line(f"for ({it} ks = 0; ks < {nks}; ks++, it++) {{", d)
        self.line(f"const uint s = it % {stages};", d + 1)
        self.line(f"if (it >= {stages}) {{", d + 1)
        self.wait(f"Mb_at + 8 * (s + {stages})", f"(it / {stages} - 1) & 1", d + 2)
        self.line("}", d + 1)
        self.line("const uint full = Mb_at + 8 * s;", d + 1)
        self.ptx(f"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], {sa + sb};", '"r"(full)', d + 1)
        self.copy("tmap_a", f"As_at + s * {sa}", f"ks * {tl.kt}", m0, d + 1)
        if b_kf:
            self.copy("tmap_b", f"Bs_at + s * {sb}", f"ks * {tl.kt}", n0, d + 1)
        else:
            for p in range(tl.tn // 64):
                dst = f"Bs_at + s * {sb} + {p * tl.kt * 128}"
                self.copy("tmap_b", dst, f"{n0} + {64 * p}", f"ks * {tl.kt}", d + 1)
        self.line("}", d)
        self.line("}", d - 1)

    def ptx(self, text: str, ins: str, depth: int) -> None:
        """A marked instruction taking ``ins`` (input operands)."""
        self.line(f'asm volatile("{SM90A}{text}" :: {ins} : "memory");', depth)

    def wait(self, bar: str, parity: str, depth: int) -> None:
        """Spin until the ``mbarrier`` at ``bar`` has completed its phase of ``parity``."""
        self.line("{", depth)
        self.line("uint done = 0;", depth + 1)
        self.line("while (!done) {", depth + 1)
        text = (
            f"{SM90A}{{ .reg .pred P; mbarrier.try_wait.parity.shared::cta.b64 P, [%1], %2; "
            "selp.u32 %0, 1, 0, P; }"
        )
        self.line(f'asm volatile("{text}" : "=r"(done) : "r"({bar}), "r"((uint)({parity})) : "memory");',
                  depth + 2)
        self.line("}", depth + 1)
        self.line("}", depth)

    def copy(self, tmap: str, dst: str, c0: str, c1: str, depth: int) -> None:
        """One tile of the tensor map ``tmap`` at coordinates (``c0``, ``c1``), innermost first,
        into local memory at ``dst``, completing the barrier ``full``."""
        text = (
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
            "[%0], [%1, {%2, %3}], [%4];"
        )
        ins = f'"r"({dst}), "l"((ulong){tmap}), "r"((int)({c0})), "r"((int)({c1})), "r"(full)'
        self.ptx(text, ins, depth)
