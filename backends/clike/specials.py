"""The ``Special`` statements as C loops over whole views, with the interpreter's semantics.

Each mirrors ``ref_interp.stripe_special``: specials overwrite their outputs (no ``agg_op``), read
and write through the views' dtypes, and gather/scatter clamp indices into range. With
``parallel`` (a kernel that is just the special) the work is spread over work-items where that
keeps every element's writes in order: one per output element (``zero``, ``agg_init_*``, ``copy``,
``reshape``, ``gather``), one per row (softmaxes), one per trailing element of the values
(``scatter``: a column gets its additions in the values' row-major order, as ``np.add.at``);
otherwise one work-item loops over everything. Softmax works row by row: the row maximum (nan
propagates), ``e = exp(x - max)``, their sum in order (in float for float16), then ``e / sum`` or
``x - max - log(sum)``: the interpreter's composition (strict mode: its bits, as §8.3 states).
The PRNG specials (``prng_step``, ``prng_state``) give one work-item to each of the 2048 streams,
which advances in registers through its elements ``t, t + 2048, ...``; ``prng_value`` converts one
element per work-item. All three give the interpreter's bits exactly (``ref_interp.prng``).
"""

from __future__ import annotations

import numpy as np

from backends.clike import numbers
from backends.clike.ops import binary, float_fn
from backends.clike.views import View
from backends.clike.writer import CodeWriter
from backends.symbolic import is_slot
from stripe.ir import Special
from stripe.specials import BACKEND, Checked, check, identity
from tile.dtypes import DType
from tile.prng import SCALE, STREAMS, TAUS88


class _Loops:
    """Loop helpers over one emitter; ``each`` uses the work-item id once when ``parallel``."""

    def __init__(self, em: CodeWriter, parallel: bool):
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
        with em.scope(f"for ({em.long} {var} = {lo}; {var} < {numbers.expr(hi)}; {var}++)"):
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
            c = flat if numbers.known(inner) and inner == 1 else f"({flat} / {numbers.expr(inner)})"
            coords.append(f"{c} % {numbers.text(s)}" if k else c)
            # (a run-time size of 0 leaves no element: no work-item reaches this)
            inner = numbers.times(inner, s if is_slot(s) else max(s, 1))
        return list(reversed(coords))


def emit_special(em: CodeWriter, stmt: Special, views: dict[str, View], where: str, parallel: bool) -> int:
    """Emit ``stmt``; return the number of work-items it needs (1 unless ``parallel``)."""
    sp = check(stmt, views, where, BACKEND)
    lp = _Loops(em, parallel and len(sp.outs) == 1)
    _EMIT[sp.kind](em, lp, sp)
    return lp.work


def elements(v: View):
    """``v``'s element count (``numbers.times`` factors where its sizes come at run time)."""
    n = 1
    for s in v.sizes:
        n = numbers.times(n, s)
    return n


def _fill(em: CodeWriter, lp: _Loops, sp: Checked[View]) -> None:
    t = em.t
    for o in sp.outs:
        value = t.literal(identity(sp.op, o.dtype), o.dtype)
        lp.each(
            elements(o),
            lambda f, o=o, value=value: em.line(o.write(t, o.at(lp.unravel(f, o.sizes)), value)),
        )


def _copy(em: CodeWriter, lp: _Loops, sp: Checked[View]) -> None:
    (src,), (dst,) = sp.ins, sp.outs
    t = em.t

    def move(flat: str) -> None:
        dc = lp.unravel(flat, dst.sizes)
        sc = dc if src.sizes == dst.sizes else lp.unravel(flat, src.sizes)
        v = em.tmp(src.read(t, src.at(sc)), src.dtype)
        em.line(dst.write(t, dst.at(dc), t.convert(v, src.dtype, dst.dtype)))

    lp.each(elements(dst), move)


