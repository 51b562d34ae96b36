"""Types and shapes: the promotion table, builtin result types, broadcasting, contraction dtypes,
named integer constants and symbolic shapes."""

from __future__ import annotations

import pytest
import sympy

from tile import bind, bind_symbolic, parse
from tile.affine import Affine
from tile.dtypes import DType, promote
from tile.errors import TileShapeError, TileTypeError
from tile.typed import TContraction, TensorType

D = DType
BOOL, I8, I16, I32, I64 = D.BOOL, D.INT8, D.INT16, D.INT32, D.INT64
U8, U16, U32, U64 = D.UINT8, D.UINT16, D.UINT32, D.UINT64
F16, F32, F64 = D.FLOAT16, D.FLOAT32, D.FLOAT64


def T(dtype: DType, *shape: int) -> TensorType:  # noqa: N802
    return TensorType(dtype, tuple(shape))


def types(src: str, **inputs: TensorType) -> dict[str, TensorType]:
    return bind(parse(src), inputs).types


def out(stmt: str, header: str | None = None, **inputs: TensorType) -> TensorType:
    """The type of O in a one-statement program (inputs without dims unless ``header`` says)."""
    header = header or f"({', '.join(inputs)})"
    return types(f"function {header} -> (O) {{ {stmt} }}", **inputs)["O"]


def sym(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, positive=True, integer=True)


# ------------------------------------------------------------------------- promotion
@pytest.mark.parametrize("lhs, rhs, result", [
    # a float side wins whatever its width
    (I64, F16, F16), (F16, I64, F16), (U64, F32, F32), (BOOL, F16, F16), (F64, I8, F64),
    # otherwise the wider wins
    (I8, I32, I32), (I32, I8, I32), (U8, I16, I16), (I16, U32, U32), (F16, F64, F64), (F32, F16, F32),
    (I64, U8, I64),
    # equal widths: the left operand wins
    (I32, U32, I32), (U32, I32, U32), (I8, U8, I8), (U8, I8, U8), (U64, I64, U64), (F32, F32, F32),
    # bool is a 1-bit integer
    (BOOL, I8, I8), (I8, BOOL, I8), (BOOL, U16, U16), (BOOL, BOOL, BOOL),
])
def test_promotion_table(lhs, rhs, result):
    assert promote(lhs, rhs) is result
    # and the same through a bound program, where only bool arithmetic changes the result
    assert out("O = A + B;", A=T(lhs, 2), B=T(rhs, 2)).dtype is (I32 if result is BOOL else result)
    assert out("O = max(A, B);", A=T(lhs, 2), B=T(rhs, 2)).dtype is result


@pytest.mark.parametrize("stmt", ["O = A + B;", "O = A - B;", "O = A * B;", "O = A / B;", "O = -A;"])
def test_bool_arithmetic_is_int32(stmt):
    assert out(stmt, A=T(BOOL, 2), B=T(BOOL, 2)) == T(I32, 2)


def test_bool_logic_stays_bool():
    assert out("O = A & B;", A=T(BOOL, 2), B=T(BOOL, 2)) == T(BOOL, 2)
    assert out("O = ~A;", A=T(BOOL, 2)) == T(BOOL, 2)
    assert out("O = A | B;", A=T(BOOL, 2), B=T(I8, 2)) == T(I8, 2)


def test_negation_keeps_non_bool_types():
    for dt in (I8, U8, F16, I64):
        assert out("O = -A;", A=T(dt, 3)) == T(dt, 3)


def test_literal_types():
    assert out("O = A + 1;", A=T(I8, 2)).dtype is I32  # an int literal is int32
    assert out("O = A + 1;", A=T(I64, 2)).dtype is I64
    assert out("O = A + 1;", A=T(U32, 2)).dtype is U32  # equal width, left wins
    assert out("O = 1 + A;", A=T(U32, 2)).dtype is I32
    assert out("O = A * 0.5;", A=T(I64, 2)).dtype is F32  # a float literal is float32
    assert out("O = A * 0.5;", A=T(F64, 2)).dtype is F64
    assert out("O = A * 0.5;", A=T(F16, 2)).dtype is F32
    assert out("O = A + 3000000000;", A=T(I32, 2)).dtype is I64  # too large for int32
    t = types("function () -> (O, P, Q, R) { O = 2147483647; P = 2147483648; Q = -2147483648; "
              "R = -2147483649; }")
    assert [t[n] for n in "OPQR"] == [T(I32), T(I64), T(I32), T(I64)]
    assert out("O = 2.5;", "()") == T(F32)


