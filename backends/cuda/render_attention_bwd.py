"""An attention chain's gradient (``stripe.passes.attention_backward``, planned with an
``AttentionBackwardPlan``) on the tensor cores: the two fused kernels of
``backends.clike.attention_backward``, with every product a warp-level ``mma.sync`` (float16 or
bfloat16 operands, float32 sums; the pieces are ``attention_tiles``'s).

Taken for float16 or bfloat16 Q, K, V and DO, heads up to 128 wide, with a scale, a mask written as
constraints and score kernels (a ``cond`` mask, a scale written on S: the score P from S, and DS
from the cotangent of P, point by point in registers at each row and key, ``_scored_gradient``; a
bias's gradient is not fused at all). With ``c`` the scale:

* part ``dq``: a work-group per (batch point, 64 query rows), a warp per 16 rows, the rows of Q and
  DO held as A fragments. A first pass over the keys (blocks of K and V staged in ``__local``
  memory) computes ``S = Q·Kᵀ`` and ``DO·Vᵀ`` and runs the online softmax of the raw scores: the
  running max ``m``, the sum ``l`` of ``exp(c (s - m))`` and the same weighted sum of ``DO · v_j``.
  The statistics ``Mx``, ``Z`` and ``DZ_1`` follow as in the portable kernel and are written; a
  second pass recomputes both products and ``DS = c E (DO·v_j / Z + DZ_1)`` (``E = exp(c (s -
  Mx))``), rounds DS to the operands' type and sums ``DQ = DS·K``.
* part ``dkv``: a work-group per (point of K's batch dims, 64 keys), a warp per 16 keys, K's and V's
  blocks staged once. For each head sharing them, the query rows come in steps: their Q and DO
  staged, their ``Mx``, ``1 / Z`` and ``DZ_1`` in ``__local`` memory. ``Sᵀ = K·Qᵀ`` and ``V·DOᵀ``
  give ``Eᵀ / Z`` and ``DSᵀ``, both rounded to the operands' type, and ``DV += (E / Z)ᵀ·DO``,
  ``DK += DSᵀ·Q``.

A key past the last, or failing a constraint, has no weight; a step some constraint drops whole is
skipped. Against the portable kernels the weights and DS are rounded to the operands' type before
their products (``conformance.attention.gradient_tolerance`` allows for it, ``docs/semantics.md``
§8.7) and every sum is in the unit's order.
"""

from __future__ import annotations

import math

from backends.clike.kernel import KernelEmitter, KernelSource
from backends.cuda.attention_tiles import Printer, operands, padded
from backends.cuda.mma import COMMIT
from stripe.plans import AttentionBackwardPlan
from tile.dtypes import DType

WARPS = 4  # a work-group's warps: 64 query rows (part dq) or keys (part dkv)
WIDEST = 128
_F32 = DType.FLOAT32
_FLOATS = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)
_WAIT_ALL = 'asm volatile("cp.async.wait_group 0;" ::: "memory");'


def steps(p: AttentionBackwardPlan) -> int:
    """Keys a step (part dq) or query rows a step (part dkv): fewer for wide heads (registers)."""
    wide = max(padded(p.depth), padded(p.width)) > 64
    if p.part == "dq":
        return 32 if wide else 64
    return 16 if wide else 32


def local_bytes(p: AttentionBackwardPlan) -> int:
    """The ``__local`` memory of ``p``'s kernel (dynamic: launched with it): part dq, the rows' Q
    and DO and two key blocks of K and V; part dkv, the keys' K and V and two steps' Q, DO and
    statistics."""
    dp, wp, n = padded(p.depth), padded(p.width), steps(p)
    return 2 * (16 * WARPS + 2 * n) * (dp + wp) + (24 * n if p.part == "dkv" else 0)


