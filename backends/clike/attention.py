"""Attention chains (``stripe.passes.attention``, planned with an ``AttentionPlan``) as one fused
kernel with an online softmax: S is never written to memory.

One work-group per (batch point, block of ``block_rows`` query rows), one work-item per row. The
work-item keeps its row of Q and its partial output (``width`` floats) in registers, and a running
max ``m`` and sum ``l`` of the exponentials. The keys come in steps of ``block_keys``: the
work-group stages that step's rows of K and V in ``__local`` memory (zeros past the end; each
work-item's exponents of the step live there too, in a column of their own), then each
work-item computes its scores ``s = q · k_j`` in float32 (kept so), runs the plan's score kernels on them
point by point (the chain's own statements, through ``KernelEmitter.point``: a bias, a ``cond``
mask, a scale, whatever elementwise they are), takes ``x = c * P`` for the step's keys that pass
the mask's constraints, and updates ``m' = max(m, max x)``, ``acc = acc * exp(m - m') +
Σ exp(x_j - m') v_j``, ``l = l * exp(m - m') + Σ exp(x_j - m')``. A step whose every key fails a
constraint for every row of the work-group (above the diagonal of a causal mask) is skipped whole
(its bound is uniform across the work-group, so the barriers stay matched). At the end each
element of the row's output is ``acc / l`` (a row with no key left: ``0 / 0``, NaN, as the chain
gives), converted to the output's type.

The result is the chain's up to rounding: the exponentials are taken against the running max
instead of the row's max and summed in another order (``docs/semantics.md`` §8.7 bounds the
difference); the pass that made the block is registered as reordering, so strict mode runs the
chain's kernels instead.

Taken: a block whose plan is an ``AttentionPlan``, on a target with work-groups, whose score
kernels are still among its statements (by name), with float operands. Otherwise the general
kernel runs the block's statements one after the other in one work-item (the same results,
slowly).
"""

from __future__ import annotations

from backends.clike.kernel import KernelEmitter
from backends.clike.views import View
from stripe.ir import Block, Dim, RefDir
from stripe.plans import AttentionPlan
from tile.dtypes import DType

_F32 = DType.FLOAT32
# the loops over a head's elements, unrolled so that the row of Q and the partial output stay in
# registers (indexed by constants); compilers that do not know the pragma ignore it
_UNROLL = "#pragma unroll"
_FLOATS = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)


def takes(em: KernelEmitter) -> AttentionPlan | None:
    """The block's plan when this target runs it fused (module docstring), else None."""
    b, t, p = em.block, em.t, em.block.plan
    if not t.workgroups or not isinstance(p, AttentionPlan):
        return None
    children = {s.name for s in b.stmts if isinstance(s, Block)}
    if any(n not in children for n in p.scores):
        return None
    for name in (p.q, p.k, p.v, p.out):
        if b.ref(name).source not in em.ptrs or b.ref(name).shape.dtype not in _FLOATS:
            return None
    local = 4 * p.block_keys * (p.depth + p.width + p.block_rows)
    return p if local <= t.local_bytes else None


