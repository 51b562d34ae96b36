"""A ``gemm_tile`` nest on a matrix unit (tensor cores): the tiled kernel of ``tiled``, with the
products issued as the unit's operations.

The nest's plan names the unit and precision mode (``GemmPlan.unit``, ``tensor_core.f16``;
``stripe.passes.tensorize``); the operation (``stripe.hardware.MmaShape``: its shape, its
instruction and where each lane's fragment elements sit) comes from the config's hardware model,
which the driver hands over with the settings. The kernel is ``GemmEmitter``'s, except:

* **a work-item of the nest is a warp**: ``unit.lanes`` work-items issue each operation together.
  Warp ``(wy, wx)`` owns the nest's register block of ``rm x rn`` outputs, in the nest's layout
  (block row ``r`` is tile row ``(r / 8)·(tm·8/rm) + wy·8 + r % 8``, columns likewise), as a grid
  of ``rm/m x rn/n`` operations. Every work-item loads its share of the staged tiles.
* **operand bits, not values, are staged**: 16-bit operands move as ``ushort`` (no half
  arithmetic is needed), 32-bit ones as ``uint``, in vectors of up to 16 bytes. An operand whose
  K elements are contiguous in memory is staged K-fastest (``[mn][k]``, rows padded by 16 bytes,
  so a fragment's pair of K elements is one 32-bit ``__local`` read and the eight rows a fragment
  reads fall in distinct banks), otherwise M- (N-) fastest (``[k][mn]``, padded by 8 elements).
  When every load is 4, 8 or 16 bytes they are ``cp.async`` copies straight into ``__local``
  memory (zero-filled where a guard drops them), as many K steps in flight as fit (up to four,
  ``pipelined``); otherwise they go through registers, two buffers (``staged``, as ``tiled``).
* **fragments** are read with ``ldmatrix`` (four 8x8 matrices per instruction; ``.trans`` for a
  16-bit operand staged M/N-fastest) where the unit's ``Fragment`` stencils are the layouts it
  delivers (``LDMATRIX``), else element by element per the stencils; each lane's row offsets
  are computed once outside the K loop. TF32 operands are rounded to TF32 as they
  are read (``cvt.rna.tf32.f32``); ``3xtf32`` splits each into a TF32 high part and a TF32
  residual and issues three operations (``lo·hi + hi·lo + hi·hi``), float32-level accuracy.
* **the sums** stay in float32 registers (the accumulator fragments) and are stored, or handed
  to the fused epilogue, once at the end: a float16 output is rounded once. The unit's own
  additions round toward zero (a float32 product's error grows well past the SIMT kernel's), so
  ``3xtf32`` sums each K step in a fragment of its own and adds it to the running
  sum with a float32 (round-to-nearest) addition.

The unit sums each operation's products in its own order (the kernel reorders aggregation; strict
mode never tensorizes). An A with guards on its own M indexes (a padded convolution's input) keeps
its skipped points out as ``backends.cuda.mma_skips`` says; a B with guards on N never reaches
here (``tensorize`` leaves it to the SIMT kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.clike.target import CTarget
from backends.clike.tiled import GemmEmitter, Tiles, count
from backends.cuda import mma_skips
from stripe.gemm import Gemm, Group, Operand
from stripe.hardware import Fragment, MatrixUnit, MmaShape
from tile.dtypes import DType

# the fragment layouts ``ldmatrix`` delivers, per operand: (elements per register, elements)
LDMATRIX = {
    "a": {
        (2, ((0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9), (8, 8), (8, 9))),  # m16 x k16, 16-bit
        (1, ((0, 0), (8, 0), (0, 4), (8, 4))),  # m16 x k8, 32-bit
    },
    "b": {
        (2, ((0, 0), (1, 0), (8, 0), (9, 0))),  # k16 x n8, 16-bit
        (1, ((0, 0), (4, 0))),  # k8 x n8, 32-bit
    },
}


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


# PTX's names of the operand and accumulator types (``MmaShape.inputs``, ``accumulator``)
PTX_TYPES = {"float16": "f16", "bfloat16": "bf16", "tf32": "tf32", "float32": "f32"}


def instruction(op: MmaShape) -> str:
    """The ``mma.sync`` instruction that issues ``op``: A row-major, B column-major (its fragment
    stencils), ``D = A·B + C`` with D and C of the accumulator's type."""
    acc, ins = PTX_TYPES[op.accumulator], PTX_TYPES[op.inputs]
    return f"mma.sync.aligned.m{op.m}n{op.n}k{op.k}.row.col.{acc}.{ins}.{ins}.{acc}"


