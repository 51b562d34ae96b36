"""The ``attention_backward`` pass's matcher: ``backward_at`` reads a run of ``#main``'s kernels as
the gradient ``tile.autodiff`` derives for a softmax attention chain (``stripe.passes.attention``):
the chain's forward as far as ``Z`` and ``O1`` (``attention_match.forward_at``), then the
backward kernels below in any order, each matched by its structure (its output's agg, its
constraints, the expression tree it stores, the roles of every access), never by names.

With ``c`` the exponent's scale, ``P`` the score, the rows ``i``, keys ``j``, the width ``e`` of V and
the depth ``d`` (batch roles everywhere), and ``DO`` the result's cotangent (an input)::

    DZ_b[i, e] = -(DO * O1 / (Z * Z))            DZ_1[i] = +(DZ_b[i, e])
    DO1[i, e]  = DO / Z                          DE_1[i, j] = +(DO1[i, e] * V[j, e]), mask
    DV[j, e]   = +(DO1[i, e] * E[i, j]), mask    DE_2[i, j] = +(DZ_1[i]), mask
    DE = DE_1 + DE_2                             DMx_b = -(DE * E * c)
    DMx_1[i] = +(DMx_b[i, j])                    DP_1[i, j] = +(P == Mx ? DMx_1[i]), mask
    DP = DE * E * c + DP_1                       DQ[i, d] = +(DS[i, j] * K[j, d])
    DK[j, d] = +(DS[i, j] * Q[i, d])

(``* c`` also ``/ (1/c)``, or nothing when ``c`` is 1; the operands of ``*`` and ``+`` in either
order.) With the weights normalized first (``A = E / Z``, ``O = A · V``) the first lines are
``DA_1[i, j] = +(DO[i, e] * V[j, e])``, mask; ``DV[j, e] = +(DO[i, e] * A[i, j])``, mask; ``DZ_b =
-(DA_1 * E / (Z * Z))``; ``DZ_1[i] = +(DZ_b[i, j])``; ``DE_1[i, j] = +(DZ_1[i])``, mask; ``DE = DA_1
/ Z + DE_1`` (the same ``DZ_1``: ``-Σ_j dP w / Z = -DO · O / Z``).

``DS``, the cotangent of S, is ``DP`` when the score is S; after score kernels (a scale, a ``cond``
mask, a bias), their derivatives are elementwise kernels from ``DP`` to ``DS``, each reading the
last one at its point (and the scores, or any program buffer): the fused kernels run them point by
point as the chain does, whatever they compute. A kernel that sums the cotangent otherwise (a
bias's gradient, a sum over the batch) ends the match. Taken: a positive scale, every batch dim in
Q and the cotangent (K and V may both lack some: heads sharing them), all three gradients asked
for, more than one key and V wider than one (over one element ``tile.autodiff`` drops the row sums
``DZ_1`` and ``DMx_1``). ``Miss`` ends a match.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from stripe.ir import Block, Constant, Intrinsic, Load, RefDir
from stripe.passes.attention_access import (
    FLOATS,
    ZERO,
    Chain,
    Miss,
    fill_of,
    leaf_parts,
    mask_of,
    scalar_defs,
    stored_from,
    vars_of,
    whole_ref,
)
from stripe.passes.attention_match import forward_at

GRADS = ("DQ", "DK", "DV")


@dataclass(frozen=True)
class L:
    """A load of the buffer bound to ``buf`` at the roles ``dims`` (a key of ``_dims``)."""

    buf: str
    dims: str


@dataclass(frozen=True)
class Kern:
    """An expected kernel: it writes the buffer bound to ``out`` (a fresh name) at ``dims``, with
    ``agg`` (``assign``: point by point; ``add``: a sum), the chain's mask when ``masked``."""

    out: str
    dims: str
    agg: str
    expr: object
    masked: bool = False


def _scaled(x):
    return ("scale", x)


