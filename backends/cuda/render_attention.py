"""An ``attention`` block (``stripe.passes.attention``, planned with an ``AttentionPlan``) on the
tensor cores: the online softmax of ``backends.clike.attention``, with both products issued as
warp-level ``mma.sync`` operations (float16 or bfloat16 operands, float32 sums).

The kernel, for a plan over float16 or bfloat16 Q, K and V of heads up to 128 wide, with a scale,
a mask written as constraints, and score kernels (a bias added to S, a ``cond`` mask on indexes:
run on each float32 score in registers at its row and key, ``Printer.scored``):

* **a work-group per (batch point, block of 128 query rows)**: four warps of 32 rows each (two
  16-row tiles: each B fragment read serves both, halving the ``__local`` reads a product takes).
  Q's block is copied once into ``__local`` memory; its A fragments stay in registers for heads up
  to 64 wide and are read again each step for wider ones (registers); the keys come in steps of
  ``STEP_KEYS`` (half as many past 64), ``BLOCK_STEPS`` steps a block. The kernel is launched
  with its ``__local`` memory as dynamic memory (up to the device's opt-in limit; 96 KiB at head
  width 128).
* **staging**: each block of K and V is copied into ``__local`` memory with ``cp.async`` (16
  bytes a copy, zero-filled past the last row and the head's width) where rows are 16-byte runs,
  else element by element, into one of two buffers: the next block's copies are in flight while
  this block's steps run, and one barrier a block hands the buffers over. Rows of ``__local``
  memory are 16-byte chunks XOR-swizzled by the row, so the eight rows an ``ldmatrix`` reads fall
  in distinct banks.
* **S in registers**: a warp's 16 x ``STEP_KEYS`` scores are accumulator fragments. Each is scaled
  by ``c·log2(e)``, masked (a key past the last, or failing a constraint, is -inf; a block every
  constraint keeps whole skips the test; a block, or a step, one constraint drops whole is never
  visited),
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

STEP_KEYS = 64  # keys a step (half as many for heads wider than 64: registers)
BLOCK_STEPS = 2  # steps a block of K and V copied at once
WARPS = 4
M_TILES = 2  # 16-row tiles a warp owns: 128 query rows a work-group
REGISTER_Q = 64  # Q's fragments stay in registers up to this depth (padded), else are read per step
WIDEST = 128  # the widest head (Q·K depth or V width, padded to 16) whose fragments fit in registers
_OUTS = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)
_WAIT_ALL = 'asm volatile("cp.async.wait_group 0;" ::: "memory");'


def step_keys(p: AttentionPlan) -> int:
    """The keys a step of ``p``'s kernel: its scores' registers (half as many past 64 wide)."""
    return STEP_KEYS if max(padded(p.depth), padded(p.width)) <= 64 else STEP_KEYS // 2


def block_keys(p: AttentionPlan) -> int:
    """The keys a block of K and V copied at once (``BLOCK_STEPS`` steps, one barrier)."""
    return step_keys(p) * BLOCK_STEPS


def local_bytes(p: AttentionPlan) -> int:
    """The ``__local`` memory the kernel of ``p`` takes (dynamic: launched with it): Q's block and
    two blocks each of K and V (one multiplied while the other's copies are in flight)."""
    dp, wp = padded(p.depth), padded(p.width)
    return 2 * (16 * WARPS * M_TILES * dp + 2 * block_keys(p) * (dp + wp))


def takes(em: KernelEmitter) -> tuple | None:
    """``(plan, operation)`` when the block runs on the tensor cores (module docstring), else None."""
    p = em.block.plan
    if not isinstance(p, AttentionPlan):
        return None
    return operands(em, AttentionPlan, (p.q, p.k, p.v), (p.out,), _OUTS, local_bytes(p), WIDEST)


def source(em: KernelEmitter) -> KernelSource | None:
    """The block's kernel (module docstring), or None where ``takes`` declines it."""
    got = takes(em)
    if got is None:
        return None
    text, work, local = _Writer(em, *got).kernel()
    launch = {"local_bytes": local_bytes(got[0]), "maps": []}
    return KernelSource(em.symbol, text, work, (), local, launch)


class _Writer(Printer):
    """Prints one kernel; every choice is made from the plan in ``__init__``."""

    def __init__(self, em: KernelEmitter, p: AttentionPlan, op):
        super().__init__(em, p, op, WARPS, M_TILES)
        self.rows = 16 * WARPS * M_TILES

    def row_block(self, row_blocks: int, br: int, bc: int) -> None:
        """Declares ``i0``, the work-group's first row, and leaves in ``grp`` its batch point.

        Where the mask makes some row blocks visit more key blocks than others (causal), the
        work-groups take them longest first over every head, and when they all fit on the device
        at once at two a multiprocessor (one wave), the second half in reverse, so that the
        groups sharing a multiprocessor (dispatched one per multiprocessor, in order) pair the
        longest with the shortest; otherwise (no mask, or work that is not monotonic in the
        row) a head's row blocks are consecutive (K and V shared in the L2 cache) from the last."""
        p, line = self.p, self.line
        heads = 1
        for _, n in p.batch:
            heads *= n
        work = [self.visits(rb * br, br, bc) for rb in range(row_blocks)] if p.constraints else []
        rising = bool(work) and None not in work and all(a <= b for a, b in zip(work, work[1:]))
        falling = bool(work) and None not in work and all(a >= b for a, b in zip(work, work[1:]))
        if rising == falling:  # constant work (or none known): a head at a time
            line(f"const long i0 = ({row_blocks - 1} - grp % {row_blocks}) * {br};")
            line(f"grp /= {row_blocks};")
            return
        groups, sms = row_blocks * heads, self.t.compute_units
        if sms and sms < groups <= 2 * sms:
            line(f"if (grp >= {sms}) grp = {groups - 1 + sms} - grp;  /* the longest with the shortest */")
        rank = f"(grp / {heads})"
        first = f"({row_blocks - 1} - {rank})" if rising else rank
        line(f"const long i0 = {first} * {br};  /* longest first */")
        line(f"grp %= {heads};")

    def step(self, a, j0: str, sk: str, sv: str, keys: int) -> None:
        """One step of the online softmax over the ``keys`` keys from ``j0`` (a C expression), their
        K and V rows at ``sk`` and ``sv`` in ``__local`` memory: S = Q·Kᵀ, the scores, the mask,
        the rows' running max and sum, the partial output rescaled and P·V added; skipped where a
        constraint drops the whole step (the causal diagonal's far half)."""
        p, mt, line = self.p, self.mt, self.line
        sn, wn = keys // 8, self.wp // 8
        line(f"if (!({self.box('i0', self.rows, j0, keys, False)})) {{")
        line(f"const long js = {j0};")
        self.zeros("s", sn)
        self.times_rows("s", a, sk, keys, self.dp)
        self.scored("s", sn, "r0", "js", "c2")
        line(f"if (!({self.box('i0', self.rows, 'js', keys, True)} && js + {keys} <= {p.keys})) {{")
        self.masked("s", sn, "r0", "js", "-INFINITY")
        line("}")
        line("#pragma unroll")
        line(f"for (int m = 0; m < {mt}; m++) {{")
        self.row_max("s[m]", sn, "mr[m][0]", "mr[m][1]")
        line("const float u0 = x0 == -INFINITY ? 0.0f : x0, u1 = x1 == -INFINITY ? 0.0f : x1;")
        line("const float a0 = exp2f(mr[m][0] - u0), a1 = exp2f(mr[m][1] - u1);")
        line("mr[m][0] = x0; mr[m][1] = x1;")
        line("float l0 = 0.0f, l1 = 0.0f;")
        line("#pragma unroll")
        line(f"for (int n = 0; n < {sn}; n++) {{")
        line("s[m][n][0] = exp2f(s[m][n][0] - u0); s[m][n][1] = exp2f(s[m][n][1] - u0);")
        line("s[m][n][2] = exp2f(s[m][n][2] - u1); s[m][n][3] = exp2f(s[m][n][3] - u1);")
        line("l0 += s[m][n][0] + s[m][n][1]; l1 += s[m][n][2] + s[m][n][3];")
        line("}")
        line("lr[m][0] = fmaf(lr[m][0], a0, l0); lr[m][1] = fmaf(lr[m][1], a1, l1);")
        line("#pragma unroll")
        line(f"for (int n = 0; n < {wn}; n++) {{ o[m][n][0] *= a0; o[m][n][1] *= a0; o[m][n][2] *= a1; "
             "o[m][n][3] *= a1; }")
        line("}")
        self.pack("pa", "s", sn)
        self.times_tile("o", "pa", sv, keys, self.wp)
        line("}")

    def kernel(self) -> tuple[str, int, int]:
        p, t, em, mt = self.p, self.t, self.em, self.mt
        dp, wp, br, bc, sub = self.dp, self.wp, self.rows, block_keys(p), step_keys(p)
        blocks = -(-p.keys // bc)
        row_blocks = -(-p.rows // br)
        kb, vb = bc * dp, bc * wp  # a block's K and V elements
        line = self.line
        line("extern __local uint4 tile_attention_local[];  /* launched with local_bytes */")
        line("__local ushort* sq = (__local ushort*)tile_attention_local;")
        line(f"__local ushort* sk = sq + {br * dp};  /* two K blocks */")
        line(f"__local ushort* sv = sk + {2 * kb};  /* two V blocks */")
        line("const int tid = (int)get_local_id(0), lane = tid & 31, warp = tid >> 5;")
        line("long grp = (long)get_group_id(0);")
        self.row_block(row_blocks, br, bc)
        self.roles(p.batch)
        for ptr, name, dims in (("qg", p.q, p.q_dims), ("kg", p.k, p.k_dims), ("vg", p.v, p.v_dims)):
            self.base(ptr, name, dims)
        q_vec = self.vector(p.q, p.q_dims, "i", "d", p.depth)
        k_vec = self.vector(p.k, p.k_dims, "j", "d", p.depth)
        v_vec = self.vector(p.v, p.v_dims, "j", "e", p.width)
        qs = (self.stride(p.q, p.q_dims, "i"), self.stride(p.q, p.q_dims, "d"))
        ks = (self.stride(p.k, p.k_dims, "j"), self.stride(p.k, p.k_dims, "d"))
        vs = (self.stride(p.v, p.v_dims, "j"), self.stride(p.v, p.v_dims, "e"))

        def stage_kv(j0: str, buf: str) -> None:
            self.stage(f"(sk + ({buf}) * {kb})", "kg", j0, p.keys, bc, *ks, p.depth, dp, k_vec)
            self.stage(f"(sv + ({buf}) * {vb})", "vg", j0, p.keys, bc, *vs, p.width, wp, v_vec)

        def dropped(j0: str) -> str:
            return self.box("i0", br, j0, bc, False)

        line(f"long jb = 0;  /* the next block of {bc} keys that some constraint does not drop whole */")
        line(f"while (jb < {blocks} && ({dropped(f'(jb * {bc})')})) jb++;")
        self.stage("sq", "qg", "i0", p.rows, br, *qs, p.depth, dp, q_vec)
        line(f"if (jb < {blocks}) {{")
        stage_kv(f"jb * {bc}", "0")
        line("}")
        line(COMMIT)
        line(_WAIT_ALL)
        line("barrier(CLK_LOCAL_MEM_FENCE);")
        wn = wp // 8
        first = f"warp * {16 * mt}"
        a = ("sq", first)
        if dp <= REGISTER_Q:
            self.a_fragments("qf", "sq", first, dp)
            a = "qf"
        self.zeros("o", wn)
        line(f"float mr[{mt}][2], lr[{mt}][2];")
        line("#pragma unroll")
        line(f"for (int m = 0; m < {mt}; m++) {{ mr[m][0] = mr[m][1] = -INFINITY; "
             "lr[m][0] = lr[m][1] = 0.0f; }")
        line(f"const long r0 = i0 + {first} + (lane >> 2);  /* the lane's rows: r0 + 16 m + 8 h */")
        scale = p.scale_num / p.scale_den * math.log2(math.e)
        line(f"const float c2 = {t.float_literal(scale, DType.FLOAT32)};  /* c * log2(e) */")
        line("int buf = 0;")
        line(f"while (jb < {blocks}) {{")
        line(f"const long j0 = jb * {bc};")
        line("long jn = jb + 1;")
        line(f"while (jn < {blocks} && ({dropped(f'(jn * {bc})')})) jn++;")
        line(f"if (jn < {blocks}) {{  /* the next block's copies, in flight through this one */")
        stage_kv(f"jn * {bc}", "buf ^ 1")
        line("}")
        line(COMMIT)
        line(f"__local ushort* skb = sk + buf * {kb};")
        line(f"__local ushort* svb = sv + buf * {vb};")
        line("#pragma unroll 1  /* a step's registers, not two steps' */")
        line(f"for (int h = 0; h < {bc // sub}; h++) {{")
        self.step(a, f"(j0 + h * {sub})", f"(skb + h * {sub * dp})", f"(svb + h * {sub * wp})", sub)
        line("}")
        line(_WAIT_ALL)
        line("barrier(CLK_LOCAL_MEM_FENCE);  /* the next block is in; every warp is done with this one */")
        line("buf ^= 1;")
        line("jb = jn;")
        line("}")
        line("#pragma unroll")
        line(f"for (int m = 0; m < {mt}; m++) {{")
        line("#pragma unroll")
        line("for (int h = 0; h < 2; h++) {")
        line("lr[m][h] += __shfl_xor_sync(0xffffffffu, lr[m][h], 1);")
        line("lr[m][h] += __shfl_xor_sync(0xffffffffu, lr[m][h], 2);")
        line("}")
        line("}")
        self.store("o", p.out, p.out_dims, f"i0 + {first}", "i", "e", wn, p.width, "/ lr[m][h]")
        groups = row_blocks
        for _, n in p.batch:
            groups *= n
        text = t.group_kernel(em.symbol, em.params, self.threads, self.lines)
        return text, groups * self.threads, self.threads


__all__ = ["BLOCK_STEPS", "STEP_KEYS", "block_keys", "local_bytes", "source", "step_keys", "takes"]
