"""The renderer of a tensor-core GEMM kernel: prints a ``schedule.GemmSchedule`` as OpenCL C with
inline PTX, deciding nothing itself.

``Render`` holds what every kernel prints alike: the work-group's place and each operand's
element plans (``plans``), the lanes' warps and fragment places (``lanes``, ``block_pos``: by the
schedule's ``Warps.rows``), where a staged element goes (``staged_index``, ``destination``: padded
rows or the unit's swizzle, by the schedule's ``Staging``), register loads and asynchronous copies
(``load``, ``copies``, ``prefetch``, ``refill``) and the stores of the sums where they sit
(``places``, ``store_mma``). The K loops are the kernel's: ``render_mma`` (warp-level products),
``render_wg`` (warp-group products from hand-staged tiles) and ``render_tma`` (a loading warp and
the tensor memory accelerator); ``mma_skips`` and ``tile_store`` print their parts with it too.

``unit_emitter`` is the entry point (``CTarget.unit_emitter``, through ``backends.opencl.vendors``
or a CUDA dialect): a plan naming the unit becomes a ``UnitKernel``, which plans the schedule once
it has the kernel's parameters and renders it.
"""

from __future__ import annotations

from backends.clike.gemm_writer import GemmWriter, Tiles, count
from backends.clike.target import CTarget
from backends.cuda import mma_skips, render_mma, render_tma, render_wg
from backends.cuda.mma import COMMIT, slot
from backends.cuda.schedule import GemmSchedule, operation, plan
from backends.cuda.wgmma import SM90A
from stripe.gemm import Gemm, Operand
from tile.dtypes import DType

_KERNELS = {"mma": render_mma.kernel, "wgmma": render_wg.kernel, "tma": render_tma.kernel}


def unit_emitter(t: CTarget, g: Gemm, ptrs: dict[str, str], tiles: Tiles, unit: str, epilogue=None):
    """The kernel of a nest whose plan names ``unit`` (``name.mode``) where the target has that unit
    and mode (``schedule.operation``), else None (``CTarget.unit_emitter``)."""
    found = operation(t.matrix_units, unit)
    return UnitKernel(t, g, ptrs, tiles, *found, epilogue) if found is not None else None


class UnitKernel:
    """A nest on the unit: ``source`` plans its schedule (``schedule``, kept) and renders it;
    ``launch`` is the launch record of a launched kernel (None otherwise)."""

    def __init__(self, t: CTarget, g: Gemm, ptrs: dict[str, str], tiles: Tiles, unit, op, mode: str,
                 epilogue=None):
        self.t, self.g, self.ptrs, self.tiles, self.epilogue = t, g, ptrs, tiles, epilogue
        self.unit, self.op, self.mode = unit, op, mode
        self.schedule: GemmSchedule | None = None
        self.launch: dict | None = None

    def source(self, symbol: str, params: list[tuple[str, DType]]) -> tuple[str, int, int]:
        s = plan(self.t, self.g, self.ptrs, params, self.tiles, self.unit, self.op, self.mode)
        self.schedule, self.launch = s, s.launch
        return Render(self.t, self.g, self.ptrs, s, self.epilogue).source(symbol, params)


