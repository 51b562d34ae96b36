"""An attention chain's gradient (``stripe.passes.attention_backward``, planned with an
``AttentionBackwardPlan``) as two fused kernels that recompute the scores blockwise, as
FlashAttention's backward does: S, the weights and their cotangents never reach memory.

With ``c`` the scale, ``s = q_i · k_j`` (float32), the chain's statistics ``Mx`` (row max of S),
``Z`` (row sum of ``exp(c (s - Mx))``) and ``DZ_1 = -Σ_e DO_ie O1_ie / Z²``, each weight is
``E_ij = exp(c (P_ij - Mx_i))`` and ``DP_ij = c E_ij (DO_i / Z_i · v_j + DZ_1_i)`` (the tie term
``DP_1`` is taken as its real value, 0), where the score ``P`` is ``s`` itself or, with score
kernels, ``s`` through them, and S's cotangent ``DS`` is ``DP`` itself or ``DP`` through the
derivatives of the score kernels: both run point by point on registers
(``backends.clike.attention.run_points``), their own statements rounding as the chain's do. A key
whose score is ``-inf`` (a ``cond`` mask) has no weight.

* part ``dq``: a work-group of ``group`` query rows, one work-item each, its row of Q and of DO
  in registers. A first pass over the keys (``step`` rows of K and V staged in ``__local``
  memory at a time) is the forward's online softmax: a running max ``m`` of P, the sum ``l`` of
  ``exp(c (P - m))`` and the same weighted sum of ``DO · v_j`` (``DO · O1``, without O1's row),
  both rescaled when ``m`` grows. Then ``Mx = m``
  and ``Z = l exp(c (m - Mx))`` in their types (the scale applies to the value Mx holds), and
  ``DZ_1``, are written, one element per row. A second pass over the keys recomputes ``E``,
  ``DS`` and sums ``DQ_i = Σ_j DS_ij k_j`` in registers.
* part ``dkv``: a work-group of ``group`` keys (at a point of K's batch dims), one work-item each,
  its rows of K and V in registers; for each head sharing them (the batch dims K lacks, if any),
  the query rows come in steps of ``step``: their rows of Q, of ``DO / Z`` and their
  ``Mx`` and ``DZ_1`` staged in ``__local`` memory; each work-item sums ``DV_j = Σ_i E_ij DO_i /
  Z_i`` and ``DK_j = Σ_i DS_ij q_i`` in registers.

A step whose every (row, key) fails a mask's constraint is skipped whole (above a causal mask's
diagonal). Sums are float32; Q, K, V, DO and the statistics are read in their own types (half
types through the target's conversions) and the results written in theirs. Lengths need not be
multiples of the blocks: rows and keys past the end are staged as zeros and skipped.

Taken: a block whose plan is an ``AttentionBackwardPlan`` on a target with work-groups, its
buffers float and passed to the kernel, its staging within the local memory; otherwise the
general kernel runs the block's statements (the same results, slowly).
"""

from __future__ import annotations

from backends.clike.attention import load_f32, mask_tests, offset, run_points, skip_masked
from backends.clike.kernel import KernelEmitter
from stripe.ir import Block
from stripe.plans import AttentionBackwardPlan
from tile.dtypes import DType

_F32 = DType.FLOAT32
_FLOATS = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)
_UNROLL = "#pragma unroll"


def takes(em: KernelEmitter) -> AttentionBackwardPlan | None:
    """The block's plan when this target runs it fused (module docstring), else None."""
    b, t, p = em.block, em.t, em.block.plan
    if not t.workgroups or not isinstance(p, AttentionBackwardPlan):
        return None
    children = {s.name for s in b.stmts if isinstance(s, Block)}
    if any(n not in children for n in p.scores + p.grad_scores):
        return None
    names = [p.q, p.k, p.v, p.do, p.mx, p.z, p.dz, *((p.dq,) if p.part == "dq" else (p.dk, p.dv))]
    for name in names:
        if b.ref(name).source not in em.ptrs or b.ref(name).shape.dtype not in _FLOATS:
            return None
    local = 4 * p.step * (p.depth + p.width + 3)
    return p if local <= t.local_bytes else None


def emit(em: KernelEmitter) -> tuple[int, int]:
    """Emits the part's kernel body through ``em``; returns its work-items and work-group size."""
    p = em.block.plan
    assert isinstance(p, AttentionBackwardPlan), "attention_backward.emit runs planned blocks (takes)"
    return _dq(em, p) if p.part == "dq" else _dkv(em, p)


