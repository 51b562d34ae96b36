"""A ``gemm_tile`` nest as a work-group-tiled OpenCL kernel.

The kernel is what the nest says (``stripe.passes.gemm_tile``; ``stripe.gemm_nest`` reads its
``Gemm`` and tiles back): the proven SGEMM recipe, for any contraction the pass tiles (matmul,
batched matmul, convolutions as implicit GEMM). Each index ``v`` has its tile ``T_v`` (``Tiles.per``):

* **work-groups** are the nest's outer block: one per (batch point, M tile, N tile), N fastest
  (``get_group_id(0)`` decomposed by each index's tile count); each index's origin is its tile
  number times ``T_v``. The work-group's ``TM x TN`` output tile is flat: a row is a point of the
  M indexes' tile box (the last index fastest), a column one of N's.
* **work-items** (``TM/RM x TN/RN``, the thread block) each own an ``RM x RN`` register block, in
  chunks of four contiguous rows and columns (``chunk * TM*4/RM + ty*4 + i``, the layout of the
  nest's thread and register pieces): the ``__local`` reads are ``float4``-wide and a warp's
  stores are contiguous along N.
* **K** steps over the K indexes' tiles (``KT`` points, their product), each index's origin
  decomposed once per step. The work-group fills the ``LOCAL`` tiles of the nest as ``__local``
  arrays ``As[KT][TM]`` and ``Bs[KT][TN]`` cooperatively (element ``e = lid + r*L`` of the tile,
  the operand's contiguous group fastest, so global loads coalesce; a work-item's element offsets
  within the tile are fixed outside the K loop; a last round past the tile loads nothing). The
  next K tile is loaded into registers while the current one is multiplied, and the ``__local``
  tiles are double-buffered, so each K step needs one barrier.
* **edges**: sizes are known at compile time, so a guard is emitted only for an index whose tile
  does not divide its range (the nest's edge constraints: points past it load zero and are not
  stored). Constraints guard loads (a zero operand) or the store, as ``stripe.gemm`` sorts them.
* **skipped points**: the interpreter never combines a point a constraint skips, but a zero times
  the other operand's inf or NaN is NaN. So an operand with a guard on its own M (N) indexes (a
  padded convolution's input) also writes, beside each ``__local`` element, a flag saying whether
  the guards keep the point; the other operand's loads note a K tile holding an inf or NaN, and
  such a tile (the same for the whole work-group) takes a loop where each row (column) of the
  register block adds its products only where its flag is set. Other tiles keep the plain loop:
  there a skipped point adds ``0 * finite``, a zero, which leaves a sum begun at +0 unchanged.
  Guards on K alone zero both operands (``0 * 0``); operands without guards (matmul, unpadded
  convolutions) generate the same code as before.

Each output element's values are summed by one work-item in the nest's K order (Stripe's: the
pass's K tiles keep it), then added once to the element (which a zero kernel initialized). With
``contract`` the multiply-add is ``fma`` (one rounding: semantics §8.3 allows it); without it
(strict mode) it is a separate multiply and add, so the result is bit-identical to the
interpreter.
"""

from __future__ import annotations

from backends.clike.gemm_writer import GemmWriter, Tiles, count, flagged, int_type, k_fastest
from backends.clike.target import CTarget
from stripe.gemm import Gemm, Group, Operand
from tile.dtypes import DType

__all__ = ["GemmEmitter", "Tiles", "count"]


