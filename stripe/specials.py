"""The rules of Stripe's ``Special`` statements, stated once for every executor.

A special reads and writes whole views with the semantics of the Tile builtin of the same name.
``check`` is what every executor (``ref_interp.stripe_special``, ``backends.llvm.specials``,
``backends.clike.specials``) calls first: it finds the views a special names, checks what the
special takes and gives, and returns a ``Checked`` that says what to do; the executor then only
evaluates or emits code for it. The rules:

* ``zero``, ``agg_init_add|mul|max|min`` (kind ``fill``): every output is overwritten with the
  aggregation's ``identity`` (``zero`` is ``add``'s); any number of refinements.
* ``copy`` (equal sizes) and ``reshape`` (equal element counts), kind ``copy``: one input, one
  output; elements move in row-major order.
* ``shape``: one input ``T``, one output of sizes ``(rank T,)`` receiving T's sizes (as int32).
* ``gather(D, I) -> O``: integer ``I``; ``O``'s sizes are ``I``'s followed by ``D``'s after the
  first; ``D`` has a row unless ``I`` is empty. Indices clamp into ``[0, rows)``.
* ``scatter(V, I[, L]) -> O``: integer ``I``, ``V``'s sizes start with ``I``'s, and ``O`` is
  ``(length, *V's sizes after I's rank)`` where the length is ``L``'s first size (else ``O``'s
  own). ``O`` starts at zero and adds ``V``'s rows at their clamped indices.
* ``builtin_softmax``, ``builtin_logsoftmax`` (kind ``softmax``): a 2-D input, an output of the
  same sizes, int params (if any) equal to them; code generators also need a float output.
* ``prng_step(S) -> H`` and ``prng_state(S) -> S2`` (kind ``prng``, ``op`` ``step``/``state``): S is
  uint32 ``(3, 2048)``; the int params are the sizes of the draw (``length``: their product, which
  for ``prng_step`` is also H's element count). H (uint32) receives the raw draws ``s1 ^ s2 ^ s3``
  in row-major order, S2 (uint32 ``(3, 2048)``) the state after them; ``ref_interp.prng`` states
  the generator. ``prng_value(H) -> V`` (kind ``prng_value``): uint32 in, float32 out, same sizes,
  ``V = float32(H) * 2**-32``.

Views are the executors' own classes; the rules read only ``name``, ``dims``, ``sizes``,
``dtype`` and ``elements`` (``stripe.ir.Shaped`` derives the last two from ``dims``). Errors are
``TileRuntimeError``s "special 'NAME' in WHERE: ..." with a hint. The texts where the interpreter
and the code generators have always differed are kept, in ``INTERPRETER`` and ``BACKEND``.

Intrinsic statements follow from the same split: a whole-tensor builtin (``STRUCTURAL``) is a
Special, never an Intrinsic, which ``check_intrinsic`` tells the code generators' users.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np

from stripe.ir import Dim, Special
from tile.builtins import BUILTINS
from tile.dtypes import DType
from tile.errors import TileRuntimeError
from tile.prng import STREAMS

AGG_INIT = ("add", "mul", "max", "min")
KNOWN = (
    "known specials: zero, copy, reshape, shape, gather, scatter, builtin_softmax, "
    "builtin_logsoftmax, agg_init_add|mul|max|min, prng_step, prng_state, prng_value"
)
# Builtins that act on whole tensors: Stripe spells them as Specials, never as Intrinsics.
STRUCTURAL = frozenset(
    {"index", "shape", "reshape", "gather", "scatter", "builtin_softmax", "builtin_logsoftmax"}
    | {"prng_step", "prng_state", "prng_value"}
)


class ViewLike(Protocol):
    name: str
    dims: tuple[Dim, ...]
    dtype: DType

    @property
    def sizes(self) -> tuple[int, ...]: ...

    @property
    def elements(self) -> int: ...


V = TypeVar("V", bound=ViewLike)


@dataclass(frozen=True, slots=True)
class Executor:
    """What an executor says in its errors (kept as they were), and whether softmax must be float."""

    noun: str  # "is not a special this {noun} knows"
    missing_hint: str  # a special names a refinement its block lacks
    no_row_hint: str  # gather from data whose first size is 0
    float_softmax: bool  # code generators compute softmax in the output's (float) type


INTERPRETER = Executor(
    noun="interpreter",
    missing_hint="add the refinement to the block",
    no_row_hint="gather needs data with at least one row",
    float_softmax=False,
)
BACKEND = Executor(
    noun="backend", missing_hint="add it", no_row_hint="gather needs a row", float_softmax=True
)


@dataclass(frozen=True, slots=True)
class Checked(Generic[V]):
    """A special that passed ``check``: what to do (``kind``) and on which views."""

    name: str  # the statement's name, for messages
    kind: str  # fill | copy | shape | gather | scatter | softmax | prng | prng_value
    ins: tuple[V, ...]
    outs: tuple[V, ...]
    op: str = ""  # fill: the aggregation whose identity fills the outputs; prng: step | state
    length: int = -1  # scatter: the output's first size; prng: the number of elements drawn
    log: bool = False  # softmax: builtin_logsoftmax


def fill_name(op: str) -> str:
    """The special that fills its outputs with aggregation ``op``'s identity: ``zero`` for ``add``
    (as lowering writes it), else ``agg_init_<op>``."""
    return "zero" if op == "add" else f"agg_init_{op}"


def identity(op: str, dt: DType) -> bool | int | float:
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


@dataclass(frozen=True, slots=True)
class _At:
    """The special being checked, where, and by whom: what its errors are built from."""

    stmt: Special
    where: str
    executor: Executor

    def fail(self, message: str, hint: str) -> TileRuntimeError:
        return TileRuntimeError(f"special '{self.stmt.name}' in {self.where}: {message}", None, hint=hint)

    def checked(self, kind: str, ins: tuple[V, ...], outs: tuple[V, ...], **extra) -> Checked[V]:
        return Checked(self.stmt.name, kind, ins, outs, **extra)


def check(stmt: Special, views: Mapping[str, V], where: str, executor: Executor) -> Checked[V]:
    """Check ``stmt`` against the views of its block; raise the special's error, or say what to do."""
    at = _At(stmt, where, executor)
    for n in (*stmt.inputs, *stmt.outputs):
        if n not in views:
            raise at.fail(f"names refinement '{n}', which the block does not have", executor.missing_hint)
    ins = tuple(views[n] for n in stmt.inputs)
    outs = tuple(views[n] for n in stmt.outputs)
    name = stmt.name
    if name == "zero" or name.startswith("agg_init_"):
        op = "add" if name == "zero" else name[len("agg_init_") :]
        if op not in AGG_INIT:
            raise at.fail(f"unknown aggregation '{op}'", "use agg_init_add|mul|max|min")
        return at.checked("fill", ins, outs, op=op)
    if name not in _RULES:
        raise at.fail(f"is not a special this {executor.noun} knows", KNOWN)
    n_in, n_out, rule = _RULES[name]
    if len(ins) not in n_in or len(outs) != n_out:
        want = " or ".join(map(str, n_in))
        got = f"got {len(ins)} and {len(outs)}"
        raise at.fail(
            f"takes {want} input(s) and {n_out} output(s), {got}", "check the special's refinement lists"
        )
    return rule(at, ins, outs)


