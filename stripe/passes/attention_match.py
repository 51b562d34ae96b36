"""The ``attention`` pass's matcher: ``chain_at`` reads a run of ``#main``'s kernels as the chain
the pass's docstring describes (``stripe.passes.attention``), one kernel at a time (``step``), each
stage checking the kernel's structure and the roles of its indexes, or gives up (``Miss``)."""

from __future__ import annotations

from fractions import Fraction

from stripe.ir import (
    Block,
    Constant,
    Intrinsic,
    RefDir,
    Refinement,
    Special,
)
from stripe.passes.attention_access import (
    FLOATS,
    ZERO,
    Chain,
    Miss,
    assign_of_load,
    at_point,
    fill_of,
    leaf_parts,
    load_of,
    mask_of,
    roles_of,
    scalar_defs,
    stored_from,
    vars_of,
    whole_ref,
)
from tile.dtypes import DType


def chain_at(stmts, start: int, parent: Block, tmps: set[str], max_depth: int):
    """``(chain, end)`` when the kernels from ``start`` are an attention chain, else None."""

    def done(ch: Chain, k: int) -> bool:
        if ch.stage != "done":
            return False
        _check_outside(ch, stmts[:start] + stmts[k + 1:])
        _check_inside(ch, stmts[start:k + 1])
        if max(ch.depth, ch.width) > max_depth:
            raise Miss("a head too wide for registers")
        return True

    return _walk(stmts, start, parent, tmps, done)


def forward_at(stmts, start: int, parent: Block, tmps: set[str]):
    """``(chain, end)`` when the kernels from ``start`` are a chain's forward as far as its row sum
    ``Z`` and ``O1 = E · V`` (either order), the division not yet met, or (softmax first) ``Z`` and
    the weights ``W = E / Z``: the part of the chain that its gradient recomputes
    (``stripe.passes.attention_backward``); else None."""
    return _walk(stmts, start, parent, tmps, lambda ch, _k: bool(ch.z and (ch.o1 or ch.w)))


def _walk(stmts, start: int, parent: Block, tmps: set[str], done):
    """``(chain, end)``: the kernels from ``start`` read step by step into a chain until
    ``done(chain, k)`` after kernel ``k``; None at a statement that is no kernel, a kernel that
    does not fit (``Miss``), or the end."""
    ch = Chain()
    try:
        for k in range(start, len(stmts)):
            s = stmts[k]
            if not (isinstance(s, Block) and s.has_tags("kernel")):
                return None
            _step(ch, s, parent, tmps)
            if done(ch, k):
                return ch, k + 1
    except Miss:
        return None
    return None


def _check_outside(ch: Chain, others) -> None:
    for s in others:
        if isinstance(s, Block) and any(r.source in ch.temps for r in s.refs):
            raise Miss  # a temporary read elsewhere (S materialized for another use)


def _check_inside(ch: Chain, run) -> None:
    """The run writes only its temporaries and ``O`` (by its last kernel, after its fill), and
    reads ``O`` nowhere: the fused kernel reads its other inputs while it writes ``O``."""
    for s in run:
        writes_o = s is run[-1] or (len(s.refs) == 1 and not s.idxs and isinstance(s.stmts[0], Special))
        for r in s.refs:
            stray = r.dir is not RefDir.IN and r.source not in ch.temps | {ch.o}
            if r.source == ch.o and not writes_o or stray:
                raise Miss
    if any(r.source == ch.o and r.dir is not RefDir.OUT for r in run[-1].refs):
        raise Miss


def _step(ch: Chain, b: Block, parent: Block, tmps: set[str]) -> None:
    """Takes kernel ``b`` as the chain's next member, or raises ``Miss``."""
    fill = fill_of(b, parent)
    if fill is not None:  # of a temporary, or of the result that normalized weights sum into
        if fill in ch.filled or fill in ch.temps:
            raise Miss
        ch.filled.add(fill)
        return
    if b.constraints and ch.stage not in ("scores", "sums") or any(ix.affine is not None for ix in b.idxs):
        raise Miss
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
        raise Miss


