"""Buffers, views and the whole-view ``Special`` statements of the Stripe interpreter.

A ``View`` is what a refinement denotes at one index point: a flat ``Buffer``, the position of its
base element, and ``(size, stride)`` per dimension. Specials read and write whole views (every
element ``base + Σ k_d * stride_d`` for ``k`` in the box of sizes, row-major) with the same
semantics as the Tile builtins of the same names (``ref_interp.elementwise``). They write plainly:
the output refinement's ``agg_op`` does not apply to a special.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ref_interp.elementwise import apply
from ref_interp.numerics import Numerics
from stripe.ir import Dim, Special
from tile.dtypes import DType
from tile.errors import TileRuntimeError
from tile.typed import TCall, TensorType, TRef


@dataclass(slots=True)
class Buffer:
    """One allocation: a flat array in the ``Numerics`` storage of its dtype."""

    name: str
    dtype: DType
    data: np.ndarray


@dataclass(slots=True)
class View:
    """A refinement at one or more index points (``base`` is an int, or an int64 array per point)."""

    name: str
    buf: Buffer
    base: int | np.ndarray
    dims: tuple[Dim, ...]
    dtype: DType
    agg_op: str

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(d.size for d in self.dims)


def new_buffer(nx: Numerics, name: str, dtype: DType, dims: tuple[Dim, ...]) -> Buffer:
    """A zero-filled buffer just large enough for ``dims`` (strides must not be negative)."""
    if any(d.stride < 0 for d in dims):
        raise TileRuntimeError(
            f"buffer '{name}' has a negative stride", None, hint="allocations use non-negative strides"
        )
    extent = 0 if any(d.size == 0 for d in dims) else 1 + sum((d.size - 1) * d.stride for d in dims)
    data = np.zeros(extent, dtype=nx.storage(dtype))
    if data.dtype == object:
        data[...] = nx.const(0, dtype)[()]
    return Buffer(name, dtype, data)


def check_bounds(view: View, flat: np.ndarray, what: str, point=None) -> None:
    """Every element position in ``flat`` must lie inside the view's buffer."""
    size = view.buf.data.size
    if flat.size == 0 or (flat.min() >= 0 and flat.max() < size):
        return
    bad = np.flatnonzero((flat.reshape(-1) < 0) | (flat.reshape(-1) >= size))[0]
    at = f" at {point(int(bad))}" if point is not None else ""
    raise TileRuntimeError(
        f"{what} of refinement '{view.name}'{at} reaches element {int(flat.reshape(-1)[bad])} of buffer "
        f"'{view.buf.name}', which has {size} elements",
        None,
        hint="a constraint is missing, or an access or stride is wrong",
    )


def elements(view: View, what: str) -> np.ndarray:
    """The buffer position of every element of ``view``, an int64 array shaped like its sizes."""
    idx = np.asarray(view.base, dtype=np.int64)
    rank = len(view.dims)
    for k, d in enumerate(view.dims):
        shape = [1] * rank
        shape[k] = d.size
        idx = idx + np.arange(d.size, dtype=np.int64).reshape(shape) * d.stride
    idx = np.broadcast_to(idx, view.sizes)
    check_bounds(view, idx, what)
    return idx


def read(nx: Numerics, view: View, what: str = "a read") -> np.ndarray:
    """The elements of ``view`` as an array of its sizes, in its dtype."""
    return nx.cast(view.buf.data[elements(view, what)], view.dtype)


def write(nx: Numerics, view: View, values: np.ndarray, what: str = "a write") -> None:
    """Overwrite every element of ``view`` with ``values`` (broadcast), converted to its dtype."""
    idx = elements(view, what)
    converted = nx.cast(nx.cast(np.asarray(values), view.dtype), view.buf.dtype)
    view.buf.data[idx] = np.broadcast_to(converted, idx.shape)


def identity(nx: Numerics, op: str, dt: DType) -> np.ndarray:
    """The identity of an aggregation: 0, 1, the lowest value (max) or the highest (min)."""
    if op in ("add", "mul"):
        return nx.const(0 if op == "add" else 1, dt)
    low = op == "max"
    if dt is DType.BOOL:
        return np.asarray(not low)
    if dt.is_float:
        return nx.const(-np.inf if low else np.inf, dt)
    info = np.iinfo(dt.numpy)
    return np.asarray(info.min if low else info.max, dtype=dt.numpy)