DIVISION_LAST = (
    Kern("DZ_b", "o", "assign",
         ("neg", ("div", ("mul", L("DO", "o"), L("O1", "o")), ("mul", L("Z", "stat"), L("Z", "stat"))))),
    Kern("DZ_1", "stat", "add", L("DZ_b", "o")),
    Kern("DO1", "o", "assign", ("div", L("DO", "o"), L("Z", "stat"))),
    Kern("DE_1", "s", "add", ("mul", L("DO1", "o"), L("V", "v")), True),
    Kern("DV", "v", "add", ("mul", L("DO1", "o"), L("E", "s")), True),
    Kern("DE_2", "s", "add", L("DZ_1", "stat"), True),
    Kern("DE", "s", "assign", ("add", L("DE_1", "s"), L("DE_2", "s"))),
)
SOFTMAX_FIRST = (  # the weights A = E / Z first, then O = A · V
    Kern("DA_1", "s", "add", ("mul", L("DO", "o"), L("V", "v")), True),
    Kern("DV", "v", "add", ("mul", L("DO", "o"), L("A", "s")), True),
    Kern("DZ_b", "s", "assign",
         ("neg", ("div", ("mul", L("DA_1", "s"), L("E", "s")), ("mul", L("Z", "stat"), L("Z", "stat"))))),
    Kern("DZ_1", "stat", "add", L("DZ_b", "s")),
    Kern("DE_1", "s", "add", L("DZ_1", "stat"), True),
    Kern("DE", "s", "assign", ("add", ("div", L("DA_1", "s"), L("Z", "stat")), L("DE_1", "s"))),
)
PATTERNS = (
    Kern("DMx_b", "s", "assign", ("neg", _scaled(("mul", L("DE", "s"), L("E", "s"))))),
    Kern("DMx_1", "stat", "add", L("DMx_b", "s")),
    Kern("DP_1", "s", "add",
         ("cond", ("cmp_eq", L("P", "s"), L("Mx", "stat")), L("DMx_1", "stat"), 0.0), True),
    Kern("DP", "s", "assign", ("add", _scaled(("mul", L("DE", "s"), L("E", "s"))), L("DP_1", "s"))),
    Kern("DQ", "q", "add", ("mul", L("DS", "s"), L("K", "k"))),
    Kern("DK", "k", "add", ("mul", L("DS", "s"), L("Q", "q"))),
)


@dataclass
class Backward:
    """A matched gradient: the forward chain, the buffers bound to the patterns' names, the run's
    temporaries (the chain's and the backward's) and the kernel statements of each name."""

    ch: Chain
    bufs: dict[str, str] = field(default_factory=dict)
    temps: set[str] = field(default_factory=set)
    filled: set[str] = field(default_factory=set)
    grad_scores: list[str] = field(default_factory=list)  # DP -> DS kernels' names

    def dims(self, key: str) -> tuple[str, ...]:
        ch = self.ch
        # the result's (and its cotangent's) dims: O1's; with the weights first, where no kernel of
        # the gradient writes O: the row statistics' with the width in place of the summed keys
        o = ch.dims[ch.o1] if ch.o1 else tuple("e" if d == ZERO else d for d in ch.dims[ch.mx])
        return {"s": ch.dims[ch.s], "stat": ch.dims[ch.mx], "o": o, "q": ch.q_dims, "k": ch.k_dims,
                "v": ch.v_dims}[key]


def backward_at(stmts, start: int, parent: Block, tmps: set[str], max_depth: int):
    """``(backward, end)`` when the kernels from ``start`` are an attention chain's gradient
    (module docstring), else None."""
    got = forward_at(stmts, start, parent, tmps)
    if got is None:
        return None
    ch, k = got
    if not _taken(ch):
        return None
    known = {"S": ch.s, "P": ch.p, "Mx": ch.mx, "E": ch.e, "Z": ch.z, "Q": ch.q, "K": ch.k}
    known |= {"A": ch.w} if ch.w else {"O1": ch.o1, "V": ch.v}
    bw = Backward(ch, known, set(ch.temps), set(ch.filled))
    left = [*(SOFTMAX_FIRST if ch.w else DIVISION_LAST), *PATTERNS]
    try:
        while left:
            if k >= len(stmts):
                return None
            s = stmts[k]
            if not (isinstance(s, Block) and s.has_tags("kernel")):
                return None
            fill = fill_of(s, parent)
            if fill is not None:
                if fill in bw.filled or fill in bw.bufs.values():
                    raise Miss
                bw.filled.add(fill)
            else:
                for p in left:
                    more = _kernel(bw, s, p, parent, tmps)
                    if more is not None:
                        left.remove(p)
                        left += more
                        break
                else:
                    if not _pointwise(bw, s, tmps):
                        raise Miss
            k += 1
        _check(bw, stmts[:start] + stmts[k:], stmts[start:k])
        if not _shapes(ch) or max(ch.depth, ch.width) > max_depth:
            raise Miss
    except Miss:
        return None
    return bw, k


def _taken(ch: Chain) -> bool:
    return ch.scale > 0 and ch.keys > 1 and {n for n, _ in ch.batch} <= set(ch.q_dims)


def _shapes(ch: Chain) -> bool:
    """V (known once the gradient's kernels read it, with the weights first) wider than one, with
    the batch dims K has."""
    batch = {n for n, _ in ch.batch}
    return ch.width > 1 and batch & set(ch.k_dims) == batch & set(ch.v_dims)