def emit(em: KernelEmitter) -> tuple[int, int]:
    """Emits the fused kernel's body through ``em``; returns its work-items and work-group size."""
    b, t = em.block, em.t
    p = b.plan
    assert isinstance(p, AttentionPlan), "attention.emit runs planned attention blocks (takes)"
    br, bc, depth, width = p.block_rows, p.block_keys, p.depth, p.width
    row_blocks = -(-p.rows // br)
    ks, vs, xs = em.fresh("ks"), em.fresh("vs"), em.fresh("xs")
    em.line(f"__local float {ks}[{bc * depth}];")
    em.line(f"__local float {vs}[{bc * width}];")
    em.line(f"__local float {xs}[{bc * br}];  /* each work-item's exponents: column lid */")
    em.line("const long lid = (long)get_local_id(0);")
    em.line("const long grp = (long)get_group_id(0);")
    role: dict[str, str] = {"_0": "0"}
    rest = "grp"
    rb = em.declare(DType.INT64, f"{rest} % {row_blocks}", "rb")
    rest = f"({rest} / {row_blocks})"
    for name, n in reversed(p.batch):
        role[name] = em.declare(DType.INT64, f"{rest} % {n}", name)
        rest = f"({rest} / {n})"
    i0 = em.declare(DType.INT64, f"{rb} * {br}", "i0")
    role["i"] = em.declare(DType.INT64, f"{i0} + lid", "i")
    active = em.declare(DType.BOOL, f"{role['i']} < {p.rows}", "active")
    neg_inf = t.float_literal(float("-inf"), _F32)

    def load(name: str, dims, at) -> str:
        return load_f32(em, name, dims, at)

    q, acc = em.fresh("q"), em.fresh("acc")
    m, l_ = em.fresh("m"), em.fresh("l")
    em.line(f"float {q}[{depth}];")
    em.line(f"float {acc}[{width}];")
    em.line(f"float {m} = {neg_inf};")
    em.line(f"float {l_} = 0.0f;")
    em.line(_UNROLL)
    with em.scope(f"for (long d = 0; d < {depth}; d++)"):
        em.line(f"{q}[d] = {active} ? {load(p.q, p.q_dims, role | {'d': 'd'})} : 0.0f;")
    em.line(_UNROLL)
    with em.scope(f"for (long e = 0; e < {width}; e++)"):
        em.line(f"{acc}[e] = 0.0f;")
    with em.scope(f"for (long j0 = 0; j0 < {p.keys}; j0 += {bc})"):
        skip_masked(em, p, role, i0, "j0", p.block_rows, p.block_keys)
        for buf, dims, n, stage, what in ((p.k, p.k_dims, depth, ks, "d"), (p.v, p.v_dims, width, vs, "e")):
            with em.scope(f"for (long u = lid; u < {bc * n}; u += {br})"):
                jj = em.declare(DType.INT64, f"u / {n}", "jj")
                at = em.declare(DType.INT64, f"u % {n}", what)
                j = em.declare(DType.INT64, f"j0 + {jj}", "j")
                em.line(f"{stage}[u] = {j} < {p.keys} ? {load(buf, dims, role | {'j': j, what: at})} : 0.0f;")
        em.line("barrier(CLK_LOCAL_MEM_FENCE);")
        with em.scope(f"if ({active})"):
            top = em.fresh("top")
            x = f"{xs}[jj * {br} + lid]"
            em.line(f"float {top} = {neg_inf};")
            with em.scope(f"for (long jj = 0; jj < {bc}; jj++)"):
                j = em.declare(DType.INT64, "j0 + jj", "j")
                em.line(f"{x} = {neg_inf};")
                keep = [f"{j} < {p.keys}", *mask_tests(p, role | {"j": j})]
                with em.scope(f"if ({' && '.join(keep)})"):
                    s = em.fresh("s")
                    em.line(f"float {s} = 0.0f;")
                    em.line(_UNROLL)
                    with em.scope(f"for (long d = 0; d < {depth}; d++)"):
                        em.line(f"{s} += {q}[d] * {ks}[jj * {depth} + d];")
                    score = _score(em, p, s, role | {"j": j})
                    scale = t.float_literal(p.scale_num / p.scale_den, _F32)
                    em.line(f"{x} = {scale} * {score};")
                    em.line(f"{top} = {x} > {top} ? {x} : {top};")
            new = em.declare(_F32, f"{top} > {m} ? {top} : {m}", "m_new")
            with em.scope(f"if ({new} > {neg_inf})"):
                alpha = em.declare(_F32, t.math("exp", _F32, [f"{m} - {new}"]), "alpha")
                em.line(f"{l_} *= {alpha};")
                em.line(_UNROLL)
                with em.scope(f"for (long e = 0; e < {width}; e++)"):
                    em.line(f"{acc}[e] *= {alpha};")
                with em.scope(f"for (long jj = 0; jj < {bc}; jj++)"):
                    pj = em.declare(_F32, t.math("exp", _F32, [f"{x} - {new}"]), "p")
                    em.line(f"{l_} += {pj};")
                    em.line(_UNROLL)
                    with em.scope(f"for (long e = 0; e < {width}; e++)"):
                        em.line(f"{acc}[e] += {pj} * {vs}[jj * {width} + e];")
                em.line(f"{m} = {new};")
        em.line("barrier(CLK_LOCAL_MEM_FENCE);")
    with em.scope(f"if ({active})"):
        out = b.ref(p.out)
        em.line(_UNROLL)
        with em.scope(f"for (long e = 0; e < {width}; e++)"):
            value = t.convert(t.fdiv(f"{acc}[e]", l_, _F32), _F32, out.shape.dtype)
            em.line(t.store(em.ptrs[out.source], offset(b, p.out, p.out_dims, role | {"e": "e"}), value,
                            out.shape.dtype))
    groups = row_blocks
    for _, n in p.batch:
        groups *= n
    return groups * br, br


def offset(b: Block, name: str, dims: tuple[str, ...], at: dict[str, str]) -> str:
    """The C offset of the element of ``b``'s refinement ``name`` whose dims have the roles
    ``dims``, each role at the C expression ``at[role]``."""
    strides = [d.stride for d in b.ref(name).shape.dims]
    terms = [f"{at[r]} * {s}" if s != 1 else at[r] for r, s in zip(dims, strides, strict=True)
             if r != "_0" and s != 0]
    return " + ".join(terms) or "0"


def load_f32(em: KernelEmitter, name: str, dims: tuple[str, ...], at: dict[str, str]) -> str:
    """That element of refinement ``name`` of the kernel's block, read and converted to float."""
    b, t = em.block, em.t
    dt = b.ref(name).shape.dtype
    return t.convert(t.load(em.ptrs[b.ref(name).source], offset(b, name, dims, at), dt), dt, _F32)


def mask_tests(p, at: dict[str, str]) -> list[str]:
    """The mask's constraints at the point ``at`` (role -> C expression), as C conditions."""
    out = []
    for terms, const in p.constraints:
        parts = [f"{c} * {at[r]}" for r, c in terms] + [str(const)]
        out.append(f"({' + '.join(parts)}) >= 0")
    return out


def skip_masked(em: KernelEmitter, p, role: dict[str, str], i0: str, j0: str, rows: int, keys: int) -> None:
    """``continue`` the loop when a constraint fails at every (row, key) of the box of ``rows``
    rows from ``i0`` and ``keys`` keys from ``j0``: its largest value over the box is below 0 (the
    same in every work-item)."""
    i_hi = f"({i0} + {rows - 1})"
    j_hi = f"({j0} + {keys - 1})"
    box = {"i": (i0, i_hi), "j": (j0, j_hi)}
    for terms, const in p.constraints:
        parts = [str(const)]
        for r, c in terms:
            lo, hi = box[r] if r in box else (role[r], role[r])
            parts.append(f"{c} * {hi if c > 0 else lo}")
        em.line(f"if (({' + '.join(parts)}) < 0) continue;")


def _score(em: KernelEmitter, p: AttentionPlan, s: str, at: dict[str, str]) -> str:
    """The score ``P`` (a float expression) from the float32 product ``s``: ``s`` itself, or S's
    value in its type through the plan's score kernels, run point by point on registers (their
    statements round as the chain's do)."""
    if not p.scores:  # S itself: kept in float32 (rounding it to a half type would only add error)
        return s
    return run_points(em, p.scores, p.s, s, p.s_dims, at, {})


def run_points(em: KernelEmitter, names, first: str, value: str, dims: tuple[str, ...], at: dict[str, str],
               regs: dict[str, View]) -> str:
    """Runs the block's child kernels ``names`` (elementwise over the points of the dims whose roles
    are ``dims``) at the point ``at`` on registers, in order: ``first``'s register holds the float32
    ``value`` in its type, each kernel's output gets one, and the kernels read registers for the
    buffers in ``regs`` (which gains these) and memory for the others. The last output's value,
    as a float expression (``value`` when ``names`` is empty)."""
    b, t = em.block, em.t

    def register(name: str, value: str | None) -> View:
        r = b.ref(name)
        dt = r.shape.dtype
        reg = em.fresh(f"r_{name}")
        em.line(f"{t.reg(dt)} {reg}[1];")
        if value is not None:
            em.line(f"{reg}[0] = {t.convert(value, _F32, dt)};")
        dims = tuple(Dim(d.size, 0) for d in r.shape.dims)
        return View(name, reg, dt, "0", dims, dt, "", True)

    if not names:
        return value
    regs[first] = register(first, value)
    last = first
    children = {c.name: c for c in b.stmts if isinstance(c, Block)}
    for name in names:
        c = children[name]
        out = next(r for r in c.refs if r.dir is not RefDir.IN)
        regs[out.source] = register(out.source, None)
        views = dict(regs)
        for r in c.refs:
            if r.source not in views:
                views[r.source] = em.view(b, b.ref(r.source), {}, None)
        vals = {ix.name: "0" for ix in c.idxs}
        for a, dim_role in zip(out.access, dims, strict=True):
            if len(a.vars) == 1:
                vals[a.vars[0]] = at[dim_role]
        with em.scope(""):
            em.point(c, vals, views)
        last = out.source
    v = regs[last]
    return t.convert(f"{v.ptr}[0]", v.dtype, _F32)


__all__ = ["emit", "load_f32", "mask_tests", "offset", "run_points", "skip_masked", "takes"]