def test_dimensions_are_int32_values():
    assert out("O = A + N;", "(A[N])", A=T(I8, 4)) == T(I32, 4)
    assert out("O = A * N;", "(A[N])", A=T(F16, 4)) == T(F16, 4)
    assert out("O = N;", "(A[N])", A=T(F16, 4)) == T(I32)


@pytest.mark.parametrize("stmt", ["O = A < B;", "O = A == B;", "O = A != B;", "O = A >= 1.5;",
                                  "O = as_bool(A) & as_bool(B);"])
def test_comparisons_are_bool(stmt):
    assert out(stmt, A=T(F32, 2, 3), B=T(I8, 3)) == T(BOOL, 2, 3)


def test_conditional_type_and_shape():
    assert out("O = C ? A : B;", A=T(I8, 1, 4), B=T(U8), C=T(F64, 3, 1)) == T(I8, 3, 4)
    assert out("O = C ? A : B;", A=T(U8, 4), B=T(I8, 4), C=T(BOOL, 4)) == T(U8, 4)
    assert out("O = C ? A : B;", A=T(I32, 4), B=T(F16, 4), C=T(I8, 4)) == T(F16, 4)


# -------------------------------------------------------------------------- builtins
@pytest.mark.parametrize("fn", ["exp", "log", "sqrt", "sin", "cos", "tan", "sinh", "cosh", "tanh", "asin",
                                "acos", "atan", "asinh", "acosh", "atanh", "floor", "ceil", "round", "recip",
                                "sigmoid"])
def test_float_builtins(fn):
    for src, res in ((I8, F32), (U64, F32), (BOOL, F32), (I32, F32), (F16, F16), (F64, F64)):
        assert out(f"O = {fn}(A);", A=T(src, 2, 2)) == T(res, 2, 2)


def test_type_keeping_builtins():
    assert out("O = pow(A, B);", A=T(I32, 3), B=T(I8, 3)) == T(F32, 3)
    assert out("O = pow(A, B);", A=T(F64, 3), B=T(I32, 1)) == T(F64, 3)
    for fn in ("abs", "relu", "ident"):
        for dt in (I8, U16, F16, BOOL):
            assert out(f"O = {fn}(A);", A=T(dt, 2)) == T(dt, 2)
    assert out("O = max(A, B);", A=T(I8, 2, 1), B=T(I16, 3)) == T(I16, 2, 3)
    assert out("O = min(A, B);", A=T(F16, 2), B=T(I32, 2)) == T(F16, 2)


def test_mod_crossentropy_and_reverse_grad_types():
    assert out("O = mod(A, B);", A=T(I8, 2, 1), B=T(U8, 3)) == T(I8, 2, 3)  # as the arithmetic
    assert out("O = mod(A, B);", A=T(BOOL, 2), B=T(BOOL, 2)) == T(I32, 2)
    assert out("O = mod(A, 2.5);", A=T(I32, 2)) == T(F32, 2)
    bce = "O = builtin_binary_crossentropy(A, B, 6);"
    assert out(bce, A=T(F16, 2, 3), B=T(I8, 3)) == T(F16, 2, 3)  # float of the promoted type
    assert out(bce, A=T(I32, 2), B=T(I32, 2)) == T(F32, 2)
    assert out("O = reverse_grad(A, B);", A=T(F16, 4), B=T(F64)) == T(F16, 4)  # A's type


def test_conversions():
    for bits, dt in ((16, F16), (32, F32), (64, F64)):
        assert out(f"O = as_float(A, {bits});", A=T(I8, 2)) == T(dt, 2)
    for bits, dt in ((8, I8), (16, I16), (32, I32), (64, I64)):
        assert out(f"O = as_int(A, {bits});", A=T(F32, 2)) == T(dt, 2)
    for bits, dt in ((8, U8), (16, U16), (32, U32), (64, U64)):
        assert out(f"O = as_uint(A, {bits});", A=T(F32, 2)) == T(dt, 2)
    assert out("O = as_int(A, 4 * 2);", A=T(F32, 2)) == T(I8, 2)  # the width is a constant expression
    with pytest.raises(TileTypeError):
        out("O = as_int(A, 12);", A=T(F32, 2))
    with pytest.raises(TileTypeError):
        out("O = as_float(A, 8);", A=T(I32, 2))


def test_bit_ops():
    assert out("O = A & B;", A=T(I8, 2), B=T(I16, 2)).dtype is I16
    assert out("O = A << B;", A=T(U8, 2), B=T(I32, 2)).dtype is I32
    assert out("O = A >> 1;", A=T(I64, 2)).dtype is I64
    assert out("O = ~A;", A=T(U8, 2)).dtype is U8
    for stmt in ("O = A ^ B;", "O = B | A;", "O = A << B;"):
        with pytest.raises(TileTypeError):
            out(stmt, A=T(F16, 2), B=T(I32, 2))


