"""An ``attention`` block (``stripe.passes.attention``, planned with an ``AttentionPlan``) on the
tensor cores: the online softmax of ``backends.clike.attention``, with both products issued as
warp-level ``mma.sync`` operations (float16 or bfloat16 operands, float32 sums).

The kernel, for a plan whose score is S itself (no score kernels: a scale, a mask written as
constraints) over float16 or bfloat16 Q, K and V of heads up to 128 wide:

* **a work-group per (batch point, block of ``16 * warps`` query rows)**, a warp per 16 rows. Q's
  block is copied once into ``__local`` memory and held in registers as the product's A fragments
  (``ldmatrix``); the keys come in blocks of ``BLOCK_KEYS``.
* **staging**: each block of K and of V is copied into ``__local`` memory with ``cp.async`` (16
  bytes a copy, zero-filled past the last row and the head's width) where rows are 16-byte runs,
  else element by element. V's copy is in flight while S = Q·Kᵀ is computed and the next K's while
  the softmax and the product with V are: one buffer each. Rows of ``__local`` memory are 16-byte
  chunks XOR-swizzled by the row, so the eight rows an ``ldmatrix`` reads fall in distinct banks.
* **S in registers**: a warp's 16 x ``BLOCK_KEYS`` scores are accumulator fragments. Each is scaled
  by ``c·log2(e)``, masked (a key past the last, or failing a constraint, is -inf; a block every
  constraint keeps whole skips the test; a block one constraint drops whole is never visited),
  and the rows' running max ``m`` and sum ``l`` updated as in ``backends.clike.attention``, with
  ``exp2``; a row whose every key so far is masked keeps ``m = -inf`` and subtracts 0.
* **P·V**: the exponentials, rounded to the operands' type, are the second product's A fragments
  (an accumulator pair of 8-key columns is one 16-key A fragment), V's B fragments come from
  ``ldmatrix.trans``, and the partial output (16 x width floats a warp) is rescaled by
  ``exp2(m - m')`` per block. At the end each element is ``acc / l`` (``0 / 0``, NaN, for a row with
  no key), converted to the output's type.

The result differs from the chain's by rounding: the scores are float32 sums in the unit's order
(the chain rounds S to its type), the exponentials are rounded to the operands' type before the
product (the chain keeps them in float32, its literal's type), and the online rescaling reorders
the sums. ``conformance.attention.tolerance`` (``docs/semantics.md`` §8.7) covers each: ``4u``
relative per weight, with ``u`` the operands' unit roundoff.
"""

from __future__ import annotations

import math

from backends.clike.attention import offset
from backends.clike.kernel import KernelEmitter, KernelSource
from backends.cuda.mma import COMMIT, instruction
from backends.cuda.schedule import operation
from stripe.plans import AttentionPlan
from tile.dtypes import DType

BLOCK_KEYS = 64  # keys a step
WIDEST = 128  # the widest head (Q·K depth or V width, padded to 16) whose fragments fit in registers
_MODES = {DType.FLOAT16: "f16", DType.BFLOAT16: "bf16"}
_OUTS = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)
_PACK = {DType.FLOAT16: "cvt.rn.f16x2.f32", DType.BFLOAT16: "cvt.rn.bf16x2.f32"}


def padded(n: int) -> int:
    """A head's width in ``__local`` memory: the next power of two, at least 16 (one ``k`` step,
    and whole 16-byte chunks that the swizzle permutes within a row)."""
    return max(16, 1 << (n - 1).bit_length())


def warps(depth: int, width: int) -> int:
    """Warps a work-group (16 query rows each): 4 for heads wider than 64, else 8."""
    return 4 if max(depth, width) > 64 else 8


def local_bytes(p: AttentionPlan) -> int:
    """The ``__local`` memory the kernel of ``p`` takes: Q's block, one K block and one V block."""
    dp, wp = padded(p.depth), padded(p.width)
    return 2 * (16 * warps(p.depth, p.width) * dp + BLOCK_KEYS * (dp + wp))


def takes(em: KernelEmitter) -> tuple | None:
    """``(plan, operation)`` when the block runs on the tensor cores (module docstring), else None."""
    b, t, p = em.block, em.t, em.block.plan
    if not (t.workgroups and t.contract and isinstance(p, AttentionPlan)) or p.scores:
        return None
    dts = {b.ref(n).shape.dtype for n in (p.q, p.k, p.v)}
    if len(dts) != 1 or next(iter(dts)) not in _MODES or b.ref(p.out).shape.dtype not in _OUTS:
        return None
    if any(b.ref(n).source not in em.ptrs for n in (p.q, p.k, p.v, p.out)):
        return None
    if padded(p.depth) > WIDEST or padded(p.width) > WIDEST or local_bytes(p) > t.local_bytes:
        return None
    found = operation(t.matrix_units, f"tensor_core.{_MODES[next(iter(dts))]}")
    return (p, found[1]) if found is not None else None


