"""The ``Special`` statements as loops over whole views, with the interpreter's semantics.

Each mirrors ``ref_interp.stripe_special``: specials overwrite their outputs (no ``agg_op``), read
and write through the views' dtypes, and gather/scatter clamp indices into range. ``scatter``
starts from zeros and adds the values in row-major order of the value tensor (``np.add.at``'s
order); it accumulates through the output buffer, which is exact when the output refinement has
its buffer's dtype (always, for lowered programs). Softmax works row by row: the row maximum
(nan propagates), ``e = exp(x - max)``, their sum (in float for float16, as numpy), then
``e / sum`` or ``x - max - log(sum)``; numpy sums pairwise where this sums in order, and libm's
``exp`` is not numpy's, so softmax agrees with the interpreter to rounding, not bit for bit.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from backends.llvm.intrinsics import binary, float_fn
from backends.llvm.loops import View, for_box, for_range, unravel
from backends.llvm.scalars import I64, Emitter, i64, reg_type
from stripe.ir import Special
from tile.dtypes import DType
from tile.errors import TileRuntimeError

AGG_INIT = ("add", "mul", "max", "min")


def identity(em: Emitter, op: str, dt: DType) -> ir.Constant:
    """The identity of an aggregation in ``dt``: 0, 1, the lowest value (max) or the highest (min)."""
    if op in ("add", "mul"):
        return em.const(0 if op == "add" else 1, dt)
    low = op == "max"
    if dt is DType.BOOL:
        return em.const(not low, dt)
    if dt.is_float:
        return em.const(-np.inf if low else np.inf, dt)
    info = np.iinfo(dt.numpy)
    return em.const(int(info.min if low else info.max), dt)


def _fail(stmt: Special, where: str, message: str, hint: str) -> TileRuntimeError:
    return TileRuntimeError(f"special '{stmt.name}' in {where}: {message}", None, hint=hint)


def _arity(stmt: Special, where: str, n_in: tuple[int, ...], n_out: int) -> None:
    if len(stmt.inputs) not in n_in or len(stmt.outputs) != n_out:
        want = " or ".join(map(str, n_in))
        raise _fail(
            stmt,
            where,
            f"takes {want} input(s) and {n_out} output(s), got {len(stmt.inputs)} and {len(stmt.outputs)}",
            "check the special's refinement lists",
        )


def fill(em: Emitter, view: View, value: ir.Value) -> None:
    for_box(em, view.sizes, lambda c: view.write(em, view.at(em, c), value))


def emit_special(em: Emitter, stmt: Special, views: dict[str, View], where: str) -> None:
    for n in (*stmt.inputs, *stmt.outputs):
        if n not in views:
            raise _fail(stmt, where, f"names refinement '{n}', which the block does not have", "add it")
    ins = [views[n] for n in stmt.inputs]
    outs = [views[n] for n in stmt.outputs]
    name = stmt.name
    if name == "zero" or name.startswith("agg_init_"):
        op = "add" if name == "zero" else name[len("agg_init_") :]
        if op not in AGG_INIT:
            raise _fail(stmt, where, f"unknown aggregation '{op}'", "use agg_init_add|mul|max|min")
        for o in outs:
            fill(em, o, identity(em, op, o.dtype))
        return
    if name in ("copy", "reshape"):
        _arity(stmt, where, (1,), 1)
        _copy(em, stmt, where, ins[0], outs[0])
        return
    if name == "shape":
        _arity(stmt, where, (1,), 1)
        (src,), (dst,) = ins, outs
        if dst.sizes != (len(src.dims),):
            raise _fail(
                stmt,
                where,
                f"the output must have sizes ({len(src.dims)},), not {dst.sizes}",
                "shape(T) is a vector of T's sizes",
            )
        for k, s in enumerate(src.sizes):
            dst.write(em, dst.at(em, [i64(k)]), em.convert(em.const(s, DType.INT32), DType.INT32, dst.dtype))
        return
    if name == "gather":
        _arity(stmt, where, (2,), 1)
        _gather(em, stmt, where, ins, outs[0])
        return
    if name == "scatter":
        _arity(stmt, where, (2, 3), 1)
        _scatter(em, stmt, where, ins, outs[0])
        return
    if name in ("builtin_softmax", "builtin_logsoftmax"):
        _arity(stmt, where, (1,), 1)
        (x,), (o,) = ins, outs
        if len(x.dims) != 2 or o.sizes != x.sizes or (stmt.int_params and tuple(stmt.int_params) != x.sizes):
            raise _fail(
                stmt,
                where,
                f"needs a 2-D input and an output of the same sizes (and int params R, C "
                f"equal to them), got {x.sizes} -> {o.sizes} with params {stmt.int_params}",
                "softmax works row-wise on a (R, C) view",
            )
        if not o.dtype.is_float:
            raise _fail(stmt, where, f"the output must be float, not {o.dtype}", "softmax gives floats")
        _softmax(em, x, o, name == "builtin_logsoftmax")
        return
    raise _fail(
        stmt,
        where,
        "is not a special this backend knows",
        "known specials: zero, copy, reshape, shape, gather, scatter, builtin_softmax, "
        "builtin_logsoftmax, agg_init_add|mul|max|min",
    )


def _copy(em: Emitter, stmt: Special, where: str, src: View, dst: View) -> None:
    same = src.sizes == dst.sizes if stmt.name == "copy" else src.elements == dst.elements
    if not same:
        raise _fail(
            stmt,
            where,
            f"'{src.name}' has sizes {src.sizes} but '{dst.name}' has {dst.sizes}",
            "copy needs equal sizes; reshape needs equal element counts",
        )

    def move(src_coords, dst_coords) -> None:
        v = src.read(em, src.at(em, src_coords))
        dst.write(em, dst.at(em, dst_coords), em.convert(v, src.dtype, dst.dtype))

    if src.sizes == dst.sizes:
        for_box(em, dst.sizes, lambda c: move(c, c))
    else:
        body = lambda f: move(unravel(em, f, src.sizes), unravel(em, f, dst.sizes))  # noqa: E731
        for_range(em, i64(0), i64(dst.elements), body)


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


def _gather(em: Emitter, stmt: Special, where: str, ins: list[View], out: View) -> None:
    data, idx = ins
    if not idx.dtype.is_int:
        raise _fail(
            stmt,
            where,
            f"the index refinement '{idx.name}' must be integer, not {idx.dtype}",
            "convert the indices with as_int first",
        )
    if not data.dims or out.sizes != idx.sizes + data.sizes[1:]:
        raise _fail(
            stmt,
            where,
            f"gather of {data.sizes} by {idx.sizes} cannot give {out.sizes}",
            "the output's sizes are the index's sizes followed by the data's after the first",
        )
    if data.sizes[0] == 0 and idx.elements > 0:
        raise _fail(stmt, where, f"gathers from '{data.name}', whose first size is 0", "gather needs a row")
    r = len(idx.dims)

    def body(c: list[ir.Value]) -> None:
        row = clamp_index(em, idx.read(em, idx.at(em, c[:r])), idx.dtype, data.sizes[0])
        v = data.read(em, data.at(em, [row, *c[r:]]))
        out.write(em, out.at(em, c), em.convert(v, data.dtype, out.dtype))

    for_box(em, out.sizes, body)


def _scatter(em: Emitter, stmt: Special, where: str, ins: list[View], out: View) -> None:
    values, idx = ins[:2]
    length = ins[2].sizes[0] if len(ins) == 3 and ins[2].dims else (out.sizes[0] if out.dims else -1)
    r = len(idx.dims)
    if not idx.dtype.is_int:
        raise _fail(
            stmt,
            where,
            f"the index refinement '{idx.name}' must be integer, not {idx.dtype}",
            "convert the indices with as_int first",
        )
    if values.sizes[:r] != idx.sizes or out.sizes != (length, *values.sizes[r:]):
        raise _fail(
            stmt,
            where,
            f"scatter of {values.sizes} by {idx.sizes} cannot give {out.sizes}",
            "scatter(V, I[, L]): the output is (L's first size, *V's sizes after I's rank)",
        )
    fill(em, out, em.zero(out.dtype))
    if length == 0:
        return

    def body(c: list[ir.Value]) -> None:
        row = clamp_index(em, idx.read(em, idx.at(em, c[:r])), idx.dtype, length)
        pos = out.at(em, [row, *c[r:]])
        v = em.convert(values.read(em, values.at(em, c)), values.dtype, out.dtype)
        out.write(em, pos, binary(em, "add", out.read(em, pos), v, out.dtype))

    for_box(em, values.sizes, body)


def _softmax(em: Emitter, x: View, o: View, log: bool) -> None:
    rows, cols = x.sizes
    if rows == 0 or cols == 0:
        return
    dt = o.dtype
    acc_dt = DType.FLOAT32 if dt is DType.FLOAT16 else dt
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

        for_range(em, i64(1), i64(cols), to_max)
        b.store(em.zero(acc_dt), s_slot)

        def to_sum(col: ir.Value) -> None:
            e = em.convert(float_fn(em, "exp", [shifted(row, col)], dt), dt, acc_dt)
            b.store(b.fadd(b.load(s_slot, typ=reg_type(acc_dt)), e), s_slot)

        for_range(em, i64(0), i64(cols), to_sum)
        total = em.convert(b.load(s_slot, typ=reg_type(acc_dt)), acc_dt, dt)

        def out(col: ir.Value) -> None:
            sh = shifted(row, col)
            if log:
                v = binary(em, "sub", sh, float_fn(em, "log", [total], dt), dt)
            else:
                v = binary(em, "div", float_fn(em, "exp", [sh], dt), total, dt)
            o.write(em, o.at(em, [row, col]), v)

        for_range(em, i64(0), i64(cols), out)

    for_range(em, i64(0), i64(rows), per_row)
