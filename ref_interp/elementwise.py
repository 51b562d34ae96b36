"""numpy implementations of every elementwise builtin, with Tile's exact semantics.

``apply(nx, call, args)`` evaluates one ``TCall`` whose arguments are already evaluated. Operands
are first converted to the type the operation works in (the result type for arithmetic, the
promoted operand type for comparisons); then:

* integer ``/`` truncates toward zero and ``x / 0`` is 0; integer arithmetic wraps;
* ``mod`` is the remainder of that division (C's ``%`` and ``fmod``: the sign of the dividend),
  and integer ``x mod 0`` is 0;
* float ``/`` follows IEEE (±inf, nan); ``max``/``min`` propagate nan;
* the elementary functions (``exp log sin ... atanh pow``) are the C library's double routines
  rounded once to the result type (``ref_interp.libm``), ``sigmoid`` and the softmaxes compose
  them rounding each step, as strict compiled targets do (docs/semantics.md §8.3);
* ``round`` rounds half away from zero; ``?:`` is true where the condition is non-zero;
* ``round_tf32`` converts to float32 and rounds that to TF32 (``tile.precision``) in every
  precision mode, so its result is a float32 value even where floats are stored wider;
* shift counts are taken modulo the operand width (as OpenCL does);
* ``gather``/``scatter`` clamp out-of-range indices to the valid range.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from ref_interp import libm
from ref_interp.numerics import Numerics
from ref_interp.prng import IMPLS as PRNG_IMPLS
from tile.composites import COMPOSITES, expand
from tile.dtypes import DType, promote
from tile.precision import round_tf32
from tile.typed import TCall, TConst, TExpr, TRef

Impl = Callable[[Numerics, TCall, list[np.ndarray]], np.ndarray]
IMPLS: dict[str, Impl] = dict(PRNG_IMPLS)  # prng_step, prng_value, prng_state: ref_interp.prng


def _impl(*names: str):
    def register(fn: Impl) -> Impl:
        for n in names:
            IMPLS[n] = fn
        return fn

    return register


def apply(nx: Numerics, call: TCall, args: list[np.ndarray]) -> np.ndarray:
    with np.errstate(all="ignore"):
        out = IMPLS[call.fn](nx, call, args)
    out = nx.cast(out, call.type.dtype)
    shape = call.type.shape
    if out.shape != shape:
        out = np.broadcast_to(out, shape)
    return out


def _as(nx: Numerics, call: TCall, args: list[np.ndarray]) -> list[np.ndarray]:
    """All arguments converted to the call's result type."""
    return [nx.cast(a, call.type.dtype) for a in args]


def _is_exact_float(nx: Numerics, call: TCall) -> bool:
    return nx.exact and call.type.dtype.is_float


def _objwise(fn: Callable, *arrays: np.ndarray) -> np.ndarray:
    return np.asarray(np.frompyfunc(fn, len(arrays), 1)(*arrays), dtype=object)


# ------------------------------------------------------------------------- arithmetic
@_impl("add")
def _add(nx, call, args):
    a, b = _as(nx, call, args)
    return a + b


@_impl("sub")
def _sub(nx, call, args):
    a, b = _as(nx, call, args)
    return a - b


@_impl("mul")
def _mul(nx, call, args):
    a, b = _as(nx, call, args)
    return a * b


def _exact_div(a, b):
    if isinstance(a, float) or isinstance(b, float):
        try:
            return a / b
        except ZeroDivisionError:
            return math.nan if a == 0 or a != a else math.copysign(math.inf, a)
    if b == 0:
        return math.nan if a == 0 else math.copysign(math.inf, a)
    return Fraction(a) / b


