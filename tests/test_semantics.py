"""Tile's elementwise and contraction semantics, one decision per test (see the binding decisions in
the project brief and docs). Expected values are computed by hand, with ``math`` or with numpy."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import ref_interp
from ref_interp.elementwise import IMPLS
from tile.builtins import BUILTINS
from tile.errors import TileIndexError, TilePrecisionWarning, TileShapeError, TileTypeError

I32_MIN, I32_MAX = -(2**31), 2**31 - 1


def run(src: str, precision: str = "native", **inputs) -> dict[str, np.ndarray]:
    return ref_interp.run(src, inputs, precision)


def one(src: str, precision: str = "native", **inputs) -> np.ndarray:
    (out,) = run(src, precision, **inputs).values()
    return out


def ew(expr: str, precision: str = "native", **inputs) -> np.ndarray:
    """``O = expr`` over the given inputs (declared without dims)."""
    return one(f"function ({', '.join(inputs)}) -> (O) {{ O = {expr}; }}", precision, **inputs)


def same(got: np.ndarray, want) -> None:
    want = np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_array_equal(got, want)


def f32(*v) -> np.ndarray:
    return np.array(v, np.float32)


def i32(*v) -> np.ndarray:
    return np.array(v, np.int32)


# ---------------------------------------------------------------------------- contractions
@pytest.mark.parametrize("agg", ["+", "*", ">", "<", "="])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_skipped_positions_are_zero_for_every_aggregation(agg, dtype):
    # Odd positions lie inside the output's range but no integer i writes them: 0, not -inf/1/INT_MIN.
    src = f"function (I[N]) -> (O) {{ O[2*i: 2*N] = {agg}(I[i]); }}"
    same(one(src, I=np.array([-3, -1, -2], dtype)), np.array([-3, 0, -1, 0, -2, 0], dtype))


@pytest.mark.parametrize("agg", ["+", "*", ">", "<", "="])
def test_padding_past_the_input_is_zero_for_every_aggregation(agg):
    src = f"function (I[N]) -> (O) {{ O[i: N + 2] = {agg}(I[i]); }}"
    same(one(src, I=i32(5, 7)), i32(5, 7, 0, 0))


def test_default_fills_unwritten_and_is_not_combined_into_written():
    src = "function (I[N], D[M]) -> (O) { O[2*i: 2*N] = +(I[i]) default D; }"
    # D is float64; the output is int32, so D is converted (truncated) to int32.
    same(one(src, I=i32(1, 2), D=np.array([9.7, 8.0, -7.9, 6.0])), i32(1, 8, 2, 6))
    src = "function (I[N], D[N]) -> (O) { O[i: N] = >(I[i]), i < 1 default D; }"
    same(one(src, I=f32(-5, -6), D=f32(100, 100)), f32(-5, 100))


def test_default_must_have_the_output_shape():
    src = "function (I[N], D[M]) -> (O) { O[i: N] = +(I[i]) default D; }"
    with pytest.raises(TileShapeError):
        run(src, I=i32(1), D=i32(1, 2))


@pytest.mark.parametrize("agg,c,want", [("<", i32(5, 6), 0), (">", i32(-5, -6), 0), ("+", i32(5, 6), 5),
                                        ("*", i32(5, 6), 0)])
def test_conditional_combination_aggregates_its_zero(agg, c, want):
    # A[0] == B[0] only: the tuple j=1 contributes 0, and that 0 takes part in the aggregation.
    src = f"function (A[N], B[M], C[M]) -> (O) {{ O[i: N] = {agg}(A[i] == B[j] ? C[j]); }}"
    same(one(src, A=i32(1), B=i32(1, 3), C=c), i32(want))


def test_conditional_compares_in_the_promoted_type_and_has_cs_type():
    # int32 1 vs float32 1.5 is compared in float32: not equal (in int32, 1.5 would become 1).
    src = "function (A[N], B[M], C[M]) -> (O) { O[i: N] = +(A[i] == B[j] ? C[j]); }"
    same(one(src, A=i32(1), B=f32(1.0, 1.5), C=np.array([5, 6], np.int8)), np.array([5], np.int8))


def test_equality_combination_sums_to_int32_counts():
    src = "function (A[N], B[M]) -> (O) { O[i: N] = +(A[i] == B[j]); }"
    same(one(src, A=i32(1, 2, 4), B=i32(1, 1, 2)), i32(2, 1, 0))


def test_bool_sum_and_product_aggregate_in_int32():
    b = np.array([True, True, False, True])
    same(one("function (B[N]) -> (O) { O[] = +(B[i]); }", B=b), np.int32(3))
    same(one("function (B[N]) -> (O) { O[] = *(B[i]); }", B=b[:2]), np.int32(1))
    same(one("function (B[N]) -> (O) { O[] = >(B[i]); }", B=b), np.bool_(True))
    same(ew("A + B", A=b, B=b), i32(2, 2, 0, 2))
    same(ew("-A", A=b), i32(-1, -1, 0, -1))


def test_contraction_sum_wraps_int32():
    same(one("function (A[N]) -> (O) { O[] = +(A[i]); }", A=i32(I32_MAX, 1)), np.int32(I32_MIN))


# ---------------------------------------------------------------------------- arithmetic
def test_integer_division_truncates_and_x_over_zero_is_zero():
    same(ew("A / B", A=i32(7, -7, 7, -7, 5, -5, 0), B=i32(2, 2, -2, -2, 0, 0, 0)), i32(3, -3, -3, 3, 0, 0, 0))
    same(ew("A / B", A=np.array([7, 2**32 - 1], np.uint32), B=np.array([2, 0], np.uint32)),
         np.array([3, 0], np.uint32))


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_int_min_over_minus_one_wraps(dtype):
    lo = np.iinfo(dtype).min
    same(ew("A / B", A=np.array([lo], dtype), B=np.array([-1], dtype)), np.array([lo], dtype))


def test_integer_overflow_wraps():
    same(ew("A + B", A=i32(I32_MAX), B=i32(1)), i32(I32_MIN))
    same(ew("A * B", A=i32(65536), B=i32(65537)), i32(65536))  # 2**32 + 65536 mod 2**32
    same(ew("A + B", A=np.array([127], np.int8), B=np.array([1], np.int8)), np.array([-128], np.int8))
    same(ew("A - B", A=np.array([0], np.uint8), B=np.array([1], np.uint8)), np.array([255], np.uint8))
    same(ew("A + 1", A=np.array([127], np.int8)), i32(128))  # the literal is int32: no wrap


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_division_by_zero_is_ieee(dtype):
    got = ew("A / B", A=np.array([1, -1, 0], dtype), B=np.zeros(3, dtype))
    assert got.dtype == dtype
    assert got[0] == math.inf and got[1] == -math.inf and math.isnan(got[2])


def test_round_is_half_away_from_zero():
    x = np.array([0.5, 1.5, 2.5, -2.5, -0.5, 0.49999999999999994, -0.49999999999999994, 2.4, -2.6])
    same(ew("round(A)", A=x), np.array([1, 2, 3, -3, -1, 0, 0, 2, -3], np.float64))
    same(ew("round(A)", A=f32(0.5, -1.5, 2.5)), f32(1, -2, 3))
    same(ew("round(A)", "exact", A=np.array([-2.5, 2.5, 0.49999999999999994])),
         np.array([Fraction(-3), Fraction(3), Fraction(0)], dtype=object))


def test_casts_truncate_and_wrap():
    x = np.array([300.7, -2.7, np.nan, np.inf, -np.inf, 3e9 + 7, 2.0**70 + 2.0**20, 2.0**40 + 200.5])
    same(ew("as_int(A, 8)", A=x), np.array([44, -2, 0, 0, 0, 7, 0, -56], np.int8))
    same(ew("as_uint(A, 8)", A=x), np.array([44, 254, 0, 0, 0, 7, 0, 200], np.uint8))
    same(ew("as_int(A, 32)", A=x), i32(300, -2, 0, 0, 0, 3_000_000_007 - 2**32, 2**20, 200))
    same(ew("as_int(A, 8)", A=i32(300, -129)), np.array([44, 127], np.int8))
    same(ew("as_bool(A)", A=np.array([-0.5, 0.0, -0.0, np.nan])), np.array([True, False, False, True]))
    same(ew("as_int(A, 8)", "exact", A=np.array([300.7, -2.7, np.nan])), np.array([44, -2, 0], np.int8))


def test_float_condition_is_true_when_non_zero():
    c = np.array([-0.5, 0.0, np.nan, 0.25, -0.0])
    same(ew("C ? A : B", C=c, A=np.ones(5, np.int32), B=np.zeros(5, np.int32)), i32(1, 0, 1, 1, 0))
    same(ew("C ? 1 : 2.5", C=c), f32(1, 2.5, 1, 1, 2.5))


@pytest.mark.parametrize("values", [[np.nan, 1, 3], [1, np.nan, 3], [1, 3, np.nan]])
@pytest.mark.parametrize("precision", ["native", "exact"])
def test_nan_propagates_through_max_min_aggregations(values, precision):
    src = "function (A[N]) -> (O, P) { O[] = >(A[i]); P[] = <(A[i]); }"
    out = run(src, precision, A=np.array(values))
    assert math.isnan(float(out["O"])) and math.isnan(float(out["P"]))


@pytest.mark.parametrize("precision", ["native", "exact"])
def test_nan_propagates_through_max_min_builtins(precision):
    a, b = np.array([np.nan, 1.0, 2.0]), np.array([1.0, np.nan, 3.0])
    for fn, third in (("max", 3.0), ("min", 2.0)):
        got = ew(f"{fn}(A, B)", precision, A=a, B=b)
        assert math.isnan(float(got[0])) and math.isnan(float(got[1])) and float(got[2]) == third


def test_shift_counts_are_taken_modulo_the_width():
    same(ew("A << B", A=i32(1, 1, -8, 1), B=i32(33, 32, 1, -1)), i32(2, 1, -16, I32_MIN))
    same(ew("A >> B", A=i32(16, -16, -1, 16), B=i32(2, 2, 31, 34)), i32(4, -4, -1, 4))
    same(ew("A << B", A=np.array([1, 3], np.int8), B=np.array([9, 8], np.int8)), np.array([2, 3], np.int8))
    same(ew("A >> B", A=np.array([-128, 128], np.int16), B=np.array([17, 3], np.int16)),
         np.array([-64, 16], np.int16))


def test_bit_ops():
    a, b = i32(12, -1, 5), i32(10, 3, 0)
    same(ew("A & B", A=a, B=b), i32(8, 3, 0))
    same(ew("A | B", A=a, B=b), i32(14, -1, 5))
    same(ew("A ^ B", A=a, B=b), i32(6, -4, 5))
    same(ew("~A", A=a), i32(-13, 0, -6))
    same(ew("~A", A=np.array([True, False])), np.array([False, True]))
    same(ew("A & B", A=np.array([True, True]), B=np.array([True, False])), np.array([True, False]))
    same(ew("A | 4 ^ 6 & 3", A=i32(1)), i32(1 | 4 ^ 6 & 3))  # C precedence: | below ^ below &


@pytest.mark.parametrize("expr", ["A & B", "A | B", "A ^ B", "A << B", "~A"])
def test_bit_ops_reject_floats(expr):
    with pytest.raises(TileTypeError):
        ew(expr, A=f32(1), B=i32(1))


# ------------------------------------------------------------------ structural builtins
def test_gather_clamps_and_has_index_then_data_shape():
    d = np.arange(8, dtype=np.float32).reshape(4, 2)
    idx = i32(-1, 5, 1, 2).reshape(2, 2)
    same(ew("gather(D, I)", D=d, I=idx), d[np.clip(idx, 0, 3)])
    with pytest.raises(TileTypeError):
        ew("gather(D, I)", D=d, I=f32(1))


def test_scatter_adds_into_clamped_rows():
    v = np.arange(6, dtype=np.float32).reshape(3, 2)
    want = np.zeros((4, 2), np.float32)
    want[0] = v[0] + v[2]  # index -2 clamps to 0
    want[3] = v[1]  # index 5 clamps to 3
    same(ew("scatter(V, I, L)", V=v, I=i32(0, 5, -2), L=np.zeros(4)), want)
    v2 = np.arange(4, dtype=np.int32).reshape(2, 2)
    same(ew("scatter(V, I, L)", V=v2, I=i32(1, 1, 0, 2).reshape(2, 2), L=np.zeros((3, 7))), i32(2, 1, 3))


def test_index_shape_reshape():
    t = np.arange(6, dtype=np.int64).reshape(2, 3)
    same(ew("index(T, 0)", T=t), i32(0, 0, 0, 1, 1, 1).reshape(2, 3))
    same(ew("index(T, 1)", T=t), i32(0, 1, 2, 0, 1, 2).reshape(2, 3))
    same(ew("shape(T)", T=t), i32(2, 3))
    same(ew("reshape(T, 3, 2)", T=t), t.reshape(3, 2))
    same(ew("reshape(T, 6)", T=t), t.reshape(6))
    with pytest.raises(TileShapeError):
        ew("reshape(T, 4, 2)", T=t)
    with pytest.raises(TileShapeError):
        ew("index(T, 2)", T=t)


def np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_builtin_softmax_rows_sum_to_one():
    x = np.array([[1, 2, 3, 4], [0, 0, 0, 0], [-50, 50, 0, 1]], np.float32)
    src = "function (X[R, C]) -> (O, L) { O = builtin_softmax(X, R, C); L = builtin_logsoftmax(X, R, C); }"
    out = run(src, X=x)
    assert out["O"].dtype == np.float32 and out["L"].dtype == np.float32
    np.testing.assert_allclose(out["O"], np_softmax(x.astype(np.float64)), rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(out["O"].sum(axis=1), 1, rtol=1e-6)
    np.testing.assert_allclose(out["L"], np.log(np_softmax(x.astype(np.float64))), rtol=1e-6)


def test_float_builtins_of_integers_give_float32():
    for expr in ("exp(A)", "sqrt(A)", "sigmoid(A)", "floor(A)", "pow(A, A)", "tanh(A)"):
        assert ew(expr, A=i32(1, 4)).dtype == np.float32, expr
        assert ew(expr, A=np.array([True])).dtype == np.float32, expr
    same(ew("sqrt(A)", A=i32(4, 9)), f32(2, 3))
    for expr in ("abs(A)", "relu(A)", "ident(A)", "max(A, A)"):
        assert ew(expr, A=np.array([-1], np.int8)).dtype == np.int8, expr


# --------------------------------------------------------------- every builtin, by name
P = np.array([0.5, 1.0, 2.0, 9.0])  # positive
U = np.array([-0.75, -0.25, 0.0, 0.5])  # inside (-1, 1)
G = np.array([1.0, 1.5, 4.0])  # >= 1
F = np.array([-1.5, -0.5, 0.0, 0.5, 2.0, 2.7])
IA, IB = i32(7, -7, 5, 0, -3), i32(2, 2, -3, 4, 0)


def _map(fn, x) -> np.ndarray:
    return np.array([fn(float(v)) for v in x], dtype=np.float64)


def _unary(fn, x):
    return ({"A": x}, _map(fn, x))


def _binary(expected, a=IA, b=IB):
    return ({"A": a, "B": b}, expected(a, b))


# name -> (call, inputs, expected value with the expected dtype); the float functions are compared
# with a relative tolerance of a few ulps (numpy vs math), everything else exactly.
CASES = {
    "add": ("add(A, B)", *_binary(lambda a, b: a + b)),
    "sub": ("sub(A, B)", *_binary(lambda a, b: a - b)),
    "mul": ("mul(A, B)", *_binary(lambda a, b: a * b)),
    "div": ("div(A, B)", {"A": IA, "B": IB}, i32(3, -3, -1, 0, 0)),
    "mod": ("mod(A, B)", {"A": IA, "B": IB}, i32(1, -1, 2, 0, 0)),
    "recip": ("recip(A)", {"A": F}, np.array([-1 / 1.5, -2, np.inf, 2, 0.5, 1 / 2.7])),
    "reverse_grad": ("reverse_grad(A, 3)", {"A": F}, F),
    "builtin_binary_crossentropy": ("builtin_binary_crossentropy(A, B, 4)", {"A": P / 10, "B": U + 0.75},
                                    np.array([-t * math.log(p) - (1 - t) * math.log(1 - p)
                                              for p, t in zip(P / 10, U + 0.75, strict=True)])),
    "cmp_eq": ("cmp_eq(A, B)", *_binary(np.equal, i32(1, 2, 3), i32(1, 3, 2))),
    "cmp_ne": ("cmp_ne(A, B)", *_binary(np.not_equal, i32(1, 2, 3), i32(1, 3, 2))),
    "cmp_lt": ("cmp_lt(A, B)", *_binary(np.less, i32(1, 2, 3), i32(1, 3, 2))),
    "cmp_gt": ("cmp_gt(A, B)", *_binary(np.greater, i32(1, 2, 3), i32(1, 3, 2))),
    "cmp_le": ("cmp_le(A, B)", *_binary(np.less_equal, i32(1, 2, 3), i32(1, 3, 2))),
    "cmp_ge": ("cmp_ge(A, B)", *_binary(np.greater_equal, i32(1, 2, 3), i32(1, 3, 2))),
    "bit_and": ("bit_and(A, B)", *_binary(np.bitwise_and)),
    "bit_or": ("bit_or(A, B)", *_binary(np.bitwise_or)),
    "bit_xor": ("bit_xor(A, B)", *_binary(np.bitwise_xor)),
    "bit_left": ("bit_left(A, B)", {"A": i32(1, 3, -1), "B": i32(0, 4, 31)}, i32(1, 48, I32_MIN)),
    "bit_right": ("bit_right(A, B)", {"A": i32(16, -16, 7), "B": i32(2, 2, 0)}, i32(4, -4, 7)),
    "bit_not": ("bit_not(A)", {"A": IA}, i32(*[~int(v) for v in IA])),
    "neg": ("neg(A)", {"A": IA}, -IA),
    "max": ("max(A, B)", *_binary(np.maximum)),
    "min": ("min(A, B)", *_binary(np.minimum)),
    "abs": ("abs(A)", {"A": IA}, i32(7, 7, 5, 0, 3)),
    "relu": ("relu(A)", {"A": F}, np.array([0, 0, 0, 0.5, 2.0, 2.7])),
    "ident": ("ident(A)", {"A": F}, F),
    "pow": ("pow(A, B)", {"A": P, "B": F[:4]},
            np.array([math.pow(a, b) for a, b in zip(P, F[:4], strict=True)])),
    "cond": ("cond(C, A, B)", {"C": i32(0, 2, -1), "A": f32(1, 2, 3), "B": f32(4, 5, 6)}, f32(4, 2, 3)),
    "exp": ("exp(A)", *_unary(math.exp, F)),
    "log": ("log(A)", *_unary(math.log, P)),
    "sqrt": ("sqrt(A)", *_unary(math.sqrt, P)),
    "sin": ("sin(A)", *_unary(math.sin, F)),
    "cos": ("cos(A)", *_unary(math.cos, F)),
    "tan": ("tan(A)", *_unary(math.tan, F)),
    "sinh": ("sinh(A)", *_unary(math.sinh, F)),
    "cosh": ("cosh(A)", *_unary(math.cosh, F)),
    "tanh": ("tanh(A)", *_unary(math.tanh, F)),
    "asin": ("asin(A)", *_unary(math.asin, U)),
    "acos": ("acos(A)", *_unary(math.acos, U)),
    "atan": ("atan(A)", *_unary(math.atan, F)),
    "asinh": ("asinh(A)", *_unary(math.asinh, F)),
    "acosh": ("acosh(A)", *_unary(math.acosh, G)),
    "atanh": ("atanh(A)", *_unary(math.atanh, U)),
    "floor": ("floor(A)", *_unary(math.floor, F)),
    "ceil": ("ceil(A)", *_unary(math.ceil, F)),
    "round": ("round(A)", {"A": F}, np.array([-2, -1, 0, 1, 2, 3.0])),
    "sigmoid": ("sigmoid(A)", *_unary(lambda x: 1 / (1 + math.exp(-x)), F)),
    "as_float": ("as_float(A, 16)", {"A": i32(1, -3, 2049)}, np.array([1, -3, 2048], np.float16)),
    "as_bfloat": (  # 257 is halfway between 256 and 258: to even; 259 goes up to 260
        "as_bfloat(A, 16)",
        {"A": i32(1, -3, 257, 259)},
        np.array([1, -3, 256, 260], ml_dtypes.bfloat16),
    ),
    "round_tf32": (  # float32 first (16777217 -> 16777216), then 11 significant bits, ties away
        "round_tf32(A)",
        {"A": i32(2049, -2049, 2051, 16777217)},
        np.array([2050, -2050, 2052, 16777216], np.float32),
    ),
    "as_int": ("as_int(A, 16)", {"A": F}, np.array([-1, 0, 0, 0, 2, 2], np.int16)),
    "as_uint": ("as_uint(A, 16)", {"A": F}, np.array([65535, 0, 0, 0, 2, 2], np.uint16)),
    "as_bool": ("as_bool(A)", {"A": F}, F != 0),
    "index": ("index(A, 0)", {"A": np.zeros((3, 1))}, i32(0, 1, 2).reshape(3, 1)),
    "shape": ("shape(A)", {"A": np.zeros((3, 1, 2))}, i32(3, 1, 2)),
    "reshape": ("reshape(A, 2, 3)", {"A": F}, F.reshape(2, 3)),
    "gather": ("gather(A, B)", {"A": F, "B": i32(5, 9, -9)}, np.array([2.7, 2.7, -1.5])),
    "scatter": ("scatter(A, B, C)", {"A": F, "B": i32(0, 1, 0, 1, 0, 1), "C": np.zeros(2)},
                np.array([-1.5 + 0.0 + 2.0, -0.5 + 0.5 + 2.7])),
    "builtin_softmax": ("builtin_softmax(A, 2, 3)", {"A": F.reshape(2, 3)}, np_softmax(F.reshape(2, 3))),
    "builtin_logsoftmax": ("builtin_logsoftmax(A, 2, 3)", {"A": F.reshape(2, 3)},
                           np.log(np_softmax(F.reshape(2, 3)))),
}
_APPROX = {"pow", "exp", "log", "sqrt", "sin", "cos", "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan",
           "asinh", "acosh", "atanh", "sigmoid", "builtin_softmax", "builtin_logsoftmax", "scatter",
           "builtin_binary_crossentropy"}


# Builtins that only make sense as whole statements (tests/test_prng.py, tests/test_simple_reduce.py)
STATEMENT_LEVEL = {"prng_step", "prng_value", "prng_state", "simple_reduce"}


@pytest.mark.parametrize("name", sorted(set(BUILTINS) - STATEMENT_LEVEL))
def test_every_builtin(name):
    assert name in CASES, f"builtin '{name}' has no test case in CASES"
    call, inputs, want = CASES[name]
    got = ew(call, **inputs)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    if name in _APPROX:
        np.testing.assert_allclose(got, want, rtol=4e-16 * 8, atol=0)
    else:
        np.testing.assert_array_equal(got, want)


def test_interpreter_implements_exactly_the_builtins():
    assert set(IMPLS) == set(BUILTINS) - {"simple_reduce"}  # bound as a `+` contraction
    assert set(CASES) == set(BUILTINS) - STATEMENT_LEVEL


# ---------------------------------------------------------------------- precision modes
def test_exact_mode_uses_fractions():
    got = ew("A / B", "exact", A=f32(1, 2), B=f32(3, 7))
    assert got.dtype == object
    assert list(got) == [Fraction(1, 3), Fraction(2, 7)]
    assert ew("A * 0.1", "exact", A=f32(3))[0] == Fraction(3, 10)  # the literal keeps its decimal value
    s = one("function (A[N]) -> (O) { O[] = +(A[i]); }", "exact", A=np.array([0.1, 0.2]))
    assert s[()] == Fraction(0.1) + Fraction(0.2)
    same(ew("A / B", "exact", A=i32(7), B=i32(2)), i32(3))  # integers stay integers


def test_native_and_float64_modes():
    third = ew("A / B", A=f32(1), B=f32(3))
    same(third, f32(np.float32(1) / np.float32(3)))
    same(ew("A / B", "float64", A=f32(1), B=f32(3)), np.array([1 / 3]))
    same(ew("A * 0.1", A=np.array([3.0])), np.array([3.0 * 0.1]))  # the double nearest 0.1
    same(ew("A * 0.1", A=f32(3)), f32(np.float32(3) * np.float32(0.1)))
    same(ew("A + B", "float64", A=i32(1), B=i32(2)), i32(3))


def test_exact_transcendental_warns_and_falls_back_to_float64():
    with pytest.warns(TilePrecisionWarning):
        got = ew("exp(A)", "exact", A=f32(1))
    assert float(got[0]) == math.exp(1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TilePrecisionWarning)
        ew("A * A + sqrt(B)", "float64", A=f32(1), B=f32(4))  # no warning outside exact mode


# ------------------------------------------------------------------- shapes and programs
def test_zero_size_output_and_operands():
    same(one("function (I[N]) -> (O) { O[i: 0] = +(I[i]); }", I=i32(1, 2)), np.zeros(0, np.int32))
    same(one("function (I[N]) -> (O) { O[] = +(I[i]); }", I=np.zeros(0, np.int32)), np.int32(0))
    empty = np.zeros(0, np.float32)
    same(one("function (I[N]) -> (O) { O[i: 3] = >(I[j]); }", I=empty), np.zeros(3, np.float32))
    src = "function (A[N], B[M], D[M]) -> (O) { O[j: M] = +(A[i] * B[j]) default D; }"
    same(one(src, A=np.zeros(0, np.int32), B=i32(1, 1), D=f32(7, 8)), i32(7, 8))
    same(ew("A + 1", A=np.zeros((2, 0), np.int8)), np.zeros((2, 0), np.int32))


def test_empty_constraint_is_an_index_error():
    with pytest.raises(TileIndexError, match="i < 0"):
        run("function (A[N]) -> (O) { O[i: N] = +(A[i]), i < 0; }", A=i32(3))


def test_outputs_depending_on_no_tensor():
    same(one("function (I[N]) -> (O) { O = N; }", I=np.zeros(5)), np.int32(5))
    same(one("function (I[N, M]) -> (O) { O = N * M - 1; }", I=np.zeros((2, 3))), np.int32(5))
    same(one("function () -> (O) { O = 3; }"), np.int32(3))


def test_multiple_outputs():
    out = run("function (A) -> (O1, O2, O3) { O1 = A + 1; O2 = -A; O3 = A * A; }", A=i32(2, -3))
    assert list(out) == ["O1", "O2", "O3"]
    same(out["O1"], i32(3, -2))
    same(out["O2"], i32(-2, 3))
    same(out["O3"], i32(4, 9))


def test_named_integer_constants_in_sizes_polys_and_elementwise():
    src = """function (I[N]) -> (O, Q) {
        Pad = (N - 1) / 2;
        O[i: N + 2 * Pad] = +(I[i - Pad]);
        Q = I + Pad;
    }"""
    out = run(src, I=i32(1, 2, 3, 4, 5))
    same(out["O"], i32(0, 0, 1, 2, 3, 4, 5, 0, 0))
    same(out["Q"], i32(3, 4, 5, 6, 7))


def test_broadcasting_with_0d_and_size_1():
    a, b, s = i32(1, 2, 3).reshape(3, 1), i32(10, 20, 30, 40), np.array(2, np.int32)
    same(ew("A + B", A=a, B=b), a + b)
    same(ew("A * S", A=a, S=s), a * 2)
    same(ew("S - B", S=s, B=b), 2 - b)
    same(ew("A + B", A=i32(1), B=np.ones((2, 3), np.int32)), np.full((2, 3), 2, np.int32))
    same(ew("S + S", S=s), np.int32(4))
    with pytest.raises(TileShapeError):
        ew("A + B", A=i32(1, 2, 3), B=b)