def _pointwise(bw: Backward, b: Block, tmps: set[str]) -> bool:
    """Whether kernel ``b`` takes S's cotangent a step back through a score kernel: elementwise at
    the scores' points, reading the last cotangent ``DS`` there, other temporaries only if they are
    scores (read at the point), and writing a fresh temporary, which becomes ``DS``."""
    ch = bw.ch
    if "DS" not in bw.bufs or b.constraints or any(ix.affine is not None for ix in b.idxs):
        return False
    try:
        ins, outs = leaf_parts(b)
    except Miss:
        return False
    if len(outs) != 1 or (outs[0].agg_op or "assign") != "assign":
        return False
    out = outs[0]
    if out.source not in tmps or out.source in bw.temps | bw.filled or out.shape.dtype not in FLOATS:
        return False
    # the scores the fused kernels hold in registers at the point (S and the score kernels' outputs,
    # when there are score kernels: run_points registers them)
    scores = {t for t in ch.temps if ch.dims.get(t) == ch.dims[ch.s] and t not in (ch.e, ch.w)}
    scores = scores if ch.scores else set()
    env = _Env(dict(bw.bufs), {})
    ranges = {ix.name: ix.range for ix in b.idxs}
    if not _access(bw, env, out, "s", ranges):
        return False
    tail = False
    for r in ins:
        if r.source in bw.temps:
            if (r.source != bw.bufs["DS"] and r.source not in scores) or not _access(bw, env, r, "s", ranges):
                return False
            tail = tail or r.source == bw.bufs["DS"]
        elif r.source in {bw.bufs.get(g) for g in GRADS}:
            return False
    if not tail or any(v not in env.roles and n > 1 for v, n in ranges.items()):
        return False
    bw.temps.add(out.source)
    bw.bufs["DS"] = out.source
    bw.grad_scores.append(b.name)
    return True


def _check(bw: Backward, others, run) -> None:
    """No temporary is read outside the run; the run writes only its temporaries and the three
    gradients, and every fill is of one of those."""
    grads = {bw.bufs[g] for g in GRADS}
    for s in others:
        if isinstance(s, Block) and any(r.source in bw.temps for r in s.refs):
            raise Miss
    for s in run:
        if any(r.dir is not RefDir.IN and r.source not in bw.temps | grads for r in s.refs):
            raise Miss
    if bw.filled - bw.temps - grads:
        raise Miss


@dataclass
class _Env:
    bufs: dict[str, str]
    roles: dict[str, str]  # the kernel's index -> role
    v_dims: tuple[str, ...] = ()  # V's dims' roles, when this kernel is the first to read V

    def copy(self) -> _Env:
        return _Env(dict(self.bufs), dict(self.roles), self.v_dims)


def _kernel(bw: Backward, b: Block, p: Kern, parent: Block, tmps: set[str]) -> tuple[Kern, ...] | None:
    """The patterns left to match after ``b`` when kernel ``b`` is the pattern ``p`` (``p.out``, and
    ``DO``, bound), else None. A gradient summed into a float32 temporary (``DQ_wide``, as lowering
    sums half types) leaves its conversion to match: ``DQ = as_float(DQ_wide)`` (``as_bfloat``)."""
    try:
        ins, outs = leaf_parts(b)
    except Miss:
        return None
    if len(outs) != 1 or any(ix.affine is not None for ix in b.idxs):
        return None
    out = outs[0]
    if (out.agg_op or "assign") != p.agg or out.source in bw.bufs.values():
        return None
    if (p.agg == "add") != (out.source in bw.filled):
        return None
    wide = p.out in GRADS and out.source in tmps and p.agg == "add"
    if p.out in GRADS and not wide:
        if out.source in tmps:
            return None
        try:
            whole_ref(parent, out)
        except Miss:
            return None
    elif out.source not in tmps:
        return None
    env = _Env(dict(bw.bufs), {})
    ranges = {ix.name: ix.range for ix in b.idxs}
    refs = {r.into: r for r in b.refs}
    try:
        if not _access(bw, env, out, p.dims, ranges):
            return None
        defs = scalar_defs(b)
        if not _expr(bw, env, defs, refs, ranges, stored_from(b, out.into), p.expr):
            return None
        if any(v not in env.roles and n > 1 for v, n in ranges.items()):
            return None
        mask = mask_of(b, env.roles)
    except Miss:
        return None
    if mask != ((bw.ch.mask or frozenset()) if p.masked else frozenset()):
        return None
    bw.bufs = env.bufs
    if env.v_dims:  # V first met here (the weights first): its roles and width
        ch = bw.ch
        ch.v, ch.v_dims = env.bufs["V"], env.v_dims
        ch.width = next(n for v, n in ranges.items() if env.roles.get(v) == "e")
    name = f"{p.out}_wide" if wide else p.out
    bw.bufs[name] = out.source
    if p.out == "DP":  # S's cotangent, until score kernels' derivatives follow (_pointwise)
        bw.bufs["DS"] = out.source
    if p.out not in GRADS or wide:
        bw.temps.add(out.source)
    return (Kern(p.out, p.dims, "assign", ("convert", L(name, p.dims))),) if wide else ()