def _scores(ch: Chain, b: Block, parent: Block, tmps: set[str]) -> None:
    ins, outs = leaf_parts(b)
    if len(ins) != 2 or len(outs) != 1 or outs[0].agg_op != "add" or b.constraints:
        raise Miss
    out = outs[0]
    if out.source not in tmps or out.source not in ch.filled:
        raise Miss
    defs = scalar_defs(b)
    prod = defs.get(stored_from(b, out.into))
    if not (isinstance(prod, Intrinsic) and prod.name == "mul"):
        raise Miss
    loaded = [load_of(defs, x) for x in prod.inputs]
    if sorted(loaded, key=str) != sorted((ins[0].into, ins[1].into), key=str):
        raise Miss
    ranges = {ix.name: ix.range for ix in b.idxs}
    s_vars = vars_of(out.access, ranges)
    reduced = [v for v in ranges if v not in s_vars]
    a_vars, b_vars = vars_of(ins[0].access, ranges), vars_of(ins[1].access, ranges)
    if len(reduced) != 1 or reduced[0] not in a_vars or reduced[0] not in b_vars:
        raise Miss
    if any(r.shape.dtype not in FLOATS for r in (*ins, out)):
        raise Miss
    for r in ins:
        whole_ref(parent, r)
    ch.s = ch.p = out.source
    ch.temps.add(ch.s)
    ch.depth = ranges[reduced[0]]
    ch.dims[ch.s] = tuple(v or ZERO for v in s_vars)  # the kernel's own names for now: _max names roles
    ch.q_dims = tuple(v or ZERO for v in a_vars)
    ch.k_dims = tuple(v or ZERO for v in b_vars)
    ch.q, ch.k = ins[0].source, ins[1].source
    ch.ranges, ch.d = ranges, reduced[0]


def _score_kernel(ch: Chain, b: Block, tmps: set[str]) -> None:
    """An elementwise kernel making the next score from the last one, point by point (of more than
    one point: a one-point kernel would be inlined into the block, and the plan names it)."""
    ins, outs = leaf_parts(b)
    if b.index_space < 2:
        raise Miss
    if len(outs) != 1 or outs[0].agg_op not in ("", "assign") or b.constraints:
        raise Miss
    out = outs[0]
    roles = roles_of(b, ch, {n: ch.dims[n] for n in ch.temps})
    ranges = {ix.name: ix.range for ix in b.idxs}
    if any(v not in roles and n > 1 for v, n in ranges.items()):
        raise Miss
    if out.source not in tmps or out.source in ch.temps | ch.filled:
        raise Miss
    if not at_point(b, out, roles, ch.dims[ch.s]):
        raise Miss
    if not any(r.source == ch.p for r in ins):
        raise Miss
    for r in ins:
        if r.source in ch.temps and not at_point(b, r, roles, ch.dims[r.source]):
            raise Miss
    if out.shape.dtype not in FLOATS:
        raise Miss
    ch.scores.append(b.name)
    ch.p = out.source
    ch.temps.add(out.source)
    ch.dims[out.source] = ch.dims[ch.s]


def _reduction(ch: Chain, b: Block, src: str, agg: str, tmps: set[str]):
    """A kernel aggregating ``src`` (one of the chain's, S-shaped) over the keys with ``agg``: its
    output refinement, its roles and the roles of its output's dims."""
    ins, outs = leaf_parts(b)
    main = [r for r in outs if r.agg_op == agg]
    if len(main) != 1 or not any(r.source == src for r in ins):
        raise Miss
    roles = roles_of(b, ch, {n: ch.dims[n] for n in ch.temps})
    out = main[0]
    if out.source not in tmps or out.source not in ch.filled or out.source in ch.temps:
        raise Miss
    ranges = {ix.name: ix.range for ix in b.idxs}
    out_roles = tuple(ZERO if v is None or ranges[v] == 1 and v not in roles else roles.get(v, "?")
                      for v in vars_of(out.access, ranges))
    return out, roles, out_roles


