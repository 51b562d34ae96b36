"""The ``Special`` statements as C loops over whole views, with the interpreter's semantics.

Each mirrors ``ref_interp.stripe_special``: specials overwrite their outputs (no ``agg_op``), read
and write through the views' dtypes, and gather/scatter clamp indices into range. With
``parallel`` (a kernel that is just the special) the work is spread over work-items where that
keeps every element's writes in order: one per output element (``zero``, ``agg_init_*``, ``copy``,
``reshape``, ``gather``), one per row (softmaxes), one per trailing element of the values
(``scatter``: a column gets its additions in the values' row-major order, as ``np.add.at``);
otherwise one work-item loops over everything. Softmax works row by row: the row maximum (nan
propagates), ``e = exp(x - max)``, their sum in order (in float for float16), then ``e / sum`` or
``x - max - log(sum)``; numpy sums pairwise, so softmax agrees with the interpreter to rounding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from backends.clike.ops import binary, float_fn
from stripe.ir import Special
from tile.dtypes import DType
from tile.errors import TileRuntimeError

if TYPE_CHECKING:
    from backends.clike.kernel import KernelEmitter
    from backends.clike.views import View

AGG_INIT = ("add", "mul", "max", "min")
KNOWN = (
    "known specials: zero, copy, reshape, shape, gather, scatter, builtin_softmax, "
    "builtin_logsoftmax, agg_init_add|mul|max|min"
)


def identity(op: str, dt: DType):
    """The identity of an aggregation in ``dt``: 0, 1, the lowest value (max) or the highest (min)."""
    if op in ("add", "mul"):
        return 0 if op == "add" else 1
    low = op == "max"
    if dt is DType.BOOL:
        return not low
    if dt.is_float:
        return -np.inf if low else np.inf
    info = np.iinfo(dt.numpy)
    return int(info.min if low else info.max)


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


class _Loops:
    """Loop helpers over one emitter; ``each`` uses the work-item id once when ``parallel``."""

    def __init__(self, em: KernelEmitter, parallel: bool):
        self.em = em
        self.parallel = parallel
        self.work = 1

    def each(self, n: int, body) -> None:
        """``body(flat)`` for flat in [0, n): one work-item each when parallel, else a loop."""
        if self.parallel:
            self.parallel = False
            self.work = n
            body("gid")
            return
        self.loop(0, n, body)

    def loop(self, lo: int, hi: int, body) -> None:
        em = self.em
        var = em.fresh("f")
        with em.scope(f"for ({em.long} {var} = {lo}; {var} < {hi}; {var}++)"):
            body(var)

    def box(self, sizes: tuple[int, ...], body, coords: tuple[str, ...] = ()) -> None:
        """Nested loops over ``sizes``, row-major."""
        if len(coords) == len(sizes):
            body(list(coords))
            return
        self.loop(0, sizes[len(coords)], lambda c: self.box(sizes, body, (*coords, c)))

    def unravel(self, flat: str, sizes: tuple[int, ...]) -> list[str]:
        """Row-major coordinates of ``flat`` in a box of ``sizes``."""
        coords, inner = [], 1
        for k in reversed(range(len(sizes))):
            s = sizes[k]
            c = flat if inner == 1 else f"({flat} / {inner})"
            coords.append(f"{c} % {s}" if k else c)
            inner *= max(s, 1)
        return list(reversed(coords))


def emit_special(em: KernelEmitter, stmt: Special, views: dict[str, View], where: str, parallel: bool) -> int:
    """Emit ``stmt``; return the number of work-items it needs (1 unless ``parallel``)."""
    for n in (*stmt.inputs, *stmt.outputs):
        if n not in views:
            raise _fail(stmt, where, f"names refinement '{n}', which the block does not have", "add it")
    ins = [views[n] for n in stmt.inputs]
    outs = [views[n] for n in stmt.outputs]
    lp = _Loops(em, parallel and len(outs) == 1)
    t = em.t
    name = stmt.name
    if name == "zero" or name.startswith("agg_init_"):
        op = "add" if name == "zero" else name[len("agg_init_") :]
        if op not in AGG_INIT:
            raise _fail(stmt, where, f"unknown aggregation '{op}'", "use agg_init_add|mul|max|min")
        for o in outs:
            value = t.literal(identity(op, o.dtype), o.dtype)
            lp.each(
                o.elements,
                lambda f, o=o, value=value: em.line(o.write(t, o.at(lp.unravel(f, o.sizes)), value)),
            )
    elif name in ("copy", "reshape"):
        _arity(stmt, where, (1,), 1)
        _copy(em, lp, stmt, where, ins[0], outs[0])
    elif name == "shape":
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
            em.line(dst.write(t, dst.at([str(k)]), t.const(s, DType.INT32, dst.dtype)))
    elif name == "gather":
        _arity(stmt, where, (2,), 1)
        _gather(em, lp, stmt, where, ins, outs[0])
    elif name == "scatter":
        _arity(stmt, where, (2, 3), 1)
        _scatter(em, lp, stmt, where, ins, outs[0])
    elif name in ("builtin_softmax", "builtin_logsoftmax"):
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
        _softmax(em, lp, x, o, name == "builtin_logsoftmax")
    else:
        raise _fail(stmt, where, "is not a special this backend knows", KNOWN)
    return lp.work


def _copy(em: KernelEmitter, lp: _Loops, stmt: Special, where: str, src: View, dst: View) -> None:
    same = src.sizes == dst.sizes if stmt.name == "copy" else src.elements == dst.elements
    if not same:
        raise _fail(
            stmt,
            where,
            f"'{src.name}' has sizes {src.sizes} but '{dst.name}' has {dst.sizes}",
            "copy needs equal sizes; reshape needs equal element counts",
        )
    t = em.t

    def move(flat: str) -> None:
        dc = lp.unravel(flat, dst.sizes)
        sc = dc if src.sizes == dst.sizes else lp.unravel(flat, src.sizes)
        v = em.tmp(src.read(t, src.at(sc)), src.dtype)
        em.line(dst.write(t, dst.at(dc), t.convert(v, src.dtype, dst.dtype)))

    lp.each(dst.elements, move)


def clamp_index(em: KernelEmitter, v: str, dt: DType, n: int) -> str:
    """An index register of integer ``dt`` clamped into ``[0, n)`` (compared in its own type)."""
    t = em.t
    v = em.tmp(v, dt)
    top = t.literal(n - 1, dt)
    wide = f"({em.long}){v}"
    if dt.is_signed:
        return em.declare(
            DType.INT64, f"{v} < {t.literal(0, dt)} ? 0 : {v} > {top} ? {n - 1} : {wide}", "row"
        )
    return em.declare(DType.INT64, f"{v} > {top} ? {n - 1} : {wide}", "row")


def _gather(em: KernelEmitter, lp: _Loops, stmt: Special, where: str, ins: list[View], out: View) -> None:
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
    t = em.t

    def body(flat: str) -> None:
        c = lp.unravel(flat, out.sizes)
        row = clamp_index(em, idx.read(t, idx.at(c[:r])), idx.dtype, data.sizes[0])
        v = em.tmp(data.read(t, data.at([row, *c[r:]])), data.dtype)
        em.line(out.write(t, out.at(c), t.convert(v, data.dtype, out.dtype)))

    lp.each(out.elements, body)


def _scatter(em: KernelEmitter, lp: _Loops, stmt: Special, where: str, ins: list[View], out: View) -> None:
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
    t = em.t
    trailing = values.sizes[r:]
    cols = int(np.prod(trailing, dtype=np.int64))
    zero = t.literal(0, out.dtype)

    def column(flat: str) -> None:
        j = lp.unravel(flat, trailing)
        lp.loop(0, length, lambda row: em.line(out.write(t, out.at([row, *j]), zero)))

        def add(i: list[str]) -> None:
            row = clamp_index(em, idx.read(t, idx.at(i)), idx.dtype, length)
            pos = em.declare(DType.INT64, out.at([row, *j]), "pos")
            v = em.tmp(t.convert(values.read(t, values.at([*i, *j])), values.dtype, out.dtype), out.dtype)
            cur = em.tmp(out.read(t, pos), out.dtype)
            em.line(out.write(t, pos, binary(t, "add", cur, v, out.dtype)))

        if length > 0:
            lp.box(idx.sizes, add)

    lp.each(cols, column)


def _softmax(em: KernelEmitter, lp: _Loops, x: View, o: View, log: bool) -> None:
    rows, cols = x.sizes
    if rows == 0 or cols == 0:
        lp.work = 0 if lp.parallel else lp.work
        return
    t = em.t
    dt = o.dtype
    acc = DType.FLOAT32 if dt is DType.FLOAT16 else dt

    def per_row(row: str) -> None:
        def elem(col: str) -> str:
            return em.tmp(t.convert(x.read(t, x.at([row, col])), x.dtype, dt), dt)

        m = em.fresh("m")
        em.line(f"{t.reg(dt)} {m} = {elem('0')};")
        lp.loop(1, cols, lambda c: em.line(f"{m} = {binary(t, 'max', m, elem(c), dt)};"))
        s = em.fresh("sum")
        em.line(f"{t.reg(acc)} {s} = {t.literal(0, acc)};")

        def to_sum(col: str) -> None:
            sh = em.tmp(binary(t, "sub", elem(col), m, dt), dt)
            e = em.tmp(float_fn(t, em.tmp, "exp", [sh], dt), dt)
            em.line(f"{s} = {s} + {t.convert(e, dt, acc)};")

        lp.loop(0, cols, to_sum)
        total = em.tmp(t.convert(s, acc, dt), dt)

        def out(col: str) -> None:
            sh = em.tmp(binary(t, "sub", elem(col), m, dt), dt)
            if log:
                lg = em.tmp(float_fn(t, em.tmp, "log", [total], dt), dt)
                v = binary(t, "sub", sh, lg, dt)
            else:
                e = em.tmp(float_fn(t, em.tmp, "exp", [sh], dt), dt)
                v = binary(t, "div", e, total, dt)
            em.line(o.write(t, o.at([row, col]), v))

        lp.loop(0, cols, out)

    lp.each(rows, per_row)
