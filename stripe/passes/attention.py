"""``attention``: the kernels of a softmax attention become one block, tagged ``attention`` and
planned (``stripe.plans.AttentionPlan``), which a code generator that knows the tag runs as one
fused kernel with an online softmax (``backends.clike.attention``): S is never written to memory.

The chain, as lowering writes ``S = Q·K; P = f(S); Mx = max_j P; E = exp(c·(P - Mx));
Z = sum_j E; O1 = E·V; O = O1 / Z`` (issue 41), is a contiguous run of ``#main``'s kernels:

* fills (one ``zero``/``agg_init_max`` special of a whole buffer) of the chain's temporaries, each
  before the kernel aggregating into it;
* the **scores** ``S[batch.., i, j] = +(Q[..] * K[..])``: one reduced index ``d`` (the depth),
  every access dim one index alone (coefficient 1) or 0; the indexes of S are batch indexes (in
  both operands), the rows ``i`` (Q's alone) and the keys ``j`` (K's alone);
* any number of elementwise **score kernels**, each writing a temporary with S's shape point by
  point from the previous one (a scale, a bias added, a ``cond`` on ``index`` masking: anything
  elementwise; they may read other buffers);
* the **row max** of the last score ``P`` over the keys (``>``), into ``Mx`` with the batch and row
  dims (and dims of size 1); a masked max (constraints) writes an accumulator and a written-flag
  and a ``cond`` kernel makes ``Mx`` of them, as lowering does for §6.5's unwritten elements;
* ``E = exp(c * (P - Mx))`` (or ``(P - Mx) * c``, ``(P - Mx) / c``, ``P - Mx``): ``c`` a constant;
* the **row sum** ``Z = +(E)`` over the keys and ``O1[batch.., i, e] = +(E[.., i, j] * V[.., j,
  e])``, in either order, then ``O = O1 / Z`` point by point; or (softmax first) the row sum, the
  weights ``A = E / Z`` point by point, and ``O = +(A[.., i, j] * V[.., j, e])``.

The max, the sum and the product with V must carry the same constraints (a mask written as constraints, say
causal ``i - j >= 0``), read as affines of the roles. Every temporary is a ``tmp`` buffer no kernel
outside the run uses (a second reader of S, which needs it materialized, keeps the chain apart).

The run becomes one block over no indexes whose statements are the run's kernels unchanged (the
Stripe interpreter still runs the plain semantics), their tags dropped so later passes keyed on
them (splitting, fusion, tiling) leave them alone; the temporaries become its local allocations
(never program buffers: a fused kernel allocates none). Its plan names the roles (see
``stripe.plans``). The fused kernel's result differs from the chain's by rounding only: the online
softmax rescales partial sums (``docs/semantics.md`` §8.7 gives the tolerance), so the pass is
registered as reordering and strict mode skips it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction

from stripe.hardware import Hardware
from stripe.ir import (
    Block,
    Constant,
    Dim,
    Intrinsic,
    Load,
    LoadIndex,
    RefDir,
    Refinement,
    Special,
    Store,
    TensorShape,
    dense_strides,
)
from stripe.passes.registry import register
from stripe.passes.rewrite import Context, rewrite
from stripe.plans import ATTENTION_TAG, AttentionPlan
from tile.affine import Affine
from tile.dtypes import DType

_FLOATS = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)
ZERO = "_0"  # the role of an access dim that is constant 0 (a dim of size 1)


@dataclass(frozen=True)
class AttentionConfig:
    reqs: tuple[str, ...]  # the blocks (``main``) whose child kernels are searched
    block_rows: int = 64  # query rows per work-group (one work-item each)
    block_keys: int = 32  # keys staged in local memory per step (fewer when the heads are wide)
    max_depth: int = 256  # the widest head (Q·K depth or V width) a work-item keeps in registers


class _Miss(Exception):
    """The run is not an attention chain (internal: the matcher gives up)."""


@register("attention", AttentionConfig, reorders=True)
def attention(program: Block, cfg: AttentionConfig, hw: Hardware) -> Block:
    """Makes every attention chain of the module docstring one planned ``attention`` block."""
    tmps = {r.into for r in program.refs if "tmp" in r.tags and not {"input", "output"} & r.tags}
    local_bytes = hw.mem_bytes("LOCAL") if "LOCAL" in hw.mem_units else 48 * 1024
    gone: set[str] = set()

    def visit(block: Block, ctx: Context) -> Block | None:
        stmts, out, k, changed = block.stmts, [], 0, False
        while k < len(stmts):
            got = _chain_at(stmts, k, block, tmps, cfg)
            if got is None:
                out.append(stmts[k])
                k += 1
                continue
            chain, end = got
            out.append(_container(chain, stmts[k:end], block, cfg, local_bytes))
            gone.update(chain.temps)
            k, changed = end, True
        if not changed:
            return None
        return replace(block, stmts=tuple(out), refs=tuple(r for r in block.refs if r.into not in gone))

    out = rewrite(program, visit, cfg.reqs)
    if out is program:
        return program
    return replace(out, refs=tuple(r for r in out.refs if r.into not in gone))


# ------------------------------------------------------------------------------ matching
@dataclass
class _Chain:
    s: str = ""  # the scores' buffer
    p: str = ""  # the last score (S, or the last score kernel's output)
    s_dims: tuple[str, ...] = ()  # S's dims' roles
    batch: list[tuple[str, int]] = field(default_factory=list)
    rows: int = 0
    keys: int = 0
    depth: int = 0
    width: int = 0
    q: str = ""
    k: str = ""
    v: str = ""
    o: str = ""
    q_dims: tuple[str, ...] = ()
    k_dims: tuple[str, ...] = ()
    v_dims: tuple[str, ...] = ()
    o_dims: tuple[str, ...] = ()
    scores: list[str] = field(default_factory=list)  # the score kernels' names
    mask: tuple | None = None  # the max's constraints as role affines (frozenset)
    scale: Fraction = Fraction(1)
    temps: set[str] = field(default_factory=set)  # S, scores, Mx (and its parts), E, Z, O1
    filled: set[str] = field(default_factory=set)
    dims: dict[str, tuple[str, ...]] = field(default_factory=dict)  # temp -> its dims' roles
    stage: str = "scores"  # what comes next: scores, max, flag, exp, sums, div, done
    mx: str = ""
    acc: str = ""  # a masked max's accumulator and written-flag
    flag: str = ""
    e: str = ""
    z: str = ""
    o1: str = ""
    w: str = ""  # normalized weights E / Z, when O sums them against V
    ranges: dict[str, int] = field(default_factory=dict)  # the scores kernel's index ranges
    d: str = ""  # its reduced index


def _chain_at(stmts, start: int, parent: Block, tmps: set[str], cfg: AttentionConfig):
    """``(chain, end)`` when the kernels from ``start`` are an attention chain, else None."""
    first = stmts[start]
    if not (isinstance(first, Block) and first.has_tags("kernel")):
        return None
    ch = _Chain()
    try:
        for k in range(start, len(stmts)):
            s = stmts[k]
            if not (isinstance(s, Block) and s.has_tags("kernel")):
                return None
            _step(ch, s, parent, tmps)
            if ch.stage == "done":
                _check_outside(ch, stmts[:start] + stmts[k + 1:])
                _check_inside(ch, stmts[start:k + 1])
                if max(ch.depth, ch.width) > cfg.max_depth:
                    return None
                return ch, k + 1
    except _Miss:
        return None
    return None


def _check_outside(ch: _Chain, others) -> None:
    for s in others:
        if isinstance(s, Block) and any(r.source in ch.temps for r in s.refs):
            raise _Miss  # a temporary read elsewhere (S materialized for another use)


def _check_inside(ch: _Chain, run) -> None:
    """The run writes only its temporaries and ``O`` (by its last kernel, after its fill), and
    reads ``O`` nowhere: the fused kernel reads its other inputs while it writes ``O``."""
    for s in run:
        writes_o = s is run[-1] or (len(s.refs) == 1 and not s.idxs and isinstance(s.stmts[0], Special))
        for r in s.refs:
            stray = r.dir is not RefDir.IN and r.source not in ch.temps | {ch.o}
            if r.source == ch.o and not writes_o or stray:
                raise _Miss
    if any(r.source == ch.o and r.dir is not RefDir.OUT for r in run[-1].refs):
        raise _Miss


def _step(ch: _Chain, b: Block, parent: Block, tmps: set[str]) -> None:
    """Takes kernel ``b`` as the chain's next member, or raises ``_Miss``."""
    fill = _fill_of(b, parent)
    if fill is not None:  # of a temporary, or of the result that normalized weights sum into
        if fill in ch.filled or fill in ch.temps:
            raise _Miss
        ch.filled.add(fill)
        return
    if b.constraints and ch.stage not in ("scores", "sums") or any(ix.affine is not None for ix in b.idxs):
        raise _Miss
    if ch.stage == "scores" and not ch.s:
        _scores(ch, b, parent, tmps)
    elif ch.stage == "scores":
        if not _max(ch, b, tmps):
            _score_kernel(ch, b, tmps)
    elif ch.stage == "flag":
        _flag(ch, b, tmps)
    elif ch.stage == "exp":
        _exp(ch, b, tmps)
    elif ch.stage == "sums":
        _sum(ch, b, parent, tmps)
    else:
        raise _Miss