def int_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C division: truncate toward zero; ``x / 0`` is 0; ``INT_MIN / -1`` wraps."""
    zero = b == 0
    b1 = np.where(zero, np.ones_like(b), b)
    q = np.floor_divide(a, b1)
    r = a - q * b1
    if a.dtype.kind == "i":
        q = q + ((r != 0) & ((a < 0) != (b1 < 0))).astype(q.dtype)
    return np.where(zero, np.zeros_like(q), q)


@_impl("div")
def _div(nx, call, args):
    a, b = _as(nx, call, args)
    dt = call.type.dtype
    if _is_exact_float(nx, call):
        return _objwise(_exact_div, a, b)
    if dt.is_float:
        return np.true_divide(a, b)
    a, b = np.broadcast_arrays(a, b)
    return int_divide(a, b)


def int_remainder(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C's ``%``: ``a - (a / b) * b`` with ``/`` as ``int_divide``, so the sign is a's; ``x mod 0``
    is 0 (as ``x / 0``) and ``INT_MIN mod -1`` is 0 (the wrapped quotient times -1 gives it back)."""
    r = a - int_divide(a, b) * b
    return np.where(b == 0, np.zeros_like(r), r)


def _exact_fmod(a, b):
    """C's ``fmod`` on Fractions (floats here are only inf and nan): ``a - b * trunc(a / b)``."""
    if not isinstance(a, float) and not isinstance(b, float):
        return math.nan if b == 0 else a - b * math.trunc(a / b)
    if not isinstance(a, float) and math.isinf(b):
        return a
    return math.nan


@_impl("mod")
def _mod(nx, call, args):
    a, b = _as(nx, call, args)
    if _is_exact_float(nx, call):
        return _objwise(_exact_fmod, a, b)
    if call.type.dtype.is_float:
        return np.fmod(a, b)
    a, b = np.broadcast_arrays(a, b)
    return int_remainder(a, b)


@_impl("recip")
def _recip(nx, call, args):
    (a,) = _as(nx, call, args)
    if _is_exact_float(nx, call):
        return _objwise(lambda x: _exact_div(Fraction(1), x), a)
    return np.true_divide(np.asarray(1, dtype=a.dtype), a)


@_impl("neg")
def _neg(nx, call, args):
    (a,) = _as(nx, call, args)
    return -a


@_impl("ident")
def _ident(nx, call, args):
    return _as(nx, call, args)[0]


@_impl("abs")
def _abs(nx, call, args):
    (a,) = _as(nx, call, args)
    if call.type.dtype is DType.BOOL:
        return a
    return np.abs(a)


@_impl("relu")
def _relu(nx, call, args):
    (a,) = _as(nx, call, args)
    zero = nx.const(0, call.type.dtype)
    return np.where(a < zero, zero, a)


def _nan_aware(pick_first: Callable):
    def fn(a, b):
        if isinstance(a, float) and a != a:
            return a
        if isinstance(b, float) and b != b:
            return b
        return a if pick_first(a, b) else b

    return fn


@_impl("max")
def _max(nx, call, args):
    a, b = _as(nx, call, args)
    if _is_exact_float(nx, call):
        return _objwise(_nan_aware(lambda x, y: x >= y), a, b)
    return np.maximum(a, b)


@_impl("min")
def _min(nx, call, args):
    a, b = _as(nx, call, args)
    if _is_exact_float(nx, call):
        return _objwise(_nan_aware(lambda x, y: x <= y), a, b)
    return np.minimum(a, b)


# ------------------------------------------------------------------------ comparisons
_COMPARE = {
    "cmp_eq": np.equal,
    "cmp_ne": np.not_equal,
    "cmp_lt": np.less,
    "cmp_gt": np.greater,
    "cmp_le": np.less_equal,
    "cmp_ge": np.greater_equal,
}


@_impl(*_COMPARE)
def _compare(nx, call, args):
    common = promote(call.args[0].type.dtype, call.args[1].type.dtype)
    a, b = (nx.cast(x, common) for x in args)
    return np.asarray(_COMPARE[call.fn](a, b), dtype=bool)


@_impl("cond")
def _cond(nx, call, args):
    c = nx.cast(args[0], DType.BOOL)
    a, b = (nx.cast(x, call.type.dtype) for x in args[1:])
    return np.where(c, a, b)


# ----------------------------------------------------------------------------- bits
@_impl("bit_and", "bit_or", "bit_xor")
def _bitwise(nx, call, args):
    a, b = _as(nx, call, args)
    fn = {"bit_and": np.bitwise_and, "bit_or": np.bitwise_or, "bit_xor": np.bitwise_xor}[call.fn]
    return fn(a, b)


