"""The pieces the tensor-core attention kernels print (``render_attention``'s forward,
``render_attention_bwd``'s gradient): tiles of 16-bit operands staged in ``__local`` memory
(``cp.async`` copies of 16 bytes where rows are 16-byte runs, else element by element; zeros past
the extents; each row's 16-byte chunks XOR-swizzled by the row so the eight rows an ``ldmatrix``
reads fall in distinct banks), fragments read with ``ldmatrix``, products issued as ``mma.sync``
(m16n8k16, float32 sums), accumulators rounded into A fragments, masks, and the stores.

A warp owns 16 rows of a product; each lane's accumulator elements are rows ``lane / 4`` and
``lane / 4 + 8``, columns ``2 (lane % 4)`` and the next, of each 8-column fragment.
"""

from __future__ import annotations

from backends.clike.attention import offset, run_points
from backends.clike.kernel import KernelEmitter
from backends.cuda.mma import instruction
from backends.cuda.schedule import operation
from tile.dtypes import DType

PACK = {DType.FLOAT16: "cvt.rn.f16x2.f32", DType.BFLOAT16: "cvt.rn.bf16x2.f32"}
MODES = {DType.FLOAT16: "f16", DType.BFLOAT16: "bf16"}  # the unit's precision mode per operand type


def operands(em: KernelEmitter, plan_type, ins: tuple[str, ...], outs: tuple[str, ...], out_types,
             need: int, widest: int):
    """``(plan, operation)`` where the block ``em`` emits has a plan of ``plan_type`` whose refinements
    ``ins`` are all float16 or all bfloat16 and ``outs`` of ``out_types``, each passed to the
    kernel, on a target with work-groups that reorders and has the tensor cores for that type,
    with heads at most ``widest`` wide (padded) and ``need`` bytes of ``__local`` memory it has;
    else None."""
    b, t, p = em.block, em.t, em.block.plan
    if not (t.workgroups and t.contract and isinstance(p, plan_type)):
        return None
    dts = {b.ref(n).shape.dtype for n in ins}
    if len(dts) != 1 or next(iter(dts)) not in MODES:
        return None
    if any(b.ref(n).shape.dtype not in out_types for n in outs):
        return None
    if any(b.ref(n).source not in em.ptrs for n in (*ins, *outs)):
        return None
    if padded(p.depth) > widest or padded(p.width) > widest or need > getattr(t, "launch_bytes", 0):
        return None
    found = operation(t.matrix_units, f"tensor_core.{MODES[next(iter(dts))]}")
    return (p, found[1]) if found is not None else None


def padded(n: int) -> int:
    """A head's width in ``__local`` memory: the next power of two, at least 16 (one ``k`` step,
    and whole 16-byte chunks that the swizzle permutes within a row)."""
    return max(16, 1 << (n - 1).bit_length())