def _max(ch: Chain, b: Block, tmps: set[str]) -> bool:
    """The row max of the last score: names the roles (the dim it reduces is the keys)."""
    outs = [r for r in b.refs if r.dir is not RefDir.IN]
    if not any(r.agg_op == "max" for r in outs):
        return False
    _name_roles(ch, b)
    out, roles, out_roles = _reduction(ch, b, ch.p, "max", tmps)
    keys = [v for v, role in roles.items() if role == "j"]
    if len(keys) != 1 or "j" in out_roles or sorted(r for r in out_roles if r != ZERO) != sorted(
            {d for d in ch.dims[ch.s] if d not in (ZERO, "j")}):
        raise Miss
    flags = [r for r in outs if r is not out]
    defs = scalar_defs(b)
    if load_of(defs, stored_from(b, out.into)) is None and not assign_of_load(defs, stored_from(b, out.into)):
        raise Miss
    ch.mask = mask_of(b, roles)
    if flags:  # a masked max: accumulator and written-flag, then a cond kernel makes Mx
        if len(flags) != 1 or flags[0].agg_op not in ("", "assign") or flags[0].shape.dtype is not DType.BOOL:
            raise Miss
        flag = flags[0]
        if flag.source not in tmps or flag.source not in ch.filled or tuple(flag.access) != tuple(out.access):
            raise Miss
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


def _name_roles(ch: Chain, b: Block) -> None:
    """The scores' dims' roles, once the row max says which of S's indexes is the keys: the
    batch indexes ``b0 b1 ..``, the rows ``i``, the keys ``j`` (and ``d``, the depth)."""
    ranges = {ix.name: ix.range for ix in b.idxs}
    src = next((r for r in b.refs if r.dir is RefDir.IN and r.source == ch.p), None)
    out = next((r for r in b.refs if r.dir is not RefDir.IN and r.agg_op == "max"), None)
    if src is None or out is None:
        raise Miss
    kept = {v for v in vars_of(out.access, ranges) if v is not None}
    s_vars = ch.dims[ch.s]
    keys_at = [k for k, v in enumerate(vars_of(src.access, ranges)) if v is not None and v not in kept]
    if len(keys_at) != 1:
        raise Miss
    key_var = s_vars[keys_at[0]]
    if key_var in ch.q_dims and key_var not in ch.k_dims:  # the keys come from the first operand
        ch.q, ch.k, ch.q_dims, ch.k_dims = ch.k, ch.q, ch.k_dims, ch.q_dims
    if key_var not in ch.k_dims or key_var in ch.q_dims:
        raise Miss
    # the rows: S's last dim that Q has and K has not; S's other dims are batch dims, K (and V)
    # perhaps broadcast over some (heads sharing their keys and values)
    row_vars = [v for v in s_vars if v not in (ZERO, key_var) and v in ch.q_dims and v not in ch.k_dims]
    if not row_vars:
        raise Miss
    row_var = row_vars[-1]
    batch = [v for v in s_vars if v not in (ZERO, key_var, row_var)]
    name = {v: f"b{n}" for n, v in enumerate(batch)} | {row_var: "i", key_var: "j", ch.d: "d", ZERO: ZERO}
    for t in ch.temps:  # S and the score kernels' outputs, all of S's dims
        ch.dims[t] = tuple(name[v] for v in s_vars)
    ch.q_dims = tuple(name[v] for v in ch.q_dims)
    ch.k_dims = tuple(name[v] for v in ch.k_dims)
    ch.rows, ch.keys = ch.ranges[row_var], ch.ranges[key_var]
    ch.batch = [(name[v], ch.ranges[v]) for v in batch]


def _flag(ch: Chain, b: Block, tmps: set[str]) -> None:
    """``Mx = cond(written, acc, default)`` point by point."""
    ins, outs = leaf_parts(b)
    if len(outs) != 1 or {r.source for r in ins} != {ch.acc, ch.flag}:
        raise Miss
    out = outs[0]
    roles = roles_of(b, ch, {n: ch.dims[n] for n in (ch.acc, ch.flag)})
    if out.source not in tmps or out.source in ch.temps or not at_point(b, out, roles, ch.dims[ch.acc]):
        raise Miss
    if any(not at_point(b, r, roles, ch.dims[ch.acc]) for r in ins):
        raise Miss
    defs = scalar_defs(b)
    c = defs.get(stored_from(b, out.into))
    if not (isinstance(c, Intrinsic) and c.name == "cond"):
        raise Miss
    by_ref = {r.into: r.source for r in ins}
    if [by_ref.get(load_of(defs, x) or "") for x in c.inputs[:2]] != [ch.flag, ch.acc]:
        raise Miss
    ch.mx = out.source
    ch.temps.add(ch.mx)
    ch.dims[ch.mx] = ch.dims[ch.acc]
    ch.stage = "exp"


