"""The launched kernel (``backends.cuda.tma``) of a schedule, printed: one warp issues the tensor
memory accelerator's copies per K step and the multiplying warps issue the warp-group products,
handing the stages over through ``mbarrier``s, each work-group looping over its tiles in the
schedule's ``TileOrder``. ``r`` is the ``render.Render`` printing the schedule."""

from __future__ import annotations

from backends.cuda import render_wg
from backends.cuda.tma import DYNAMIC, MAPS
from backends.cuda.wgmma import SM90A
from tile.dtypes import DType


def kernel(r, symbol: str, params: list[tuple[str, DType]]) -> tuple[str, int, int]:
    """The launched kernel of ``r``'s schedule (``backends.cuda.tma``)."""
    s, g = r.s, r.g
    nks, _, _, _ = r.plans()
    (i,), (j,) = g.m.idxs, g.n.idxs
    sa, sb = s.a.elements * r.size, s.b.elements * r.size  # bytes of one step's tiles
    warps, stages, order = s.warps.multiplying, s.stages, s.order  # warp ``warps`` loads
    staging = s.out_bytes  # the warps' output rows (``s.lines``)
    r.line("uint Ds_at;")
    r.line(f'asm("{SM90A}mov.u32 %0, {DYNAMIC};" : "=r"(Ds_at));')
    r.line("const uint As_at = Ds_at;")
    r.line(f"const uint Bs_at = Ds_at + {stages * sa};")
    r.line(f"const uint Cs_at = Ds_at + {stages * (sa + sb)};")  # the warps' output rows
    r.line(f"const uint Mb_at = Cs_at + {staging};")  # full[s], then empty[s]
    r.line("if (lid == 0) {")
    for st in range(stages):
        r.ptx("mbarrier.init.shared::cta.b64 [%0], 1;", f'"r"(Mb_at + {8 * st})', 2)
        r.ptx(f"mbarrier.init.shared::cta.b64 [%0], {warps};", f'"r"(Mb_at + {8 * (stages + st)})', 2)
    r.async_line("fence.mbarrier_init.release.cluster;", 2)
    r.async_line("fence.proxy.async.shared::cta;", 2)
    r.line("}")
    r.line("barrier(CLK_LOCAL_MEM_FENCE);")
    r.lanes()
    r.line(f"if (warp == {warps}) {{")
    r.line("if (lane == 0) {", 2)
    r.line("uint it = 0;  /* K steps so far, over this work-group's tiles */", 3)
    tiles(r, order, 3)
    loader(r, nks, stages, sa, sb, r.m0[i.name], r.n0[j.name], 4)
    r.line("}", 2)
    r.line("} else {")
    r.line("uint it = 0;", 2)
    tiles(r, order, 2)
    multiply(r, nks, stages, 3)
    r.line("}")
    threads = s.threads
    args = list(params) + [(m, DType.UINT8) for m in MAPS]
    return r.t.group_kernel(symbol, args, threads, r.lines), order.launched * threads, threads


def tiles(r, order, depth: int) -> None:
    """Open the loop over this work-group's tiles (every ``launched``-th from its own; one when
    each tile has a work-group) and bind the tile's origins, ``m0``/``n0`` (shadowing
    ``plans``'s): tiles numbered down bands of ``order.band`` tile rows, so the work-groups
    running at once share rows of A and columns of B in the L2 cache."""
    (i,), (j,) = r.g.m.idxs, r.g.n.idxs
    it, band, ntm, ntn, launched = r.int, order.band, order.rows, order.cols, order.launched
    r.line(f"for ({it} tile = grp; tile < {ntm * ntn}; tile += {launched}) {{", depth)
    r.line(f"const {it} first = tile / {band * ntn} * {band};", depth + 1)
    r.line(f"const {it} rows = min(({it}){ntm} - first, ({it}){band});", depth + 1)
    r.line(f"const {it} {r.m0[i.name]} = (first + tile % {band * ntn} % rows) * {r.tl.tm};",
              depth + 1)
    r.line(f"const {it} {r.n0[j.name]} = (tile % {band * ntn} / rows) * {r.tl.tn};", depth + 1)


