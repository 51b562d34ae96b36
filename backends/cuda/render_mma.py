"""The warp-level tensor-core kernel (``backends.cuda.mma``) of a schedule, printed: the K loop
through registers (``staged``) or asynchronous copies (``pipelined``), each lane's fragments read
with ``ldmatrix`` or element by element, and one ``mma.sync`` per pair of fragments. ``r`` is the
``render.Render`` printing the schedule; every choice is the schedule's."""

from __future__ import annotations

from backends.cuda import mma_skips
from backends.cuda.mma import CVT_TF32, instruction, slot
from stripe.hardware import Fragment
from tile.dtypes import DType


def kernel(r, symbol: str, params: list[tuple[str, DType]]) -> tuple[str, int, int]:
    """The warp-level kernel of ``r``'s schedule (``backends.cuda.mma``)."""
    s, g, tl, it, U = r.s, r.g, r.tl, r.int, r.U
    nks, groups, (a_items, a_kf, aw), (b_items, b_kf, bw) = r.plans()
    L = tl.threads
    sa, sb, stages = s.a.elements, s.b.elements, s.stages
    # uint4: 16-byte aligned, for the 16-byte stores
    r.line(f"__local uint4 As4[{stages * sa * r.size // 16}];")
    r.line(f"__local uint4 Bs4[{stages * sb * r.size // 16}];")
    r.line(f"__local {U}* As = (__local {U}*)As4;")
    r.line(f"__local {U}* Bs = (__local {U}*)Bs4;")
    if s.skips:
        mma_skips.declare(r, stages, sa, aw)
    if s.loads == "registers":
        for items, w in ((a_items, aw), (b_items, bw)):
            for p, *_ in items:
                r.line(f"{U}{w if w > 1 else ''} {p}_ld;")
        for p, *_ in a_items if s.skips else ():
            r.line(f"bool {p}_in;")
    r.lanes()
    fm, fn = s.fragments
    # each lane's offsets of its fragments' rows (columns): the same in every K step
    r.bases = tuple(
        fragment_bases(r, frag, side, nf, per, name) if st.fragments is None
        else ldmatrix_bases(r, name, st.fragments, nf, per)
        for frag, side, nf, per, name, st in (
            (r.op.a, "m", fm, r.op.m, "a", s.a), (r.op.b, "n", fn, r.op.n, "b", s.b)
        )
    )
    for i in range(fm):
        for j in range(fn):
            for acc in ("cs" if s.fold else "c"):
                zeros = ", ".join(f"{acc}{i}_{j}_{e} = 0.0f" for e in range(len(r.op.c.elements)))
                r.line(f"float {zeros};")
    if g.k.idxs:
        r.line(f"{it} " + ", ".join(f"ko_{ix.name} = 0" for ix in g.k.idxs) + ";")
    ops = (
        (g.a, a_items, "As", sa, aw, a_kf, s.a.row),
        (g.b, b_items, "Bs", sb, bw, b_kf, s.b.row),
    )
    if s.loads == "async":
        pipelined(r, ops, stages, nks, sa, sb, fm, fn)
    else:
        staged(r, ops, nks, sa, sb, fm, fn)
    r.store_mma(fm, fn)
    return r.t.group_kernel(symbol, params, L, r.lines), groups * L, L


def staged(r, ops, nks: int, sa: int, sb: int, fm: int, fn: int) -> None:
    """The K loop through registers: the next K step is loaded while this one is multiplied,
    two ``__local`` buffers, one barrier per step (as in ``tiled``)."""
    it = r.int
    for k, (op, items, _, _, w, _, _) in enumerate(ops):
        r.load(op, items, 1, w, r.s.skips and k == 0)
    r.line("int buf = 0;")
    r.line(f"for ({it} ks = 0; ks < {nks}; ks++) {{")
    for k, (_, items, arr, size, w, kfast, row) in enumerate(ops):
        for p, _, _, _, live in items:
            at = slot(p, "buf", size, kfast, row)
            if live:
                r.line(f"if ({live}) {{", 2)
            if r.s.skips:  # A's flags; B's values looked at for infinities and NaNs
                if k == 0:
                    mma_skips.flag(r, p, at, w, 2)
                else:
                    mma_skips.note_nonfinite(r, f"{p}_ld", w, 2)
            if w == 1:
                r.line(f"{arr}[{at}] = {p}_ld;", 2)
            else:  # w contiguous values, in either layout
                r.line(f"*(__local {r.U}{w}*)({arr} + {at}) = {p}_ld;", 2)
            if live:
                r.line("}", 2)
    r.line("barrier(CLK_LOCAL_MEM_FENCE);", 2)
    r.line(f"if (ks + 1 < {nks}) {{", 2)
    r.k_origins("(ks + 1)", 3)
    for k, (op, items, _, _, w, _, _) in enumerate(ops):
        r.load(op, items, 3, w, r.s.skips and k == 0)
    r.line("}", 2)
    step(r, sa, sb, fm, fn, 2)
    r.line("buf ^= 1;", 2)
    r.line("}")