class Render(GemmWriter):
    """Prints one schedule (module docstring)."""

    MARK = SM90A  # (for ``tile_store``'s instructions)

    def __init__(self, t: CTarget, g: Gemm, ptrs: dict[str, str], s: GemmSchedule, epilogue=None):
        super().__init__(t, g, ptrs, s.tiles, s.int_type, epilogue)
        self.s, self.op, self.mode, self.size = s, s.op, s.mode, s.element_bytes
        self.U = "ushort" if self.size == 2 else "uint"
        self.bases: tuple = ()  # (``render_mma``) each lane's fragment offsets, per operand

    def source(self, symbol: str, params: list[tuple[str, DType]]) -> tuple[str, int, int]:
        """The kernel's text, its work-items and its work-group size."""
        return _KERNELS[self.s.kernel](self, symbol, params)

    def staging(self, name: str):
        return self.s.a if name == "a" else self.s.b

    # ------------------------------------------------------------------ places
    def plans(self) -> tuple[int, int, tuple, tuple]:
        """The work-group's place (``lid``, ``grp``, the tile origins ``m0``/``n0``, the batch) and
        each operand's load plan (``operand_plan``): (K steps, work-groups, A's plan, B's)."""
        g, tl, it, s = self.g, self.tl, self.int, self.s
        ntm, ntn = count(g.m, tl.per), count(g.n, tl.per)
        self.line(f"const {it} lid = ({it})get_local_id(0);")
        self.line(f"const {it} grp = ({it})get_group_id(0);")
        self.m0 = self.decompose(g.m, f"((grp / {ntn}) % {ntm})", "m0", 1, self.counts(g.m), tl.per)
        self.n0 = self.decompose(g.n, f"(grp % {ntn})", "n0", 1, self.counts(g.n), tl.per)
        batch = self.decompose(g.batch, f"(grp / {ntn * ntm})", "bt", 1) if g.batch.idxs else {}
        a = self.operand_plan(g.a, g.m, tl.tm, "ea", self.m0, batch, s.a.kfast, s.a.width)
        b = self.operand_plan(g.b, g.n, tl.tn, "eb", self.n0, batch, s.b.kfast, s.b.width)
        return s.k_steps, s.groups, a, b

    def lanes(self) -> None:
        """The lane's warp (``wy``, ``wx`` as the nest's thread layout has them) and its place in the
        fragments (``lg``, ``lt``)."""
        tl, s = self.tl, self.s
        txn = tl.tn // tl.rn
        self.line(f"const int warp = (int)lid / {s.lanes};")
        self.line(f"const int lane = (int)lid % {s.lanes};")
        self.line(f"const int wy = warp / {txn};")
        self.line(f"const int wx = warp % {txn};")
        self.line(f"const int lg = lane / {s.group};")
        self.line(f"const int lt = lane % {s.group};")

    def block_pos(self, frag_pos: str, side: str) -> str:
        """The tile row (``side`` m) or column (n) of position ``frag_pos`` (an expression) of the
        warp's register block: in the nest's layout, or (``Warps.rows`` ``unit``) warp ``wy``
        owning tile rows ``16·wy ..`` and every column."""
        tl = self.tl
        if self.s.warps.rows == "unit":
            return f"(wy * {tl.rm} + ({frag_pos}))" if side == "m" else f"({frag_pos})"
        stride = tl.tm * 8 // tl.rm if side == "m" else tl.tn * 8 // tl.rn
        w = "wy" if side == "m" else "wx"
        return f"((({frag_pos}) >> 3) * {stride} + {w} * 8 + (({frag_pos}) & 7))"

    def lane_part(self, coeffs: tuple[int, int]) -> str:
        parts = [f"{c} * {v}" if c != 1 else v for c, v in zip(coeffs, ("lg", "lt")) if c]
        return " + ".join(parts) or "0"

    # ----------------------------------------------------------------- staging
    def swizzled(self) -> bool:
        return bool(self.s.a.swizzle)

    def staged_index(self, name: str, pos: str, k: str, size: int) -> str:
        """The index in operand ``name``'s staged tiles (buffer ``buf``, ``size`` elements each) of
        its element at tile row (column) ``pos`` and K position ``k``."""
        st = self.staging(name)
        if self.swizzled():
            return f"buf * {size} + ({byte_at(self.tl.kt, pos, k, st.kfast)}) / 2"
        row = st.row
        return f"buf * {size} + " + (f"{pos} * {row} + {k}" if st.kfast else f"{k} * {row} + {pos}")

    def flag_index(self, p: str, stage: str, size: int, kfast: bool, row: int) -> str:
        """The staged index of element ``p``'s chunk, whose flag ``mma_skips.flag`` writes."""
        if self.swizzled():
            return f"{stage} * {size} + ({byte_at(self.tl.kt, f'{p}_mm', f'{p}_kk', kfast)}) / 2"
        return slot(p, stage, size, kfast, row)

    def destination(self, arr: str, p: str, stage: str, size: int, kfast: bool, row: int) -> str:
        """The ``__local`` address (32 bits) element ``p`` of a K step is copied to."""
        if self.swizzled():
            return swizzled_destination(arr, p, stage, size, kfast, self.tl.kt, self.size)
        return f"(uint)(ulong)({arr} + {slot(p, stage, size, kfast, row)})"

    # ------------------------------------------------------------------- loads
    def load(self, op: Operand, items, depth: int, w: int = 1, flag: bool = False) -> None:
        """``{p}_ld``: the operand's bits at each element ``p`` (``w`` from there) for the K tile at
        the origins ``ko_*`` (zero where a guard drops it; with ``flag``, ``{p}_in`` says whether
        the guards keep it)."""
        vec = f"{self.U}{w}" if w > 1 else self.U
        base = f"(__global const {self.U}*){self.ptrs[op.ref.source]}"
        for p, vals, kvals, _, _ in items:
            kept, addr = self.element(op, p, vals, kvals, depth)
            value = f"*(__global const {vec}*)({base} + {addr})"
            if flag:
                self.line(f"{p}_in = {kept};", depth + 1)
                kept = f"{p}_in"
            self.line(f"{p}_ld = ({kept}) ? {value} : ({vec})(0); }}", depth + 1)

    def prefetch(self, ops, stages: int, nks: int, flags: bool) -> None:
        """The first ``stages - 1`` K steps copied, a commit group each (empty groups where there
        are fewer steps keep the count: a step waits for its own group)."""
        for s in range(min(stages - 1, nks)):
            self.k_origins(str(s), 1)
            self.copies(ops, str(s), 1, flags)
            self.line(COMMIT)
        for _ in range(nks, stages - 1):
            self.line(COMMIT)

    def refill(self, ops, stages: int, nks: int, depth: int, flags: bool) -> None:
        """Inside the K loop: step ``ks + stages - 1`` copied into its buffer, and its commit group."""
        self.line(f"if (ks + {stages - 1} < {nks}) {{", depth)
        self.k_origins(f"(ks + {stages - 1})", depth + 1)
        self.copies(ops, f"((ks + {stages - 1}) % {stages})", depth + 1, flags)
        self.line("}", depth)
        self.line(COMMIT, depth)

    def copies(self, ops, stage: str, depth: int, flags: bool) -> None:
        """Each work-item's elements of the K step at the origins ``ko_*`` copied into buffer
        ``stage``: ``cp.async`` of 4, 8 or 16 bytes, zero-filled where a guard drops them (a
        source size of 0 reads nothing); with ``flags``, A's chunks' flags staged beside them."""
        for which, (op, items, arr, size, w, kfast, row) in enumerate(ops):
            nbytes = w * self.size
            kind = "cg" if nbytes == 16 else "ca"
            base = f"(__global const {self.U}*){self.ptrs[op.ref.source]}"
            for p, vals, kvals, _, live in items:
                if live:
                    self.line(f"if ({live}) {{", depth)
                kept, addr = self.element(op, p, vals, kvals, depth)
                self.line(f"const bool {p}_in = {kept};", depth + 1)
                if flags and which == 0:
                    mma_skips.flag(self, p, self.flag_index(p, stage, size, kfast, row), w, depth + 1)
                src = f"(ulong)({p}_in ? {base} + {addr} : {base})"
                dst = self.destination(arr, p, stage, size, kfast, row)
                copy = f"cp.async.{kind}.shared.global [%0], [%1], {nbytes}, %2;"
                args = f'"r"({dst}), "l"({src}), "r"({p}_in ? {nbytes} : 0)'
                self.line(f'asm volatile("{copy}" :: {args} : "memory"); }}', depth + 1)
                if live:
                    self.line("}", depth)

    # ------------------------------------------------------------------ stores
    def places(self, fm: int, fn: int) -> tuple[dict, dict, dict[str, str]]:
        """The accumulator elements' indexes, declared: per (fragment row ``i``, element row ``r``)
        the M indexes, per (fragment column ``j``, element column ``c``) the N ones, and the
        batch's."""
        g, op = self.g, self.op
        frag = op.c
        rows: dict[tuple[int, int], dict[str, str]] = {}
        cols: dict[tuple[int, int], dict[str, str]] = {}
        mrow, ncol = self.lane_part(frag.rows), self.lane_part(frag.cols)
        for i in range(fm):
            for r, _ in frag.elements:
                if (i, r) not in rows:
                    pos = self.block_pos(f"{i * op.m + r} + {mrow}", "m")
                    self.line(f"const {self.int} r{i}_{r} = {pos};")
                    rows[(i, r)] = self.at(g.m, f"r{i}_{r}", self.m0)
        for j in range(fn):
            for _, c in frag.elements:
                if (j, c) not in cols:
                    pos = self.block_pos(f"{j * op.n + c} + {ncol}", "n")
                    self.line(f"const {self.int} q{j}_{c} = {pos};")
                    cols[(j, c)] = self.at(g.n, f"q{j}_{c}", self.n0)
        return rows, cols, {ix.name: f"bt_{ix.name}" for ix in g.batch.idxs}

    def store_mma(self, fm: int, fn: int) -> None:
        """Each accumulator element added to its output element, or (the schedule's ``epilogue``)
        finished by the fused epilogue; guards as in ``tiled``."""
        g, frag = self.g, self.op.c
        rows, cols, batch = self.places(fm, fn)
        for i in range(fm):
            for j in range(fn):
                for e, (r, c) in enumerate(frag.elements):
                    env = {**batch, **rows[(i, r)], **cols[(j, c)]}
                    conds = self.inside(g.m, rows[(i, r)]) + self.inside(g.n, cols[(j, c)])
                    conds += self.cond(g.store_guards, env)
                    acc = f"c{i}_{j}_{e}"
                    if self.s.epilogue:
                        self.line(f"if ({' && '.join(conds)}) {{" if conds else "{")
                        self.epilogue(self.lines, env, acc, 2)
                        self.line("}")
                        continue
                    ptr, dt = self.ptrs[g.out.ref.source], g.dtype
                    off = self.affine(g.out.offset, env)
                    st = self.t.store(ptr, off, f"{self.t.load(ptr, off, dt)} + {acc}", dt)
                    self.line(f"if ({' && '.join(conds)}) {st}" if conds else st)

    # ------------------------------------------------------------ instructions
    def async_line(self, text: str, depth: int) -> None:
        """A marked instruction without operands."""
        self.line(f'asm volatile("{SM90A}{text}" ::: "memory");', depth)

    def ptx(self, text: str, ins: str, depth: int) -> None:
        """A marked instruction taking ``ins`` (input operands)."""
        self.line(f'asm volatile("{SM90A}{text}" :: {ins} : "memory");', depth)


def byte_at(kt: int, mm: str, kk: str, kfast: bool) -> str:
    """The swizzled byte offset in a K step's tile (16-bit elements, K steps of ``kt``) of the
    element at row (column) ``mm`` and K position ``kk`` (``backends.cuda.wgmma``'s layouts)."""
    width = 2 * kt
    if kfast:
        chunk = f"((({kk}) >> 3) ^ (((({mm}) * {width}) >> 7) & {width // 16 - 1}))"
        return f"({mm}) * {width} + ({chunk} << 4) + ((({kk}) & 7) << 1)"
    chunk = f"(((({mm}) & 63) >> 3) ^ (({kk}) & 7))"
    return f"(({mm}) >> 6) * {kt * 128} + ({kk}) * 128 + ({chunk} << 4) + ((({mm}) & 7) << 1)"


def swizzled_destination(arr: str, p: str, stage: str, size: int, kfast: bool, kt: int, nbytes: int) -> str:
    """The ``__local`` address element ``p`` of a K step is copied to in the swizzled layout
    (``size`` elements of ``nbytes`` a buffer)."""
    return f"{arr}_at + {stage} * {size * nbytes} + {byte_at(kt, f'{p}_mm', f'{p}_kk', kfast)}"
