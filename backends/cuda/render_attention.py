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

from backends.clike.kernel import KernelEmitter, KernelSource
from backends.cuda.attention_tiles import Printer, operands, padded
from backends.cuda.mma import COMMIT
from stripe.plans import AttentionPlan
from tile.dtypes import DType

BLOCK_KEYS = 64  # keys a step
WIDEST = 128  # the widest head (Q·K depth or V width, padded to 16) whose fragments fit in registers
_OUTS = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)


def warps(depth: int, width: int) -> int:
    """Warps a work-group (16 query rows each): 4 for heads wider than 64, else 8."""
    return 4 if max(depth, width) > 64 else 8


def local_bytes(p: AttentionPlan) -> int:
    """The ``__local`` memory the kernel of ``p`` takes: Q's block, one K block and one V block."""
    dp, wp = padded(p.depth), padded(p.width)
    return 2 * (16 * warps(p.depth, p.width) * dp + BLOCK_KEYS * (dp + wp))


def takes(em: KernelEmitter) -> tuple | None:
    """``(plan, operation)`` when the block runs on the tensor cores (module docstring), else None."""
    p = em.block.plan
    if not isinstance(p, AttentionPlan) or p.scores:
        return None
    return operands(em, AttentionPlan, (p.q, p.k, p.v), (p.out,), _OUTS, local_bytes(p), WIDEST)


def source(em: KernelEmitter) -> KernelSource | None:
    """The block's kernel (module docstring), or None where ``takes`` declines it."""
    got = takes(em)
    if got is None:
        return None
    text, work, local = _Writer(em, *got).kernel()
    return KernelSource(em.symbol, text, work, (), local)


class _Writer(Printer):
    """Prints one kernel; every choice is made from the plan in ``__init__``."""

    def __init__(self, em: KernelEmitter, p: AttentionPlan, op):
        super().__init__(em, p, op, warps(p.depth, p.width))
        self.rows = 16 * self.warps

    # ------------------------------------------------------------------ kernel
    def kernel(self) -> tuple[str, int, int]:
        p, t, em = self.p, self.t, self.em
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
        self.roles(p.batch)
        for ptr, name, dims in (("qg", p.q, p.q_dims), ("kg", p.k, p.k_dims), ("vg", p.v, p.v_dims)):
            self.base(ptr, name, dims)
        q_vec = self.vector(p.q, p.q_dims, "i", "d", p.depth)
        k_vec = self.vector(p.k, p.k_dims, "j", "d", p.depth)
        v_vec = self.vector(p.v, p.v_dims, "j", "e", p.width)
        qs = (self.stride(p.q, p.q_dims, "i"), self.stride(p.q, p.q_dims, "d"))
        ks = (self.stride(p.k, p.k_dims, "j"), self.stride(p.k, p.k_dims, "d"))
        vs = (self.stride(p.v, p.v_dims, "j"), self.stride(p.v, p.v_dims, "e"))

        def stage_k(j0: str) -> None:
            self.stage("sk", "kg", j0, p.keys, bc, *ks, p.depth, dp, k_vec)

        def dropped(j0: str) -> str:
            return self.box("i0", br, j0, bc, False)

        line(f"long jb = 0;  /* the next block of {bc} keys that some constraint does not drop whole */")
        line(f"while (jb < {blocks} && ({dropped(f'(jb * {bc})')})) jb++;")
        self.stage("sq", "qg", "i0", p.rows, br, *qs, p.depth, dp, q_vec)
        line(COMMIT)
        line(f"if (jb < {blocks}) {{")
        stage_k(f"jb * {bc}")
        line("}")
        line(COMMIT)
        line('asm volatile("cp.async.wait_group 1;" ::: "memory");')
        line("barrier(CLK_LOCAL_MEM_FENCE);")
        sn, wn = bc // 8, wp // 8
        self.a_fragments("qf", "sq", "warp * 16", dp)
        self.zeros("o", wn)
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
        self.zeros("s", sn)
        self.times_rows("s", "qf", "sk", bc, dp)
        line("barrier(CLK_LOCAL_MEM_FENCE);  /* every warp is done with K's block */")
        line("long jn = jb + 1;")
        line(f"while (jn < {blocks} && ({dropped(f'(jn * {bc})')})) jn++;")
        line(f"if (jn < {blocks}) {{")
        stage_k(f"jn * {bc}")
        line("}")
        line(COMMIT)
        line("#pragma unroll")
        line(f"for (int n = 0; n < {sn}; n++) {{ s[n][0] *= c2; s[n][1] *= c2; s[n][2] *= c2; "
             "s[n][3] *= c2; }")
        line(f"if (!({self.box('i0', br, 'j0', bc, True)} && j0 + {bc} <= {p.keys})) {{")
        self.masked("s", sn, "r0", "j0", "-INFINITY")
        line("}")
        self.row_max("s", sn)
        line("const float u0 = x0 == -INFINITY ? 0.0f : x0, u1 = x1 == -INFINITY ? 0.0f : x1;")
        line("const float a0 = exp2f(m0 - u0), a1 = exp2f(m1 - u1);")
        line("m0 = x0; m1 = x1; l0 *= a0; l1 *= a1;")
        line("#pragma unroll")
        line(f"for (int n = 0; n < {wn}; n++) {{ o[n][0] *= a0; o[n][1] *= a0; o[n][2] *= a1; "
             "o[n][3] *= a1; }")
        line("#pragma unroll")
        line(f"for (int n = 0; n < {sn}; n++) {{")
        line("s[n][0] = exp2f(s[n][0] - u0); s[n][1] = exp2f(s[n][1] - u0);")
        line("s[n][2] = exp2f(s[n][2] - u1); s[n][3] = exp2f(s[n][3] - u1);")
        line("l0 += s[n][0] + s[n][1]; l1 += s[n][2] + s[n][3];")
        line("}")
        self.pack("pa", "s", sn)
        line('asm volatile("cp.async.wait_group 1;" ::: "memory");')
        line("barrier(CLK_LOCAL_MEM_FENCE);")
        self.times_tile("o", "pa", "sv", bc, wp)
        line("barrier(CLK_LOCAL_MEM_FENCE);  /* every warp is done with V's block */")
        line("jb = jn;")
        line("}")
        for x in ("l0", "l1"):
            line(f"{x} += __shfl_xor_sync(0xffffffffu, {x}, 1);")
            line(f"{x} += __shfl_xor_sync(0xffffffffu, {x}, 2);")
        self.store("o", p.out, p.out_dims, "i0 + warp * 16", "i", "e", wn, p.width, "/ (h ? l1 : l0)")
        groups = row_blocks
        for _, n in p.batch:
            groups *= n
        text = t.group_kernel(em.symbol, em.params, self.threads, self.lines)
        return text, groups * self.threads, self.threads


__all__ = ["BLOCK_KEYS", "local_bytes", "source", "takes", "warps"]
