"""Whole-line stores of a launched GEMM's output tiles (``tma``), through ``__local`` memory.

The unit leaves each lane two adjacent columns of a row per 8 columns (the accumulator fragment:
rows ``lg`` and ``lg + 8``, columns ``2·lt, 2·lt + 1``), so storing the sums where they sit writes
2 or 4 bytes per lane, eight rows per instruction: a large share of the launched kernel's time
(figures: bench/RESULTS.md, "Figures moved from docstrings").

Here each warp passes its 16 rows through a ``__local`` region of its own, 128 bytes of columns
at a time (64 float16 columns, 32 float32 ones):

1. each pair of adjacent sums is finished by the fused epilogue into registers (``into``:
   ``KernelEmitter.epilogue`` stores the output element there instead), rounded to the output's
   type as the epilogue's store would (float16 and bfloat16: to nearest even, two at once) and
   written as one 4-byte (8-byte for float32) ``__local`` store, the row's 16-byte chunks swizzled
   by the row (chunk ``c`` of row ``r`` at ``c XOR (r mod 8)``, float32: ``c XOR (2·r mod 8)``), so
   the lanes of each of a store's phases hit distinct banks;
2. after the warp synchronizes, each lane reads back one whole 16-byte chunk (four rows of 128
   bytes per instruction, conflict-free under the same swizzle) and stores it to global memory
   in one 16-byte store: whole 128-byte lines;
3. the warp synchronizes again before its region is reused.

Only where it is the same store: the epilogue stores one buffer (plainly, not read back, its
element type the buffer's: float16, bfloat16 or float32), at an element offset ``Σ s_i·m_i + n +
c`` over the GEMM's M indexes (a convolution's batch, rows and columns) and its one N index, with
every ``s_i`` and ``c`` multiples of a 16-byte chunk's elements (OpenCL buffers are aligned to at
least 16 bytes), no batch, no store guards, tiles dividing every index's range (``plan``).
Otherwise ``store_mma``'s stores stay.

Where: the launched kernel (``tma``: a region of its own after the K steps' buffers, while it
costs no K step in flight) and OpenCL's warp-group kernel (``wgmma``: the K steps' buffers
themselves, after a barrier, as each work-group does one tile).
"""

from __future__ import annotations

from dataclasses import dataclass

from stripe.ir import Block, Load, RefDir, Special, Store
from tile.affine import Affine
from tile.dtypes import DType

ROW_BYTES = 128  # columns a warp stages per pass, in bytes
WARP_BYTES = 16 * ROW_BYTES  # a warp's region: its 16 rows
PAIRS = ((0, 0), (0, 1), (8, 0), (8, 1))  # the accumulator fragment's elements this needs
PACK = {DType.FLOAT16: "f16x2", DType.BFLOAT16: "bf16x2"}  # 16-bit outputs: two rounded at once


@dataclass(frozen=True)
class Staged:
    source: str  # the stored buffer
    ptr: str  # its kernel parameter
    dtype: DType  # its element type
    offset: Affine  # the element's offset, over the GEMM's M and N indexes