def _fill_of(b: Block, parent: Block) -> str | None:
    if b.idxs or b.constraints or len(b.stmts) != 1 or len(b.refs) != 1:
        return None
    s, r = b.stmts[0], b.refs[0]
    if not isinstance(s, Special) or s.inputs or s.outputs != (r.into,):
        return None
    if s.name not in ("zero", "agg_init_max") or any(not (a.is_constant and a.const == 0) for a in r.access):
        return None
    try:
        whole = parent.ref(r.source)
    except KeyError:
        return None
    return r.source if r.shape == whole.shape and r.dir is RefDir.OUT else None


def _vars(a_access, ranges: dict[str, int]) -> tuple[str | None, ...]:
    """Each access dim's one index (coefficient 1, no constant), or None for a constant 0."""
    out: list[str | None] = []
    for a in a_access:
        if a.is_constant and a.const == 0:
            out.append(None)
        elif len(a.vars) == 1 and a.coeff(a.vars[0]) == 1 and a.const == 0 and a.vars[0] in ranges:
            out.append(a.vars[0])
        else:
            raise _Miss
    return tuple(out)


def _parts(b: Block):
    """(inputs, output) refinements of a leaf kernel with one output, or raise ``_Miss``."""
    if not all(isinstance(s, (Load, Store, Constant, Intrinsic, LoadIndex)) for s in b.stmts):
        raise _Miss
    ins = [r for r in b.refs if r.dir is RefDir.IN]
    outs = [r for r in b.refs if r.dir is not RefDir.IN]
    if any(r.dir is not RefDir.OUT for r in outs):
        raise _Miss
    return ins, outs


