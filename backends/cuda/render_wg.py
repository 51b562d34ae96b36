"""The warp-group kernel (``backends.cuda.wgmma``) of a schedule, printed: hand-staged swizzled
tiles (asynchronous copies), descriptors, one group of ``wgmma`` products per K step, A's skipped
points summed again where a tile came out tainted, and the store (``tile_store``'s whole lines or
each sum where it sits). ``products`` and ``store_tile`` serve the launched kernel
(``render_tma``) too. ``r`` is the ``render.Render`` printing the schedule."""

from __future__ import annotations

from backends.cuda import mma_skips, tile_store
from backends.cuda.mma import COMMIT
from backends.cuda.wgmma import SM90A, SWIZZLE, descriptor
from tile.dtypes import DType


def kernel(r, symbol: str, params: list[tuple[str, DType]]) -> tuple[str, int, int]:
    """The warp-group kernel of ``r``'s schedule (``backends.cuda.wgmma``)."""
    s, g, tl, it = r.s, r.g, r.tl, r.int
    nks, groups, (a_items, a_kf, aw), (b_items, b_kf, bw) = r.plans()
    sa, sb, stages = s.a.elements, s.b.elements, s.stages  # elements of one K step's tile
    for name, size in (("A", sa), ("B", sb)):  # 1024-aligned: the swizzle reads address bits
        words = stages * size * r.size // 16
        r.line(f"__local uint4 {name}s4[{words}] __attribute__((aligned(1024)));")
        r.line(f"const uint {name}s_at = (uint)(ulong){name}s4;")
        r.line(f"__local {r.U}* {name}s = (__local {r.U}*){name}s4;")
    if s.skips:  # A's skipped points: ``tainted`` below
        r.line(f"__local uchar Am[{sa // aw}];")
        r.line("__local int tainted;")
        r.line("if (lid == 0) tainted = 0;")
        r.line("barrier(CLK_LOCAL_MEM_FENCE);")
    r.lanes()
    _, fn = s.fragments
    for j in range(fn):
        zeros = ", ".join(f"c0_{j}_{e} = 0.0f" for e in range(len(r.op.c.elements)))
        r.line(f"float {zeros};")
    if g.k.idxs:
        r.line(f"{it} " + ", ".join(f"ko_{ix.name} = 0" for ix in g.k.idxs) + ";")
    ops = ((g.a, a_items, "As", sa, aw, a_kf, 0), (g.b, b_items, "Bs", sb, bw, b_kf, 0))
    k_loop(r, ops, stages, nks)
    if s.skips:
        sums = [f"c0_{j}_{e}" for j in range(fn) for e in range(len(r.op.c.elements))]
        mma_skips.note_nonfinite_sums(r, sums, 1)
        tainted_tile(r, ops, nks, sa, sb, fn, aw)
    if s.lines:
        r.line("barrier(CLK_LOCAL_MEM_FENCE);")  # every warp's products are done: the K
        r.line("const uint Cs_at = As_at;")  # steps' buffers hold the output rows
    store_tile(r, fn, 1)
    return r.t.group_kernel(symbol, params, tl.threads, r.lines), groups * tl.threads, tl.threads


def layout(r, st) -> tuple[str, int]:
    """An operand's descriptor constant (its ``Staging``: K-major rows of ``swizzle`` bytes, else
    128-byte panels) and the bytes from one K slice (32 bytes: 16 16-bit or 8 32-bit values) to
    the next."""
    if st.kfast:
        return descriptor(16, 8 * st.swizzle, SWIZZLE[st.swizzle]), 32
    return descriptor(r.tl.kt * 128, 1024, SWIZZLE[st.swizzle]), 16 * 128


def store_tile(r, fn: int, depth: int) -> None:
    """The warp's sums to the output: whole lines through ``Cs_at`` where the schedule's ``lines``
    say so (``tile_store``), else each where it sits (``store_mma``)."""
    if r.s.lines:
        tile_store.emit(r, r.s.lines, fn, depth)
    else:
        r.store_mma(1, fn)


def k_loop(r, ops, stages: int, nks: int) -> None:
    """The K loop (``backends.cuda.wgmma``): copies ``stages - 1`` steps ahead of the products."""
    it = r.int
    r.prefetch(ops, stages, nks, False)
    r.line(f"for ({it} ks = 0; ks < {nks}; ks++) {{")
    r.line(f"const uint buf = ks % {stages};", 2)
    r.line(f'asm volatile("cp.async.wait_group {stages - 2};" ::: "memory");', 2)
    r.async_line("fence.proxy.async.shared::cta;", 2)  # the copies, visible to the unit
    r.line("barrier(CLK_LOCAL_MEM_FENCE);", 2)
    r.refill(ops, stages, nks, 2, False)  # every warp has finished the previous step's products
    products(r, 2)
    r.async_line("wgmma.wait_group.sync.aligned 0;", 2)  # this step's products done
    r.line("}")