def _exp(ch: Chain, b: Block, tmps: set[str]) -> None:
    """``E = exp(c * (P - Mx))`` point by point: its scale ``c``."""
    ins, outs = leaf_parts(b)
    if len(outs) != 1 or {r.source for r in ins} != {ch.p, ch.mx}:
        raise Miss
    out = outs[0]
    roles = roles_of(b, ch, {n: ch.dims[n] for n in (ch.p, ch.mx)})
    if out.source not in tmps or out.source in ch.temps or out.source in ch.filled:
        raise Miss
    if any(not at_point(b, r, roles, ch.dims[r.source]) for r in ins) or not at_point(
            b, out, roles, ch.dims[ch.s]):
        raise Miss
    defs = scalar_defs(b)
    by_ref = {r.into: r.source for r in ins}
    top = defs.get(stored_from(b, out.into))
    if not (isinstance(top, Intrinsic) and top.name == "exp"):
        raise Miss
    ch.scale = _scale(defs, top.inputs[0], by_ref, ch)
    ch.e = out.source
    ch.temps.add(ch.e)
    ch.dims[ch.e] = ch.dims[ch.s]
    ch.stage = "sums"


def _scale(defs, x: str, by_ref: dict[str, str], ch: Chain) -> Fraction:
    """``c`` of the exponent ``x = c * (P - Mx)`` (or ``(P - Mx) * c``, ``/ c``, ``P - Mx``)."""
    def is_diff(y: str) -> bool:
        d = defs.get(y)
        return (isinstance(d, Intrinsic) and d.name == "sub"
                and [by_ref.get(load_of(defs, z) or "") for z in d.inputs] == [ch.p, ch.mx])

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
    raise Miss


