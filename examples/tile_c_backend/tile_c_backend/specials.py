"""Stripe ``Special`` statements as C loops over whole views (``codegen.View``).

A special reads and writes every element of its refinements, in row-major order, with the
meaning of the Tile builtin of the same name (docs/semantics.md §5.5, §5.8; ``stripe.specials``
states the rules). It writes plainly: the output's ``agg_op`` does not apply.

* ``zero``, ``agg_init_add|mul|max|min``: every output filled with the aggregation's identity;
* ``copy`` (equal sizes), ``reshape`` (equal element counts): elements move in row-major order;
* ``shape``: the input's sizes as int32;
* ``gather(D, I) -> O``, ``scatter(V, I[, L]) -> O``: indices clamped into the rows, in the
  index's own type (a huge uint64 picks the last row); scatter adds in the output's type;
* ``builtin_softmax``, ``builtin_logsoftmax``: per row, ``x - max``, ``exp``, the sum, then
  ``e / sum`` or ``(x - max) - log(sum)``, each step rounded in the output's (float) type;
* ``prng_step``, ``prng_state``, ``prng_value``: PlaidML's taus88 streams (``runtime.h``).
"""

from __future__ import annotations

from math import prod

from stripe.ir import Special
from tile.dtypes import DType

from tile_c_backend import cexpr
from tile_c_backend.errors import UnsupportedConstruct
from tile_c_backend.views import View

STREAMS = 2048  # the PRNG state is uint32 [3, STREAMS]


def special(k, stmt: Special, views: dict[str, View], here: str) -> None:
    """Emit ``stmt`` into kernel ``k`` (a ``codegen._Kernel``: ``emit``, ``open``, ``close``,
    ``names``), given the views of its block at the current point."""
    name = stmt.name
    for n in (*stmt.inputs, *stmt.outputs):
        if n not in views:
            raise UnsupportedConstruct(
                f"the special '{name}' of refinement '{n}', which the block lacks", here
            )
    ins = [views[n] for n in stmt.inputs]
    outs = [views[n] for n in stmt.outputs]
    at = _At(k, stmt, here)
    if name == "zero" or name.startswith("agg_init_"):
        op = "add" if name == "zero" else name.removeprefix("agg_init_")
        if op not in ("add", "mul", "max", "min"):
            raise at.unsupported(f"an unknown aggregation '{op}'")
        for o in outs:
            at.loop(o.elements, lambda e, o=o: k.emit(o.store(e, cexpr.identity(op, o.dtype), o.dtype)))
        return
    rule = _RULES.get(name)
    if rule is None:
        raise UnsupportedConstruct(f"the special '{name}'", here)
    n_in, n_out, fn = rule
    if len(ins) not in n_in or len(outs) != n_out:
        raise at.unsupported(f"{len(ins)} inputs and {len(outs)} outputs")
    fn(at, ins, outs)


class _At:
    """The special being emitted: loops, and errors that name it."""

    def __init__(self, k, stmt: Special, here: str):
        self.k, self.stmt, self.here = k, stmt, here

    def unsupported(self, what: str) -> UnsupportedConstruct:
        return UnsupportedConstruct(f"the special '{self.stmt.name}' with {what}", self.here)

    def loop(self, n: int, body, name: str = "e") -> None:
        """``for (e = 0; e < n; ++e) body(e)``, ``body`` taking the counter's C name."""
        if n == 0:
            return
        var = self.k.names(name, "")
        self.k.open(f"for (int64_t {var} = 0; {var} < {n}; ++{var})")
        body(var)
        self.k.close()


def _copy(at: _At, ins: list[View], outs: list[View]) -> None:
    (src,), (dst,) = ins, outs
    same = src.sizes == dst.sizes if at.stmt.name == "copy" else src.elements == dst.elements
    if not same:
        raise at.unsupported(f"'{src.name}' of sizes {src.sizes} and '{dst.name}' of sizes {dst.sizes}")
    at.loop(dst.elements, lambda e: at.k.emit(dst.store(e, src.load(e), src.dtype)))