def takes(em: KernelEmitter) -> tuple | None:
    """``(plan, operation)`` when the part runs on the tensor cores (module docstring), else None."""
    p = em.block.plan
    if not isinstance(p, AttentionBackwardPlan):
        return None
    outs = (p.mx, p.z, p.dz, *((p.dq,) if p.part == "dq" else (p.dk, p.dv)))
    return operands(em, AttentionBackwardPlan, (p.q, p.k, p.v, p.do), outs, _FLOATS, local_bytes(p), WIDEST)


def source(em: KernelEmitter) -> KernelSource | None:
    """The part's kernel (module docstring), or None where ``takes`` declines it."""
    got = takes(em)
    if got is None:
        return None
    w = _Writer(em, *got)
    text, work, local = w.dq() if got[0].part == "dq" else w.dkv()
    return KernelSource(em.symbol, text, work, (), local, {"local_bytes": local_bytes(got[0]), "maps": []})


class _Writer(Printer):
    def __init__(self, em: KernelEmitter, p: AttentionBackwardPlan, op):
        super().__init__(em, p, op, WARPS)
        self.n = steps(p)
        self.c = p.scale_num / p.scale_den

    def _layout(self, name: str, dims: tuple[str, ...], row: str, col: str, n: int) -> tuple:
        """``(row stride, column stride, n, vector)`` of a tile of refinement ``name``."""
        return (self.stride(name, dims, row), self.stride(name, dims, col), n,
                self.vector(name, dims, row, col, n))

    def _stage(self, dst: str, base: str, first: str, valid: int, rows: int, layout: tuple,
               width: int) -> None:
        rs, cs, n, vec = layout
        self.stage(dst, base, first, valid, rows, rs, cs, n, width, vec)

    def _scales(self) -> None:
        t = self.t
        self.line(f"const float cc = {t.float_literal(self.c, _F32)};")
        self.line(f"const float c2 = {t.float_literal(self.c * math.log2(math.e), _F32)};  /* c * log2(e) */")

    def _kernel(self, groups: int) -> tuple[str, int, int]:
        text = self.t.group_kernel(self.em.symbol, self.em.params, self.threads, self.lines)
        return text, groups * self.threads, self.threads

    def _rounded(self, name: str, value: str) -> str:
        dt = self.b.ref(name).shape.dtype
        return self.t.convert(self.t.convert(value, _F32, dt), dt, _F32)

    def _scored_gradient(self, acc: str, keep: str, mx: str, factor: str) -> str:
        """Prints, at the row ``i`` and key ``j`` (C variables, moved back into the extents here),
        the score ``P`` from the raw ``S`` in ``acc`` through the plan's score kernels, its weight
        ``w = exp(c (P - mx))`` (0 where ``keep`` fails or P is -inf), the cotangent of P,
        ``c w factor``, and DS from it through the gradient's score kernels, left in ``acc`` (0 where
        ``keep`` fails); returns the weight's name."""
        p, line = self.p, self.line
        w, ok = self.em.fresh("w"), self.em.fresh("ok")
        line(f"const bool {ok} = {keep};")
        self.clamp("i", "j")
        regs: dict = {}
        score = self.point(p.scores, p.s, acc, regs) if p.scores else acc
        line(f"const float {w} = {ok} && {score} > -INFINITY ? exp2f(c2 * ({score} - {mx})) : 0.0f;")
        dx = f"cc * {w} * ({factor})"
        ds = self.point(p.grad_scores, p.dp, dx, regs) if p.grad_scores else dx
        line(f"{acc} = {ok} ? {ds} : 0.0f;")
        return w

    # ------------------------------------------------------------------ part dq
    def dq(self) -> tuple[str, int, int]:
        p, t, line = self.p, self.t, self.line
        dp, wp, bc, br = self.dp, self.wp, self.n, 16 * WARPS
        blocks, row_blocks = -(-p.keys // bc), -(-p.rows // br)
        kb, vb = bc * dp, bc * wp  # a K block's and a V block's elements
        line("extern __local uint4 tile_attention_local[];  /* launched with local_bytes */")
        line("__local ushort* sq = (__local ushort*)tile_attention_local;")
        line(f"__local ushort* sdo = sq + {br * dp};")
        line(f"__local ushort* sk = sdo + {br * wp};  /* two K blocks */")
        line(f"__local ushort* sv = sk + {2 * kb};  /* two V blocks */")
        line("const int tid = (int)get_local_id(0), lane = tid & 31, warp = tid >> 5;")
        line("long grp = (long)get_group_id(0);")
        line(f"const long i0 = ({row_blocks - 1} - grp % {row_blocks}) * {br};")
        line(f"grp /= {row_blocks};")
        self.roles(p.batch)
        for ptr, name, dims in (("qg", p.q, p.q_dims), ("kg", p.k, p.k_dims), ("vg", p.v, p.v_dims),
                                ("dog", p.do, p.do_dims)):
            self.base(ptr, name, dims)
        q = self._layout(p.q, p.q_dims, "i", "d", p.depth)
        do = self._layout(p.do, p.do_dims, "i", "e", p.width)
        k = self._layout(p.k, p.k_dims, "j", "d", p.depth)
        v = self._layout(p.v, p.v_dims, "j", "e", p.width)
        self._stage("sq", "qg", "i0", p.rows, br, q, dp)
        self._stage("sdo", "dog", "i0", p.rows, br, do, wp)
        line(COMMIT)
        line(_WAIT_ALL)
        line("barrier(CLK_LOCAL_MEM_FENCE);")
        self.a_fragments("qf", "sq", "warp * 16", dp)
        self.a_fragments("dof", "sdo", "warp * 16", wp)
        line("const long r0 = i0 + warp * 16 + (lane >> 2);")
        self._scales()
        sn = bc // 8
        per_point = bool(p.scores or p.grad_scores)  # the gradient's weights and DS point by point

        def dropped(j0: str) -> str:
            return self.box("i0", br, j0, bc, False)

        def stage(jb: str, buf: str) -> None:
            line(f"if ({jb} < {blocks}) {{")
            self._stage(f"(sk + ({buf}) * {kb})", "kg", f"{jb} * {bc}", p.keys, bc, k, dp)
            self._stage(f"(sv + ({buf}) * {vb})", "vg", f"{jb} * {bc}", p.keys, bc, v, wp)
            line("}")
            line(COMMIT)

        def keys(body, points: bool) -> None:
            """A pass over the key blocks some constraint does not drop whole, the next one's copies
            in flight while one is multiplied: S and DO·Vᵀ computed into ``s`` and ``dv_``, then
            the scores P in place of S and the masked ones -inf (unless ``body`` does both point by
            point: ``points``), then ``body``."""
            line("{")
            line("long jb = 0;")
            line(f"while (jb < {blocks} && ({dropped(f'(jb * {bc})')})) jb++;")
            stage("jb", "0")
            line("int buf = 0;")
            line(f"while (jb < {blocks}) {{")
            line(f"const long j0 = jb * {bc};")
            line("long jn = jb + 1;")
            line(f"while (jn < {blocks} && ({dropped(f'(jn * {bc})')})) jn++;")
            stage("jn", "buf ^ 1")
            line('asm volatile("cp.async.wait_group 1;" ::: "memory");')
            line("barrier(CLK_LOCAL_MEM_FENCE);")
            line(f"__local ushort* skb = sk + buf * {kb};")
            line(f"__local ushort* svb = sv + buf * {vb};")
            self.zeros("s", sn)
            self.times_rows("s", "qf", "skb", bc, dp)
            self.zeros("dv_", sn)
            self.times_rows("dv_", "dof", "svb", bc, wp)
            if not points:
                if p.scores:
                    self.scored("s", sn, "r0", "j0", "1.0f")
                line(f"if (!({self.box('i0', br, 'j0', bc, True)} && j0 + {bc} <= {p.keys})) {{")
                self.masked("s", sn, "r0", "j0", "-INFINITY")
                line("}")
            body()
            line("barrier(CLK_LOCAL_MEM_FENCE);  /* every warp is done with the block */")
            line("buf ^= 1;")
            line("jb = jn;")
            line("}")
            line("}")

        def online() -> None:
            self.row_max("s[0]", sn, "m0", "m1")
            line("const float a0 = m0 == -INFINITY ? 0.0f : exp2f(c2 * (m0 - x0));")
            line("const float a1 = m1 == -INFINITY ? 0.0f : exp2f(c2 * (m1 - x1));")
            line("l0 *= a0; l1 *= a1; od0 *= a0; od1 *= a1; m0 = x0; m1 = x1;")
            line("#pragma unroll")
            line(f"for (int n = 0; n < {sn}; n++) {{")
            line("#pragma unroll")
            line("for (int e = 0; e < 4; e++) {")
            line("const float x = e < 2 ? x0 : x1;")
            line("const float w = s[0][n][e] == -INFINITY ? 0.0f : exp2f(c2 * (s[0][n][e] - x));")
            line("if (e < 2) { l0 += w; od0 += w * dv_[0][n][e]; } "
                 "else { l1 += w; od1 += w * dv_[0][n][e]; }")
            line("}")
            line("}")

        line("float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f, od0 = 0.0f, od1 = 0.0f;")
        keys(online, False)
        for x in ("l0", "l1", "od0", "od1"):
            line(f"{x} += __shfl_xor_sync(0xffffffffu, {x}, 1);")
            line(f"{x} += __shfl_xor_sync(0xffffffffu, {x}, 2);")
        for h in "01":
            line(f"const float mx{h} = {self._rounded(p.mx, f'm{h}')};")
            line(f"const float rs{h} = expf(cc * (m{h} - mx{h}));")
            line(f"const float z{h} = {self._rounded(p.z, f'l{h} * rs{h}')};")
            line(f"const float dz{h} = {self._rounded(p.dz, f'-(od{h} * rs{h}) / (z{h} * z{h})')};")
            line(f"if ((lane & 3) == 0 && r0 + {8 * int(h)} < {p.rows}) {{")
            at = self.role | {"i": f"(r0 + {8 * int(h)})"}
            for name, value in ((p.mx, f"mx{h}"), (p.z, f"z{h}"), (p.dz, f"dz{h}")):
                ref = self.b.ref(name)
                line(t.store(self.em.ptrs[ref.source], self.offset(name, p.stat_dims, at),
                             t.convert(value, _F32, ref.shape.dtype), ref.shape.dtype))
            line("}")
        self.zeros("dq", dp // 8)

        def gradient() -> None:
            line("#pragma unroll")
            line(f"for (int n = 0; n < {sn}; n++) {{")
            line("#pragma unroll")
            line("for (int e = 0; e < 4; e++) {")
            line("const float mx = e < 2 ? mx0 : mx1, z = e < 2 ? z0 : z1, dz = e < 2 ? dz0 : dz1;")
            if per_point:
                line("long i = r0 + (e >> 1) * 8, j = j0 + n * 8 + (lane & 3) * 2 + (e & 1);")
                self._scored_gradient("s[0][n][e]", self.keep("i", "j"), "mx", "dv_[0][n][e] / z + dz")
            else:
                line("s[0][n][e] = s[0][n][e] == -INFINITY ? 0.0f : "
                     "cc * exp2f(c2 * (s[0][n][e] - mx)) * (dv_[0][n][e] / z + dz);")
            line("}")
            line("}")
            self.pack("ds", "s", sn)
            self.times_tile("dq", "ds", "skb", bc, dp)

        keys(gradient, per_point)
        self.store("dq", p.dq, p.q_dims, "i0 + warp * 16", "i", "d", dp // 8, p.depth)
        groups = row_blocks
        for _, n in p.batch:
            groups *= n
        return self._kernel(groups)

    # ------------------------------------------------------------------ part dkv
    def dkv(self) -> tuple[str, int, int]:
        p, t, line = self.p, self.t, self.line
        dp, wp, bq, bk = self.dp, self.wp, self.n, 16 * WARPS
        key_blocks = -(-p.keys // bk)
        qb, dob = bq * dp, bq * wp
        line("extern __local uint4 tile_attention_local[];  /* launched with local_bytes */")
        line("__local ushort* sk = (__local ushort*)tile_attention_local;")
        line(f"__local ushort* sv = sk + {bk * dp};")
        line(f"__local ushort* sq = sv + {bk * wp};  /* two steps' Q */")
        line(f"__local ushort* sdo = sq + {2 * qb};  /* two steps' DO */")
        line(f"__local float* sst = (__local float*)(sdo + {2 * dob});  /* two steps' Mx, 1 / Z, DZ_1 */")
        line("const int tid = (int)get_local_id(0), lane = tid & 31, warp = tid >> 5;")
        line("long grp = (long)get_group_id(0);")
        line(f"const long j0 = (grp % {key_blocks}) * {bk};")
        line(f"grp /= {key_blocks};")
        own = [(n, e) for n, e in p.batch if n in p.k_dims]
        shared = [(n, e) for n, e in p.batch if n not in p.k_dims]
        self.roles(own)
        self.base("kg", p.k, p.k_dims)
        self.base("vg", p.v, p.v_dims)
        q = self._layout(p.q, p.q_dims, "i", "d", p.depth)
        do = self._layout(p.do, p.do_dims, "i", "e", p.width)
        self._stage("sk", "kg", "j0", p.keys, bk, self._layout(p.k, p.k_dims, "j", "d", p.depth), dp)
        self._stage("sv", "vg", "j0", p.keys, bk, self._layout(p.v, p.v_dims, "j", "e", p.width), wp)
        line(COMMIT)
        self._scales()
        self.zeros("dk", dp // 8)
        self.zeros("dv", wp // 8)
        line("const long rj = j0 + warp * 16 + (lane >> 2);  /* the lane's keys: rj, rj + 8 */")
        heads = 1
        for _, n in shared:
            heads *= n
        rsteps = -(-p.rows // bq)
        total = heads * rsteps

        def stat(name: str) -> str:
            ref = self.b.ref(name)
            dt = ref.shape.dtype
            at = self.offset(name, p.stat_dims, self.role | {"i": "i"})
            return t.convert(t.load(self.em.ptrs[ref.source], at, dt), dt, _F32)

        def at_step(tt: str) -> None:
            """Declares the step's head (the batch roles K lacks) and first row ``i0``."""
            line(f"const long i0 = ({tt} % {rsteps}) * {bq};")
            line(f"long grp = {tt} / {rsteps};")
            self.roles(shared)

        def dropped(tt: str) -> str:
            return self.box(f"(({tt} % {rsteps}) * {bq})", bq, "j0", bk, False)

        def stage(tt: str, buf: str) -> None:
            """The copies of step ``tt``'s Q and DO (a commit group) and its statistics into buffer
            ``buf``."""
            line(f"if ({tt} < {total}) {{")
            at_step(tt)
            self.base("qg", p.q, p.q_dims)
            self.base("dog", p.do, p.do_dims)
            self._stage(f"(sq + ({buf}) * {qb})", "qg", "i0", p.rows, bq, q, dp)
            self._stage(f"(sdo + ({buf}) * {dob})", "dog", "i0", p.rows, bq, do, wp)
            line(f"if (tid < {bq}) {{")
            line("const long i = i0 + tid;")
            line(f"const bool ok = i < {p.rows};")
            line(f"__local float* st = sst + ({buf}) * {3 * bq};")
            line(f"st[tid] = ok ? {stat(p.mx)} : 0.0f;")
            line(f"st[{bq} + tid] = ok ? 1.0f / {stat(p.z)} : 0.0f;")
            line(f"st[{2 * bq} + tid] = ok ? {stat(p.dz)} : 0.0f;")
            line("}")
            line("}")
            line(COMMIT)

        line("{")
        line("long tt = 0;")
        line(f"while (tt < {total} && ({dropped('tt')})) tt++;")
        stage("tt", "0")
        line('asm volatile("cp.async.wait_group 1;" ::: "memory");  /* K and V */')
        line("barrier(CLK_LOCAL_MEM_FENCE);")
        kv_regs = max(dp, wp) <= 64
        ka, va = ("sk", "warp * 16"), ("sv", "warp * 16")
        if kv_regs:
            self.a_fragments("kf", "sk", "warp * 16", dp)
            self.a_fragments("vf", "sv", "warp * 16", wp)
            ka, va = "kf", "vf"
        line("int buf = 0;")
        line(f"while (tt < {total}) {{")
        line("long tn = tt + 1;")
        line(f"while (tn < {total} && ({dropped('tn')})) tn++;")
        stage("tn", "buf ^ 1")
        line('asm volatile("cp.async.wait_group 1;" ::: "memory");')
        line("barrier(CLK_LOCAL_MEM_FENCE);")
        at_step("tt")
        line(f"__local ushort* sqb = sq + buf * {qb};")
        line(f"__local ushort* sdob = sdo + buf * {dob};")
        line(f"__local float* st = sst + buf * {3 * bq};")
        sn = bq // 8
        self.zeros("s", sn)
        self.times_rows("s", ka, "sqb", bq, dp)
        self.zeros("g", sn)
        self.times_rows("g", va, "sdob", bq, wp)
        line(f"const bool full = ({self.box('i0', bq, 'j0', bk, True)}) && i0 + {bq} <= {p.rows} && "
             f"j0 + {bk} <= {p.keys};")
        line("#pragma unroll")
        line(f"for (int n = 0; n < {sn}; n++) {{")
        line("#pragma unroll")
        line("for (int e = 0; e < 4; e++) {")
        line("const int il = n * 8 + (lane & 3) * 2 + (e & 1);")
        if p.scores or p.grad_scores:
            line("long i = i0 + il, j = rj + (e >> 1) * 8;")
            line(f"const float iz = st[{bq} + il];")
            w = self._scored_gradient("s[0][n][e]", f"full || ({self.keep('i', 'j')})", "st[il]",
                                      f"g[0][n][e] * iz + st[{2 * bq} + il]")
            line(f"g[0][n][e] = {w} * iz;")
        else:
            line("const long i = i0 + il, j = rj + (e >> 1) * 8;")
            line(f"const bool ok = full || ({self.keep('i', 'j')});")
            line(f"const float w = ok ? exp2f(c2 * (s[0][n][e] - st[il])) : 0.0f, iz = st[{bq} + il];")
            line(f"s[0][n][e] = cc * w * (g[0][n][e] * iz + st[{2 * bq} + il]);")
            line("g[0][n][e] = w * iz;")
        line("}")
        line("}")
        self.pack("pw", "g", sn)
        self.pack("pd", "s", sn)
        self.times_tile("dv", "pw", "sdob", bq, wp)
        self.times_tile("dk", "pd", "sqb", bq, dp)
        line("barrier(CLK_LOCAL_MEM_FENCE);  /* every warp is done with the step */")
        line("buf ^= 1;")
        line("tt = tn;")
        line("}")
        line("}")
        self.store("dk", p.dk, p.k_dims, "j0 + warp * 16", "j", "d", dp // 8, p.depth)
        self.store("dv", p.dv, p.v_dims, "j0 + warp * 16", "j", "e", wp // 8, p.width)
        groups = key_blocks
        for _, n in own:
            groups *= n
        return self._kernel(groups)


__all__ = ["local_bytes", "source", "steps", "takes"]
