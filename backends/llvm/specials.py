"""The ``Special`` statements as loops over whole views, with the interpreter's semantics.

Each mirrors ``ref_interp.stripe_special``: specials overwrite their outputs (no ``agg_op``), read
and write through the views' dtypes, and gather/scatter clamp indices into range. ``scatter``
starts from zeros and adds the values in row-major order of the value tensor (``np.add.at``'s
order); it accumulates through the output buffer, which is exact when the output refinement has
its buffer's dtype (always, for lowered programs). Softmax works row by row: the row maximum
(nan propagates), ``e = exp(x - max)``, their sum in column order (in float for float16 and
bfloat16), then ``e / sum`` or ``x - max - log(sum)``: the interpreter's composition, so in strict
mode (exp and log from libm's double routines, §8.3) softmax gives the interpreter's bits. The
PRNG specials loop over the 2048 streams, each advancing in registers through its elements (those
at ``t, t + 2048, ...``); they give the interpreter's bits exactly (``ref_interp.prng``).
"""

from __future__ import annotations

from llvmlite import ir

from backends.llvm.intrinsics import binary, float_fn
from backends.llvm.loops import View, for_box, for_range, unravel
from backends.llvm.scalars import I64, Emitter, i64, reg_type
from backends.llvm.symbolic import SlotUsed, is_slot
from stripe.ir import Special
from stripe.specials import BACKEND, Checked, check, identity
from tile.dtypes import DType
from tile.prng import SCALE, STREAMS, TAUS88


def fill(em: Emitter, view: View, value: ir.Value) -> None:
    for_box(em, view.sizes, lambda c: view.write(em, view.at(em, c), value))


def emit_special(em: Emitter, stmt: Special, views: dict[str, View], where: str) -> None:
    sp = check(stmt, views, where, BACKEND) if not em.extents else _generic(stmt, views)
    _EMIT[sp.kind](em, sp)


def _generic(stmt: Special, views: dict[str, View]) -> Checked[View]:
    """A generic kernel's fill or softmax (``generic``: its instances are the program's, which
    ``check`` passed where the first was built); any other special reads its sizes as numbers."""
    ins = tuple(views[n] for n in stmt.inputs)
    outs = tuple(views[n] for n in stmt.outputs)
    if stmt.name == "zero" or stmt.name.startswith("agg_init_"):
        op = "add" if stmt.name == "zero" else stmt.name[len("agg_init_") :]
        return Checked(stmt.name, "fill", ins, outs, op=op)
    if stmt.name in ("builtin_softmax", "builtin_logsoftmax") and len(ins) == len(outs) == 1:
        if len(ins[0].dims) == len(outs[0].dims) == 2 and outs[0].dtype.is_float:
            return Checked(stmt.name, "softmax", ins, outs, log=stmt.name == "builtin_logsoftmax")
    raise SlotUsed(f"special '{stmt.name}' in a generic kernel")


def _fill(em: Emitter, sp: Checked[View]) -> None:
    for o in sp.outs:
        fill(em, o, em.const(identity(sp.op, o.dtype), o.dtype))


def _copy(em: Emitter, sp: Checked[View]) -> None:
    (src,), (dst,) = sp.ins, sp.outs

    def move(src_coords, dst_coords) -> None:
        v = src.read(em, src.at(em, src_coords))
        dst.write(em, dst.at(em, dst_coords), em.convert(v, src.dtype, dst.dtype))

    if src.sizes == dst.sizes:
        for_box(em, dst.sizes, lambda c: move(c, c))
    else:
        body = lambda f: move(unravel(em, f, src.sizes), unravel(em, f, dst.sizes))  # noqa: E731
        for_range(em, i64(0), i64(dst.elements), body)


def _shape(em: Emitter, sp: Checked[View]) -> None:
    (src,), (dst,) = sp.ins, sp.outs
    for k, s in enumerate(src.sizes):
        dst.write(em, dst.at(em, [i64(k)]), em.convert(em.const(s, DType.INT32), DType.INT32, dst.dtype))


def clamp_index(em: Emitter, v: ir.Value, dt: DType, n: int) -> ir.Value:
    """An index register of integer ``dt`` clamped into ``[0, n)`` as i64 (compared in its own type)."""
    b = em.builder
    if dt.bits < 64:
        v = b.sext(v, I64) if dt.is_signed else b.zext(v, I64)
    top = i64(n - 1)
    if dt.is_signed:
        v = b.select(b.icmp_signed("<", v, i64(0)), i64(0), v)
        return b.select(b.icmp_signed(">", v, top), top, v)
    return b.select(b.icmp_unsigned(">", v, top), top, v)


def _gather(em: Emitter, sp: Checked[View]) -> None:
    (data, idx), (out,) = sp.ins, sp.outs
    r = len(idx.dims)

    def body(c: list[ir.Value]) -> None:
        row = clamp_index(em, idx.read(em, idx.at(em, c[:r])), idx.dtype, data.sizes[0])
        v = data.read(em, data.at(em, [row, *c[r:]]))
        out.write(em, out.at(em, c), em.convert(v, data.dtype, out.dtype))

    for_box(em, out.sizes, body)