def test_shape_builtins():
    assert out("O = index(A, 1);", A=T(F16, 2, 5)) == T(I32, 2, 5)
    assert out("O = shape(A);", A=T(F16, 2, 5, 7)) == T(I32, 3)
    assert out("O = reshape(A, 5, 2);", A=T(U8, 2, 5)) == T(U8, 5, 2)
    assert out("O = reshape(A, N * M);", "(A[N, M])", A=T(U8, 2, 5)) == T(U8, 10)
    assert out("O = reshape(A, 1, 1, 1);", A=T(U8, 1)) == T(U8, 1, 1, 1)
    assert out("O = gather(A, B);", A=T(F16, 5, 3), B=T(I32, 2, 4)) == T(F16, 2, 4, 3)
    assert out("O = scatter(A, B, C);", A=T(F64, 4, 3), B=T(U8, 4), C=T(I8, 7)) == T(F64, 7, 3)
    assert out("O = builtin_softmax(A, 2, 3);", A=T(I32, 2, 3)) == T(F32, 2, 3)
    assert out("O = builtin_logsoftmax(A, 2, 3);", A=T(F64, 2, 3)) == T(F64, 2, 3)
    with pytest.raises(TileTypeError):
        out("O = gather(A, B);", A=T(F16, 5, 3), B=T(F32, 2))
    with pytest.raises(TileShapeError):
        out("O = index(A, 2);", A=T(F16, 2, 5))


# ------------------------------------------------------------------------ broadcasting
@pytest.mark.parametrize("a, b, result", [
    ((2, 3), (3,), (2, 3)), ((4, 1, 3), (5, 1), (4, 5, 3)), ((), (2, 3), (2, 3)), ((1,), (), (1,)),
    ((0, 3), (1, 3), (0, 3)), ((0,), (1,), (0,)), ((2, 1), (1, 2), (2, 2)), ((1, 1), (1,), (1, 1)),
])
def test_broadcasting(a, b, result):
    assert out("O = A + B;", A=T(F32, *a), B=T(I8, *b)) == T(F32, *result)
    assert out("O = B + A;", A=T(F32, *a), B=T(I8, *b)) == T(F32, *result)


@pytest.mark.parametrize("a, b", [((2, 3), (2,)), ((0,), (2,)), ((3, 4), (4, 3))])
def test_broadcasting_errors(a, b):
    with pytest.raises(TileShapeError):
        out("O = A * B;", A=T(F32, *a), B=T(F32, *b))


# ------------------------------------------------------------------------ contractions
@pytest.mark.parametrize("body, dts, agg_results", [
    ("A[i]", (I8,), {"+": I8, "*": I8, ">": I8, "<": I8}),
    ("A[i]", (BOOL,), {"+": I32, "*": I32, ">": BOOL, "<": BOOL}),
    ("A[i]", (F16,), {"+": F16, "*": F16, ">": F16}),
    ("A[i] * B[i]", (I8, F16), {"+": F16, ">": F16}),
    ("A[i] * B[i]", (I32, U32), {"+": I32}),
    ("A[i] + B[i]", (U32, I32), {"+": U32, "<": U32}),
    ("A[i] * B[i]", (BOOL, BOOL), {"+": I32, ">": BOOL}),
    ("A[i] + B[i]", (BOOL, I8), {"+": I8}),
    ("A[i] == B[i]", (F32, I8), {"+": I32, "*": I32, ">": BOOL, "<": BOOL}),
    ("A[i] == B[i] ? C[i]", (F32, F32, I16), {"+": I16, ">": I16}),
    ("A[i] == B[i] ? C[i]", (I8, I8, BOOL), {"+": I32, ">": BOOL}),
])
def test_contraction_dtypes(body, dts, agg_results):
    inputs = {n: T(dt, 4) for n, dt in zip("ABC", dts, strict=False)}
    header = "(" + ", ".join(f"{n}[N]" for n in inputs) + ")"
    for agg, res in agg_results.items():
        assert out(f"O[i: N] = {agg}({body});", header, **inputs) == T(res, 4)
    if ">" in agg_results:  # `=` never widens, like > and <
        assert out(f"O[i: N] = =({body});", header, **inputs) == T(agg_results[">"], 4)