def plan(g, frag, tiles, ptrs: dict[str, str], params) -> Staged | None:
    """How the output of ``g``'s ``tiles`` (``frag``: the unit's accumulator fragment; ``ptrs``
    and ``params``: the kernel's parameters) is stored through ``__local`` memory, or None
    (module docstring)."""
    if g.epilogue is None or g.out is not None or g.batch.idxs or g.store_guards:
        return None
    if len(g.n.idxs) != 1 or tuple(map(tuple, frag.elements)) != PAIRS:
        return None
    if tuple(frag.rows) != (1, 0) or tuple(frag.cols) != (0, 2):  # rows lg, columns 2·lt
        return None
    if any(ix.range % tiles.per[ix.name] for ix in g.m.idxs + g.n.idxs):  # no tile overhangs
        return None
    block, _ = g.epilogue
    rest = block.stmts[1:]
    stores = [s for s in rest if isinstance(s, Store)]
    if len(stores) != 1 or any(isinstance(s, (Block, Special)) for s in rest):
        return None
    ref = next((r for r in block.refs if r.into == stores[0].into), None)
    if ref is None or ref.dir is not RefDir.OUT or ref.agg_op not in ("", "assign"):
        return None
    if any(isinstance(s, Load) and s.from_ == ref.into for s in rest) or ref.source not in ptrs:
        return None
    dt, types = ref.shape.dtype, dict(params)
    if dt not in (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32) or types.get(ptrs[ref.source]) is not dt:
        return None
    if tiles.tn * (dt.bits // 8) % ROW_BYTES:  # whole passes of 128 bytes
        return None
    offset = Affine.constant(0)
    for a, d in zip(ref.access, ref.shape.dims):
        offset = offset + a * d.stride
    per, (n,) = 16 // (dt.bits // 8), g.n.idxs
    rows = {ix.name for ix in g.m.idxs}
    if set(offset.vars) - rows - {n.name} or offset.coeff(n.name) != 1 or offset.const % per:
        return None
    if any(offset.coeff(r) % per for r in rows):
        return None
    return Staged(ref.source, ptrs[ref.source], dt, offset)


def emit(em, st: Staged, fn: int, d: int) -> None:
    """The warp's stores of its ``16 x 8·fn`` sums, ``Cs_at`` the work-group's regions (the
    warp-group layout: warp ``wy`` owns tile rows ``16·wy ..`` and every column)."""
    cols = ROW_BYTES // (st.dtype.bits // 8)  # per pass
    rows, places, _ = em.places(1, fn)
    em.line(f"const uint Ws_at = Cs_at + warp * {WARP_BYTES};", d)
    em.line("float o0[1], o1[1];", d)
    for p in range(em.tl.tn // cols):
        for j in range(p * cols // 8, (p + 1) * cols // 8):
            for e in (0, 2):  # the pair in row lg, then in row lg + 8
                em.line("{", d)
                for x in (0, 1):
                    env = {**rows[(0, PAIRS[e][0])], **places[(j, x)]}
                    em.epilogue(em.lines, env, f"c0_{j}_{e + x}", d + 1, into=(st.source, f"o{x}"))
                stage_pair(em, st, PAIRS[e][0], 8 * j - p * cols, d + 1)
                em.line("}", d)
        em.async_line("bar.warp.sync -1;", d)
        copy_out(em, st, p * cols, d)
        em.async_line("bar.warp.sync -1;", d)


def swizzle(st: Staged, row: str) -> str:
    """What a staged row's 16-byte chunks are XOR-ed with: the row, times the chunks one store
    instruction writes per row (a row's four lanes write 16 bytes of 16-bit values, 32 of float32
    ones: the four rows of a half-warp's 8-byte stores then fill distinct chunk pairs)."""
    per_row = st.dtype.bits // 16
    return f"{row} & 7" if per_row == 1 else f"({row} * {per_row}) & 7"


def stage_pair(em, st: Staged, row: int, col: int, d: int) -> None:
    """``o0``, ``o1`` (columns ``col + 2·lt`` and one more of the pass, row ``row + lg``) as the
    output's type into the warp's region, one store."""
    es = st.dtype.bits // 8
    em.line(f"const uint sb = {col * es} + 2 * lt * {es};", d)  # the byte in the staged row
    at = f"Ws_at + ({row} + lg) * {ROW_BYTES} + (((sb >> 4) ^ ({swizzle(st, 'lg')})) << 4) + (sb & 15)"
    if st.dtype in PACK:  # (``cvt`` puts its first source in the upper half)
        text = f"{{ .reg .b32 h; cvt.rn.{PACK[st.dtype]}.f32 h, %1, %0; st.shared.b32 [%2], h; }}"
    else:
        text = "st.shared.v2.f32 [%2], {%0, %1};"
    em.line(f'asm volatile("{em.MARK}{text}" :: "f"(o0[0]), "f"(o1[0]), "r"({at}) : "memory");', d)


def copy_out(em, st: Staged, col: int, d: int) -> None:
    """The warp's 16 staged rows (columns ``col ..`` of the tile) to the output: a 16-byte chunk
    per lane, four rows per instruction."""
    (n,) = em.g.n.idxs
    per = 16 // (st.dtype.bits // 8)
    load = f"{em.MARK}ld.shared.v4.b32 {{%0, %1, %2, %3}}, [%4];"
    at = f"Ws_at + sr * {ROW_BYTES} + ((sc ^ ({swizzle(st, 'sr')})) << 4)"
    for q in range(4):
        em.line("{", d)
        em.line(f"const int sr = {4 * q} + lane / 8, sc = lane % 8;", d + 1)
        em.line(f"const {em.int} tr = {em.block_pos('sr', 'm')};", d + 1)  # the tile row
        vals = {v: f"((long){x})" for v, x in em.at(em.g.m, "tr", em.m0).items()}
        vals[n.name] = f"((long)({em.n0[n.name]} + {col} + sc * {per}))"
        em.line("uint x, y, z, w;", d + 1)
        em.line(f'asm volatile("{load}" : "=r"(x), "=r"(y), "=r"(z), "=r"(w) : "r"({at}) : "memory");', d + 1)
        dst = f"(__global uint4*)({st.ptr} + {em.affine(st.offset, vals)})"
        em.line(f"*{dst} = (uint4)(x, y, z, w);", d + 1)
        em.line("}", d)