def _shape(at: _At, ins: list[View], outs: list[View]) -> None:
    (src,), (dst,) = ins, outs
    if dst.sizes != (len(src.dims),):
        raise at.unsupported(f"an output of sizes {dst.sizes} for a rank-{len(src.dims)} input")
    for d, size in enumerate(src.sizes):
        at.k.emit(dst.store(str(d), cexpr.literal(size, DType.INT32), DType.INT32))


def _clamped(at: _At, idx: View, e: str, rows: int) -> str:
    """A C int64 variable holding index element ``e`` clamped into ``[0, rows)`` in its own type."""
    if not idx.dtype.is_int:
        raise at.unsupported(f"the index '{idx.name}' of type {idx.dtype}")
    var = at.k.names("r", idx.name)
    wide = "int64_t" if idx.dtype.is_signed else "uint64_t"
    raw = f"(({wide}){idx.load(e)})"
    low = f"{raw} < 0 ? 0 : " if idx.dtype.is_signed else ""
    at.k.emit(f"const int64_t {var} = {low}{raw} > ({wide}){rows - 1} ? {rows - 1} : (int64_t){raw};")
    return var


def _gather(at: _At, ins: list[View], outs: list[View]) -> None:
    (data, idx), (out,) = ins, outs
    if not data.dims or out.sizes != idx.sizes + data.sizes[1:]:
        raise at.unsupported(f"data of sizes {data.sizes}, indices {idx.sizes} and an output {out.sizes}")
    rows, inner = data.sizes[0], prod(data.sizes[1:])
    if out.elements == 0:
        return
    if rows == 0:
        raise at.unsupported(f"data '{data.name}' without a row")

    def row(e: str) -> None:
        r = _clamped(at, idx, e, rows)
        at.loop(
            inner,
            lambda j: at.k.emit(
                out.store(f"{e} * {inner} + {j}", data.load(f"{r} * {inner} + {j}"), data.dtype)
            ),
            "j",
        )

    at.loop(idx.elements, row)


def _scatter(at: _At, ins: list[View], outs: list[View]) -> None:
    values, idx = ins[:2]
    (out,) = outs
    length = ins[2].sizes[0] if len(ins) == 3 and ins[2].dims else (out.sizes[0] if out.dims else -1)
    r = len(idx.dims)
    if values.sizes[:r] != idx.sizes or out.sizes != (length, *values.sizes[r:]):
        raise at.unsupported(f"values {values.sizes}, indices {idx.sizes} and an output {out.sizes}")
    zero = cexpr.literal(0, out.dtype)
    at.loop(out.elements, lambda e: at.k.emit(out.store(e, zero, out.dtype)))
    inner = prod(values.sizes[r:])
    if length <= 0 or values.elements == 0:
        return

    def add(e: str, row: str, j: str) -> None:
        o = f"{row} * {inner} + {j}"
        total = cexpr.combine(
            "add",
            out.load(o),
            cexpr.convert(values.load(f"{e} * {inner} + {j}"), values.dtype, out.dtype),
            out.dtype,
        )
        at.k.emit(out.store(o, total, out.dtype))

    def one(e: str) -> None:
        row = _clamped(at, idx, e, length)
        at.loop(inner, lambda j: add(e, row, j), "j")

    at.loop(idx.elements, one)