def products(r, depth: int, acc: str = "c", fresh: bool = False) -> None:
    """The warp group's products of the K step in buffer ``buf``, issued as one group, into the
    accumulators ``acc`` (``fresh``: the first product overwrites them)."""
    tl, a, b = r.tl, r.s.a, r.s.b
    r.async_line("wgmma.fence.sync.aligned;", depth)
    (a_desc, a_step), (b_desc, b_step) = layout(r, a), layout(r, b)
    a_at = f"As_at + buf * {tl.tm * tl.kt * r.size} + (wy >> 2) * {64 * tl.kt * r.size}"
    b_at = f"Bs_at + buf * {tl.tn * tl.kt * r.size}"
    for kk in range(tl.kt * r.size // 32):
        r.line("{", depth)
        for d, at, step, desc in (("ad", a_at, a_step, a_desc), ("bd", b_at, b_step, b_desc)):
            start = f"(({at} + {kk * step}) & 0x3FFFF) >> 4"
            r.line(f"const ulong {d} = (ulong)({start}) | {desc};", depth + 1)
        product(r, int(not a.kfast), int(not b.kfast), depth + 1, acc, fresh and kk == 0)
        r.line("}", depth)
    r.async_line("wgmma.commit_group.sync.aligned;", depth)


def tainted_tile(r, ops, nks: int, sa: int, sb: int, fn: int, aw: int) -> None:
    """A's skipped points (a padded convolution's input) were copied as zeros, so the unit
    added ``0 x b`` for each: nothing, unless ``b`` is infinite or NaN. When a work-item's
    sums came out infinite or NaN (``tainted``, uniform after the barrier; checked once per
    tile, not per step: a check per step cost a measurable share of the kernel) the tile is
    summed again without the unit, after its last products: each step restaged with A's
    flags (``Am``) and multiplied in ``mma_skips``'s plain loop, which leaves the skipped
    points out."""
    r.line("barrier(CLK_LOCAL_MEM_FENCE);")
    r.line("if (tainted) {")
    for j in range(fn):
        for e in range(len(r.op.c.elements)):
            r.line(f"c0_{j}_{e} = 0.0f;", 2)
    r.line("const uint buf = 0;", 2)
    r.line(f"for ({r.int} ks = 0; ks < {nks}; ks++) {{", 2)
    r.k_origins("ks", 3)
    r.copies(ops, "0", 3, True)  # with A's flags
    r.line(COMMIT, 3)
    r.line('asm volatile("cp.async.wait_group 0;" ::: "memory");', 3)
    r.line("barrier(CLK_LOCAL_MEM_FENCE);", 3)
    mma_skips.slow_step(r, sa, sb, 1, fn, aw, 3)
    r.line("barrier(CLK_LOCAL_MEM_FENCE);", 3)
    r.line("}", 2)
    r.line("}")


def product(r, trans_a: int, trans_b: int, depth: int, acc: str = "c", fresh: bool = False) -> None:
    """One ``m64 x tn x k16`` product (``k8`` of 32-bit operands, ``tf32``: both read K-major,
    so no transposition flags) of the warp group into its accumulators (``{acc}0_j_e``, the
    ``e``-th element of columns ``8j ..``; ``fresh``: replacing their values), from the
    descriptors ``ad`` and ``bd``."""
    tn = r.tl.tn
    kind = {"f16": "f16", "bf16": "bf16"}.get(r.s.mode, "tf32")
    sums = [f"{acc}0_{j}_{e}" for j in range(tn // r.op.n) for e in range(len(r.op.c.elements))]
    n = len(sums)
    regs = ",".join(f"%{x}" for x in range(n))
    if kind == "tf32":
        assert not trans_a and not trans_b, "the unit reads 32-bit operands K-major only"
    flags = "" if kind == "tf32" else f", {trans_a}, {trans_b}"
    text = (
        f"{SM90A}{{ .reg .pred p; setp.ne.b32 p, %{n + 2}, 0; "
        f"wgmma.mma_async.sync.aligned.m64n{tn}k{32 // r.size}.f32.{kind}.{kind} "
        f"{{{regs}}}, %{n}, %{n + 1}, p, 1, 1{flags}; }}"
    )
    outs = ", ".join(f'"+f"({v})' for v in sums)
    r.line(f'asm volatile("{text}" : {outs} : "l"(ad), "l"(bd), "r"({int(not fresh)}));', depth)