CVT_TF32 = "cvt.rna.tf32.f32 %0, %1;"  # float32 to TF32: nearest, ties away from zero
COMMIT = 'asm volatile("cp.async.commit_group;" ::: "memory");'  # closes a group of async copies


def slot(p: str, stage: str, size: int, kfast: bool, row: int) -> str:
    """Where element ``p`` of a K step goes in buffer ``stage`` of a staged tile: ``[mn][k]`` rows
    of ``row`` when K is fastest, else ``[k][mn]``."""
    return f"{stage} * {size} + " + (f"{p}_mm * {row} + {p}_kk" if kfast else f"{p}_kk * {row} + {p}_mm")


def operation(units: dict[str, MatrixUnit], unit: str) -> tuple[MatrixUnit, MmaShape, str] | None:
    """The unit, operation and mode a plan's ``unit`` (``name.mode``) names, or None."""
    name, _, mode = unit.rpartition(".")
    u = units.get(name)
    op = u.operation(mode) if u is not None else None
    return (u, op, mode) if op is not None else None


class MmaEmitter(GemmEmitter):
    def __init__(self, t: CTarget, g: Gemm, ptrs: dict[str, str], tiles: Tiles, unit: MatrixUnit,
                 op: MmaShape, mode: str, epilogue=None):
        lt = LaneTiles(tiles.tm, tiles.tn, tiles.rm, tiles.rn, tiles.kt, tiles.per, unit.lanes)
        super().__init__(t, g, ptrs, lt, True, epilogue)
        self.unit, self.op, self.mode = unit, op, mode
        self.size = 2 if g.dtype.bits == 16 else 4
        self.U = "ushort" if self.size == 2 else "uint"

    # ---------------------------------------------------------------- loads
    def vector_width(self, op: Operand, grp: Group, tile: int, kfast: bool) -> int:
        """The most elements (up to 16 bytes) of one aligned, contiguous run of the operand's
        fastest group that the same guards keep or drop."""
        fast = self.g.k if kfast else grp
        if not fast.idxs:
            return 1
        inner, off = fast.idxs[-1], op.offset
        if off.coeff(inner.name) != 1 or any(inner.name in c.vars for c in op.guards):
            return 1
        for w in (16 // self.size, 4, 2):
            rest = [int(c) for v, c in off.terms if v != inner.name] + [int(off.const)]
            aligned = all(c % w == 0 for c in rest)
            if aligned and inner.range % w == 0 and self.tl.per[inner.name] % w == 0 \
                    and (tile * self.tl.kt) % (w * self.tl.threads) == 0:
                return w
        return 1

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

    # --------------------------------------------------------------- kernel
    def source(self, symbol: str, params: list[tuple[str, DType]]) -> tuple[str, int, int]:
        g, tl, it, U = self.g, self.tl, self.int, self.U
        assert not self.flagged(g.b, g.n), "tensorize leaves a B with guards on N to the SIMT kernel"
        self.skips = self.flagged(g.a, g.m)  # A's skipped points (mma_skips)
        self.stage_flags = self.skips  # copies stage A's flags beside it
        nks, groups, (a_items, a_kf, aw), (b_items, b_kf, bw) = self.plans()
        L = tl.threads
        # the staged layouts: (row length, whether K is fastest) and one buffer's size
        pad_k = 16 // self.size
        self.lay = {
            "a": (tl.kt + pad_k, True) if a_kf else (tl.tm + 8, False),
            "b": (tl.kt + pad_k, True) if b_kf else (tl.tn + 8, False),
        }
        sa = tl.tm * (tl.kt + pad_k) if a_kf else tl.kt * (tl.tm + 8)
        sb = tl.tn * (tl.kt + pad_k) if b_kf else tl.kt * (tl.tn + 8)
        # copies straight from global to __local memory (cp.async, no registers in between) when
        # every load is 4, 8 or 16 bytes: as many K steps in flight as fit (up to 4)
        self.copy = all(w * self.size in (4, 8, 16) for w in (aw, bw))
        stage = (sa + sb) * self.size + (sa // aw + 4 if self.skips else 0)
        stages = max(2, min(4, self.t.local_bytes // stage)) if self.copy else 2
        # uint4: 16-byte aligned, for the 16-byte stores
        self.line(f"__local uint4 As4[{stages * sa * self.size // 16}];")
        self.line(f"__local uint4 Bs4[{stages * sb * self.size // 16}];")
        self.line(f"__local {U}* As = (__local {U}*)As4;")
        self.line(f"__local {U}* Bs = (__local {U}*)Bs4;")
        if self.skips:
            mma_skips.declare(self, stages, sa, aw)
        self.aw = aw
        if not self.copy:
            for items, w in ((a_items, aw), (b_items, bw)):
                for p, *_ in items:
                    self.line(f"{U}{w if w > 1 else ''} {p}_ld;")
            for p, *_ in a_items if self.skips else ():
                self.line(f"bool {p}_in;")
        self.lanes()
        fm, fn = tl.rm // self.op.m, tl.rn // self.op.n
        # each lane's offsets of its fragments' rows (columns): the same in every K step
        self.bases = tuple(
            self.fragment_bases(frag, side, nf, per, name) if self.ldmatrix(name, frag) is None
            else self.ldmatrix_bases(name, self.ldmatrix(name, frag), nf, per)
            for frag, side, nf, per, name in (
                (self.op.a, "m", fm, self.op.m, "a"), (self.op.b, "n", fn, self.op.n, "b")
            )
        )
        for i in range(fm):
            for j in range(fn):
                for acc in ("cs" if self.mode == "3xtf32" else "c"):
                    zeros = ", ".join(f"{acc}{i}_{j}_{e} = 0.0f" for e in range(len(self.op.c.elements)))
                    self.line(f"float {zeros};")
        if g.k.idxs:
            self.line(f"{it} " + ", ".join(f"ko_{ix.name} = 0" for ix in g.k.idxs) + ";")
        ops = (
            (g.a, a_items, "As", sa, aw, a_kf, self.lay["a"][0]),
            (g.b, b_items, "Bs", sb, bw, b_kf, self.lay["b"][0]),
        )
        if self.copy:
            self.pipelined(ops, stages, nks, sa, sb, fm, fn)
        else:
            self.staged(ops, nks, sa, sb, fm, fn)
        self.store_mma(fm, fn)
        return self.t.group_kernel(symbol, params, L, self.lines), groups * L, L

    def plans(self) -> tuple[int, int, tuple, tuple]:
        """The work-group's place (``lid``, ``grp``, the tile origins ``m0``/``n0``, the batch) and
        each operand's load plan (``operand_plan``): (K steps, work-groups, A's plan, B's)."""
        g, tl, it = self.g, self.tl, self.int
        ntm, ntn, nks = count(g.m, tl.per), count(g.n, tl.per), count(g.k, tl.per)
        self.line(f"const {it} lid = ({it})get_local_id(0);")
        self.line(f"const {it} grp = ({it})get_group_id(0);")
        self.m0 = self.decompose(g.m, f"((grp / {ntn}) % {ntm})", "m0", 1, self.counts(g.m), tl.per)
        self.n0 = self.decompose(g.n, f"(grp % {ntn})", "n0", 1, self.counts(g.n), tl.per)
        batch = self.decompose(g.batch, f"(grp / {ntn * ntm})", "bt", 1) if g.batch.idxs else {}
        a = self.operand_plan(g.a, g.m, tl.tm, "ea", self.m0, batch)
        b = self.operand_plan(g.b, g.n, tl.tn, "eb", self.n0, batch)
        return nks, ntm * ntn * g.batch.total, a, b

    def staged(self, ops, nks: int, sa: int, sb: int, fm: int, fn: int) -> None:
        """The K loop through registers: the next K step is loaded while this one is multiplied,
        two ``__local`` buffers, one barrier per step (as in ``tiled``)."""
        it = self.int
        for k, (op, items, _, _, w, _, _) in enumerate(ops):
            self.load(op, items, 1, w, self.skips and k == 0)
        self.line("int buf = 0;")
        self.line(f"for ({it} ks = 0; ks < {nks}; ks++) {{")
        for k, (_, items, arr, size, w, kfast, row) in enumerate(ops):
            for p, _, _, _, live in items:
                at = slot(p, "buf", size, kfast, row)
                if live:
                    self.line(f"if ({live}) {{", 2)
                if self.skips:  # A's flags; B's values looked at for infinities and NaNs
                    if k == 0:
                        mma_skips.flag(self, p, at, w, 2)
                    else:
                        mma_skips.note_nonfinite(self, f"{p}_ld", w, 2)
                if w == 1:
                    self.line(f"{arr}[{at}] = {p}_ld;", 2)
                else:  # w contiguous values, in either layout
                    self.line(f"*(__local {self.U}{w}*)({arr} + {at}) = {p}_ld;", 2)
                if live:
                    self.line("}", 2)
        self.line("barrier(CLK_LOCAL_MEM_FENCE);", 2)
        self.line(f"if (ks + 1 < {nks}) {{", 2)
        self.k_origins("(ks + 1)", 3)
        for k, (op, items, _, _, w, _, _) in enumerate(ops):
            self.load(op, items, 3, w, self.skips and k == 0)
        self.line("}", 2)
        self.step(sa, sb, fm, fn, 2)
        self.line("buf ^= 1;", 2)
        self.line("}")

    def pipelined(self, ops, stages: int, nks: int, sa: int, sb: int, fm: int, fn: int) -> None:
        """The K loop through asynchronous copies: ``stages - 1`` K steps in flight, each a commit
        group; a step waits for its own group, then one barrier (every work-item's copies landed,
        and every warp is done with the buffer the next copies overwrite)."""
        it = self.int
        self.prefetch(ops, stages, nks)
        self.line(f"for ({it} ks = 0; ks < {nks}; ks++) {{")
        self.line(f"const int buf = ks % {stages};", 2)
        self.line(f'asm volatile("cp.async.wait_group {stages - 2};" ::: "memory");', 2)
        if self.skips:  # the B values this work-item copied into the step, now landed
            _, items, arr, size, w, kfast, row = ops[1]
            for p, _, _, _, live in items:
                vec = f"{self.U}{w if w > 1 else ''}"
                value = f"*(__local const {vec}*)({arr} + {slot(p, 'buf', size, kfast, row)})"
                self.line(f"if ({live or 'true'}) {{", 2)
                mma_skips.note_nonfinite(self, value, w, 3)
                self.line("}", 2)
        self.line("barrier(CLK_LOCAL_MEM_FENCE);", 2)
        self.refill(ops, stages, nks, 2)
        self.step(sa, sb, fm, fn, 2)
        self.line("}")

    def prefetch(self, ops, stages: int, nks: int) -> None:
        """The first ``stages - 1`` K steps copied, a commit group each (empty groups where there
        are fewer steps keep the count: a step waits for its own group)."""
        for s in range(min(stages - 1, nks)):
            self.k_origins(str(s), 1)
            self.copies(ops, str(s), 1)
            self.line(COMMIT)
        for _ in range(nks, stages - 1):
            self.line(COMMIT)

    def refill(self, ops, stages: int, nks: int, depth: int) -> None:
        """Inside the K loop: step ``ks + stages - 1`` copied into its buffer, and its commit group."""
        self.line(f"if (ks + {stages - 1} < {nks}) {{", depth)
        self.k_origins(f"(ks + {stages - 1})", depth + 1)
        self.copies(ops, f"((ks + {stages - 1}) % {stages})", depth + 1)
        self.line("}", depth)
        self.line(COMMIT, depth)

    def copies(self, ops, stage: str, depth: int) -> None:
        """Each work-item's elements of the K step at the origins ``ko_*`` copied into buffer
        ``stage``: ``cp.async`` of 4, 8 or 16 bytes, zero-filled where a guard drops them (a
        source size of 0 reads nothing)."""
        for which, (op, items, arr, size, w, kfast, row) in enumerate(ops):
            nbytes = w * self.size
            kind = "cg" if nbytes == 16 else "ca"
            base = f"(__global const {self.U}*){self.ptrs[op.ref.source]}"
            for p, vals, kvals, _, live in items:
                if live:
                    self.line(f"if ({live}) {{", depth)
                kept, addr = self.element(op, p, vals, kvals, depth)
                self.line(f"const bool {p}_in = {kept};", depth + 1)
                if self.stage_flags and which == 0:
                    mma_skips.flag(self, p, self.flag_index(p, stage, size, kfast, row), w, depth + 1)
                src = f"(ulong)({p}_in ? {base} + {addr} : {base})"
                dst = self.destination(arr, p, stage, size, kfast, row)
                copy = f"cp.async.{kind}.shared.global [%0], [%1], {nbytes}, %2;"
                args = f'"r"({dst}), "l"({src}), "r"({p}_in ? {nbytes} : 0)'
                self.line(f'asm volatile("{copy}" :: {args} : "memory"); }}', depth + 1)
                if live:
                    self.line("}", depth)

    def staged_index(self, name: str, pos: str, k: str, size: int) -> str:
        """The index in operand ``name``'s staged tiles (buffer ``buf``, ``size`` elements each) of
        its element at tile row (column) ``pos`` and K position ``k``."""
        row, kfast = self.lay[name]
        return f"buf * {size} + " + (f"{pos} * {row} + {k}" if kfast else f"{k} * {row} + {pos}")

    def flag_index(self, p: str, stage: str, size: int, kfast: bool, row: int) -> str:
        """The staged index of element ``p``'s chunk, whose flag ``mma_skips.flag`` writes."""
        return slot(p, stage, size, kfast, row)

    def destination(self, arr: str, p: str, stage: str, size: int, kfast: bool, row: int) -> str:
        """The ``__local`` address (32 bits) element ``p`` of a K step is copied to."""
        return f"(uint)(ulong)({arr} + {slot(p, stage, size, kfast, row)})"

    def lanes(self) -> None:
        """The lane's warp (``wy``, ``wx`` as the nest's thread layout has them) and its place in the
        fragments (``lg``, ``lt``)."""
        tl, u = self.tl, self.unit
        txn = tl.tn // tl.rn
        self.line(f"const int warp = (int)lid / {u.lanes};")
        self.line(f"const int lane = (int)lid % {u.lanes};")
        self.line(f"const int wy = warp / {txn};")
        self.line(f"const int wx = warp % {txn};")
        self.line(f"const int lg = lane / {u.group};")
        self.line(f"const int lt = lane % {u.group};")

    # ------------------------------------------------------------- fragments
    def block_pos(self, frag_pos: str, side: str) -> str:
        """The tile row (``side`` m) or column (n) of position ``frag_pos`` (an expression) of the
        warp's register block, in the nest's layout."""
        tl = self.tl
        stride = tl.tm * 8 // tl.rm if side == "m" else tl.tn * 8 // tl.rn
        w = "wy" if side == "m" else "wx"
        return f"((({frag_pos}) >> 3) * {stride} + {w} * 8 + (({frag_pos}) & 7))"

    def lane_part(self, coeffs: tuple[int, int]) -> str:
        parts = [f"{c} * {v}" if c != 1 else v for c, v in zip(coeffs, ("lg", "lt")) if c]
        return " + ".join(parts) or "0"

    def fragment_bases(self, frag: Fragment, side: str, nfrags: int, per: int, name: str) -> dict:
        """Per fragment ``f`` and distinct M (N) offset of its elements: a variable holding the
        lane's ``__local`` offset of K position 0 there (declared once, before the K loop)."""
        row_len, kfast = self.lay[name]
        # operand A is m x k (rows: M); B is k x n (cols: N)
        mn_c, k_c = (frag.rows, frag.cols) if side == "m" else (frag.cols, frag.rows)
        mn_lane, k_lane = self.lane_part(mn_c), self.lane_part(k_c)
        out = {}
        for f in range(nfrags):
            for r, c in frag.elements:
                mn_off = r if side == "m" else c
                if (f, mn_off) in out:
                    continue
                var = f"{name}o{f}_{mn_off}"
                pos = self.block_pos(f"{f * per + mn_off} + {mn_lane}", side)
                at = f"{pos} * {row_len} + {k_lane}" if kfast else f"({k_lane}) * {row_len} + {pos}"
                self.line(f"const int {var} = {at};")
                out[(f, mn_off)] = var
        return out

    def read_fragment(self, frag: Fragment, side: str, f: int, kk: int, arr: str, size: int, bases: dict,
                      name: str, depth: int) -> list[str]:
        """The registers of fragment ``f`` at K offset ``kk``: expressions of 32-bit words."""
        row_len, kfast = self.lay[name]
        regs = []
        elems = frag.elements
        for r0 in range(0, len(elems), frag.per_register):
            words = []
            for r, c in elems[r0:r0 + frag.per_register]:
                mn_off, k_off = (r, c) if side == "m" else (c, r)
                k = kk + k_off
                at = f"buf * {size} + {bases[(f, mn_off)]} + " + (str(k) if kfast else f"{k * row_len}")
                words.append((at, k))
            if frag.per_register == 2:
                (a0, k0), (_, k1) = words
                if kfast and k1 == k0 + 1 and k0 % 2 == 0:
                    regs.append(f"*(__local const uint*)({arr} + {a0})")
                else:
                    regs.append(f"((uint){arr}[{words[0][0]}] | ((uint){arr}[{words[1][0]}] << 16))")
            else:
                regs.append(f"{arr}[{words[0][0]}]")
        return regs

    def ldmatrix(self, name: str, frag: Fragment) -> str | None:
        """How fragments of operand ``name`` load with ``ldmatrix`` (four 8x8 matrices of 16-byte
        rows, one row address per lane): ``""`` as stored, ``".trans"`` transposed, None when
        they cannot (the fragment is not the layout ``ldmatrix`` delivers, or 32-bit values
        would need a transpose)."""
        kfast = self.lay[name][1]
        if (frag.per_register, frag.elements) not in LDMATRIX[name]:
            return None
        if name == "b" and (self.tl.rn // self.op.n) % 2:
            return None  # B's fragments load in pairs
        if kfast:
            return ""
        return ".trans" if self.size == 2 else None

    def ldmatrix_bases(self, name: str, trans: str, nfrags: int, per: int) -> dict[int, str]:
        """Per ``ldmatrix`` of operand ``name`` (A: one per fragment; B: one per pair): the lane's
        row address in the staged tile at K offset 0, declared before the K loop. Lane ``l``
        addresses row ``l % 8`` of matrix ``l / 8``; A's matrices are (rows 0-7, K low), (8-15,
        low), (0-7, high), (8-15, high); B's (N fragment, K low), (same, high), (next, low),
        (next, high); a K half is 16 bytes."""
        row_len = self.lay[name][0]
        kh = 16 // self.size
        side = "m" if name == "a" else "n"
        if name == "a":
            mn_off, k_off = "8 * ((lane >> 3) & 1)", f"{kh} * (lane >> 4)"
        else:
            mn_off, k_off = "8 * (lane >> 4)", f"{kh} * ((lane >> 3) & 1)"
        out = {}
        step = 1 if name == "a" else 2
        for f in range(0, nfrags, step):
            var = f"{name}l{f}"
            if trans:  # rows of K, eight contiguous M (N) values each (the nest's 8-row layout)
                at = f"({k_off} + (lane & 7)) * {row_len} + {self.block_pos(f'{f * per} + {mn_off}', side)}"
            else:
                at = f"{self.block_pos(f'{f * per} + {mn_off} + (lane & 7)', side)} * {row_len} + {k_off}"
            self.line(f"const int {var} = {at};")
            out[f] = var
        return out

    def k_tile_mma(self, sa: int, sb: int, fm: int, fn: int, depth: int) -> None:
        """The products of one staged K tile: per K slice of the operation's ``k``, every fragment of
        A and B read (``ldmatrix`` where it can, else per element), then an operation per (A, B)
        pair."""
        op, tl = self.op, self.tl
        three = self.mode == "3xtf32"
        tf32 = op.inputs == "tf32"
        for kk in range(0, tl.kt, op.k):
            self.line("{", depth)
            for side, n, frag, arr, size, name in (
                ("m", fm, op.a, "As", sa, "a"), ("n", fn, op.b, "Bs", sb, "b")
            ):
                raw = self.fragments(side, n, frag, arr, size, name, kk, depth + 1)
                for (f, r), word in raw.items():
                    v = f"{name}{f}_{r}"
                    if not tf32:
                        self.line(f"const uint {v} = {word};", depth + 1)
                        continue
                    self.line(f"uint {v};", depth + 1)
                    self.line(f'asm("{CVT_TF32}" : "=r"({v}) : "f"(as_float({word})));', depth + 1)
                    if three:
                        self.line(f"uint {v}l;", depth + 1)
                        rest = f"as_float({word}) - as_float({v})"
                        self.line(f'asm("{CVT_TF32}" : "=r"({v}l) : "f"({rest}));', depth + 1)
            na = len(op.a.elements) // op.a.per_register
            nb = len(op.b.elements) // op.b.per_register
            for i in range(fm):
                for j in range(fn):
                    if three:
                        self.mma(i, j, "l", "", na, nb, depth + 1)
                        self.mma(i, j, "", "l", na, nb, depth + 1)
                    self.mma(i, j, "", "", na, nb, depth + 1)
            self.line("}", depth)

    def step(self, sa: int, sb: int, fm: int, fn: int, depth: int) -> None:
        """One staged K step's products: on the unit, or (A with skipped points, a B value infinite
        or NaN in this step) in the plain loop of ``mma_skips``; then (``3xtf32``) its sums folded."""
        if self.skips:
            self.line("if (nonfinite[buf] == ks) {", depth)
            mma_skips.slow_step(self, sa, sb, fm, fn, self.aw, depth + 1)
            self.line("} else {", depth)
            self.k_tile_mma(sa, sb, fm, fn, depth + 1)
            self.line("}", depth)
        else:
            self.k_tile_mma(sa, sb, fm, fn, depth)
        if self.mode == "3xtf32":  # the K step's sums, rounded to nearest into the running ones
            for i in range(fm):
                for j in range(fn):
                    for e in range(len(self.op.c.elements)):
                        self.line(f"c{i}_{j}_{e} += s{i}_{j}_{e}; s{i}_{j}_{e} = 0.0f;", depth)

    def fragments(self, side: str, n: int, frag: Fragment, arr: str, size: int, name: str, kk: int,
                  depth: int) -> dict[tuple[int, int], str]:
        """Fragment ``f``'s register ``r`` (raw 32-bit words) at K offset ``kk``, per (f, r)."""
        out = {}
        trans = self.ldmatrix(name, frag)
        if trans is None:
            bases = self.bases[0 if name == "a" else 1]
            for f in range(n):
                words = self.read_fragment(frag, side, f, kk, arr, size, bases, name, depth)
                for r, word in enumerate(words):
                    out[(f, r)] = word
            return out
        bases = self.bases[0 if name == "a" else 1]
        row_len = self.lay[name][0]
        off = kk * row_len if trans else kk
        per_frag = len(frag.elements) // frag.per_register
        for f, base in bases.items():
            regs = [f"{name}x{f}_{x}" for x in range(4)]
            self.line(f"uint {', '.join(regs)};", depth)
            addr = f"(uint)(ulong)({arr} + buf * {size} + {base} + {off})"
            outs = ", ".join(f'"=r"({v})' for v in regs)
            load = f"ldmatrix.sync.aligned.m8n8.x4{trans}.shared.b16 {{%0,%1,%2,%3}}, [%4];"
            self.line(f'asm volatile("{load}" : {outs} : "r"({addr}));', depth)
            for x, v in enumerate(regs):  # A: one fragment's 4 registers; B: two fragments' 2 each
                out[(f + x // per_frag, x % per_frag)] = v
        return out

    def mma(self, i: int, j: int, sa: str, sb: str, na: int, nb: int, depth: int) -> None:
        """One operation into fragment ``(i, j)``'s accumulator (``3xtf32``: the K step's own)."""
        nc = len(self.op.c.elements)
        d = [f"%{x}" for x in range(nc)]
        a = [f"%{nc + x}" for x in range(na)]
        b = [f"%{nc + na + x}" for x in range(nb)]
        c = [f"%{nc + na + nb + x}" for x in range(nc)]
        text = f"{instruction(self.op)} " + ", ".join("{" + ",".join(x) + "}" for x in (d, a, b, c)) + ";"
        acc = [f"{'s' if self.mode == '3xtf32' else 'c'}{i}_{j}_{e}" for e in range(nc)]
        outs = ", ".join(f'"=f"({v})' for v in acc)
        ins = [f'"r"(a{i}_{x}{sa})' for x in range(na)] + [f'"r"(b{j}_{x}{sb})' for x in range(nb)]
        ins += [f'"f"({v})' for v in acc]
        self.line(f'asm volatile("{text}" : {outs} : {", ".join(ins)});', depth)

    # ---------------------------------------------------------------- store
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
        """Each accumulator element added to its output element, or (fused) finished by the
        epilogue; guards as in ``tiled``."""
        g, frag = self.g, self.op.c
        rows, cols, batch = self.places(fm, fn)
        out = g.out
        for i in range(fm):
            for j in range(fn):
                for e, (r, c) in enumerate(frag.elements):
                    env = {**batch, **rows[(i, r)], **cols[(j, c)]}
                    conds = self.inside(g.m, rows[(i, r)]) + self.inside(g.n, cols[(j, c)])
                    conds += self.cond(g.store_guards, env)
                    acc = f"c{i}_{j}_{e}"
                    if out is None:
                        self.line(f"if ({' && '.join(conds)}) {{" if conds else "{")
                        self.epilogue(self.lines, env, acc, 2)
                        self.line("}")
                        continue
                    ptr, dt = self.ptrs[out.ref.source], g.dtype
                    off = self.affine(out.offset, env)
                    st = self.t.store(ptr, off, f"{self.t.load(ptr, off, dt)} + {acc}", dt)
                    self.line(f"if ({' && '.join(conds)}) {st}" if conds else st)