def source(em: KernelEmitter) -> KernelSource | None:
    """The block's kernel (module docstring), or None where ``takes`` declines it."""
    got = takes(em)
    if got is None:
        return None
    text, work, local = _Writer(em, *got).kernel()
    return KernelSource(em.symbol, text, work, (), local)


class _Writer:
    """Prints one kernel; every choice is made from the plan in ``__init__``."""

    def __init__(self, em: KernelEmitter, p: AttentionPlan, op):
        self.em, self.p, self.b, self.t = em, p, em.block, em.t
        self.dt = self.b.ref(p.q).shape.dtype
        self.mma = instruction(op)
        self.dp, self.wp = padded(p.depth), padded(p.width)
        self.warps = warps(p.depth, p.width)
        self.rows = 16 * self.warps
        self.threads = 32 * self.warps
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

    def box(self, j0: str, whole: bool) -> str:
        """C: every constraint holds on the whole box (``whole``) of the work-group's rows and the
        keys from ``j0``, or (not ``whole``) some constraint fails on all of it."""
        p = self.p
        i_hi = f"(i0 + {self.rows} < {p.rows} ? i0 + {self.rows - 1} : {p.rows - 1}L)"
        j_hi = f"({j0} + {BLOCK_KEYS} < {p.keys} ? {j0} + {BLOCK_KEYS - 1} : {p.keys - 1}L)"
        box = {"i": ("i0", i_hi), "j": (j0, j_hi)}
        tests = []
        for terms, const in p.constraints:
            parts = [str(const)]
            for r, c in terms:
                lo, hi = box[r] if r in box else (self.role[r], self.role[r])
                parts.append(f"{c} * {(lo if c > 0 else hi) if whole else (hi if c > 0 else lo)}")
            tests.append(f"(({' + '.join(parts)}) {'>=' if whole else '<'} 0)")
        return (" && " if whole else " || ").join(tests) or ("true" if whole else "false")

    def keep(self, i: str, j: str) -> str:
        """C: key ``j`` counts for row ``i``."""
        tests = [f"{j} < {self.p.keys}"]
        for terms, const in self.p.constraints:
            parts = [f"{c} * {({'i': i, 'j': j}).get(r, self.role.get(r, '0'))}" for r, c in terms]
            tests.append(f"({' + '.join([*parts, str(const)])}) >= 0")
        return " && ".join(tests)

    # ------------------------------------------------------------------ kernel
    def kernel(self) -> tuple[str, int, int]:
        p, b, t, em = self.p, self.b, self.t, self.em
        dp, wp, br, bc = self.dp, self.wp, self.rows, BLOCK_KEYS
        blocks = -(-p.keys // bc)
        row_blocks = -(-p.rows // br)
        line = self.line
        line(f"__local uint4 sm4[{(br * dp + bc * (dp + wp)) // 8}];")
        line("__local ushort* sq = (__local ushort*)sm4;")
        line(f"__local ushort* sk = sq + {br * dp};")
        line(f"__local ushort* sv = sk + {bc * dp};")
        line("const int tid = (int)get_local_id(0), lane = tid & 31, warp = tid >> 5;")
        line("long grp = (long)get_group_id(0);")
        line(f"const long i0 = ({row_blocks - 1} - grp % {row_blocks}) * {br};  /* the longest rows first */")
        line(f"grp /= {row_blocks};")
        self.role = {"_0": "0", "i": "i0"}
        for name, n in reversed(p.batch):
            line(f"const long {name}_ = grp % {n}; grp /= {n};")
            self.role[name] = f"{name}_"
        zero = {"d": "0", "e": "0", "j": "0", "i": "0"}
        for buf, name, dims in (("qg", p.q, p.q_dims), ("kg", p.k, p.k_dims), ("vg", p.v, p.v_dims)):
            line(f"__global const ushort* {buf} = (__global const ushort*){em.ptrs[b.ref(name).source]} + "
                 f"({offset(b, name, dims, self.role | zero)});")
        q_vec = self.vector(p.q, p.q_dims, "i", "d", p.depth)
        k_vec = self.vector(p.k, p.k_dims, "j", "d", p.depth)
        v_vec = self.vector(p.v, p.v_dims, "j", "e", p.width)
        qs = (self.stride(p.q, p.q_dims, "i"), self.stride(p.q, p.q_dims, "d"))
        ks = (self.stride(p.k, p.k_dims, "j"), self.stride(p.k, p.k_dims, "d"))
        vs = (self.stride(p.v, p.v_dims, "j"), self.stride(p.v, p.v_dims, "e"))

        def stage_k(j0: str) -> None:
            self.stage("sk", "kg", j0, p.keys, bc, *ks, p.depth, dp, k_vec)

        line(f"long jb = 0;  /* the next block of {bc} keys that some constraint does not drop whole */")
        line(f"while (jb < {blocks} && ({self.box(f'(jb * {bc})', False)})) jb++;")
        self.stage("sq", "qg", "i0", p.rows, br, *qs, p.depth, dp, q_vec)
        line(COMMIT)
        line(f"if (jb < {blocks}) {{")
        stage_k(f"jb * {bc}")
        line("}")
        line(COMMIT)
        line('asm volatile("cp.async.wait_group 1;" ::: "memory");')
        line("barrier(CLK_LOCAL_MEM_FENCE);")
        kq, sn, wn = dp // 16, bc // 8, wp // 8
        line(f"uint qf[{kq}][4];")
        line("#pragma unroll")
        line(f"for (int k = 0; k < {kq}; k++) {{")
        self.ldmatrix([f"qf[k][{e}]" for e in range(4)], "sq",
                      "warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8", "2 * k + (lane >> 4)", dp, False)
        line("}")
        line(f"float o[{wn}][4];")
        line("#pragma unroll")
        line(f"for (int n = 0; n < {wn}; n++) {{ o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f; }}")
        line("float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;")
        line("const long r0 = i0 + warp * 16 + (lane >> 2), r1 = r0 + 8;")
        scale = p.scale_num / p.scale_den * math.log2(math.e)
        line(f"const float c2 = {t.float_literal(scale, DType.FLOAT32)};  /* c * log2(e) */")
        line(f"while (jb < {blocks}) {{")
        line(f"const long j0 = jb * {bc};")
        self.stage("sv", "vg", "j0", p.keys, bc, *vs, p.width, wp, v_vec)
        line(COMMIT)
        line('asm volatile("cp.async.wait_group 1;" ::: "memory");')
        line("barrier(CLK_LOCAL_MEM_FENCE);")
        line(f"float s[{sn}][4];")
        line("#pragma unroll")
        line(f"for (int n = 0; n < {sn}; n++) {{ s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f; }}")
        line("#pragma unroll")
        line(f"for (int n = 0; n < {sn // 2}; n++) {{")
        line("#pragma unroll")
        line(f"for (int k = 0; k < {kq}; k++) {{")
        line("uint kb[4];")
        self.ldmatrix([f"kb[{e}]" for e in range(4)], "sk", "n * 16 + (lane & 7) + (lane >> 4) * 8",
                      "2 * k + ((lane >> 3) & 1)", dp, False)
        self.product("s[2 * n]", "qf[k]", "kb[0]", "kb[1]")
        self.product("s[2 * n + 1]", "qf[k]", "kb[2]", "kb[3]")
        line("}")
        line("}")
        line("barrier(CLK_LOCAL_MEM_FENCE);  /* every warp is done with K's block */")
        line("long jn = jb + 1;")
        line(f"while (jn < {blocks} && ({self.box(f'(jn * {bc})', False)})) jn++;")
        line(f"if (jn < {blocks}) {{")
        stage_k(f"jn * {bc}")
        line("}")
        line(COMMIT)
        line("#pragma unroll")
        line(f"for (int n = 0; n < {sn}; n++) {{ s[n][0] *= c2; s[n][1] *= c2; s[n][2] *= c2; "
             "s[n][3] *= c2; }")
        line(f"if (!({self.box('j0', True)} && j0 + {bc} <= {p.keys})) {{")
        line("#pragma unroll")
        line(f"for (int n = 0; n < {sn}; n++) {{")
        line("#pragma unroll")
        line("for (int e = 0; e < 4; e++) {")
        line("const long i = e < 2 ? r0 : r1, j = j0 + n * 8 + (lane & 3) * 2 + (e & 1);")
        line(f"if (!({self.keep('i', 'j')})) s[n][e] = -INFINITY;")
        line("}")
        line("}")
        line("}")
        line("float x0 = -INFINITY, x1 = -INFINITY;")
        line("#pragma unroll")
        line(f"for (int n = 0; n < {sn}; n++) {{ x0 = fmaxf(x0, fmaxf(s[n][0], s[n][1])); "
             "x1 = fmaxf(x1, fmaxf(s[n][2], s[n][3])); }")
        for x in ("x0", "x1"):
            line(f"{x} = fmaxf({x}, __shfl_xor_sync(0xffffffffu, {x}, 1));")
            line(f"{x} = fmaxf({x}, __shfl_xor_sync(0xffffffffu, {x}, 2));")
        line("x0 = fmaxf(m0, x0); x1 = fmaxf(m1, x1);")
        line("const float u0 = x0 == -INFINITY ? 0.0f : x0, u1 = x1 == -INFINITY ? 0.0f : x1;")
        line("const float a0 = exp2f(m0 - u0), a1 = exp2f(m1 - u1);")
        line("m0 = x0; m1 = x1; l0 *= a0; l1 *= a1;")
        line("#pragma unroll")
        line(f"for (int n = 0; n < {wn}; n++) {{ o[n][0] *= a0; o[n][1] *= a0; o[n][2] *= a1; "
             "o[n][3] *= a1; }")
        line(f"uint pa[{sn // 2}][4];")
        line("#pragma unroll")
        line(f"for (int n = 0; n < {sn}; n++) {{")
        line("s[n][0] = exp2f(s[n][0] - u0); s[n][1] = exp2f(s[n][1] - u0);")
        line("s[n][2] = exp2f(s[n][2] - u1); s[n][3] = exp2f(s[n][3] - u1);")
        line("l0 += s[n][0] + s[n][1]; l1 += s[n][2] + s[n][3];")
        pack = _PACK[self.dt]
        for e, (lo, hi) in enumerate(((0, 1), (2, 3))):
            line(f'asm("{pack} %0, %1, %2;" : "=r"(pa[n >> 1][(n & 1) * 2 + {e}]) : '
                 f'"f"(s[n][{hi}]), "f"(s[n][{lo}]));')
        line("}")
        line('asm volatile("cp.async.wait_group 1;" ::: "memory");')
        line("barrier(CLK_LOCAL_MEM_FENCE);")
        line("#pragma unroll")
        line(f"for (int n = 0; n < {wn // 2}; n++) {{")
        line("#pragma unroll")
        line(f"for (int k = 0; k < {sn // 2}; k++) {{")
        line("uint vb[4];")
        self.ldmatrix([f"vb[{e}]" for e in range(4)], "sv", "k * 16 + (lane & 7) + ((lane >> 3) & 1) * 8",
                      "2 * n + (lane >> 4)", wp, True)
        self.product("o[2 * n]", "pa[k]", "vb[0]", "vb[1]")
        self.product("o[2 * n + 1]", "pa[k]", "vb[2]", "vb[3]")
        line("}")
        line("}")
        line("barrier(CLK_LOCAL_MEM_FENCE);  /* every warp is done with V's block */")
        line("jb = jn;")
        line("}")
        for x in ("l0", "l1"):
            line(f"{x} += __shfl_xor_sync(0xffffffffu, {x}, 1);")
            line(f"{x} += __shfl_xor_sync(0xffffffffu, {x}, 2);")
        out = b.ref(p.out)
        line("#pragma unroll")
        line(f"for (int n = 0; n < {wn}; n++) {{")
        line("#pragma unroll")
        line("for (int e = 0; e < 4; e++) {")
        line("const long i = e < 2 ? r0 : r1, c = n * 8 + (lane & 3) * 2 + (e & 1);")
        line(f"if (i < {p.rows} && c < {p.width}) {{")
        value = t.convert("(o[n][e] / (e < 2 ? l0 : l1))", DType.FLOAT32, out.shape.dtype)
        at = offset(b, p.out, p.out_dims, self.role | {"i": "i", "e": "c"})
        line(t.store(em.ptrs[out.source], at, value, out.shape.dtype))
        line("}")
        line("}")
        line("}")
        groups = row_blocks
        for _, n in p.batch:
            groups *= n
        text = t.group_kernel(em.symbol, em.params, self.threads, self.lines)
        return text, groups * self.threads, self.threads


__all__ = ["BLOCK_KEYS", "local_bytes", "padded", "source", "takes", "warps"]