def _scatter(em: Emitter, sp: Checked[View]) -> None:
    (values, idx), (out,), length = sp.ins[:2], sp.outs, sp.length
    r = len(idx.dims)
    fill(em, out, em.zero(out.dtype))
    if length == 0:
        return

    def body(c: list[ir.Value]) -> None:
        row = clamp_index(em, idx.read(em, idx.at(em, c[:r])), idx.dtype, length)
        pos = out.at(em, [row, *c[r:]])
        v = em.convert(values.read(em, values.at(em, c)), values.dtype, out.dtype)
        out.write(em, pos, binary(em, "add", out.read(em, pos), v, out.dtype))

    for_box(em, values.sizes, body)


def _softmax(em: Emitter, sp: Checked[View]) -> None:
    (x,), (o,), log = sp.ins, sp.outs, sp.log
    rows, cols = x.sizes
    generic = is_slot(rows) or is_slot(cols)
    if not generic and (rows == 0 or cols == 0):
        return
    dt = o.dtype
    acc_dt = DType.FLOAT32 if dt.is_narrow_float else dt
    b = em.builder
    m_slot = em.alloca(reg_type(dt))
    s_slot = em.alloca(reg_type(acc_dt))

    def elem(row: ir.Value, col: ir.Value) -> ir.Value:
        return em.convert(x.read(em, x.at(em, [row, col])), x.dtype, dt)

    def shifted(row: ir.Value, col: ir.Value) -> ir.Value:
        return binary(em, "sub", elem(row, col), b.load(m_slot, typ=reg_type(dt)), dt)

    def per_row(row: ir.Value) -> None:
        b.store(elem(row, i64(0)), m_slot)

        def to_max(col: ir.Value) -> None:
            b.store(binary(em, "max", b.load(m_slot, typ=reg_type(dt)), elem(row, col), dt), m_slot)

        for_range(em, i64(1), em.num(cols), to_max)
        b.store(em.zero(acc_dt), s_slot)

        def to_sum(col: ir.Value) -> None:
            e = em.convert(float_fn(em, "exp", [shifted(row, col)], dt), dt, acc_dt)
            b.store(b.fadd(b.load(s_slot, typ=reg_type(acc_dt)), e), s_slot)

        for_range(em, i64(0), em.num(cols), to_sum)
        total = em.convert(b.load(s_slot, typ=reg_type(acc_dt)), acc_dt, dt)

        def out(col: ir.Value) -> None:
            sh = shifted(row, col)
            if log:
                v = binary(em, "sub", sh, float_fn(em, "log", [total], dt), dt)
            else:
                v = binary(em, "div", float_fn(em, "exp", [sh], dt), total, dt)
            o.write(em, o.at(em, [row, col]), v)

        for_range(em, i64(0), em.num(cols), out)

    if generic:  # a row of no columns has no first element to start the maximum from
        with b.if_then(b.icmp_signed(">", em.num(cols), i64(0))):
            for_range(em, i64(0), em.num(rows), per_row)
    else:
        for_range(em, i64(0), i64(rows), per_row)


def _prng(em: Emitter, sp: Checked[View]) -> None:
    (state,), (out,), n = sp.ins, sp.outs, sp.length
    b = em.builder
    u32 = reg_type(DType.UINT32)
    slots = [em.alloca(u32) for _ in TAUS88]

    def stream(t: ir.Value) -> None:
        for k, slot in enumerate(slots):
            b.store(state.read(em, state.at(em, [i64(k), t])), slot)

        def step(j: ir.Value) -> None:
            raw = None
            for slot, (mask, a, c, r) in zip(slots, TAUS88):
                s = b.load(slot, typ=u32)
                fb = b.lshr(b.xor(b.shl(s, ir.Constant(u32, c)), s), ir.Constant(u32, r))
                s = b.xor(b.shl(b.and_(s, ir.Constant(u32, mask)), ir.Constant(u32, a)), fb)
                b.store(s, slot)
                raw = s if raw is None else b.xor(raw, s)
            if sp.op == "step":
                flat = b.add(t, b.mul(j, i64(STREAMS)))
                out.write(em, out.at(em, unravel(em, flat, out.sizes)), raw)

        # stream t gives elements t, t + 2048, ... below n: ceil((n - t) / 2048) of them
        for_range(em, i64(0), b.udiv(b.sub(i64(n + STREAMS - 1), t), i64(STREAMS)), step)
        if sp.op == "state":
            for k, slot in enumerate(slots):
                out.write(em, out.at(em, [i64(k), t]), b.load(slot, typ=u32))

    for_range(em, i64(0), i64(STREAMS), stream)


def _prng_value(em: Emitter, sp: Checked[View]) -> None:
    (raw,), (out,) = sp.ins, sp.outs

    def body(c: list[ir.Value]) -> None:
        f = em.convert(raw.read(em, raw.at(em, c)), DType.UINT32, DType.FLOAT32)  # rounds to nearest
        out.write(em, out.at(em, c), em.builder.fmul(f, em.const(SCALE, DType.FLOAT32)))

    for_box(em, out.sizes, body)


_EMIT = dict(fill=_fill, copy=_copy, shape=_shape, gather=_gather, scatter=_scatter, softmax=_softmax)
_EMIT.update(prng=_prng, prng_value=_prng_value)