# ------------------------------------------------------------------------------ specials
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


def _call(fn: str, args: list[View], out: View, params: tuple[int, ...] = ()) -> TCall:
    refs = tuple(TRef(a.name, TensorType(a.dtype, a.sizes)) for a in args)
    return TCall(fn, refs, TensorType(out.dtype, out.sizes), params)


def run_special(nx: Numerics, stmt: Special, views: dict[str, View], where: str) -> None:
    """Execute one ``Special`` on the views of its block at one index point."""
    for name in (*stmt.inputs, *stmt.outputs):
        if name not in views:
            raise _fail(
                stmt,
                where,
                f"names refinement '{name}', which the block does not have",
                "add the refinement to the block",
            )
    ins = [views[n] for n in stmt.inputs]
    outs = [views[n] for n in stmt.outputs]
    name = stmt.name
    if name == "zero" or name.startswith("agg_init_"):
        op = "add" if name == "zero" else name[len("agg_init_") :]
        if op not in ("add", "mul", "max", "min"):
            raise _fail(stmt, where, f"unknown aggregation '{op}'", "use agg_init_add|mul|max|min")
        for o in outs:
            write(nx, o, identity(nx, op, o.dtype), f"'{name}'")
        return
    if name in ("copy", "reshape"):
        _arity(stmt, where, (1,), 1)
        (src,), (dst,) = ins, outs
        same = src.sizes == dst.sizes if name == "copy" else np.prod(src.sizes) == np.prod(dst.sizes)
        if not same:
            raise _fail(
                stmt,
                where,
                f"'{src.name}' has sizes {src.sizes} but '{dst.name}' has {dst.sizes}",
                "copy needs equal sizes; reshape needs equal element counts",
            )
        write(nx, dst, read(nx, src, f"'{name}'").reshape(dst.sizes), f"'{name}'")
        return
    if name == "shape":
        _arity(stmt, where, (1,), 1)
        if outs[0].sizes != (len(ins[0].dims),):
            raise _fail(
                stmt,
                where,
                f"the output must have sizes ({len(ins[0].dims)},), not {outs[0].sizes}",
                "shape(T) is a vector of T's sizes",
            )
        write(nx, outs[0], np.asarray(ins[0].sizes, dtype=np.int32).reshape(outs[0].sizes), "'shape'")
        return
    if name == "gather":
        _arity(stmt, where, (2,), 1)
        _gather(nx, stmt, where, ins, outs[0])
        return
    if name == "scatter":
        _arity(stmt, where, (2, 3), 1)
        _scatter(nx, stmt, where, ins, outs[0])
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
        value = apply(nx, _call(name, [x], o, x.sizes), [read(nx, x, f"'{name}'")])
        write(nx, o, value, f"'{name}'")
        return
    raise _fail(
        stmt,
        where,
        "is not a special this interpreter knows",
        "known specials: zero, copy, reshape, shape, gather, scatter, builtin_softmax, "
        "builtin_logsoftmax, agg_init_add|mul|max|min",
    )


def _gather(nx: Numerics, stmt: Special, where: str, ins: list[View], out: View) -> None:
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
    if data.sizes[0] == 0 and np.prod(idx.sizes) > 0:
        raise _fail(
            stmt,
            where,
            f"gathers from '{data.name}', whose first size is 0",
            "gather needs data with at least one row",
        )
    args = [read(nx, data, "'gather'"), read(nx, idx, "'gather'")]
    write(nx, out, apply(nx, _call("gather", [data, idx], out), args), "'gather'")


def _scatter(nx: Numerics, stmt: Special, where: str, ins: list[View], out: View) -> None:
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
    like = TRef("like", TensorType(out.dtype, (length,)))
    call = TCall(
        "scatter", (*_call("scatter", [values, idx], out).args, like), TensorType(out.dtype, out.sizes)
    )
    args = [read(nx, values, "'scatter'"), read(nx, idx, "'scatter'"), np.zeros(length)]
    write(nx, out, apply(nx, call, args), "'scatter'")
