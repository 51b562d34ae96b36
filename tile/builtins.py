"""The elementwise builtins: arity, compile-time parameters, and result type and shape.

Every operator is one of these (``a + b`` is ``add(a, b)``) and every one can be called by name.
The interpreter's numpy implementations live in ``ref_interp.elementwise``, keyed by the same
names; a test checks the two tables agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tile import prng, simple_reduce
from tile.dtypes import DType, arithmetic, float_of, promote, promote_all
from tile.errors import Span, TileShapeError, TileTypeError
from tile.shapes import broadcast, fmt_shape, is_concrete, may_equal, numel, same_size
from tile.typed import TensorType

Rule = Callable[[list[TensorType], list[int], Span, list[str], list[str]], TensorType]


@dataclass(frozen=True, slots=True)
class Builtin:
    name: str
    tensors: int  # leading tensor arguments
    params: int  # trailing compile-time integer arguments; -1: any number (zero or more)
    rule: Rule
    doc: str


def _bcast(types: list[TensorType], span: Span, names: list[str], notes: list[str]):
    return broadcast([t.shape for t in types], names, span, notes)


def _no_float(fn: str, types: list[TensorType], span: Span) -> None:
    for t in types:
        if t.dtype.is_float:
            raise TileTypeError(
                f"'{fn}' needs integer or bool operands, not {t.dtype}",
                span,
                hint="convert with as_int(X, 32) first",
            )


def _arith(types, params, span, names, notes):
    return TensorType(arithmetic(promote_all([t.dtype for t in types])), _bcast(types, span, names, notes))


def _compare(types, params, span, names, notes):
    return TensorType(DType.BOOL, _bcast(types, span, names, notes))


def _same(types, params, span, names, notes):
    return TensorType(promote_all([t.dtype for t in types]), _bcast(types, span, names, notes))


def _neg(types, params, span, names, notes):
    return TensorType(arithmetic(types[0].dtype), types[0].shape)


def _floaty(types, params, span, names, notes):
    return TensorType(float_of(promote_all([t.dtype for t in types])), _bcast(types, span, names, notes))


def _bits(fn: str):
    def rule(types, params, span, names, notes):
        _no_float(fn, types, span)
        return TensorType(promote_all([t.dtype for t in types]), _bcast(types, span, names, notes))

    return rule


def _float32(types, params, span, names, notes):
    return TensorType(DType.FLOAT32, types[0].shape)


def _first(types, params, span, names, notes):
    return TensorType(types[0].dtype, _bcast(types, span, names, notes))


def _cond(types, params, span, names, notes):
    return TensorType(promote(types[1].dtype, types[2].dtype), _bcast(types, span, names, notes))


def _cast(table: dict[int, DType], fn: str) -> Rule:
    def rule(types, params, span, names, notes):
        if params[0] not in table:
            raise TileTypeError(
                f"'{fn}' takes a width of {', '.join(map(str, table))}, not {params[0]}",
                span,
                hint=f"e.g. {fn}(X, {list(table)[-2 if len(table) > 2 else -1]})",
            )
        return TensorType(table[params[0]], types[0].shape)

    return rule


def _as_bool(types, params, span, names, notes):
    return TensorType(DType.BOOL, types[0].shape)


def _index(types, params, span, names, notes):
    t = types[0]
    if t.rank is not None and not 0 <= params[0] < t.rank:
        raise TileShapeError(
            f"index axis {params[0]} is out of range for a rank-{t.rank} tensor",
            span,
            hint=f"axes are 0 .. {max(t.rank - 1, 0)}",
        )
    return TensorType(DType.INT32, t.shape)


def _shape(types, params, span, names, notes):
    t = types[0]
    return TensorType(DType.INT32, None if t.rank is None else (t.rank,))


def _reshape(types, params, span, names, notes):
    t = types[0]
    if any(p < 0 for p in params):
        raise TileShapeError(
            "reshape sizes must not be negative",
            span,
            hint="sizes are non-negative integer expressions of dimensions",
        )
    new = tuple(params)
    if t.shape is not None and not may_equal(numel(t.shape), numel(new), notes, "reshape element count"):
        raise TileShapeError(
            f"reshape of {names[0]} with shape {fmt_shape(t.shape)} to {fmt_shape(new)} changes the "
            "element count",
            span,
            hint="the new sizes must multiply to the same number of elements",
        )
    return TensorType(t.dtype, new)


def _require_int(fn: str, t: TensorType, what: str, span: Span) -> None:
    if not t.dtype.is_int:
        raise TileTypeError(
            f"the {what} of '{fn}' must be an integer tensor, not {t.dtype}",
            span,
            hint="convert it with as_int(I, 32)",
        )


def _gather(types, params, span, names, notes):
    data, idx = types
    _require_int("gather", idx, "index tensor", span)
    if data.rank == 0:
        raise TileShapeError(
            "gather needs data of rank at least 1",
            span,
            hint="gather(D, I) picks rows of D along its first dimension",
        )
    shape = None if data.shape is None or idx.shape is None else idx.shape + data.shape[1:]
    if (
        data.shape is not None
        and idx.shape is not None
        and is_concrete(data.shape[0])
        and data.shape[0] == 0
        and is_concrete(numel(idx.shape))
        and numel(idx.shape) > 0
    ):
        raise TileShapeError(
            f"gather from {names[0]}, whose first dimension is 0: there is no row to pick",
            span,
            hint="gather needs data with at least one row",
        )
    return TensorType(data.dtype, shape)


def _scatter(types, params, span, names, notes):
    values, idx, like = types
    _require_int("scatter", idx, "index tensor", span)
    if values.shape is None or idx.shape is None or like.shape is None:
        return TensorType(values.dtype, None)
    r = len(idx.shape)
    if len(values.shape) < r or not all(
        may_equal(a, b, notes, "scatter index shape") for a, b in zip(values.shape[:r], idx.shape)
    ):
        raise TileShapeError(
            "scatter needs the values' leading dimensions to equal the index shape",
            span,
            hint="scatter(V, I, Like): V[i.., j..] goes to O[I[i..], j..]",
        )
    if not like.shape:
        raise TileShapeError(
            "scatter's third argument must have rank at least 1 (it gives the output's first size)",
            span,
            hint="pass a tensor whose first dimension is the output's length",
        )
    return TensorType(values.dtype, (like.shape[0],) + values.shape[r:])


def _softmax(types, params, span, names, notes):
    t = types[0]
    if t.shape is not None:
        if len(t.shape) != 2 or not (same_size(t.shape[0], params[0]) and same_size(t.shape[1], params[1])):
            raise TileShapeError(
                f"builtin_softmax(X, R, C) needs X of shape (R, C) = ({params[0]}, {params[1]}), "
                f"got {fmt_shape(t.shape)}",
                span,
                hint="R and C are the row and column counts of X",
            )
    return TensorType(float_of(t.dtype), t.shape)


_FLOAT_UNARY = (
    "exp",
    "log",
    "sqrt",
    "sin",
    "cos",
    "tan",
    "sinh",
    "cosh",
    "tanh",
    "asin",
    "acos",
    "atan",
    "asinh",
    "acosh",
    "atanh",
    "floor",
    "ceil",
    "round",
    "sigmoid",
    "recip",
)

BUILTINS: dict[str, Builtin] = {}


def _add(name: str, tensors: int, params: int, rule: Rule, doc: str) -> None:
    BUILTINS[name] = Builtin(name, tensors, params, rule, doc)


for _n in ("add", "sub", "mul", "div"):
    _add(_n, 2, 0, _arith, "arithmetic with promotion; integer division truncates, x/0 is 0")
_add("mod", 2, 0, _arith, "remainder of truncating division (C's % and fmod): sign of a; x mod 0 is 0")
for _n in ("cmp_eq", "cmp_ne", "cmp_lt", "cmp_gt", "cmp_le", "cmp_ge"):
    _add(_n, 2, 0, _compare, "comparison, bool result")
for _n in ("bit_and", "bit_or", "bit_xor", "bit_left", "bit_right"):
    _add(_n, 2, 0, _bits(_n), "bitwise on integers and bools; shift counts are taken modulo the width")
_add("bit_not", 1, 0, _bits("bit_not"), "bitwise not (logical not on bool)")
_add("neg", 1, 0, _neg, "negation")
_add("max", 2, 0, _same, "elementwise maximum (NaN propagates)")
_add("min", 2, 0, _same, "elementwise minimum (NaN propagates)")
_add("abs", 1, 0, _same, "absolute value")
_add("relu", 1, 0, _same, "max(x, 0)")
_add("ident", 1, 0, _same, "identity")
_add("pow", 2, 0, _floaty, "power, float result")
_add("cond", 3, 0, _cond, "c ? a : b; c is true when non-zero")
for _n in _FLOAT_UNARY:
    _add(_n, 1, 0, _floaty, "float function; integer inputs give float32")
_add(
    "as_float",
    1,
    1,
    _cast({16: DType.FLOAT16, 32: DType.FLOAT32, 64: DType.FLOAT64}, "as_float"),
    "convert to float16/32/64",
)
_add(
    "as_bfloat",
    1,
    1,
    _cast({16: DType.BFLOAT16}, "as_bfloat"),
    "convert to bfloat16 (the only width): round to nearest even, nan stays nan",
)
_add(
    "as_int",
    1,
    1,
    _cast({8: DType.INT8, 16: DType.INT16, 32: DType.INT32, 64: DType.INT64}, "as_int"),
    "convert to int8..64: truncate toward zero, wrap modulo 2^bits",
)
_add(
    "as_uint",
    1,
    1,
    _cast({8: DType.UINT8, 16: DType.UINT16, 32: DType.UINT32, 64: DType.UINT64}, "as_uint"),
    "convert to uint8..64: truncate toward zero, wrap",
)
_add("as_bool", 1, 0, _as_bool, "x != 0")
_add(
    "round_tf32",
    1,
    0,
    _float32,
    "float32 (any input converted as by as_float(x, 32)) rounded to TF32, 10 stored mantissa bits: "
    "to nearest, ties away from zero; nan and inf kept",
)
_add("index", 1, 1, _index, "index(T, axis): each element's coordinate along axis (int32)")
_add("shape", 1, 0, _shape, "shape(T): the sizes of T as an int32 vector")
_add("reshape", 1, -1, _reshape, "reshape(T, d1, ..., dk): same elements, row-major; k = 0 is 0-D")
_add("gather", 2, 0, _gather, "gather(D, I): O[i.., j..] = D[clamp(I[i..]), j..]")
_add(
    "scatter",
    3,
    0,
    _scatter,
    "scatter(V, I, L): zeros of size L.dims[0], then O[clamp(I[i..]), j..] += V[i.., j..]",
)
_add("builtin_softmax", 1, 2, _softmax, "row-wise softmax of a 2-D (R, C) tensor")
_add("builtin_logsoftmax", 1, 2, _softmax, "row-wise log-softmax of a 2-D (R, C) tensor")
_add(
    "builtin_binary_crossentropy",
    2,
    1,
    _floaty,
    "builtin_binary_crossentropy(P, T, n) = -T*log(P) - (1-T)*log(1-P); n is accepted and unused",
)
# Builtins whose compile-time arguments change no value: the binder accepts any numeric scalar
# expression there (PlaidML's Keras passes a 0-D tensor computed from dimensions), not only
# integers of dimensions (docs/semantics.md §5.2).
VALUE_FREE_PARAMS = frozenset({"builtin_binary_crossentropy"})
_add("reverse_grad", 2, 0, _first, "reverse_grad(X, s): X itself; its gradient is -s times the adjoint")
_add("prng_step", 1, -1, prng.step_rule, "H = prng_step(S, d1, ..., dk): S uint32 [3, 2048]; see tile.prng")
_add("prng_value", 1, 0, prng.value_rule, "prng_value(H): float32 [d1, ..., dk] uniform in [0, 1]")
_add("prng_state", 1, 0, prng.state_rule, "prng_state(H): the next uint32 [3, 2048] state")
_add(
    "simple_reduce",
    1,
    -1,
    simple_reduce.nested_rule,
    "R = simple_reduce(T, d1, ..., dk): sum T to trailing-aligned sizes (1: summed); a statement of its own",
)