def pipelined(r, ops, stages: int, nks: int, sa: int, sb: int, fm: int, fn: int) -> None:
    """The K loop through asynchronous copies: ``stages - 1`` K steps in flight, each a commit
    group; a step waits for its own group, then one barrier (every work-item's copies landed,
    and every warp is done with the buffer the next copies overwrite)."""
    it = r.int
    r.prefetch(ops, stages, nks, r.s.skips)
    r.line(f"for ({it} ks = 0; ks < {nks}; ks++) {{")
    r.line(f"const int buf = ks % {stages};", 2)
    r.line(f'asm volatile("cp.async.wait_group {stages - 2};" ::: "memory");', 2)
    if r.s.skips:  # the B values this work-item copied into the step, now landed
        _, items, arr, size, w, kfast, row = ops[1]
        for p, _, _, _, live in items:
            vec = f"{r.U}{w if w > 1 else ''}"
            value = f"*(__local const {vec}*)({arr} + {slot(p, 'buf', size, kfast, row)})"
            r.line(f"if ({live or 'true'}) {{", 2)
            mma_skips.note_nonfinite(r, value, w, 3)
            r.line("}", 2)
    r.line("barrier(CLK_LOCAL_MEM_FENCE);", 2)
    r.refill(ops, stages, nks, 2, r.s.skips)
    step(r, sa, sb, fm, fn, 2)
    r.line("}")


def fragment_bases(r, frag: Fragment, side: str, nfrags: int, per: int, name: str) -> dict:
    """Per fragment ``f`` and distinct M (N) offset of its elements: a variable holding the
    lane's ``__local`` offset of K position 0 there (declared once, before the K loop)."""
    row_len, kfast = r.staging(name).row, r.staging(name).kfast
    # operand A is m x k (rows: M); B is k x n (cols: N)
    mn_c, k_c = (frag.rows, frag.cols) if side == "m" else (frag.cols, frag.rows)
    mn_lane, k_lane = r.lane_part(mn_c), r.lane_part(k_c)
    out = {}
    for f in range(nfrags):
        for row, col in frag.elements:
            mn_off = row if side == "m" else col
            if (f, mn_off) in out:
                continue
            var = f"{name}o{f}_{mn_off}"
            pos = r.block_pos(f"{f * per + mn_off} + {mn_lane}", side)
            at = f"{pos} * {row_len} + {k_lane}" if kfast else f"({k_lane}) * {row_len} + {pos}"
            r.line(f"const int {var} = {at};")
            out[(f, mn_off)] = var
    return out


def read_fragment(r, frag: Fragment, side: str, f: int, kk: int, arr: str, size: int, bases: dict,
                  name: str, depth: int) -> list[str]:
    """The registers of fragment ``f`` at K offset ``kk``: expressions of 32-bit words."""
    row_len, kfast = r.staging(name).row, r.staging(name).kfast
    regs = []
    elems = frag.elements
    for r0 in range(0, len(elems), frag.per_register):
        words = []
        for row, col in elems[r0:r0 + frag.per_register]:
            mn_off, k_off = (row, col) if side == "m" else (col, row)
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


def ldmatrix_bases(r, name: str, trans: str, nfrags: int, per: int) -> dict[int, str]:
    """Per ``ldmatrix`` of operand ``name`` (A: one per fragment; B: one per pair): the lane's
    row address in the staged tile at K offset 0, declared before the K loop. Lane ``l``
    addresses row ``l % 8`` of matrix ``l / 8``; A's matrices are (rows 0-7, K low), (8-15,
    low), (0-7, high), (8-15, high); B's (N fragment, K low), (same, high), (next, low),
    (next, high); a K half is 16 bytes."""
    row_len = r.staging(name).row
    kh = 16 // r.size
    side = "m" if name == "a" else "n"
    if name == "a":
        mn_off, k_off = "8 * ((lane >> 3) & 1)", f"{kh} * (lane >> 4)"
    else:
        mn_off, k_off = "8 * (lane >> 4)", f"{kh} * ((lane >> 3) & 1)"
    out = {}
    for f in range(0, nfrags, 1 if name == "a" else 2):
        var = f"{name}l{f}"
        if trans:  # rows of K, eight contiguous M (N) values each (the nest's 8-row layout)
            at = f"({k_off} + (lane & 7)) * {row_len} + {r.block_pos(f'{f * per} + {mn_off}', side)}"
        else:
            at = f"{r.block_pos(f'{f * per} + {mn_off} + (lane & 7)', side)} * {row_len} + {k_off}"
        r.line(f"const int {var} = {at};")
        out[f] = var
    return out