class GemmEmitter(GemmWriter):
    """The SIMT kernel (module docstring), written with ``GemmWriter``'s index arithmetic."""

    def __init__(
        self, t: CTarget, g: Gemm, ptrs: dict[str, str], tiles: Tiles, contract: bool, epilogue=None
    ):
        super().__init__(t, g, ptrs, tiles, int_type(g, tiles, tiles.threads), epilogue)
        self.contract = contract

    def operand(self, op: Operand, grp: Group, tile: int, side: str, origin: dict[str, str], batch):
        """``operand_plan`` with the operand's layout in the tile (K fastest where it is so in
        memory) and its loads ``float4``-wide where they can be (``vector_width``)."""
        kfast = k_fastest(self.g, op, grp)
        w = self.vector_width(op, grp, tile, kfast)
        return self.operand_plan(op, grp, tile, side, origin, batch, kfast, w)

    def vector_width(self, op: Operand, grp: Group, tile: int, kfast: bool) -> int:
        """4 when four consecutive elements of the operand's contiguous group in the tile are four
        aligned, adjacent elements of memory that the same guards keep or drop (one ``float4``
        load), else 1."""
        fast = self.g.k if kfast else grp
        if not fast.idxs or self.g.dtype not in (DType.FLOAT32, DType.FLOAT64):
            return 1
        inner = fast.idxs[-1]
        off = op.offset
        aligned = all(int(c) % 4 == 0 for v, c in off.terms if v != inner.name) and int(off.const) % 4 == 0
        if off.coeff(inner.name) != 1 or inner.range % 4 or self.tl.per[inner.name] % 4 or not aligned:
            return 1
        if any(inner.name in c.vars for c in op.guards):
            return 1
        return 4 if (tile * self.tl.kt) % (4 * self.tl.threads) == 0 else 1

    def load(self, op: Operand, items, depth: int, w: int = 1, flag: bool = False) -> None:
        """Registers ``{p}_ld`` = the operand at each element ``p`` (``w`` of them from there) for the
        K tile at the origins ``ko_*``, and ``{p}_in`` = whether the point is not skipped when
        ``flag``."""
        g = self.g
        zero = self.t.literal(0, g.dtype)
        ptr = self.ptrs[op.ref.source]
        if w > 1:
            vec = f"{self.T}{w}"
            zero = f"(({vec})({zero}))"
            ptr = f"*(__global const {vec}*)({ptr} + "
        for p, vals, kvals, _, _ in items:
            kept, addr = self.element(op, p, vals, kvals, depth)
            # (one element: through the target's load, which converts a float16 or bfloat16 to
            # its float register: CUDA's ``half`` is its bits, an unsigned short)
            value = f"{ptr}{addr})" if w > 1 else self.t.load(ptr, addr, op.ref.shape.dtype)
            if flag:
                self.line(f"{p}_in = {kept};", depth + 1)
                self.line(f"{p}_ld = {p}_in ? {value} : {zero}; }}", depth + 1)
            else:
                self.line(f"{p}_ld = ({kept}) ? {value} : {zero}; }}", depth + 1)

    # --------------------------------------------------------------- kernel
    def source(self, symbol: str, params: list[tuple[str, DType]]) -> tuple[str, int, int]:
        g, tl, T, it = self.g, self.tl, self.T, self.int
        txn = tl.tn // tl.rn
        ntm, ntn, nks = count(g.m, tl.per), count(g.n, tl.per), count(g.k, tl.per)
        groups = ntm * ntn * g.batch.total
        L = tl.threads
        T4 = f"{T}4"
        sa, sb = tl.kt * (tl.tm + 4), tl.kt * (tl.tn + 4)  # one K tile, rows padded by 4
        self.line(f"__local {T4} As4[{2 * sa // 4}];")  # two of each: write one while others read
        self.line(f"__local {T4} Bs4[{2 * sb // 4}];")
        self.line(f"__local {T}* As = (__local {T}*)As4;")
        self.line(f"__local {T}* Bs = (__local {T}*)Bs4;")
        flags = {"a": flagged(g.a, g.m), "b": flagged(g.b, g.n)}
        for name, size in (("A", sa), ("B", sb)):
            if flags[name.lower()]:  # whether each element of the tile is a point the guards keep
                self.line(f"__local uchar4 {name}m4[{2 * size // 4}];")
                self.line(f"__local uchar* {name}m = (__local uchar*){name}m4;")
        self.line(f"const {it} lid = ({it})get_local_id(0);")
        self.line(f"const {it} grp = ({it})get_group_id(0);")
        self.line(f"const {it} tx = lid % {txn};")
        self.line(f"const {it} ty = lid / {txn};")
        # the work-group's tile: each index's origin (its tile number times its tile)
        self.m0 = self.decompose(g.m, f"((grp / {ntn}) % {ntm})", "m0", 1, self.counts(g.m), tl.per)
        self.n0 = self.decompose(g.n, f"(grp % {ntn})", "n0", 1, self.counts(g.n), tl.per)
        batch = self.decompose(g.batch, f"(grp / {ntn * ntm})", "bt", 1) if g.batch.idxs else {}
        a_items, a_kf, aw = self.operand(g.a, g.m, tl.tm, "ea", self.m0, batch)
        b_items, b_kf, bw = self.operand(g.b, g.n, tl.tn, "eb", self.n0, batch)
        a_row = tl.tm + (4 if a_kf else 0)
        b_row = tl.tn + (4 if b_kf else 0)
        # the __local arrays are sized for a padded row (4 more) whichever layout fills them
        for items, w, flag in ((a_items, aw, flags["a"]), (b_items, bw, flags["b"])):
            for p, *_ in items:
                self.line(f"{T}{w if w > 1 else ''} {p}_ld;")
                if flag:
                    self.line(f"bool {p}_in;")
        zero = self.t.literal(0, g.dtype)
        for i in range(tl.rm):
            self.line(f"{T} " + ", ".join(f"c{i}_{j} = {zero}" for j in range(tl.rn)) + ";")
        if g.k.idxs:
            self.line(f"{it} " + ", ".join(f"ko_{ix.name} = 0" for ix in g.k.idxs) + ";")
        self.load(g.a, a_items, 1, aw, flags["a"])
        self.load(g.b, b_items, 1, bw, flags["b"])
        if flags["a"] or flags["b"]:
            # the K step whose tile in each buffer holds an inf or NaN the flags must keep out (a K
            # step, not a bool: no reset, so no race between double-buffered steps)
            self.line(f"__local {it} nonfinite[2];")
            self.line("if (lid == 0) { nonfinite[0] = -1; nonfinite[1] = -1; }")
            self.line("barrier(CLK_LOCAL_MEM_FENCE);")
        self.line("int buf = 0;")
        self.line(f"for ({it} ks = 0; ks < {nks}; ks++) {{")
        for items, arr, size, w, kfast, row, flag, check in (
            (a_items, "As", sa, aw, a_kf, a_row, flags["a"], flags["b"]),
            (b_items, "Bs", sb, bw, b_kf, b_row, flags["b"], flags["a"]),
        ):
            for p, _, _, at, live in items:
                if live:  # past the tile: this work-item has no element of this round
                    self.line(f"if ({live}) {{", 2)
                if check:  # a value the other operand's skipped points would multiply into NaN
                    parts = [f"{p}_ld.{c}" for c in "xyzw"] if w > 1 else [f"{p}_ld"]
                    bad = " || ".join(f"!isfinite({v})" for v in parts)
                    self.line(f"if ({bad}) nonfinite[buf] = ks;", 2)
                if w == 1:
                    self.line(f"{arr}[buf * {size} + {at}] = {p}_ld;", 2)
                elif kfast:  # four K values of one row: four rows of the tile
                    for c, comp in enumerate("xyzw"):
                        self.line(f"{arr}[buf * {size} + {at} + {c * row}] = {p}_ld.{comp};", 2)
                else:  # four adjacent columns of one row: one aligned float4
                    self.line(f"{arr}4[(buf * {size} + {at}) / 4] = {p}_ld;", 2)
                for c in range(w) if flag else ():  # the four share their guards (vector_width)
                    step = (c * row if kfast else c) if w > 1 else 0
                    self.line(f"{arr[0]}m[buf * {size} + {at} + {step}] = {p}_in;", 2)
                if live:
                    self.line("}", 2)
        self.line("barrier(CLK_LOCAL_MEM_FENCE);", 2)
        self.line(f"if (ks + 1 < {nks}) {{", 2)
        self.k_origins("(ks + 1)", 3)
        self.load(g.a, a_items, 3, aw, flags["a"])
        self.load(g.b, b_items, 3, bw, flags["b"])
        self.line("}", 2)
        reads = (("a", "As4", a_row, tl.rm, tl.tm, "ty", sa), ("b", "Bs4", b_row, tl.rn, tl.tn, "tx", sb))
        if flags["a"] or flags["b"]:
            # the same in the whole work-group: tiles of finite values take the plain loop, where a
            # skipped point adds 0 * finite, which leaves every sum as it is (a sum begun at +0
            # is never -0)
            self.line("if (nonfinite[buf] == ks) {", 2)
            self.k_tile(reads, flags, 3)
            self.line("} else {", 2)
            self.k_tile(reads, {"a": False, "b": False}, 3)
            self.line("}", 2)
        else:
            self.k_tile(reads, flags, 2)
        # no second barrier: the next step fills the other buffer, and the one after it waits at
        # the next barrier for every work-item to finish reading this one
        self.line("buf ^= 1;", 2)
        self.line("}")
        self.store()
        return self.t.group_kernel(symbol, params, L, self.lines), groups * L, L

    def k_tile(self, reads, flags: dict[str, bool], depth: int) -> None:
        """The products of one ``__local`` K tile: per K point, the register block's operands read
        as ``float4`` (and the flags of the flagged ones), then ``products``."""
        T4 = f"{self.T}4"
        self.line("#pragma unroll", depth)
        self.line(f"for (int kk = 0; kk < {self.tl.kt}; kk++) {{", depth)
        for name, arr, row, r, tile, lane, size in reads:
            for c in range(r // 4):
                at = f"buf * {size // 4} + kk * {row // 4} + {c * tile // r} + {lane}"
                self.line(f"const {T4} {name}v{c} = {arr}[{at}];", depth + 1)
                if flags[name]:
                    self.line(f"const uchar4 {name}m{c} = {name.upper()}m4[{at}];", depth + 1)
        self.products(flags, depth + 1)
        self.line("}", depth)

    def products(self, flags: dict[str, bool], depth: int) -> None:
        """Each register's ``acc += a * b`` for one K point; a flagged operand's skipped points add
        nothing (a branch per row, or column, of the register block; per product when both are)."""
        tl = self.tl
        comps = ("x", "y", "z", "w")

        def update(i: int, j: int, depth: int) -> None:
            a, b, acc = f"av{i // 4}.{comps[i % 4]}", f"bv{j // 4}.{comps[j % 4]}", f"c{i}_{j}"
            expr = f"fma({a}, {b}, {acc})" if self.contract else f"{acc} + {a} * {b}"
            self.line(f"{acc} = {expr};", depth)

        def kept(side: str, r: int) -> str:
            return f"{side}m{r // 4}.{comps[r % 4]}"

        if flags["a"] and flags["b"]:
            for i in range(tl.rm):
                for j in range(tl.rn):
                    self.line(f"if ({kept('a', i)} && {kept('b', j)})", depth)
                    update(i, j, depth + 1)
            return
        outer, inner = (tl.rn, tl.rm) if flags["b"] else (tl.rm, tl.rn)
        for o in range(outer):
            flag = "b" if flags["b"] else "a" if flags["a"] else None
            if flag:
                self.line(f"if ({kept(flag, o)}) {{", depth)
            for q in range(inner):
                update(*((q, o) if flags["b"] else (o, q)), depth + 1 if flag else depth)
            if flag:
                self.line("}", depth)

    def store(self) -> None:
        g, tl = self.g, self.tl
        out = g.out
        rows, cols = {}, {}
        for i in range(tl.rm):
            at = f"{(i // 4) * tl.tm * 4 // tl.rm + i % 4} + ty * 4"
            self.line(f"const {self.int} r{i} = {at};")
            rows[i] = self.at(g.m, f"r{i}", self.m0)
        for j in range(tl.rn):
            at = f"{(j // 4) * tl.tn * 4 // tl.rn + j % 4} + tx * 4"
            self.line(f"const {self.int} q{j} = {at};")
            cols[j] = self.at(g.n, f"q{j}", self.n0)
        batch = {ix.name: f"bt_{ix.name}" for ix in g.batch.idxs}
        for i in range(tl.rm):
            for j in range(tl.rn):
                env = {**batch, **rows[i], **cols[j]}
                conds = self.inside(g.m, rows[i]) + self.inside(g.n, cols[j])
                conds += self.cond(g.store_guards, env)
                if out is None:
                    self.line(f"if ({' && '.join(conds)}) {{" if conds else "{")
                    self.epilogue(self.lines, env, f"c{i}_{j}", 2)
                    self.line("}")
                    continue
                ptr = self.ptrs[out.ref.source]
                off = self.affine(out.offset, env)
                dt = out.ref.shape.dtype  # (through the target's load and store: a half is its bits)
                st = self.t.store(ptr, off, f"{self.t.load(ptr, off, dt)} + c{i}_{j}", dt)
                self.line(f"if ({' && '.join(conds)}) {st}" if conds else st)