def test_contraction_shapes_from_sizes():
    t = types("function (A[N, M]) -> (O, P, Q, R, S) { O[i, j: M + 1, N / 2] = +(A[j, i]); "
              "P[i: max(N, 7) - min(M, 2)] = >(A[i, j]); Q[i: (N - 7) / 2 + 1] = +(A[i, j]); "
              "R[] = +(A[i, j]); S[i, j: 0, N] = +(A[j, i]); }", A=T(F32, 5, 3))
    assert [t[n].shape for n in "OPQRS"] == [(4, 2), (5,), (0,), (), (0, 5)]  # (5 - 7) / 2 truncates to -1


def test_default_must_have_the_output_shape():
    src = "function (A[N], D[M]) -> (O) { O[i: N] = +(A[i]) default D; }"
    assert types(src, A=T(I8, 3), D=T(F64, 3))["O"] == T(I8, 3)
    with pytest.raises(TileShapeError):
        types(src, A=T(I8, 3), D=T(F64, 4))


# ---------------------------------------------------------------- named constants
def test_named_integer_constants():
    src = ("function (A[N]) -> (O, P, Q) { Pad = (N - 1) / 2; Two = Pad * 2 + 0; "
           "O[i: N + Two] = =(A[i - Pad]), i < N + Pad; P = A + Pad; Q[i: Pad] = +(A[Pad * i + 1]); }")
    bound = bind(parse(src), {"A": T(I8, 5)})
    assert bound.constants["Pad"] == 2 and bound.constants["Two"] == 4
    assert bound.types["O"] == T(I8, 9) and bound.types["P"] == T(I32, 5) and bound.types["Q"] == T(I8, 2)
    c = next(s for s in bound.stmts if isinstance(s, TContraction) and s.name == "O")
    assert c.operands[0].polys == (Affine.build({"i": 1}, -2),)
    assert c.constraints[0].bound == 7
    q = next(s for s in bound.stmts if isinstance(s, TContraction) and s.name == "Q")
    assert q.operands[0].polys == (Affine.build({"i": 2}, 1),)


def test_float_and_tensor_assignments_are_not_constants():
    bound = bind(parse("function (A[N]) -> (O) { H = 1.5; S = A; O = S + H; }"), {"A": T(I8, 1)})
    assert "H" not in bound.constants and "S" not in bound.constants
    assert bound.types["O"] == T(F32, 1)
    with pytest.raises(TileTypeError):
        bind(parse("function (A[N]) -> (O) { H = 1.5; O[i: H] = +(A[i]); }"), {"A": T(I8, 1)})


# ------------------------------------------------------------------ symbolic shapes
def test_symbolic_matmul():
    b = bind_symbolic(parse("function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"))
    assert b.types["C"] == TensorType(F32, (sym("M"), sym("N")))
    assert str(b.types["C"]) == "float32[M, N]"
    assert b.symbolic and b.notes == ()


def test_symbolic_expressions_in_sizes():
    b = bind_symbolic(parse(
        "function (I[N, L, CI], K[LK, CI, CO]) -> (O, P) { "
        "O[n, x, co: N, L - LK + 1, CO] = +(I[n, x + k, ci] * K[k, ci, co]); "
        "P[i: (N + 1) / 2] = >(I[2i, j, k]); }"),
        {"I": I8, "K": I16})
    o = b.types["O"]
    assert o.dtype is I16
    assert sympy.simplify(o.shape[1] - (sym("L") - sym("LK") + 1)) == 0
    assert o.shape[0] == sym("N") and o.shape[2] == sym("CO")
    p = b.types["P"].shape[0]
    assert [p.subs(sym("N"), n) for n in (1, 2, 5)] == [1, 1, 3]


def test_symbolic_dims_shared_across_inputs():
    b = bind_symbolic(parse("function (A[N, K], B[K]) -> (O) { O = A * B; }"))
    assert b.types["O"].shape == (sym("N"), sym("K")) and b.notes == ()
    b = bind_symbolic(parse("function (A[N], B[M]) -> (O) { O = A + B; }"))
    assert len(b.notes) == 1 and "N" in b.notes[0] and "M" in b.notes[0]


def test_partly_concrete_check():
    b = bind_symbolic(parse("function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"),
                      {"A": I8}, {"A": (2, 3)})
    assert b.types["A"] == T(I8, 2, 3)
    assert b.types["B"] == TensorType(F32, (3, sym("N")))  # L is known from A
    assert b.types["C"] == TensorType(F32, (2, sym("N")))


def test_concrete_dims_shared_across_inputs():
    b = bind(parse("function (A[N, K], B[K, M]) -> (C) { C[i, j: N, M] = +(A[i, k] * B[k, j]); }"),
             {"A": T(I8, 2, 3), "B": T(U8, 3, 4)})
    assert b.constants == {"N": 2, "K": 3, "M": 4}
    assert b.types["C"] == T(I8, 2, 4)