def _shape(em: CodeWriter, lp: _Loops, sp: Checked[View]) -> None:
    (src,), (dst,) = sp.ins, sp.outs
    t = em.t
    for k, s in enumerate(src.sizes):
        em.line(dst.write(t, dst.at([str(k)]), t.const(s, DType.INT32, dst.dtype)))


def clamp_index(em: CodeWriter, v: str, dt: DType, n: int) -> str:
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


def _gather(em: CodeWriter, lp: _Loops, sp: Checked[View]) -> None:
    (data, idx), (out,) = sp.ins, sp.outs
    r = len(idx.dims)
    t = em.t

    def body(flat: str) -> None:
        c = lp.unravel(flat, out.sizes)
        row = clamp_index(em, idx.read(t, idx.at(c[:r])), idx.dtype, data.sizes[0])
        v = em.tmp(data.read(t, data.at([row, *c[r:]])), data.dtype)
        em.line(out.write(t, out.at(c), t.convert(v, data.dtype, out.dtype)))

    lp.each(out.elements, body)


def _scatter(em: CodeWriter, lp: _Loops, sp: Checked[View]) -> None:
    (values, idx), (out,), length = sp.ins[:2], sp.outs, sp.length
    r = len(idx.dims)
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


def _softmax(em: CodeWriter, lp: _Loops, sp: Checked[View]) -> None:
    (x,), (o,), log = sp.ins, sp.outs, sp.log
    rows, cols = x.sizes
    if numbers.zero(rows) or numbers.zero(cols):
        lp.work = 0 if lp.parallel else lp.work
        return
    t = em.t
    dt = o.dtype
    acc = DType.FLOAT32 if dt.is_narrow_float else dt

    def per_row(row: str) -> None:
        if is_slot(cols):  # a generic kernel's row length, which may be 0 (then nothing to write)
            with em.scope(f"if ({numbers.text(cols)} > 0)"):
                row_body(row)
        else:
            row_body(row)

    def row_body(row: str) -> None:
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


def _prng(em: CodeWriter, lp: _Loops, sp: Checked[View]) -> None:
    (state,), (out,), n = sp.ins, sp.outs, sp.length
    t = em.t
    u32 = t.reg(DType.UINT32)

    def stream(s: str) -> None:
        regs = [em.fresh(f"s{k + 1}") for k in range(3)]
        for k, r in enumerate(regs):
            em.line(f"{u32} {r} = {state.read(t, state.at([str(k), s]))};")
        flat = em.fresh("i")
        with em.scope(f"for ({em.long} {flat} = {s}; {flat} < {n}; {flat} += {STREAMS})"):
            for r, (mask, a, c, sh) in zip(regs, TAUS88):
                em.line(f"{r} = (({r} & {mask}u) << {a}) ^ ((({r} << {c}) ^ {r}) >> {sh});")
            if sp.op == "step":
                raw = " ^ ".join(regs)
                em.line(out.write(t, out.at(lp.unravel(flat, out.sizes)), f"({raw})"))
        if sp.op == "state":
            for k, r in enumerate(regs):
                em.line(out.write(t, out.at([str(k), s]), r))

    lp.each(STREAMS, stream)


def _prng_value(em: CodeWriter, lp: _Loops, sp: Checked[View]) -> None:
    (raw,), (out,) = sp.ins, sp.outs
    t = em.t

    def body(flat: str) -> None:
        c = lp.unravel(flat, out.sizes)
        f = t.convert(em.tmp(raw.read(t, raw.at(c)), DType.UINT32), DType.UINT32, DType.FLOAT32)
        em.line(out.write(t, out.at(c), f"{f} * {t.literal(SCALE, DType.FLOAT32)}"))

    lp.each(out.elements, body)


_EMIT = dict(fill=_fill, copy=_copy, shape=_shape, gather=_gather, scatter=_scatter, softmax=_softmax)
_EMIT.update(prng=_prng, prng_value=_prng_value)