def _groups(em: KernelEmitter, p: AttentionBackwardPlan, own: str, span: int, batch) -> tuple[dict, str, int]:
    """The work-group's point of the ``batch`` roles and its first row (``own`` ``i``) or key
    (``j``): the roles' C expressions, with the work-item's own ``own``; the first's name; the
    number of groups."""
    em.line("const long lid = (long)get_local_id(0);")
    em.line("const long grp = (long)get_group_id(0);")
    blocks = -(-span // p.group)
    role: dict[str, str] = {"_0": "0"}
    rb = em.declare(DType.INT64, f"grp % {blocks}", "blk")
    rest = f"(grp / {blocks})"
    for name, n in reversed(batch):
        role[name] = em.declare(DType.INT64, f"{rest} % {n}", name)
        rest = f"({rest} / {n})"
    first = em.declare(DType.INT64, f"{rb} * {p.group}", f"{own}0")
    role[own] = em.declare(DType.INT64, f"{first} + lid", own)
    groups = blocks
    for _, n in batch:
        groups *= n
    return role, first, groups


def _dot(em: KernelEmitter, n: int, a: str, b: str) -> str:
    """A float32 register holding ``Σ_k a(k) b(k)`` over ``k < n`` (``a``, ``b`` formats of ``k``)."""
    s = em.fresh("dot")
    em.line(f"float {s} = 0.0f;")
    em.line(_UNROLL)
    with em.scope(f"for (long n_ = 0; n_ < {n}; n_++)"):
        em.line(f"{s} += {a.format(k='n_')} * {b.format(k='n_')};")
    return s


def _array(em: KernelEmitter, name: str, n: int, init: str = "0.0f") -> str:
    arr = em.fresh(name)
    em.line(f"float {arr}[{n}];")
    em.line(_UNROLL)
    with em.scope(f"for (long n_ = 0; n_ < {n}; n_++)"):
        em.line(f"{arr}[n_] = {init.format(k='n_')};")
    return arr


def _stage(em: KernelEmitter, p, rows: list[tuple[str, tuple[str, ...], int, str, str]], who: str,
           first: str, span: int, at: dict[str, str]) -> None:
    """Stages ``p.step`` rows from ``first`` (of the role ``who``, ``span`` of them) of each
    ``(buffer, dims, length, local array, element role)``: zeros past the end."""
    for buf, dims, n, arr, what in rows:
        with em.scope(f"for (long u = lid; u < {p.step * n}; u += {p.group})"):
            uu = em.declare(DType.INT64, f"u / {n}", "uu")
            el = em.declare(DType.INT64, f"u % {n}", what)
            x = em.declare(DType.INT64, f"{first} + {uu}", who)
            em.line(f"{arr}[u] = {x} < {span} ? {load_f32(em, buf, dims, at | {who: x, what: el})} : 0.0f;")


def _store(em: KernelEmitter, name: str, dims, at: dict[str, str], value: str) -> None:
    b, t = em.block, em.t
    dt = b.ref(name).shape.dtype
    em.line(t.store(em.ptrs[b.ref(name).source], offset(b, name, dims, at), t.convert(value, _F32, dt), dt))


def _rounded(em: KernelEmitter, name: str, value: str) -> str:
    """A float32 register holding ``value`` rounded to the type of refinement ``name``."""
    t, dt = em.t, em.block.ref(name).shape.dtype
    return em.declare(_F32, t.convert(t.convert(value, _F32, dt), dt, _F32), f"r_{name}")


def _dq(em: KernelEmitter, p: AttentionBackwardPlan) -> tuple[int, int]:
    t, depth, width, step = em.t, p.depth, p.width, p.step
    c = t.float_literal(p.scale_num / p.scale_den, _F32)
    neg_inf = t.float_literal(float("-inf"), _F32)
    ks, vs = em.fresh("ks"), em.fresh("vs")
    em.line(f"__local float {ks}[{step * depth}];")
    em.line(f"__local float {vs}[{step * width}];")
    role, i0, groups = _groups(em, p, "i", p.rows, p.batch)
    active = em.declare(DType.BOOL, f"{role['i']} < {p.rows}", "active")
    q = _array(em, "q", depth, f"{active} ? {load_f32(em, p.q, p.q_dims, role | {'d': '{k}'})} : 0.0f")
    do = _array(em, "dov", width, f"{active} ? {load_f32(em, p.do, p.do_dims, role | {'e': '{k}'})} : 0.0f")
    dq = _array(em, "dq", depth)
    od = em.fresh("od")  # Σ_j exp(c (P_j - m)) DO · v_j: DO · O1, relative to the running max
    em.line(f"float {od} = 0.0f;")
    m, l_ = em.fresh("m"), em.fresh("l")
    em.line(f"float {m} = {neg_inf};")
    em.line(f"float {l_} = 0.0f;")

    def keys(body) -> None:
        """A pass over the keys: each step staged, then ``body(jj, s)`` for each key kept."""
        with em.scope(f"for (long j0 = 0; j0 < {p.keys}; j0 += {step})"):
            skip_masked(em, p, role, i0, "j0", p.group, step)
            _stage(em, p, [(p.k, p.k_dims, depth, ks, "d"), (p.v, p.v_dims, width, vs, "e")], "j", "j0",
                   p.keys, role)
            em.line("barrier(CLK_LOCAL_MEM_FENCE);")
            with em.scope(f"if ({active})"):
                with em.scope(f"for (long jj = 0; jj < {step}; jj++)"):
                    j = em.declare(DType.INT64, "j0 + jj", "j")
                    keep = [f"{j} < {p.keys}", *mask_tests(p, role | {"j": j})]
                    with em.scope(f"if ({' && '.join(keep)})"):
                        body(_dot(em, depth, f"{q}[{{k}}]", f"{ks}[jj * {depth} + {{k}}]"), role | {"j": j})
            em.line("barrier(CLK_LOCAL_MEM_FENCE);")

    def online(s: str, at: dict[str, str]) -> None:
        s = em.declare(_F32, run_points(em, p.scores, p.s, s, p.s_dims, at, {}), "score")
        em.line(f"if (!({s} > {neg_inf})) continue;  /* a key the score masks: no weight */")
        with em.scope(f"if ({s} > {m})"):
            alpha = em.declare(_F32, t.math("exp", _F32, [f"{c} * ({m} - {s})"]), "alpha")
            em.line(f"{l_} *= {alpha};")
            em.line(f"{od} *= {alpha};")
            em.line(f"{m} = {s};")
        w = em.declare(_F32, t.math("exp", _F32, [f"{c} * ({s} - {m})"]), "w")
        em.line(f"{l_} += {w};")
        em.line(f"{od} += {w} * {_dot(em, width, f'{do}[{{k}}]', f'{vs}[jj * {width} + {{k}}]')};")

    keys(online)
    # the statistics, in their types; DO / Z kept in place of DO
    mx = _rounded(em, p.mx, m)
    r = em.declare(_F32, t.math("exp", _F32, [f"{c} * ({m} - {mx})"]), "rescale")
    z = _rounded(em, p.z, f"{l_} * {r}")
    dz = _rounded(em, p.dz, f"-({od} * {r}) / ({z} * {z})")
    with em.scope(f"if ({active})"):
        for name, value in ((p.mx, mx), (p.z, z), (p.dz, dz)):
            _store(em, name, p.stat_dims, role, value)
    em.line(_UNROLL)
    with em.scope(f"for (long e = 0; e < {width}; e++)"):
        em.line(f"{do}[e] = {do}[e] / {z};")

    def grad(s: str, at: dict[str, str]) -> None:
        regs: dict = {}
        s = run_points(em, p.scores, p.s, s, p.s_dims, at, regs)
        e = em.declare(_F32, t.math("exp", _F32, [f"{c} * ({s} - {mx})"]), "e")
        dp = _dot(em, width, f"{do}[{{k}}]", f"{vs}[jj * {width} + {{k}}]")
        ds = em.declare(_F32, f"{c} * {e} * ({dp} + {dz})", "ds")
        ds = em.declare(_F32, run_points(em, p.grad_scores, p.dp, ds, p.s_dims, at, regs), "ds_s")
        em.line(_UNROLL)
        with em.scope(f"for (long d = 0; d < {depth}; d++)"):
            em.line(f"{dq}[d] += {ds} * {ks}[jj * {depth} + d];")

    keys(grad)
    with em.scope(f"if ({active})"):
        em.line(_UNROLL)
        with em.scope(f"for (long d = 0; d < {depth}; d++)"):
            _store(em, p.dq, p.q_dims, role | {"d": "d"}, f"{dq}[d]")
    return groups * p.group, p.group


def _dkv(em: KernelEmitter, p: AttentionBackwardPlan) -> tuple[int, int]:
    depth, width, step = p.depth, p.width, p.step
    qs, dos, st = em.fresh("qs"), em.fresh("dos"), em.fresh("st")
    em.line(f"__local float {qs}[{step * depth}];")
    em.line(f"__local float {dos}[{step * width}];  /* DO / Z */")
    em.line(f"__local float {st}[{2 * step}];  /* Mx, DZ_1 of each row */")
    # a work-group per point of K's batch dims; the heads that share its K and V (batch dims K
    # lacks) are summed over in a loop around the rows'
    shared = [(n, e) for n, e in p.batch if n not in p.k_dims]
    role, j0, groups = _groups(em, p, "j", p.keys, [(n, e) for n, e in p.batch if n in p.k_dims])
    active = em.declare(DType.BOOL, f"{role['j']} < {p.keys}", "active")
    k = _array(em, "kr", depth, f"{active} ? {load_f32(em, p.k, p.k_dims, role | {'d': '{k}'})} : 0.0f")
    v = _array(em, "vr", width, f"{active} ? {load_f32(em, p.v, p.v_dims, role | {'e': '{k}'})} : 0.0f")
    dk, dv = _array(em, "dk", depth), _array(em, "dv", width)
    heads = 1
    for _, n in shared:
        heads *= n
    with em.scope(f"for (long h = 0; h < {heads}; h++)"):
        at, rest = dict(role), "h"
        for name, n in reversed(shared):
            at[name] = em.declare(DType.INT64, f"{rest} % {n}", name)
            rest = f"({rest} / {n})"
        _rows(em, p, at, j0, active, (qs, dos, st), (k, v, dk, dv))
    with em.scope(f"if ({active})"):
        em.line(_UNROLL)
        with em.scope(f"for (long d = 0; d < {depth}; d++)"):
            _store(em, p.dk, p.k_dims, role | {"d": "d"}, f"{dk}[d]")
        em.line(_UNROLL)
        with em.scope(f"for (long e = 0; e < {width}; e++)"):
            _store(em, p.dv, p.v_dims, role | {"e": "e"}, f"{dv}[e]")
    return groups * p.group, p.group


def _rows(em: KernelEmitter, p: AttentionBackwardPlan, role: dict[str, str], j0: str, active: str,
          staged: tuple[str, str, str], regs_: tuple[str, str, str, str]) -> None:
    """Part ``dkv``'s pass over the query rows at one batch point ``role``: each step's rows of Q,
    of ``DO / Z`` and their ``Mx``, ``DZ_1`` staged (``staged``), then each work-item's key adds the
    step's terms to its ``dk``, ``dv`` (``regs_``: its K and V rows, then those)."""
    t, depth, width, step = em.t, p.depth, p.width, p.step
    c = t.float_literal(p.scale_num / p.scale_den, _F32)
    qs, dos, st = staged
    k, v, dk, dv = regs_
    with em.scope(f"for (long i0 = 0; i0 < {p.rows}; i0 += {step})"):
        skip_masked(em, p, role, "i0", j0, step, p.group)
        _stage(em, p, [(p.q, p.q_dims, depth, qs, "d")], "i", "i0", p.rows, role)
        with em.scope(f"for (long u = lid; u < {step * width}; u += {p.group})"):
            ii = em.declare(DType.INT64, "u / " + str(width), "ii")
            at = role | {"i": em.declare(DType.INT64, f"i0 + {ii}", "i"), "e": f"(u % {width})"}
            with em.scope(f"if ({at['i']} < {p.rows})"):
                z = load_f32(em, p.z, p.stat_dims, at)
                em.line(f"{dos}[u] = {load_f32(em, p.do, p.do_dims, at)} / {z};")
        with em.scope(f"for (long u = lid; u < {step}; u += {p.group})"):
            at = role | {"i": em.declare(DType.INT64, "i0 + u", "i")}
            with em.scope(f"if ({at['i']} < {p.rows})"):
                em.line(f"{st}[2 * u] = {load_f32(em, p.mx, p.stat_dims, at)};")
                em.line(f"{st}[2 * u + 1] = {load_f32(em, p.dz, p.stat_dims, at)};")
        em.line("barrier(CLK_LOCAL_MEM_FENCE);")
        with em.scope(f"if ({active})"):
            with em.scope(f"for (long ii = 0; ii < {step}; ii++)"):
                i = em.declare(DType.INT64, "i0 + ii", "i")
                at = role | {"i": i}
                with em.scope(f"if ({' && '.join([f'{i} < {p.rows}', *mask_tests(p, at)])})"):
                    regs: dict = {}
                    s = _dot(em, depth, f"{qs}[ii * {depth} + {{k}}]", f"{k}[{{k}}]")
                    s = run_points(em, p.scores, p.s, s, p.s_dims, at, regs)
                    e = em.declare(_F32, t.math("exp", _F32, [f"{c} * ({s} - {st}[2 * ii])"]), "e")
                    dp = _dot(em, width, f"{dos}[ii * {width} + {{k}}]", f"{v}[{{k}}]")
                    em.line(_UNROLL)
                    with em.scope(f"for (long x = 0; x < {width}; x++)"):
                        em.line(f"{dv}[x] += {e} * {dos}[ii * {width} + x];")
                    ds = em.declare(_F32, f"{c} * {e} * ({dp} + {st}[2 * ii + 1])", "ds")
                    ds = em.declare(_F32, run_points(em, p.grad_scores, p.dp, ds, p.s_dims, at, regs), "ds_s")
                    em.line(_UNROLL)
                    with em.scope(f"for (long x = 0; x < {depth}; x++)"):
                        em.line(f"{dk}[x] += {ds} * {qs}[ii * {depth} + x];")
        em.line("barrier(CLK_LOCAL_MEM_FENCE);")


__all__ = ["emit", "takes"]