def _defs(b: Block) -> dict[str, object]:
    """Each scalar's defining statement."""
    out: dict[str, object] = {}
    for s in b.stmts:
        if isinstance(s, (Load, LoadIndex, Constant)):
            out[s.into] = s
        elif isinstance(s, Intrinsic):
            out[s.outputs[0]] = s
    return out


def _stored(b: Block, into: str) -> str:
    stores = [s for s in b.stmts if isinstance(s, Store) and s.into == into]
    if len(stores) != 1:
        raise _Miss
    return stores[0].from_


def _loaded(defs, scalar: str) -> str | None:
    s = defs.get(scalar)
    return s.from_ if isinstance(s, Load) else None


def _whole(parent: Block, r: Refinement) -> Refinement:
    """``parent``'s refinement that ``r`` refines, which must be a whole buffer at offset 0."""
    try:
        whole = parent.ref(r.source)
    except KeyError:
        raise _Miss from None
    if any(not (a.is_constant and a.const == 0) for a in whole.access) or whole.from_ is not None:
        raise _Miss
    return whole


def _scores(ch: _Chain, b: Block, parent: Block, tmps: set[str]) -> None:
    ins, outs = _parts(b)
    if len(ins) != 2 or len(outs) != 1 or outs[0].agg_op != "add" or b.constraints:
        raise _Miss
    out = outs[0]
    if out.source not in tmps or out.source not in ch.filled:
        raise _Miss
    defs = _defs(b)
    prod = defs.get(_stored(b, out.into))
    if not (isinstance(prod, Intrinsic) and prod.name == "mul"):
        raise _Miss
    loaded = [_loaded(defs, x) for x in prod.inputs]
    if sorted(loaded, key=str) != sorted((ins[0].into, ins[1].into), key=str):
        raise _Miss
    ranges = {ix.name: ix.range for ix in b.idxs}
    s_vars = _vars(out.access, ranges)
    reduced = [v for v in ranges if v not in s_vars]
    a_vars, b_vars = _vars(ins[0].access, ranges), _vars(ins[1].access, ranges)
    if len(reduced) != 1 or reduced[0] not in a_vars or reduced[0] not in b_vars:
        raise _Miss
    if any(r.shape.dtype not in _FLOATS for r in (*ins, out)):
        raise _Miss
    for r in ins:
        _whole(parent, r)
    ch.s = ch.p = out.source
    ch.temps.add(ch.s)
    ch.depth = ranges[reduced[0]]
    ch.dims[ch.s] = tuple(v or ZERO for v in s_vars)  # the kernel's own names for now: _max names roles
    ch.q_dims = tuple(v or ZERO for v in a_vars)
    ch.k_dims = tuple(v or ZERO for v in b_vars)
    ch.q, ch.k = ins[0].source, ins[1].source
    ch.batch = [(v, ranges[v]) for v in s_vars if v is not None and v in a_vars and v in b_vars]
    ch.ranges, ch.d = ranges, reduced[0]