def _access(bw: Backward, env: _Env, r, key: str, ranges: dict[str, int]) -> bool:
    """Whether refinement ``r`` is accessed at the roles ``key`` names, binding the kernel's
    indexes to roles (one role per index, one index per role). V's roles, not known yet (the
    weights first: the forward's kernels met so far do not read it), are its indexes' roles."""
    dims = bw.dims(key) or env.v_dims
    vs = vars_of(r.access, ranges)
    if key == "v" and not dims:
        if any(v is not None and v not in env.roles for v in vs):
            return False
        dims = env.v_dims = tuple(ZERO if v is None else env.roles[v] for v in vs)
        if "j" not in dims or "e" not in dims:
            return False
    if len(vs) != len(dims):
        return False
    extents = dict(bw.ch.batch) | {"i": bw.ch.rows, "j": bw.ch.keys, "d": bw.ch.depth, "e": bw.ch.width}
    for v, role in zip(vs, dims, strict=True):
        if v is None:
            if role != ZERO:
                return False
            continue
        if role == ZERO:
            if ranges[v] != 1:
                return False
            continue
        if env.roles.setdefault(v, role) != role or ranges[v] != (extents[role] or ranges[v]):
            return False  # (the width unknown, 0, until V is met)
    return len(set(env.roles.values())) == len(env.roles)


def _expr(bw: Backward, env: _Env, defs, refs, ranges, x: str, pat) -> bool:
    """Whether the scalar ``x`` is computed as the pattern ``pat`` says (``env`` extended if so)."""
    d = defs.get(x)
    while isinstance(d, Intrinsic) and d.name == "assign" and len(d.inputs) == 1:
        x, d = d.inputs[0], defs.get(d.inputs[0])
    if isinstance(pat, L):
        if not isinstance(d, Load):
            return False
        r = refs[d.from_]
        bound = env.bufs.get(pat.buf)
        if bound is None:  # the cotangent, and V with the weights first: inputs met here first
            if pat.buf not in ("DO", "V") or r.source in bw.temps:
                return False
            env.bufs[pat.buf] = r.source
        elif bound != r.source:
            return False
        return r.dir is RefDir.IN and _access(bw, env, r, pat.dims, ranges)
    if isinstance(pat, float):
        return isinstance(d, Constant) and float(d.value) == pat
    op, *args = pat
    if op == "scale":
        return _scale(bw, env, defs, refs, ranges, x, d, args[0])
    names = ("as_float", "as_bfloat") if op == "convert" else (op,)  # to a half type, or bfloat16
    if not (isinstance(d, Intrinsic) and d.name in names and len(d.inputs) == len(args)):
        return False
    orders = [d.inputs, d.inputs[::-1]] if op in ("mul", "add") else [d.inputs]
    for ins in orders:
        trial = env.copy()
        if all(_expr(bw, trial, defs, refs, ranges, y, a) for y, a in zip(ins, args, strict=True)):
            env.bufs, env.roles, env.v_dims = trial.bufs, trial.roles, trial.v_dims
            return True
    return False


def _scale(bw: Backward, env: _Env, defs, refs, ranges, x: str, d, pat) -> bool:
    """``pat * c`` (either order), ``pat / (1/c)``, or ``pat`` itself when ``c`` is 1."""
    c = bw.ch.scale

    def const(y: str) -> Fraction | None:
        k = defs.get(y)
        if isinstance(k, Constant) and k.dtype.is_float and abs(float(k.value)) not in (0.0, float("inf")):
            return Fraction(float(k.value)) if float(k.value) == float(k.value) else None
        return None

    if isinstance(d, Intrinsic) and d.name in ("mul", "div") and len(d.inputs) == 2:
        a, b = d.inputs
        tries = [(a, b), (b, a)] if d.name == "mul" else [(a, b)]
        for y, k in tries:
            v = const(k)
            if v is not None and (v if d.name == "mul" else 1 / v) == c:
                trial = env.copy()
                if _expr(bw, trial, defs, refs, ranges, y, pat):
                    env.bufs, env.roles, env.v_dims = trial.bufs, trial.roles, trial.v_dims
                    return True
    return c == 1 and _expr(bw, env, defs, refs, ranges, x, pat)


__all__ = ["DIVISION_LAST", "GRADS", "PATTERNS", "SOFTMAX_FIRST", "Backward", "backward_at"]