def _copy(at: _At, ins: tuple[V, ...], outs: tuple[V, ...]) -> Checked[V]:
    (src,), (dst,) = ins, outs
    if not (src.sizes == dst.sizes if at.stmt.name == "copy" else src.elements == dst.elements):
        raise at.fail(
            f"'{src.name}' has sizes {src.sizes} but '{dst.name}' has {dst.sizes}",
            "copy needs equal sizes; reshape needs equal element counts",
        )
    return at.checked("copy", ins, outs)


def _shape(at: _At, ins: tuple[V, ...], outs: tuple[V, ...]) -> Checked[V]:
    rank, (dst,) = len(ins[0].dims), outs
    if dst.sizes != (rank,):
        raise at.fail(
            f"the output must have sizes ({rank},), not {dst.sizes}", "shape(T) is a vector of T's sizes"
        )
    return at.checked("shape", ins, outs)


def _integer_index(at: _At, idx: ViewLike) -> None:
    if not idx.dtype.is_int:
        raise at.fail(
            f"the index refinement '{idx.name}' must be integer, not {idx.dtype}",
            "convert the indices with as_int first",
        )


def _gather(at: _At, ins: tuple[V, ...], outs: tuple[V, ...]) -> Checked[V]:
    (data, idx), (out,) = ins, outs
    _integer_index(at, idx)
    if not data.dims or out.sizes != idx.sizes + data.sizes[1:]:
        raise at.fail(
            f"gather of {data.sizes} by {idx.sizes} cannot give {out.sizes}",
            "the output's sizes are the index's sizes followed by the data's after the first",
        )
    if data.sizes[0] == 0 and idx.elements > 0:
        raise at.fail(f"gathers from '{data.name}', whose first size is 0", at.executor.no_row_hint)
    return at.checked("gather", ins, outs)