def _roles_of(b: Block, ch: _Chain, known: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """``b``'s index -> role, from its accesses of the chain's buffers ``known`` (buffer -> its
    dims' roles); an index with two roles, or a chain access that is not one index per dim, misses."""
    ranges = {ix.name: ix.range for ix in b.idxs}
    roles: dict[str, str] = {}
    for r in b.refs:
        if r.source not in known:
            continue
        for v, role in zip(_vars(r.access, ranges), known[r.source], strict=True):
            if v is None or role == ZERO:
                if v is not None and ranges[v] != 1:
                    raise _Miss
                continue
            if roles.setdefault(v, role) != role:
                raise _Miss
    if len(set(roles.values())) != len(roles):
        raise _Miss
    return roles


def _identity(b: Block, r: Refinement, roles: dict[str, str], dims: tuple[str, ...]) -> bool:
    """Whether ``r`` is read or written at ``b``'s point with the roles ``dims`` (one index each)."""
    ranges = {ix.name: ix.range for ix in b.idxs}
    vs = _vars(r.access, ranges)
    return all((v is None and d == ZERO) or (v is not None and roles.get(v) == d) or
               (v is not None and d == ZERO and ranges[v] == 1) for v, d in zip(vs, dims, strict=True))


def _score_kernel(ch: _Chain, b: Block, tmps: set[str]) -> None:
    """An elementwise kernel making the next score from the last one, point by point (of more than
    one point: a one-point kernel would be inlined into the block, and the plan names it)."""
    ins, outs = _parts(b)
    if b.index_space < 2:
        raise _Miss
    if len(outs) != 1 or outs[0].agg_op not in ("", "assign") or b.constraints:
        raise _Miss
    out = outs[0]
    roles = _roles_of(b, ch, {n: ch.dims[n] for n in ch.temps})
    ranges = {ix.name: ix.range for ix in b.idxs}
    if any(v not in roles and n > 1 for v, n in ranges.items()):
        raise _Miss
    if out.source not in tmps or out.source in ch.temps | ch.filled:
        raise _Miss
    if not _identity(b, out, roles, ch.dims[ch.s]):
        raise _Miss
    if not any(r.source == ch.p for r in ins):
        raise _Miss
    for r in ins:
        if r.source in ch.temps and not _identity(b, r, roles, ch.dims[r.source]):
            raise _Miss
    if out.shape.dtype not in _FLOATS:
        raise _Miss
    ch.scores.append(b.name)
    ch.p = out.source
    ch.temps.add(out.source)
    ch.dims[out.source] = ch.dims[ch.s]


def _reduction(ch: _Chain, b: Block, src: str, agg: str, tmps: set[str]):
    """A kernel aggregating ``src`` (one of the chain's, S-shaped) over the keys with ``agg``: its
    output refinement, its roles and the roles of its output's dims."""
    ins, outs = _parts(b)
    main = [r for r in outs if r.agg_op == agg]
    if len(main) != 1 or not any(r.source == src for r in ins):
        raise _Miss
    roles = _roles_of(b, ch, {n: ch.dims[n] for n in ch.temps})
    out = main[0]
    if out.source not in tmps or out.source not in ch.filled or out.source in ch.temps:
        raise _Miss
    ranges = {ix.name: ix.range for ix in b.idxs}
    out_roles = tuple(ZERO if v is None or ranges[v] == 1 and v not in roles else roles.get(v, "?")
                      for v in _vars(out.access, ranges))
    return out, roles, out_roles


def _mask_of(b: Block, roles: dict[str, str]) -> frozenset:
    """``b``'s constraints as affines of the roles."""
    out = []
    for c in b.constraints:
        if not c.is_integral or any(v not in roles for v in c.vars):
            raise _Miss
        out.append((tuple(sorted((roles[v], int(c.coeff(v))) for v in c.vars)), int(c.const)))
    return frozenset(out)


def _max(ch: _Chain, b: Block, tmps: set[str]) -> bool:
    """The row max of the last score: names the roles (the dim it reduces is the keys)."""
    outs = [r for r in b.refs if r.dir is not RefDir.IN]
    if not any(r.agg_op == "max" for r in outs):
        return False
    _name_roles(ch, b)
    out, roles, out_roles = _reduction(ch, b, ch.p, "max", tmps)
    keys = [v for v, role in roles.items() if role == "j"]
    if len(keys) != 1 or "j" in out_roles or sorted(r for r in out_roles if r != ZERO) != sorted(
            {d for d in ch.dims[ch.s] if d not in (ZERO, "j")}):
        raise _Miss
    flags = [r for r in outs if r is not out]
    defs = _defs(b)
    if _loaded(defs, _stored(b, out.into)) is None and not _assign_of_load(defs, _stored(b, out.into)):
        raise _Miss
    ch.mask = _mask_of(b, roles)
    if flags:  # a masked max: accumulator and written-flag, then a cond kernel makes Mx
        if len(flags) != 1 or flags[0].agg_op not in ("", "assign") or flags[0].shape.dtype is not DType.BOOL:
            raise _Miss
        flag = flags[0]
        if flag.source not in tmps or flag.source not in ch.filled or tuple(flag.access) != tuple(out.access):
            raise _Miss
        ch.acc, ch.flag = out.source, flag.source
        ch.temps |= {ch.acc, ch.flag}
        ch.dims[ch.acc] = ch.dims[ch.flag] = out_roles
        ch.stage = "flag"
    else:
        ch.mx = out.source
        ch.temps.add(ch.mx)
        ch.dims[ch.mx] = out_roles
        ch.stage = "exp"
    return True


def _assign_of_load(defs, scalar: str) -> bool:
    s = defs.get(scalar)
    return isinstance(s, Intrinsic) and s.name == "assign" and _loaded(defs, s.inputs[0]) is not None


def _name_roles(ch: _Chain, b: Block) -> None:
    """The scores' dims' roles, once the row max says which of S's indexes is the keys: the
    batch indexes ``b0 b1 ..``, the rows ``i``, the keys ``j`` (and ``d``, the depth)."""
    ranges = {ix.name: ix.range for ix in b.idxs}
    src = next((r for r in b.refs if r.dir is RefDir.IN and r.source == ch.p), None)
    out = next((r for r in b.refs if r.dir is not RefDir.IN and r.agg_op == "max"), None)
    if src is None or out is None:
        raise _Miss
    kept = {v for v in _vars(out.access, ranges) if v is not None}
    s_vars = ch.dims[ch.s]
    keys_at = [k for k, v in enumerate(_vars(src.access, ranges)) if v is not None and v not in kept]
    if len(keys_at) != 1:
        raise _Miss
    key_var = s_vars[keys_at[0]]
    batch = [v for v, _ in ch.batch]
    row_vars = [v for v in s_vars if v not in (ZERO, key_var) and v not in batch]
    if len(row_vars) != 1 or key_var in batch:
        raise _Miss
    row_var = row_vars[0]
    if key_var in ch.q_dims and row_var in ch.k_dims:  # the keys come from the first operand
        ch.q, ch.k, ch.q_dims, ch.k_dims = ch.k, ch.q, ch.k_dims, ch.q_dims
    if row_var not in ch.q_dims or key_var not in ch.k_dims or key_var in ch.q_dims or row_var in ch.k_dims:
        raise _Miss
    name = {v: f"b{n}" for n, v in enumerate(batch)} | {row_var: "i", key_var: "j", ch.d: "d", ZERO: ZERO}
    for t in ch.temps:  # S and the score kernels' outputs, all of S's dims
        ch.dims[t] = tuple(name[v] for v in s_vars)
    ch.q_dims = tuple(name[v] for v in ch.q_dims)
    ch.k_dims = tuple(name[v] for v in ch.k_dims)
    ch.rows, ch.keys = ch.ranges[row_var], ch.ranges[key_var]
    ch.batch = [(name[v], n) for v, n in ch.batch]


def _flag(ch: _Chain, b: Block, tmps: set[str]) -> None:
    """``Mx = cond(written, acc, default)`` point by point."""
    ins, outs = _parts(b)
    if len(outs) != 1 or {r.source for r in ins} != {ch.acc, ch.flag}:
        raise _Miss
    out = outs[0]
    roles = _roles_of(b, ch, {n: ch.dims[n] for n in (ch.acc, ch.flag)})
    if out.source not in tmps or out.source in ch.temps or not _identity(b, out, roles, ch.dims[ch.acc]):
        raise _Miss
    if any(not _identity(b, r, roles, ch.dims[ch.acc]) for r in ins):
        raise _Miss
    defs = _defs(b)
    c = defs.get(_stored(b, out.into))
    if not (isinstance(c, Intrinsic) and c.name == "cond"):
        raise _Miss
    by_ref = {r.into: r.source for r in ins}
    if [by_ref.get(_loaded(defs, x) or "") for x in c.inputs[:2]] != [ch.flag, ch.acc]:
        raise _Miss
    ch.mx = out.source
    ch.temps.add(ch.mx)
    ch.dims[ch.mx] = ch.dims[ch.acc]
    ch.stage = "exp"


def _exp(ch: _Chain, b: Block, tmps: set[str]) -> None:
    """``E = exp(c * (P - Mx))`` point by point: its scale ``c``."""
    ins, outs = _parts(b)
    if len(outs) != 1 or {r.source for r in ins} != {ch.p, ch.mx}:
        raise _Miss
    out = outs[0]
    roles = _roles_of(b, ch, {n: ch.dims[n] for n in (ch.p, ch.mx)})
    if out.source not in tmps or out.source in ch.temps or out.source in ch.filled:
        raise _Miss
    if any(not _identity(b, r, roles, ch.dims[r.source]) for r in ins) or not _identity(
            b, out, roles, ch.dims[ch.s]):
        raise _Miss
    defs = _defs(b)
    by_ref = {r.into: r.source for r in ins}
    top = defs.get(_stored(b, out.into))
    if not (isinstance(top, Intrinsic) and top.name == "exp"):
        raise _Miss
    ch.scale = _scale(defs, top.inputs[0], by_ref, ch)
    ch.e = out.source
    ch.temps.add(ch.e)
    ch.dims[ch.e] = ch.dims[ch.s]
    ch.stage = "sums"


def _scale(defs, x: str, by_ref: dict[str, str], ch: _Chain) -> Fraction:
    """``c`` of the exponent ``x = c * (P - Mx)`` (or ``(P - Mx) * c``, ``/ c``, ``P - Mx``)."""
    def is_diff(y: str) -> bool:
        d = defs.get(y)
        return (isinstance(d, Intrinsic) and d.name == "sub"
                and [by_ref.get(_loaded(defs, z) or "") for z in d.inputs] == [ch.p, ch.mx])

    def const(y: str) -> Fraction | None:
        d = defs.get(y)
        if isinstance(d, Constant) and d.dtype.is_float and float(d.value) == float(d.value):
            v = Fraction(float(d.value))
            return v if v != 0 and abs(float(d.value)) != float("inf") else None
        return None

    if is_diff(x):
        return Fraction(1)
    d = defs.get(x)
    if isinstance(d, Intrinsic) and d.name in ("mul", "div") and len(d.inputs) == 2:
        a, c = d.inputs
        if d.name == "mul" and is_diff(c) and const(a) is not None:
            return const(a)
        if is_diff(a) and const(c) is not None:
            return const(c) if d.name == "mul" else 1 / const(c)
    raise _Miss


def _sum(ch: _Chain, b: Block, parent: Block, tmps: set[str]) -> None:
    """The row sum ``Z``, ``O1 = E · V`` (either order), then ``O = O1 / Z``; or the row sum, the
    normalized weights ``W = E / Z`` and ``O = W · V``."""
    if ch.z and ch.o1:
        _div(ch, b, parent)
        return
    ins, outs = _parts(b)
    if len(outs) == 1 and outs[0].agg_op in ("", "assign") and ch.z and not (ch.o1 or ch.w):
        _normalize(ch, b, tmps)
        return
    if len(outs) != 1 or outs[0].agg_op != "add":
        raise _Miss
    if len(ins) == 1 and not ch.z:
        out, roles, out_roles = _reduction(ch, b, ch.e, "add", tmps)
        defs = _defs(b)
        if not _assign_of_load(defs, _stored(b, out.into)) and _loaded(defs, _stored(b, out.into)) is None:
            raise _Miss
        if sorted(out_roles) != sorted(ch.dims[ch.mx]) or _mask_of(b, roles) != ch.mask:
            raise _Miss
        ch.z = out.source
        ch.temps.add(ch.z)
        ch.dims[ch.z] = out_roles
        return
    src = ch.w or ch.e
    if len(ins) != 2 or ch.o1:
        raise _Miss
    e_ref = [r for r in ins if r.source == src]
    v_ref = [r for r in ins if r.source != src]
    if len(e_ref) != 1 or len(v_ref) != 1 or v_ref[0].source in ch.temps:
        raise _Miss
    out = outs[0]
    roles = _roles_of(b, ch, {src: ch.dims[src]})
    ranges = {ix.name: ix.range for ix in b.idxs}
    defs = _defs(b)
    prod = defs.get(_stored(b, out.into))
    if not (isinstance(prod, Intrinsic) and prod.name == "mul"):
        raise _Miss
    if sorted(map(str, (_loaded(defs, x) for x in prod.inputs))) != sorted((e_ref[0].into, v_ref[0].into)):
        raise _Miss
    if not _identity(b, e_ref[0], roles, ch.dims[src]):
        raise _Miss
    width = [v for v in ranges if v not in roles and ranges[v] > 1]
    if len(width) > 1 or _mask_of(b, roles) != ch.mask:
        raise _Miss
    named = dict(roles) | ({width[0]: "e"} if width else {})
    o_vars, v_vars = _vars(out.access, ranges), _vars(v_ref[0].access, ranges)
    o_roles = tuple(ZERO if v is None or v not in named else named[v] for v in o_vars)
    v_roles = tuple(ZERO if v is None or v not in named else named[v] for v in v_vars)
    if any(v is not None and v not in named and ranges[v] > 1 for v in o_vars + v_vars):
        raise _Miss
    if "j" in o_roles or "i" not in o_roles or "j" not in v_roles or "i" in v_roles:
        raise _Miss
    if (width and ("e" not in o_roles or "e" not in v_roles)) or "d" in o_roles + v_roles:
        raise _Miss
    batch = {n for n, _ in ch.batch}
    if {r for r in o_roles if r in batch} != batch or out.source not in ch.filled:
        raise _Miss
    if out.source in ch.temps or v_ref[0].shape.dtype not in _FLOATS:
        raise _Miss
    _whole(parent, v_ref[0])
    ch.width = ranges[width[0]] if width else 1
    ch.v, ch.v_dims = v_ref[0].source, v_roles
    if ch.w:  # normalized weights: this is the result
        if out.shape.dtype not in _FLOATS:
            raise _Miss
        _whole(parent, out)
        ch.o, ch.o_dims = out.source, o_roles
        _finish(ch)
        return
    if out.source not in tmps:
        raise _Miss
    ch.o1 = out.source
    ch.temps.add(ch.o1)
    ch.dims[ch.o1] = o_roles


def _normalize(ch: _Chain, b: Block, tmps: set[str]) -> None:
    """``W = E / Z`` point by point: the normalized weights."""
    ins, outs = _parts(b)
    if {r.source for r in ins} != {ch.e, ch.z}:
        raise _Miss
    out = outs[0]
    roles = _roles_of(b, ch, {n: ch.dims[n] for n in (ch.e, ch.z)})
    if any(not _identity(b, r, roles, ch.dims[r.source]) for r in ins):
        raise _Miss
    if out.source not in tmps or out.source in ch.temps | ch.filled:
        raise _Miss
    if not _identity(b, out, roles, ch.dims[ch.e]):
        raise _Miss
    defs = _defs(b)
    by_ref = {r.into: r.source for r in ins}
    d = defs.get(_stored(b, out.into))
    if not (isinstance(d, Intrinsic) and d.name == "div"):
        raise _Miss
    if [by_ref.get(_loaded(defs, x) or "") for x in d.inputs] != [ch.e, ch.z]:
        raise _Miss
    ch.w = out.source
    ch.temps.add(ch.w)
    ch.dims[ch.w] = ch.dims[ch.e]


def _finish(ch: _Chain) -> None:
    """Every fill is of a temporary or of the result, and S, Z start filled."""
    if ch.filled - ch.temps - {ch.o} or not {ch.s, ch.z} <= ch.filled:
        raise _Miss
    ch.stage = "done"


def _div(ch: _Chain, b: Block, parent: Block) -> None:
    ins, outs = _parts(b)
    if len(outs) != 1 or outs[0].agg_op not in ("", "assign") or {r.source for r in ins} != {ch.o1, ch.z}:
        raise _Miss
    out = outs[0]
    roles = _roles_of(b, ch, {n: ch.dims[n] for n in (ch.o1, ch.z)})
    if any(not _identity(b, r, roles, ch.dims[r.source]) for r in ins):
        raise _Miss
    if out.source in ch.temps or out.source in ch.filled or not _identity(b, out, roles, ch.dims[ch.o1]):
        raise _Miss
    defs = _defs(b)
    by_ref = {r.into: r.source for r in ins}
    d = defs.get(_stored(b, out.into))
    if not (isinstance(d, Intrinsic) and d.name == "div"):
        raise _Miss
    if [by_ref.get(_loaded(defs, x) or "") for x in d.inputs] != [ch.o1, ch.z]:
        raise _Miss
    if out.shape.dtype not in _FLOATS:
        raise _Miss
    _whole(parent, out)
    ch.o, ch.o_dims = out.source, ch.dims[ch.o1]
    _finish(ch)


# ------------------------------------------------------------------------------ the block
def _container(ch: _Chain, run, parent: Block, cfg: AttentionConfig, local_bytes: int) -> Block:
    """The run as one planned block over no indexes, its temporaries local allocations."""
    reads: dict[str, bool] = {}
    writes: dict[str, bool] = {}
    for s in run:
        for r in s.refs:
            (writes if r.dir is not RefDir.IN else reads)[r.source] = True
    refs = []
    for name in dict.fromkeys([*reads, *writes]):
        whole = parent.ref(name)
        zeros = tuple(Affine.constant(0) for _ in whole.access)
        if name in ch.temps:
            sizes = whole.shape.sizes
            dims = tuple(Dim(n, st) for n, st in zip(sizes, dense_strides(sizes), strict=True))
            shape = TensorShape(whole.shape.dtype, dims)
            refs.append(Refinement(RefDir.NONE, name, zeros, shape))
            continue
        d = RefDir.INOUT if name in reads and name in writes else RefDir.OUT if name in writes else RefDir.IN
        refs.append(replace(whole, dir=d, access=zeros, from_=None))
    widest = max(ch.depth, ch.width)
    bc = cfg.block_keys
    while bc > 4 and 2 * bc * widest * 4 > local_bytes // 2:
        bc //= 2
    br = cfg.block_rows
    while br > 8 and br // 2 >= ch.rows:
        br //= 2
    plan = AttentionPlan(
        q=ch.q, k=ch.k, v=ch.v, out=ch.o, scores=tuple(ch.scores), s=ch.s,
        batch=tuple(ch.batch), rows=ch.rows, keys=ch.keys, depth=ch.depth, width=ch.width,
        q_dims=ch.q_dims, k_dims=ch.k_dims, v_dims=ch.v_dims, out_dims=ch.o_dims, s_dims=ch.dims[ch.s],
        mask=_flat_mask(ch.mask), scale_num=ch.scale.numerator, scale_den=ch.scale.denominator,
        block_rows=br, block_keys=bc,
    )
    comments = tuple(c for s in run for c in s.comments)
    return Block(
        name=f"attention_{ch.o}",
        refs=tuple(refs),
        stmts=tuple(replace(s, tags=frozenset()) for s in run),
        tags=frozenset({"kernel", ATTENTION_TAG}),
        comments=comments,
        plan=plan,
    )


def _flat_mask(mask) -> tuple[tuple[str, int], ...]:
    """The constraints as one list: each its ``(role, coefficient)`` terms, then ``(c, constant)``."""
    out: list[tuple[str, int]] = []
    for terms, const in sorted(mask or ()):
        out.extend(terms)
        out.append(("c", const))
    return tuple(out)
