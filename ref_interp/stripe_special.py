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
from ref_interp.prng import draw, value
from stripe.ir import Dim, Shaped, Special
from stripe.specials import INTERPRETER, Checked, check, identity
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
class View(Shaped):
    """A refinement at one or more index points (``base`` is an int, or an int64 array per point)."""

    name: str
    buf: Buffer
    base: int | np.ndarray
    dims: tuple[Dim, ...]
    dtype: DType
    agg_op: str


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


# ------------------------------------------------------------------------------ specials
def _call(fn: str, args: list[View], out: View, params: tuple[int, ...] = ()) -> TCall:
    refs = tuple(TRef(a.name, TensorType(a.dtype, a.sizes)) for a in args)
    return TCall(fn, refs, TensorType(out.dtype, out.sizes), params)


def run_special(nx: Numerics, stmt: Special, views: dict[str, View], where: str) -> None:
    """Execute one ``Special`` on the views of its block at one index point."""
    sp = check(stmt, views, where, INTERPRETER)
    _RUN[sp.kind](nx, sp, f"'{sp.name}'")


def _fill(nx: Numerics, sp: Checked[View], what: str) -> None:
    for o in sp.outs:
        write(nx, o, nx.const(identity(sp.op, o.dtype), o.dtype), what)


def _copy(nx: Numerics, sp: Checked[View], what: str) -> None:
    (src,), (dst,) = sp.ins, sp.outs
    write(nx, dst, read(nx, src, what).reshape(dst.sizes), what)


def _shape(nx: Numerics, sp: Checked[View], what: str) -> None:
    (src,), (dst,) = sp.ins, sp.outs
    write(nx, dst, np.asarray(src.sizes, dtype=np.int32).reshape(dst.sizes), what)


def _gather(nx: Numerics, sp: Checked[View], what: str) -> None:
    (data, idx), (out,) = sp.ins, sp.outs
    args = [read(nx, data, what), read(nx, idx, what)]
    write(nx, out, apply(nx, _call("gather", [data, idx], out), args), what)


def _scatter(nx: Numerics, sp: Checked[View], what: str) -> None:
    (values, idx), (out,), length = sp.ins[:2], sp.outs, sp.length
    like = TRef("like", TensorType(out.dtype, (length,)))
    call = TCall(
        "scatter", (*_call("scatter", [values, idx], out).args, like), TensorType(out.dtype, out.sizes)
    )
    args = [read(nx, values, what), read(nx, idx, what), np.zeros(length)]
    write(nx, out, apply(nx, call, args), what)


def _softmax(nx: Numerics, sp: Checked[View], what: str) -> None:
    (x,), (o,) = sp.ins, sp.outs
    write(nx, o, apply(nx, _call(sp.name, [x], o, x.sizes), [read(nx, x, what)]), what)


def _prng(nx: Numerics, sp: Checked[View], what: str) -> None:
    (state,), (out,) = sp.ins, sp.outs
    raw, after = draw(read(nx, state, what), sp.length)
    write(nx, out, after if sp.op == "state" else raw.reshape(out.sizes), what)


def _prng_value(nx: Numerics, sp: Checked[View], what: str) -> None:
    (raw,), (out,) = sp.ins, sp.outs
    write(nx, out, value(read(nx, raw, what)), what)


_RUN = dict(fill=_fill, copy=_copy, shape=_shape, gather=_gather, scatter=_scatter, softmax=_softmax)
_RUN.update(prng=_prng, prng_value=_prng_value)