class Printer:
    """The pieces both kernels print (module docstring); ``kernel`` of a subclass prints one."""

    def __init__(self, em: KernelEmitter, p, op, warps: int, mt: int = 1):
        self.em, self.p, self.b, self.t = em, p, em.block, em.t
        self.dt = self.b.ref(p.q).shape.dtype
        self.mma = instruction(op)
        self.dp, self.wp = padded(p.depth), padded(p.width)
        self.warps = warps
        self.mt = mt  # 16-row m-tiles a warp owns (each B fragment serves them all)
        self.threads = 32 * warps
        self.role: dict[str, str] = {"_0": "0"}
        self.lines: list[str] = []

    def line(self, text: str) -> None:
        self.lines.append(text)

    # ------------------------------------------------------------------ layout
    def stride(self, name: str, dims: tuple[str, ...], role: str) -> int:
        """The element stride of refinement ``name``'s dim with role ``role`` (0: none has it)."""
        for d, r in zip(self.b.ref(name).shape.dims, dims, strict=True):
            if r == role:
                return d.stride
        return 0

    def vector(self, name: str, dims: tuple[str, ...], row: str, col: str, n: int) -> bool:
        """Whether the tile's rows are whole 16-byte runs: columns contiguous, ``n`` a multiple of 8,
        every other stride a multiple of 8 elements (buffers are 16-byte aligned)."""
        if self.stride(name, dims, col) != 1 or n % 8:
            return False
        dims_ = zip(self.b.ref(name).shape.dims, dims, strict=True)
        return all(d.stride % 8 == 0 for d, r in dims_ if r != col)

    @staticmethod
    def mask(width: int) -> int:
        """The swizzle of a tile ``width`` elements wide: a row's 16-byte chunk ``c`` sits at
        ``c ^ (row & mask)``."""
        return min(width // 8, 8) - 1

    def at(self, row: str, chunk: str, width: int) -> str:
        """The element index in a swizzled tile of chunk ``chunk`` of row ``row``."""
        return f"(({row}) * {width} + ((({chunk}) ^ (({row}) & {self.mask(width)})) << 3))"

    # ------------------------------------------------------------------ pieces
    def stage(self, dst: str, base: str, first: str, valid: int, rows: int, rs: int, cs: int, n: int,
              width: int, vec: bool) -> None:
        """Copies ``rows`` rows of ``n`` elements (from row ``first`` of ``base``; rows at or past
        ``valid`` and columns past ``n`` zero) into the swizzled tile ``dst`` of ``width``."""
        chunks = width // 8
        if vec:
            self.line(f"for (int u = tid; u < {rows * chunks}; u += {self.threads}) {{")
            self.line(f"  const int r = u / {chunks}, c = u % {chunks};")
            self.line(f"  const bool ok = ({first} + r < {valid}) && (c * 8 < {n});")
            src = f"(ulong)(ok ? {base} + (long)({first} + r) * {rs} + c * 8 : {base})"
            dst_addr = f"(uint)(ulong)({dst} + {self.at('r', 'c', width)})"
            copy = "cp.async.cg.shared.global [%0], [%1], 16, %2;"
            args = f'"r"({dst_addr}), "l"({src}), "r"(ok ? 16 : 0)'
            self.line(f'  asm volatile("{copy}" :: {args} : "memory");')
            self.line("}")
            return
        self.line(f"for (int u = tid; u < {rows * width}; u += {self.threads}) {{")
        self.line(f"  const int r = u / {width}, c = u % {width};")
        self.line(f"  const bool ok = ({first} + r < {valid}) && (c < {n});")
        self.line(f"  {dst}[{self.at('r', 'c >> 3', width)} + (c & 7)] = "
                  f"ok ? {base}[(long)({first} + r) * {rs} + (long)c * {cs}] : (ushort)0;")
        self.line("}")

    def ldmatrix(self, outs: list[str], tile: str, row: str, chunk: str, width: int, trans: bool) -> None:
        addr = f"(uint)(ulong)({tile} + {self.at(row, chunk, width)})"
        t = ".trans" if trans else ""
        text = f"ldmatrix.sync.aligned.m8n8.x4{t}.shared.b16 {{%0,%1,%2,%3}}, [%4];"
        self.line(f'asm volatile("{text}" : {", ".join(f"{chr(34)}=r{chr(34)}({o})" for o in outs)}'
                  f' : "r"({addr}));')

    def product(self, c: str, a: str, b0: str, b1: str) -> None:
        """``c += a·b`` (``c``: four floats, ``a``: four registers, ``b0, b1``: two)."""
        cs = ", ".join(f'"+f"({c}[{e}])' for e in range(4))
        ins = ", ".join([f'"r"({a}[{e}])' for e in range(4)] + [f'"r"({b0})', f'"r"({b1})'])
        text = f"{self.mma} {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};"
        self.line(f'asm("{text}" : {cs} : {ins});')

    def box(self, i0: str, rows: int, j0: str, keys: int, whole: bool) -> str:
        """C: every constraint holds on the whole box (``whole``) of ``rows`` rows from ``i0`` and
        ``keys`` keys from ``j0`` (clipped to the extents), or (not ``whole``) some constraint fails
        on all of it."""
        p = self.p
        i_hi = f"({i0} + {rows} < {p.rows} ? {i0} + {rows - 1} : {p.rows - 1}L)"
        j_hi = f"({j0} + {keys} < {p.keys} ? {j0} + {keys - 1} : {p.keys - 1}L)"
        box = {"i": (i0, i_hi), "j": (j0, j_hi)}
        tests = []
        for terms, const in p.constraints:
            parts = [str(const)]
            for r, c in terms:
                lo, hi = box[r] if r in box else (self.role[r], self.role[r])
                parts.append(f"{c} * {(lo if c > 0 else hi) if whole else (hi if c > 0 else lo)}")
            tests.append(f"(({' + '.join(parts)}) {'>=' if whole else '<'} 0)")
        return (" && " if whole else " || ").join(tests) or ("true" if whole else "false")

    def visits(self, first: int, rows: int, keys: int) -> int | None:
        """How many blocks of ``keys`` keys the box of ``rows`` rows from ``first`` visits (those no
        constraint drops whole, as ``box`` decides at run time); None where a constraint reads a
        batch role (the count is then the work-group's own)."""
        p = self.p
        i_lo, i_hi = first, min(first + rows, p.rows) - 1
        count = 0
        for j_lo in range(0, p.keys, keys):
            box = {"i": (i_lo, i_hi), "j": (j_lo, min(j_lo + keys, p.keys) - 1)}
            dropped = False
            for terms, const in p.constraints:
                if any(r not in box for r, _ in terms):
                    return None
                top = const + sum(c * (box[r][1] if c > 0 else box[r][0]) for r, c in terms)
                dropped = dropped or top < 0
            count += not dropped
        return count

    def keep(self, i: str, j: str) -> str:
        """C: key ``j`` counts for row ``i`` (both within the extents)."""
        tests = [f"{i} < {self.p.rows}", f"{j} < {self.p.keys}"]
        for terms, const in self.p.constraints:
            parts = [f"{c} * {({'i': i, 'j': j}).get(r, self.role.get(r, '0'))}" for r, c in terms]
            tests.append(f"({' + '.join([*parts, str(const)])}) >= 0")
        return " && ".join(tests)

    def offset(self, name: str, dims: tuple[str, ...], at: dict[str, str]) -> str:
        """The C offset of refinement ``name``'s element at the roles ``at``."""
        return offset(self.b, name, dims, at)

    def roles(self, batch) -> None:
        """Declares the work-group's point of the ``batch`` roles from ``grp`` (consumed)."""
        for name, n in reversed(batch):
            self.line(f"const long {name}_ = grp % {n}; grp /= {n};")
            self.role[name] = f"{name}_"

    def base(self, ptr: str, name: str, dims: tuple[str, ...], at: dict[str, str] | None = None) -> None:
        """Declares ``ptr``, refinement ``name``'s elements as 16-bit words from its point at the
        work-group's batch roles (and ``at``), its row and column roles at 0."""
        zero = {"d": "0", "e": "0", "j": "0", "i": "0"}
        b = self.b
        where = offset(b, name, dims, self.role | zero | (at or {}))
        self.line(f"__global const ushort* {ptr} = (__global const ushort*){self.em.ptrs[b.ref(name).source]}"
                  f" + ({where});")

    def a_fragments(self, regs: str, tile: str, first_row: str, width: int) -> None:
        """``regs[mt][width / 16][4]``: the A fragments (``16 mt`` rows from ``first_row``, all of
        the swizzled tile's ``width`` columns) of a product."""
        self.line(f"uint {regs}[{self.mt}][{width // 16}][4];")
        self.line("#pragma unroll")
        self.line(f"for (int m = 0; m < {self.mt}; m++) {{")
        self.line("#pragma unroll")
        self.line(f"for (int k = 0; k < {width // 16}; k++) {{")
        row = f"{first_row} + m * 16 + (lane & 7) + ((lane >> 3) & 1) * 8"
        outs = [f"{regs}[m][k][{e}]" for e in range(4)]
        self.ldmatrix(outs, tile, row, "2 * k + (lane >> 4)", width, False)
        self.line("}")
        self.line("}")

    def times_rows(self, acc: str, a: str | tuple[str, str], tile: str, n_rows: int, width: int) -> None:
        """``acc[mt][n_rows / 8][4] += a · tileᵀ``: ``a`` the A fragments over the tile's ``width``
        columns (``regs``, or ``(tile, first row)``: read from that swizzled tile as they are
        needed), the tile's ``n_rows`` rows the product's columns (B from rows, ``ldmatrix``)."""
        mt = self.mt
        self.line("#pragma unroll")
        self.line(f"for (int k = 0; k < {width // 16}; k++) {{")
        if isinstance(a, tuple):
            src, first = a
            self.line(f"uint af[{mt}][4];")
            for m in range(mt):
                row = f"{first} + {16 * m} + (lane & 7) + ((lane >> 3) & 1) * 8"
                outs = [f"af[{m}][{e}]" for e in range(4)]
                self.ldmatrix(outs, src, row, "2 * k + (lane >> 4)", width, False)
            frag = "af[{m}]"
        else:
            frag = a + "[{m}][k]"
        self.line("#pragma unroll")
        self.line(f"for (int n = 0; n < {n_rows // 16}; n++) {{")
        self.line("uint bb[4];")
        self.ldmatrix([f"bb[{e}]" for e in range(4)], tile, "n * 16 + (lane & 7) + (lane >> 4) * 8",
                      "2 * k + ((lane >> 3) & 1)", width, False)
        for m in range(mt):
            self.product(f"{acc}[{m}][2 * n]", frag.format(m=m), "bb[0]", "bb[1]")
            self.product(f"{acc}[{m}][2 * n + 1]", frag.format(m=m), "bb[2]", "bb[3]")
        self.line("}")
        self.line("}")

    def times_tile(self, acc: str, a: str, tile: str, n_rows: int, width: int) -> None:
        """``acc[mt][width / 8][4] += a · tile``: ``a[mt][n_rows / 16][4]`` the A fragments over the
        tile's ``n_rows`` rows, the tile's ``width`` columns the product's (``ldmatrix.trans``)."""
        self.line("#pragma unroll")
        self.line(f"for (int n = 0; n < {width // 16}; n++) {{")
        self.line("#pragma unroll")
        self.line(f"for (int k = 0; k < {n_rows // 16}; k++) {{")
        self.line("uint bb[4];")
        self.ldmatrix([f"bb[{e}]" for e in range(4)], tile, "k * 16 + (lane & 7) + ((lane >> 3) & 1) * 8",
                      "2 * n + (lane >> 4)", width, True)
        for m in range(self.mt):
            self.product(f"{acc}[{m}][2 * n]", f"{a}[{m}][k]", "bb[0]", "bb[1]")
            self.product(f"{acc}[{m}][2 * n + 1]", f"{a}[{m}][k]", "bb[2]", "bb[3]")
        self.line("}")
        self.line("}")

    def row_max(self, acc: str, n: int, m0: str, m1: str) -> None:
        """Declares ``x0``, ``x1``: the running maxima ``m0``, ``m1`` (expressions) of the lane's
        two rows with the largest of their elements in the accumulator fragments ``acc[n][4]``
        (over the four lanes that hold a row)."""
        self.line("float x0 = -INFINITY, x1 = -INFINITY;")
        self.line("#pragma unroll")
        self.line(f"for (int n = 0; n < {n}; n++) {{ x0 = fmaxf(x0, fmaxf({acc}[n][0], {acc}[n][1])); "
                  f"x1 = fmaxf(x1, fmaxf({acc}[n][2], {acc}[n][3])); }}")
        for x in ("x0", "x1"):
            self.line(f"{x} = fmaxf({x}, __shfl_xor_sync(0xffffffffu, {x}, 1));")
            self.line(f"{x} = fmaxf({x}, __shfl_xor_sync(0xffffffffu, {x}, 2));")
        self.line(f"x0 = fmaxf({m0}, x0); x1 = fmaxf({m1}, x1);")

    def each(self, n: int) -> None:
        """Opens loops over the elements ``[m][n][e]`` of accumulator fragments ``[mt][n][4]``
        (closed by ``end``)."""
        for var, top in (("m", self.mt), ("n", n), ("e", 4)):
            self.line("#pragma unroll")
            self.line(f"for (int {var} = 0; {var} < {top}; {var}++) {{")

    def end(self) -> None:
        self.line("}}}")

    def zeros(self, acc: str, n: int) -> None:
        """Declares ``acc[mt][n][4]`` zeroed (accumulator fragments)."""
        self.line(f"float {acc}[{self.mt}][{n}][4];")
        self.each(n)
        self.line(f"{acc}[m][n][e] = 0.0f;")
        self.end()

    def pack(self, regs: str, acc: str, n: int) -> None:
        """``regs[mt][n / 2][4]``: the accumulator fragments ``acc[mt][n][4]`` (16 x 8n floats each)
        rounded to the operands' type as the A fragments of a product over those 8n columns."""
        self.line(f"uint {regs}[{self.mt}][{n // 2}][4];")
        self.line("#pragma unroll")
        self.line(f"for (int m = 0; m < {self.mt}; m++) {{")
        self.line("#pragma unroll")
        self.line(f"for (int n = 0; n < {n}; n++) {{")
        for e, (lo, hi) in enumerate(((0, 1), (2, 3))):
            self.line(f'asm("{PACK[self.dt]} %0, %1, %2;" : "=r"({regs}[m][n >> 1][(n & 1) * 2 + {e}]) : '
                      f'"f"({acc}[m][n][{hi}]), "f"({acc}[m][n][{lo}]));')
        self.line("}")
        self.line("}")

    def scored(self, acc: str, n: int, first_row: str, first_col: str, factor: str) -> None:
        """Replaces each element ``S`` of the accumulator fragments ``acc[mt][n][4]`` (laid out as
        ``masked`` says) by ``factor · P``: ``P`` the plan's score kernels run on it at its row and
        key (``point``), or ``S`` itself where there are none."""
        p = self.p
        self.each(n)
        if p.scores:
            self.element("long", first_row, first_col)
            self.clamp("i", "j")
            self.line(f"{acc}[m][n][e] = {factor} * ({self.point(p.scores, p.s, f'{acc}[m][n][e]', {})});")
        else:
            self.line(f"{acc}[m][n][e] *= {factor};")
        self.end()

    def clamp(self, i: str, j: str) -> None:
        """Moves the variables ``i`` (a row) and ``j`` (a key) past the extents back to the last
        one: a score kernel then reads memory that exists, for a value masked or never stored."""
        p = self.p
        self.line(f"{i} = {i} < {p.rows} ? {i} : {p.rows - 1}L; {j} = {j} < {p.keys} ? {j} : {p.keys - 1}L;")

    def point(self, kernels, first: str, value: str, regs: dict) -> str:
        """Prints the plan's elementwise ``kernels`` (score kernels from ``first`` = S, or the
        gradient's from ``first`` = the score's cotangent) on the float32 ``value`` at the row
        ``i`` and key ``j`` (C variables), as ``backends.clike.attention.run_points`` does; the
        result's float expression. ``regs`` holds the registers of kernels run before at the
        point (a gradient kernel may read them) and gains these."""
        em, p = self.em, self.p
        mark = len(em.lines)
        value = run_points(em, kernels, first, value, p.s_dims, self.role | {"i": "i", "j": "j"}, regs)
        self.lines.extend(em.lines[mark:])
        del em.lines[mark:]
        return value

    def masked(self, acc: str, n: int, first_row: str, first_col: str, value: str) -> None:
        """Sets the elements of the accumulator fragments ``acc[mt][n][4]`` (a warp's ``16 mt`` rows,
        the lane's first ``first_row``; ``8n`` keys from ``first_col``) whose key does not count for
        their row to ``value``."""
        self.each(n)
        self.element("const long", first_row, first_col)
        self.line(f"if (!({self.keep('i', 'j')})) {acc}[m][n][e] = {value};")
        self.end()

    def element(self, decl: str, first_row: str, first_col: str) -> None:
        """Declares ``i`` and ``j`` (as ``decl``): the row and key of the accumulator element
        ``[m][n][e]`` (inside ``each``) of a warp whose lane's first row is ``first_row`` and whose
        first key is ``first_col``."""
        self.line(f"{decl} i = {first_row} + m * 16 + (e >> 1) * 8;")
        self.line(f"{decl} j = {first_col} + n * 8 + (lane & 3) * 2 + (e & 1);")

    def store(self, acc: str, name: str, dims: tuple[str, ...], first: str, role: str, col_role: str,
              n: int, cols: int, then: str = "") -> None:
        """Stores the accumulator fragments ``acc[mt][n][4]`` (each element ``x`` as ``(x then)``,
        with ``m`` its m-tile and ``h`` its row half, 0 or 1) as refinement ``name``'s rows from
        ``first`` (the warp's first; role ``role``) and its columns ``< cols`` (role ``col_role``)."""
        b, t = self.b, self.t
        ref = b.ref(name)
        extent = self.p.rows if role == "i" else self.p.keys
        self.each(n)
        self.line("const int h = e >> 1;")
        self.line(f"const long x = {first} + m * 16 + (lane >> 2) + h * 8;")
        self.line("const long c = n * 8 + (lane & 3) * 2 + (e & 1);")
        self.line(f"if (x < {extent} && c < {cols}) {{")
        value = t.convert(f"({acc}[m][n][e] {then})", DType.FLOAT32, ref.shape.dtype)
        at = offset(b, name, dims, self.role | {role: "x", col_role: "c"})
        self.line(t.store(self.em.ptrs[ref.source], at, value, ref.shape.dtype))
        self.line("}")
        self.end()


__all__ = ["MODES", "PACK", "Printer", "operands", "padded"]