def _softmax(at: _At, ins: list[View], outs: list[View]) -> None:
    (x,), (o,) = ins, outs
    params = at.stmt.int_params
    if len(x.dims) != 2 or o.sizes != x.sizes or (params and tuple(params) != x.sizes):
        raise at.unsupported(f"an input of sizes {x.sizes}, an output {o.sizes} and params {params}")
    dt = o.dtype
    if not dt.is_float:
        raise at.unsupported(f"the output type {dt}")
    rows, cols = x.sizes
    if rows == 0 or cols == 0:
        return
    k, ct, sfx = at.k, cexpr.ctype(dt), cexpr.SUFFIX[dt]
    fn = "" if dt is DType.FLOAT64 else "f"

    def xs(r: str, c: str) -> str:
        return cexpr.convert(x.load(f"{r} * {cols} + {c}"), x.dtype, dt)

    def row(r: str) -> None:
        m, s = k.names("m", ""), k.names("sum", "")
        k.emit(f"{ct} {m} = {xs(r, '0')};")
        at.loop(cols, lambda c: k.emit(f"{m} = tile_max_{sfx}({m}, {xs(r, c)});"), "c")
        k.emit(f"{ct} {s} = {cexpr.literal(0, dt)};")

        def exp(c: str) -> None:
            e = cexpr.rounded(f"exp{fn}({cexpr.rounded(f'{xs(r, c)} - {m}', dt)})", dt)
            var = k.names("x", "")
            k.emit(f"const {ct} {var} = {e};")
            k.emit(o.store(f"{r} * {cols} + {c}", var, dt))
            k.emit(f"{s} = {cexpr.rounded(f'{s} + {var}', dt)};")

        at.loop(cols, exp, "c")
        if at.stmt.name == "builtin_logsoftmax":
            log = cexpr.rounded(f"log{fn}({s})", dt)
            at.loop(
                cols,
                lambda c: k.emit(
                    o.store(
                        f"{r} * {cols} + {c}",
                        cexpr.rounded(f"{cexpr.rounded(f'{xs(r, c)} - {m}', dt)} - {log}", dt),
                        dt,
                    )
                ),
                "c",
            )
        else:
            at.loop(
                cols,
                lambda c: k.emit(
                    o.store(
                        f"{r} * {cols} + {c}", cexpr.rounded(f"{o.load(f'{r} * {cols} + {c}')} / {s}", dt), dt
                    )
                ),
                "c",
            )

    at.loop(rows, row, "row")


def _prng(at: _At, ins: list[View], outs: list[View]) -> None:
    (state,), (out,) = ins, outs
    n = prod(at.stmt.int_params)
    op = at.stmt.name.removeprefix("prng_")
    if state.sizes != (3, STREAMS) or state.dtype is not DType.UINT32 or out.dtype is not DType.UINT32:
        raise at.unsupported(f"a state {state.dtype}{list(state.sizes)} and an output of type {out.dtype}")
    if (op == "state" and out.sizes != (3, STREAMS)) or (op == "step" and out.elements != n):
        raise at.unsupported(f"an output of sizes {out.sizes} for {n} draws")
    k = at.k
    st = k.names("state", "")
    k.emit(f"uint32_t {st}[{3 * STREAMS}];")
    at.loop(3 * STREAMS, lambda e: k.emit(f"{st}[{e}] = {state.load(e)};"))

    def draw(e: str) -> None:
        raw = f"tile_taus88({st} + {e} % {STREAMS})"
        k.emit(out.store(e, raw, DType.UINT32) if op == "step" else f"(void){raw};")

    at.loop(n, draw)
    if op == "state":
        at.loop(3 * STREAMS, lambda e: k.emit(out.store(e, f"{st}[{e}]", DType.UINT32)))


def _prng_value(at: _At, ins: list[View], outs: list[View]) -> None:
    (raw,), (out,) = ins, outs
    if raw.dtype is not DType.UINT32 or out.dtype is not DType.FLOAT32 or raw.sizes != out.sizes:
        raise at.unsupported(f"draws {raw.dtype}{list(raw.sizes)} and an output {out.dtype}{list(out.sizes)}")
    # one rounding to float32, then an exact scaling by 2**-32
    at.loop(
        out.elements, lambda e: at.k.emit(out.store(e, f"((float){raw.load(e)} * 0x1p-32f)", DType.FLOAT32))
    )


# what each special (other than the fills) takes: input counts, output count, its emitter
_RULES = {
    "copy": ((1,), 1, _copy),
    "reshape": ((1,), 1, _copy),
    "shape": ((1,), 1, _shape),
    "gather": ((2,), 1, _gather),
    "scatter": ((2, 3), 1, _scatter),
    "builtin_softmax": ((1,), 1, _softmax),
    "builtin_logsoftmax": ((1,), 1, _softmax),
    "prng_step": ((1,), 1, _prng),
    "prng_state": ((1,), 1, _prng),
    "prng_value": ((1,), 1, _prng_value),
}