def _scatter(at: _At, ins: tuple[V, ...], outs: tuple[V, ...]) -> Checked[V]:
    values, idx = ins[:2]
    (out,) = outs
    length = ins[2].sizes[0] if len(ins) == 3 and ins[2].dims else (out.sizes[0] if out.dims else -1)
    r = len(idx.dims)
    _integer_index(at, idx)
    if values.sizes[:r] != idx.sizes or out.sizes != (length, *values.sizes[r:]):
        raise at.fail(
            f"scatter of {values.sizes} by {idx.sizes} cannot give {out.sizes}",
            "scatter(V, I[, L]): the output is (L's first size, *V's sizes after I's rank)",
        )
    return at.checked("scatter", ins, outs, length=length)


def _softmax(at: _At, ins: tuple[V, ...], outs: tuple[V, ...]) -> Checked[V]:
    (x,), (o,), params = ins, outs, at.stmt.int_params
    if len(x.dims) != 2 or o.sizes != x.sizes or (params and tuple(params) != x.sizes):
        raise at.fail(
            f"needs a 2-D input and an output of the same sizes (and int params R, C "
            f"equal to them), got {x.sizes} -> {o.sizes} with params {params}",
            "softmax works row-wise on a (R, C) view",
        )
    if at.executor.float_softmax and not o.dtype.is_float:
        raise at.fail(f"the output must be float, not {o.dtype}", "softmax gives floats")
    return at.checked("softmax", ins, outs, log=at.stmt.name == "builtin_logsoftmax")


def _prng(at: _At, ins: tuple[V, ...], outs: tuple[V, ...]) -> Checked[V]:
    (state,), (out,), params = ins, outs, at.stmt.int_params
    n = int(np.prod(params, dtype=np.int64))
    op = at.stmt.name[len("prng_") :]
    want = (3, STREAMS) if op == "state" else tuple(params)
    if state.sizes != (3, STREAMS) or state.dtype is not DType.UINT32 or out.dtype is not DType.UINT32:
        raise at.fail(
            f"needs a uint32 (3, {STREAMS}) state and a uint32 output, got {state.dtype} {state.sizes} "
            f"-> {out.dtype}",
            "the PRNG state is uint32 [3, 2048]",
        )
    if out.sizes != want and not (op == "step" and out.elements == n):
        raise at.fail(
            f"the output must have sizes {want}, not {out.sizes} (int params {params})",
            "prng_step's output has the draw's sizes; prng_state's is (3, 2048)",
        )
    return at.checked("prng", ins, outs, op=op, length=n)


def _prng_value(at: _At, ins: tuple[V, ...], outs: tuple[V, ...]) -> Checked[V]:
    (raw,), (out,) = ins, outs
    if raw.dtype is not DType.UINT32 or out.dtype is not DType.FLOAT32 or raw.sizes != out.sizes:
        raise at.fail(
            f"needs uint32 draws and a float32 output of the same sizes, got {raw.dtype} {raw.sizes} "
            f"-> {out.dtype} {out.sizes}",
            "prng_value converts the raw draws of prng_step",
        )
    return at.checked("prng_value", ins, outs)


# What each special (other than zero and agg_init_*) takes: input counts, output count, its rule.
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


# the intrinsics that only convert their one input to the result type (the conversion builtins,
# ``ident`` and Stripe's ``assign``): a code generator's casts
CASTS = ("as_float", "as_bfloat", "as_int", "as_uint", "as_bool", "ident", "assign")


def check_intrinsic(name: str, n_args: int, supported: frozenset[str], where: str) -> None:
    """An Intrinsic names a builtin the code generator ``supported`` (never a Special's), with its arity."""
    if name not in supported:
        hint = (
            "whole-tensor operations are Specials"
            if name in STRUCTURAL
            else "intrinsics are the elementwise builtins of tile.builtins, or assign"
        )
        raise TileRuntimeError(f"{where}: unknown intrinsic '{name}'", None, hint=hint)
    want = 1 if name == "assign" else BUILTINS[name].tensors
    if n_args != want:
        raise TileRuntimeError(
            f"{where}: intrinsic '{name}' takes {want} input(s), got {n_args}",
            None,
            hint="check the intrinsic's inputs",
        )