@_impl("bit_not")
def _bit_not(nx, call, args):
    (a,) = _as(nx, call, args)
    return np.logical_not(a) if a.dtype == bool else np.invert(a)


@_impl("bit_left", "bit_right")
def _shift(nx, call, args):
    dt = call.type.dtype
    work = DType.INT32 if dt is DType.BOOL else dt
    a = nx.cast(args[0], work)
    count = nx.cast(args[1], work) & np.asarray(work.bits - 1, dtype=work.numpy)
    out = np.left_shift(a, count) if call.fn == "bit_left" else np.right_shift(a, count)
    return nx.cast(out, dt)


# --------------------------------------------------------------------- float functions
# The elementary functions are the C library's double routines (``ref_interp.libm``), rounded once
# to the result type: numpy's float32/float16 loops are not, and compiled targets call libm
# (docs/semantics.md §8.3). sqrt is correctly rounded in every type, so numpy's is that value.
ELEMENTARY = frozenset(libm.ROUTINES) - {"pow"}


def _sigmoid(nx: Numerics, a: np.ndarray, dt: DType) -> np.ndarray:
    """``1 / (1 + exp(-x))``, each step rounded to ``dt`` (the compiled targets' composition)."""
    one = np.asarray(1, dtype=a.dtype)
    return one / (one + nx.cast(libm.evaluate("exp", -a), dt))


def _via_float64(nx: Numerics, call: TCall, fn: Callable, *arrays: np.ndarray) -> np.ndarray:
    """Exact mode: evaluate in float64 and convert the result back (exactly) to Fractions."""
    nx.fallback(call.fn)
    floats = [np.asarray(a.astype(np.float64)) for a in arrays]
    return nx.cast(np.asarray(fn(*floats)), call.type.dtype)


@_impl(*ELEMENTARY, "sqrt", "sigmoid")
def _float_fn(nx, call, args):
    (a,) = _as(nx, call, args)
    name = call.fn
    if _is_exact_float(nx, call):
        f64 = Numerics("float64")
        if name == "sigmoid":
            return _via_float64(nx, call, lambda v: _sigmoid(f64, v, DType.FLOAT64), a)
        return _via_float64(nx, call, np.sqrt if name == "sqrt" else lambda v: libm.evaluate(name, v), a)
    if name == "sqrt":
        return np.sqrt(a)
    if name == "sigmoid":
        return _sigmoid(nx, a, call.type.dtype)
    return libm.evaluate(name, a)  # float64: ``apply`` rounds it once to the result type


def _round_half_away(x: np.ndarray) -> np.ndarray:
    t = np.trunc(x)
    frac = x - t  # exact in binary floating point
    return t + np.where(np.abs(frac) >= 0.5, np.sign(x), 0).astype(x.dtype)


def _exact_rounding(fn: str):
    def go(x):
        if isinstance(x, float):
            return x  # inf and nan round to themselves
        if fn == "floor":
            return Fraction(math.floor(x))
        if fn == "ceil":
            return Fraction(math.ceil(x))
        t = math.trunc(x)
        return Fraction(t + (int(math.copysign(1, x)) if abs(x - t) >= Fraction(1, 2) else 0))

    return go


@_impl("floor", "ceil", "round")
def _rounding(nx, call, args):
    (a,) = _as(nx, call, args)
    if _is_exact_float(nx, call):
        return _objwise(_exact_rounding(call.fn), a)
    if call.fn == "floor":
        return np.floor(a)
    if call.fn == "ceil":
        return np.ceil(a)
    return _round_half_away(a)


def _exact_pow(a, b):
    if isinstance(a, Fraction) and isinstance(b, Fraction) and b.denominator == 1 and (a != 0 or b >= 0):
        return a ** int(b)
    return None


@_impl("pow")
def _pow(nx, call, args):
    a, b = _as(nx, call, args)
    if _is_exact_float(nx, call):
        out = _objwise(_exact_pow, a, b)
        missing = np.equal(out, None)
        if missing.any():
            pair = np.broadcast_arrays(a, b)
            approx = _via_float64(nx, call, lambda x, y: libm.evaluate("pow", x, y), *pair)
            out = np.where(missing, approx, out)
        return out
    return libm.evaluate("pow", a, b)