def k_tile_mma(r, sa: int, sb: int, fm: int, fn: int, depth: int) -> None:
    """The products of one staged K tile: per K slice of the operation's ``k``, every fragment of
    A and B read (``ldmatrix`` where it can, else per element), then an operation per (A, B)
    pair."""
    op, tl = r.op, r.tl
    three = r.s.fold
    tf32 = op.inputs == "tf32"
    for kk in range(0, tl.kt, op.k):
        r.line("{", depth)
        for side, n, frag, arr, size, name in (
            ("m", fm, op.a, "As", sa, "a"), ("n", fn, op.b, "Bs", sb, "b")
        ):
            raw = fragments(r, side, n, frag, arr, size, name, kk, depth + 1)
            for (f, reg), word in raw.items():
                v = f"{name}{f}_{reg}"
                if not tf32:
                    r.line(f"const uint {v} = {word};", depth + 1)
                    continue
                r.line(f"uint {v};", depth + 1)
                r.line(f'asm("{CVT_TF32}" : "=r"({v}) : "f"(as_float({word})));', depth + 1)
                if three:
                    r.line(f"uint {v}l;", depth + 1)
                    rest = f"as_float({word}) - as_float({v})"
                    r.line(f'asm("{CVT_TF32}" : "=r"({v}l) : "f"({rest}));', depth + 1)
        na = len(op.a.elements) // op.a.per_register
        nb = len(op.b.elements) // op.b.per_register
        for i in range(fm):
            for j in range(fn):
                if three:
                    mma(r, i, j, "l", "", na, nb, depth + 1)
                    mma(r, i, j, "", "l", na, nb, depth + 1)
                mma(r, i, j, "", "", na, nb, depth + 1)
        r.line("}", depth)


def step(r, sa: int, sb: int, fm: int, fn: int, depth: int) -> None:
    """One staged K step's products: on the unit, or (A with skipped points, a B value infinite
    or NaN in this step) in the plain loop of ``mma_skips``; then (``3xtf32``) its sums folded."""
    if r.s.skips:
        r.line("if (nonfinite[buf] == ks) {", depth)
        mma_skips.slow_step(r, sa, sb, fm, fn, r.s.a.width, depth + 1)
        r.line("} else {", depth)
        k_tile_mma(r, sa, sb, fm, fn, depth + 1)
        r.line("}", depth)
    else:
        k_tile_mma(r, sa, sb, fm, fn, depth)
    if r.s.fold:  # the K step's sums, rounded to nearest into the running ones
        for i in range(fm):
            for j in range(fn):
                for e in range(len(r.op.c.elements)):
                    r.line(f"c{i}_{j}_{e} += s{i}_{j}_{e}; s{i}_{j}_{e} = 0.0f;", depth)


def fragments(r, side: str, n: int, frag: Fragment, arr: str, size: int, name: str, kk: int,
              depth: int) -> dict[tuple[int, int], str]:
    """Fragment ``f``'s register ``reg`` (raw 32-bit words) at K offset ``kk``, per (f, reg)."""
    out = {}
    trans = r.staging(name).fragments
    if trans is None:
        bases = r.bases[0 if name == "a" else 1]
        for f in range(n):
            words = read_fragment(r, frag, side, f, kk, arr, size, bases, name, depth)
            for reg, word in enumerate(words):
                out[(f, reg)] = word
        return out
    bases = r.bases[0 if name == "a" else 1]
    row_len = r.staging(name).row
    off = kk * row_len if trans else kk
    per_frag = len(frag.elements) // frag.per_register
    for f, base in bases.items():
        regs = [f"{name}x{f}_{x}" for x in range(4)]
        r.line(f"uint {', '.join(regs)};", depth)
        addr = f"(uint)(ulong)({arr} + buf * {size} + {base} + {off})"
        outs = ", ".join(f'"=r"({v})' for v in regs)
        load = f"ldmatrix.sync.aligned.m8n8.x4{trans}.shared.b16 {{%0,%1,%2,%3}}, [%4];"
        r.line(f'asm volatile("{load}" : {outs} : "r"({addr}));', depth)
        for x, v in enumerate(regs):  # A: one fragment's 4 registers; B: two fragments' 2 each
            out[(f + x // per_frag, x % per_frag)] = v
    return out


def mma(r, i: int, j: int, sa: str, sb: str, na: int, nb: int, depth: int) -> None:
    """One operation into fragment ``(i, j)``'s accumulator (``3xtf32``: the K step's own)."""
    nc = len(r.op.c.elements)
    d = [f"%{x}" for x in range(nc)]
    a = [f"%{nc + x}" for x in range(na)]
    b = [f"%{nc + na + x}" for x in range(nb)]
    c = [f"%{nc + na + nb + x}" for x in range(nc)]
    text = f"{instruction(r.op)} " + ", ".join("{" + ",".join(x) + "}" for x in (d, a, b, c)) + ";"
    acc = [f"{'s' if r.s.fold else 'c'}{i}_{j}_{e}" for e in range(nc)]
    outs = ", ".join(f'"=f"({v})' for v in acc)
    ins = [f'"r"(a{i}_{x}{sa})' for x in range(na)] + [f'"r"(b{j}_{x}{sb})' for x in range(nb)]
    ins += [f'"f"({v})' for v in acc]
    r.line(f'asm volatile("{text}" : {outs} : {", ".join(ins)});', depth)