def multiply(r, nks: int, stages: int, depth: int) -> None:
    """The multiplying warps' products of one tile, each K step's buffer released once its
    products are done (``3xtf32``: each step's sums added to the running ones), then the store
    (and epilogue); closes the tile loop."""
    it, d = r.int, depth
    fn = r.tl.tn // r.op.n
    fold = r.s.fold
    sums = [(f"c0_{jj}_{e}", f"s0_{jj}_{e}") for jj in range(fn) for e in range(len(r.op.c.elements))]
    for acc in (0, 1) if fold else (0,):
        r.line(f"float {', '.join(f'{v[acc]} = 0.0f' for v in sums)};", d)
    r.line(f"for ({it} ks = 0; ks < {nks}; ks++, it++) {{", d)
    r.line(f"const uint buf = it % {stages};", d + 1)
    wait(r, "Mb_at + 8 * buf", f"(it / {stages}) & 1", d + 1)
    if fold:  # the step's sums on their own, then added to the running ones rounding to nearest
        render_wg.products(r, d + 1, "s", fresh=True)
        r.async_line("wgmma.wait_group.sync.aligned 0;", d + 1)
        for c, sv in sums:
            r.line(f"{c} += {sv};", d + 1)
        release(r, stages, "buf", "lane == 0", d + 1)
    else:  # the step's products left running while the next step's tiles arrive
        render_wg.products(r, d + 1)
        r.async_line("wgmma.wait_group.sync.aligned 1;", d + 1)  # the step before's are done
        release(r, stages, f"(it - 1) % {stages}", "ks > 0 && lane == 0", d + 1)
    r.line("}", d)
    r.async_line("wgmma.wait_group.sync.aligned 0;", d)
    if not fold:  # the tile's last step (the next tile's copies may wait for it)
        release(r, stages, f"(it - 1) % {stages}", "lane == 0", d)
    render_wg.store_tile(r, fn, d)
    r.line("}", d - 1)


def release(r, stages: int, buf: str, when: str, depth: int) -> None:
    """One multiplying warp's arrival at buffer ``buf``'s *empty* barrier (after the ``stages``
    *full* ones), where ``when``."""
    r.line(f"if ({when}) {{", depth)
    empty = f'"r"(Mb_at + 8 * ({stages} + {buf}))'
    r.ptx("mbarrier.arrive.shared::cta.b64 _, [%0];", empty, depth + 1)
    r.line("}", depth)


def loader(r, nks: int, stages: int, sa: int, sb: int, m0: str, n0: str, d: int) -> None:
    """The loading warp's first lane, per K step of the tile: once its buffer is empty, the
    step's bytes announced to its *full* barrier and the copies issued (B: one ``tn``-row copy
    when it is K-major, else one per 64 columns); closes the tile loop."""
    tl, it = r.tl, r.int
    r.line(f"for ({it} ks = 0; ks < {nks}; ks++, it++) {{", d)
    r.line(f"const uint s = it % {stages};", d + 1)
    r.line(f"if (it >= {stages}) {{", d + 1)
    wait(r, f"Mb_at + 8 * (s + {stages})", f"(it / {stages} - 1) & 1", d + 2)
    r.line("}", d + 1)
    r.line("const uint full = Mb_at + 8 * s;", d + 1)
    r.ptx(f"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], {sa + sb};", '"r"(full)', d + 1)
    copy(r, "tmap_a", f"As_at + s * {sa}", f"ks * {tl.kt}", m0, d + 1)
    if r.s.b.kfast:
        copy(r, "tmap_b", f"Bs_at + s * {sb}", f"ks * {tl.kt}", n0, d + 1)
    else:
        for p in range(tl.tn // 64):
            dst = f"Bs_at + s * {sb} + {p * tl.kt * 128}"
            copy(r, "tmap_b", dst, f"{n0} + {64 * p}", f"ks * {tl.kt}", d + 1)
    r.line("}", d)
    r.line("}", d - 1)


def wait(r, bar: str, parity: str, depth: int) -> None:
    """Spin until the ``mbarrier`` at ``bar`` has completed its phase of ``parity``."""
    r.line("{", depth)
    r.line("uint done = 0;", depth + 1)
    r.line("while (!done) {", depth + 1)
    text = (
        f"{SM90A}{{ .reg .pred P; mbarrier.try_wait.parity.shared::cta.b64 P, [%1], %2; "
        "selp.u32 %0, 1, 0, P; }"
    )
    r.line(f'asm volatile("{text}" : "=r"(done) : "r"({bar}), "r"((uint)({parity})) : "memory");',
              depth + 2)
    r.line("}", depth + 1)
    r.line("}", depth)


def copy(r, tmap: str, dst: str, c0: str, c1: str, depth: int) -> None:
    """One tile of the tensor map ``tmap`` at coordinates (``c0``, ``c1``), innermost first,
    into local memory at ``dst``, completing the barrier ``full``."""
    text = (
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%2, %3}], [%4];"
    )
    ins = f'"r"({dst}), "l"((ulong){tmap}), "r"((int)({c0})), "r"((int)({c1})), "r"(full)'
    r.ptx(text, ins, depth)