# ---------------------------------------------------------------------------- casts
@_impl("as_float", "as_bfloat", "as_int", "as_uint", "as_bool")
def _convert(nx, call, args):
    return nx.cast(args[0], call.type.dtype)


@_impl("round_tf32")
def _round_tf32(nx, call, args):
    # float32 first, rounded in every mode (float64 and exact too): the result is a float32 value
    return round_tf32(nx.float32_values(args[0]))


# ------------------------------------------------------------------- structural ops
@_impl("index")
def _index(nx, call, args):
    axis = call.params[0]
    shape = call.type.shape
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return np.broadcast_to(np.arange(shape[axis], dtype=np.int32).reshape(view), shape)


@_impl("shape")
def _shape(nx, call, args):
    return np.asarray(call.args[0].type.shape, dtype=np.int32).reshape(call.type.shape)


@_impl("reshape")
def _reshape(nx, call, args):
    return np.ascontiguousarray(args[0]).reshape(call.type.shape)


def _clamp(idx: np.ndarray, n: int) -> np.ndarray:
    """Indices clamped into [0, n) in their own type first, so huge unsigned ones stay huge."""
    return np.clip(idx, 0, n - 1).astype(np.int64)


@_impl("gather")
def _gather(nx, call, args):
    data, idx = args
    return data[_clamp(idx, data.shape[0])]


@_impl("scatter")
def _scatter(nx, call, args):
    values, idx, _like = args
    dt = call.type.dtype
    out = np.zeros(call.type.shape, dtype=nx.storage(dt))
    if nx.exact and dt.is_float:
        out[...] = Fraction(0)
    if out.shape[0] == 0 or values.size == 0:
        return out
    np.add.at(out, _clamp(idx, out.shape[0]), nx.cast(values, dt))
    return out


def _softmax_rows(nx: Numerics, x: np.ndarray, dt: DType, log: bool) -> np.ndarray:
    """Row-wise softmax as every compiled target composes it: the row maximum, ``e = exp(x - m)``
    rounded to ``dt``, their sum in column order (in float32 for 2-byte floats), rounded to ``dt``
    once, then ``e / sum`` or ``x - m - log(sum)``; exp and log are ``libm``'s."""
    m = np.max(x, axis=1, keepdims=True)
    shifted = x - m
    e = nx.cast(libm.evaluate("exp", shifted), dt)
    acc = np.float32 if x.dtype.itemsize == 2 else x.dtype
    s = nx.cast(np.cumsum(e.astype(acc), axis=1)[:, -1:], dt)  # cumsum adds in order, unlike sum
    return shifted - nx.cast(libm.evaluate("log", s), dt) if log else e / s


@_impl("builtin_softmax", "builtin_logsoftmax")
def _softmax(nx, call, args):
    (x,) = _as(nx, call, args)
    log = call.fn == "builtin_logsoftmax"
    if _is_exact_float(nx, call):
        f64 = Numerics("float64")
        return _via_float64(nx, call, lambda v: _softmax_rows(f64, v, DType.FLOAT64, log), x)
    if x.size == 0:
        return x
    return _softmax_rows(nx, x, call.type.dtype, log)


# --------------------------------------------------------------------------- composites
def _evaluate(nx: Numerics, e: TExpr, values: dict[str, np.ndarray]) -> np.ndarray:
    if isinstance(e, TConst):
        return nx.const(e.value, e.type.dtype)
    if isinstance(e, TRef):
        return values[e.name]
    return apply(nx, e, [_evaluate(nx, a, values) for a in e.args])


@_impl(*COMPOSITES)
def _composite(nx, call, args):
    """The expansion of ``tile.composites`` over the evaluated arguments (each evaluated once)."""
    slots = tuple(TRef(f"${k}", a.type) for k, a in enumerate(call.args))
    values = {s.name: v for s, v in zip(slots, args, strict=True)}
    return _evaluate(nx, expand(TCall(call.fn, slots, call.type, call.params, call.span)), values)