def _sum(ch: Chain, b: Block, parent: Block, tmps: set[str]) -> None:
    """The row sum ``Z``, ``O1 = E · V`` (either order), then ``O = O1 / Z``; or the row sum, the
    normalized weights ``W = E / Z`` and ``O = W · V``."""
    if ch.z and ch.o1:
        _div(ch, b, parent)
        return
    ins, outs = leaf_parts(b)
    if len(outs) == 1 and outs[0].agg_op in ("", "assign") and ch.z and not (ch.o1 or ch.w):
        _normalize(ch, b, tmps)
        return
    if len(outs) != 1 or outs[0].agg_op != "add":
        raise Miss
    if len(ins) == 1 and not ch.z:
        out, roles, out_roles = _reduction(ch, b, ch.e, "add", tmps)
        defs = scalar_defs(b)
        value = stored_from(b, out.into)
        if not assign_of_load(defs, value) and load_of(defs, value) is None:
            raise Miss
        if sorted(out_roles) != sorted(ch.dims[ch.mx]) or mask_of(b, roles) != ch.mask:
            raise Miss
        ch.z = out.source
        ch.temps.add(ch.z)
        ch.dims[ch.z] = out_roles
        return
    src = ch.w or ch.e
    if len(ins) != 2 or ch.o1:
        raise Miss
    e_ref = [r for r in ins if r.source == src]
    v_ref = [r for r in ins if r.source != src]
    if len(e_ref) != 1 or len(v_ref) != 1 or v_ref[0].source in ch.temps:
        raise Miss
    out = outs[0]
    roles = roles_of(b, ch, {src: ch.dims[src]})
    ranges = {ix.name: ix.range for ix in b.idxs}
    defs = scalar_defs(b)
    prod = defs.get(stored_from(b, out.into))
    if not (isinstance(prod, Intrinsic) and prod.name == "mul"):
        raise Miss
    if sorted(map(str, (load_of(defs, x) for x in prod.inputs))) != sorted((e_ref[0].into, v_ref[0].into)):
        raise Miss
    if not at_point(b, e_ref[0], roles, ch.dims[src]):
        raise Miss
    width = [v for v in ranges if v not in roles and ranges[v] > 1]
    if len(width) > 1 or mask_of(b, roles) != ch.mask:
        raise Miss
    named = dict(roles) | ({width[0]: "e"} if width else {})
    o_vars, v_vars = vars_of(out.access, ranges), vars_of(v_ref[0].access, ranges)
    o_roles = tuple(ZERO if v is None or v not in named else named[v] for v in o_vars)
    v_roles = tuple(ZERO if v is None or v not in named else named[v] for v in v_vars)
    if any(v is not None and v not in named and ranges[v] > 1 for v in o_vars + v_vars):
        raise Miss
    if "j" in o_roles or "i" not in o_roles or "j" not in v_roles or "i" in v_roles:
        raise Miss
    if (width and ("e" not in o_roles or "e" not in v_roles)) or "d" in o_roles + v_roles:
        raise Miss
    batch = {n for n, _ in ch.batch}
    if {r for r in o_roles if r in batch} != batch or out.source not in ch.filled:
        raise Miss
    if out.source in ch.temps or v_ref[0].shape.dtype not in FLOATS:
        raise Miss
    whole_ref(parent, v_ref[0])
    ch.width = ranges[width[0]] if width else 1
    ch.v, ch.v_dims = v_ref[0].source, v_roles
    if ch.w:  # normalized weights: this is the result
        if out.shape.dtype not in FLOATS:
            raise Miss
        whole_ref(parent, out)
        ch.o, ch.o_dims = out.source, o_roles
        _finish(ch)
        return
    if out.source not in tmps:
        raise Miss
    ch.o1 = out.source
    ch.temps.add(ch.o1)
    ch.dims[ch.o1] = o_roles


def _quotient(ch: Chain, b: Block, num: str) -> Refinement:
    """The output of a leaf kernel storing ``num / Z`` point by point (over ``num``'s dims), one
    element each: the normalized weights (``num`` E) or the result (``num`` O1)."""
    ins, outs = leaf_parts(b)
    if len(outs) != 1 or outs[0].agg_op not in ("", "assign") or {r.source for r in ins} != {num, ch.z}:
        raise Miss
    out = outs[0]
    roles = roles_of(b, ch, {n: ch.dims[n] for n in (num, ch.z)})
    if any(not at_point(b, r, roles, ch.dims[r.source]) for r in ins):
        raise Miss
    if not at_point(b, out, roles, ch.dims[num]):
        raise Miss
    defs = scalar_defs(b)
    by_ref = {r.into: r.source for r in ins}
    d = defs.get(stored_from(b, out.into))
    if not (isinstance(d, Intrinsic) and d.name == "div"):
        raise Miss
    if [by_ref.get(load_of(defs, x) or "") for x in d.inputs] != [num, ch.z]:
        raise Miss
    return out


def _normalize(ch: Chain, b: Block, tmps: set[str]) -> None:
    """``W = E / Z`` point by point: the normalized weights."""
    out = _quotient(ch, b, ch.e)
    if out.source not in tmps or out.source in ch.temps | ch.filled:
        raise Miss
    ch.w = out.source
    ch.temps.add(ch.w)
    ch.dims[ch.w] = ch.dims[ch.e]


def _finish(ch: Chain) -> None:
    """Every fill is of a temporary or of the result, and S, Z start filled."""
    if ch.filled - ch.temps - {ch.o} or not {ch.s, ch.z} <= ch.filled:
        raise Miss
    ch.stage = "done"


def _div(ch: Chain, b: Block, parent: Block) -> None:
    """``O = O1 / Z`` point by point: the result."""
    out = _quotient(ch, b, ch.o1)
    if out.source in ch.temps or out.source in ch.filled or out.shape.dtype not in FLOATS:
        raise Miss
    whole_ref(parent, out)
    ch.o, ch.o_dims = out.source, ch.dims[ch.o1]
    _finish(ch)
