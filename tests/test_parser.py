"""Parser unit tests: every statement form, operator precedence, the printer round trip, and the
exact location of syntax errors."""

from __future__ import annotations

import random

import pytest

from tile import ast
from tile.ast import AggOp, Binary, CombOp, FloatLit, IntLit, Name, Ternary, Unary
from tile.errors import TileSyntaxError
from tile.parser import parse
from tile.printer import format_expr, format_program


def body(stmt: str, header: str = "function (A[N], B[N], C[N], D[N]) -> (O)") -> ast.Statement:
    """The single statement of a small program."""
    p = parse(f"{header} {{ {stmt} }}")
    assert len(p.stmts) == 1
    return p.stmts[0]


def expr(text: str) -> ast.Expr:
    s = body(f"O = {text};")
    assert isinstance(s, ast.Assignment)
    return s.expr


def syntax_error(src: str) -> TileSyntaxError:
    with pytest.raises(TileSyntaxError) as info:
        parse(src)
    return info.value


def B(op, lhs, rhs):  # noqa: N802 - reads like the AST
    return Binary(op, lhs, rhs)


A_, B_, C_, D_, E_ = (Name(n) for n in "ABCDE")


# ------------------------------------------------------------------------------- header
def test_inputs_with_dims_without_dims_and_0d():
    p = parse("function (I0[N0, N1], I1[M0, M1, M2], I2, S[]) -> (O0, O1) { O0 = I2; O1 = S; }")
    assert [(i.name, i.dims) for i in p.inputs] == [
        ("I0", ("N0", "N1")), ("I1", ("M0", "M1", "M2")), ("I2", None), ("S", ())]
    assert p.output_names == ("O0", "O1")
    assert [s.name for s in p.stmts] == ["O0", "O1"]


def test_no_inputs_and_empty_statements():
    p = parse("function () -> (O) { ; O = 3;; ; }")
    assert p.inputs == ()
    assert p.stmts == (ast.Assignment("O", IntLit(3)),)


def test_comments_are_dropped():
    p = parse("// leading\nfunction (A) -> (O) { // after brace\n  O = A // mid-statement\n  + 1; }\n// end")
    assert p.stmts == (ast.Assignment("O", B("+", A_, IntLit(1))),)
    assert parse("function (A) -> (O) { O = A; } // no newline at the end").stmts[0].name == "O"


def test_attributes_are_accepted_and_ignored():
    plain = parse("function (A[N]) -> (O) { O[i: N] = +(A[i]); }")
    for attrs in ("[[pid(x)]]", "[[pid(res2a_branch2a, Conv)]]", "[[hint]] [[pid(a)]]"):
        p = parse(f"function (A[N]) -> (O) {{ {attrs} O[i: N] = +(A[i]); }}")
        assert p == plain


# ------------------------------------------------------------------------- contractions
@pytest.mark.parametrize("spelled, agg", [
    ("= +(", AggOp.SUM), ("= *(", AggOp.PROD), ("= >(", AggOp.MAX), ("= <(", AggOp.MIN),
    ("= =(", AggOp.ASSIGN), ("==(", AggOp.ASSIGN), ("=+(", AggOp.SUM), ("=<(", AggOp.MIN),
])
def test_aggregations(spelled, agg):
    s = body(f"O[i: N] {spelled}A[i]);")
    assert isinstance(s, ast.Contraction)
    assert s.agg is agg and s.comb is CombOp.NONE
    assert s.operands == (ast.TensorRef("A", (Name("i"),)),)


def test_assign_aggregation_spellings_agree():
    a = body("O[i: N] = =(A[i]);")
    assert body("O[i: N] = = (A[i]);") == a
    assert body("O[i: N]= =(A[i]);") == a
    assert body("O[i: N] ==(A[i]);") == a


@pytest.mark.parametrize("comb_text, comb, n", [
    ("A[i] * B[i]", CombOp.MUL, 2), ("A[i] + B[i]", CombOp.ADD, 2),
    ("A[i] == B[i]", CombOp.EQ, 2), ("A[i] == B[i] ? C[i]", CombOp.COND, 3),
])
def test_combinations(comb_text, comb, n):
    s = body(f"O[i: N] = +({comb_text});")
    assert s.comb is comb
    assert [o.name for o in s.operands] == ["A", "B", "C"][:n]


def test_contraction_full_form():
    s = body("O[i, 2 * j + k: N, N / 2] = >(A[i] * B[j - k]), j < 3, i + k < N no_defract default D;",
             "function (A[N], B[N], D[N, M]) -> (O)")
    assert s.output.indices == (Name("i"), B("+", B("*", IntLit(2), Name("j")), Name("k")))
    assert s.sizes == (Name("N"), B("/", Name("N"), IntLit(2)))
    assert s.constraints == (ast.Constraint(Name("j"), IntLit(3)),
                             ast.Constraint(B("+", Name("i"), Name("k")), Name("N")))
    assert s.no_defract and s.default == "D"
    other_order = body("O[i, 2 * j + k: N, N / 2] = >(A[i] * B[j - k]), j < 3, i + k < N "
                       "default D no_defract;", "function (A[N], B[N], D[N, M]) -> (O)")
    assert other_order == s


def test_zero_d_output_and_sizes():
    s = body("O[] = +(A[i]);")
    assert s.output.indices == () and s.sizes == ()  # `O[]` is 0-D
    assert body("O[:] = +(A[i]);") == s
    s = body("O[i] = +(A[i]);")
    assert s.sizes is None  # missing sizes are a bind-time error, not a syntax error
    s = body("S[] = +(A[]);", "function (A[]) -> (S)")
    assert s.operands[0].indices == ()


def test_adjacent_integer_and_index_is_a_product():
    s = body("O[i: N] = +(A[2i + 3j]);")
    assert s.operands[0].indices == (B("+", B("*", IntLit(2), Name("i")), B("*", IntLit(3), Name("j"))),)
    assert body("O[i: N] = +(A[2i + 3j]);") == body("O[i: N] = +(A[2 * i + 3 * j]);")


def test_negative_literals():
    assert expr("-3") == IntLit(-3)
    assert expr("-2.5") == FloatLit("-2.5")
    assert expr("A - -3") == B("-", A_, IntLit(-3))
    assert expr("-A") == Unary("-", A_)
    assert expr("-2147483648") == IntLit(-2147483648)
    assert expr("~A") == Unary("~", A_)
    assert expr("1.5e-3") == FloatLit("1.5e-3")


# ------------------------------------------------------------------------- precedence
@pytest.mark.parametrize("text, tree", [
    ("A + B * C", B("+", A_, B("*", B_, C_))),
    ("A - B - C", B("-", B("-", A_, B_), C_)),
    ("A / B * C", B("*", B("/", A_, B_), C_)),
    ("-A * B", B("*", Unary("-", A_), B_)),
    ("A << B + C", B("<<", A_, B("+", B_, C_))),
    ("A < B << C", B("<", A_, B("<<", B_, C_))),
    ("A == B < C", B("==", A_, B("<", B_, C_))),
    ("A != B", B("!=", A_, B_)),
    ("A & B == C", B("&", A_, B("==", B_, C_))),
    ("A | B ^ C & D", B("|", A_, B("^", B_, B("&", C_, D_)))),
    ("A & B ^ C | D", B("|", B("^", B("&", A_, B_), C_), D_)),
    ("A ^ B ^ C", B("^", B("^", A_, B_), C_)),
    ("~A & B", B("&", Unary("~", A_), B_)),
    ("A | B ? C : D", Ternary(B("|", A_, B_), C_, D_)),
    ("A ? B : C ? D : E", Ternary(A_, B_, Ternary(C_, D_, E_))),
    ("A ? B ? C : D : E", Ternary(A_, Ternary(B_, C_, D_), E_)),
    ("(A ? B : C) ? D : E", Ternary(Ternary(A_, B_, C_), D_, E_)),
    ("(A + B) * C", B("*", B("+", A_, B_), C_)),
    ("(A < B) == C", B("==", B("<", A_, B_), C_)),
])
def test_precedence(text, tree):
    assert expr(text) == tree


def test_calls():
    assert expr("exp(A)") == ast.Call("exp", (A_,))
    assert expr("reshape(A, 2, N * 3)") == ast.Call("reshape", (A_, IntLit(2), B("*", Name("N"), IntLit(3))))
    assert expr("max(A ? B : C, -D)") == ast.Call("max", (Ternary(A_, B_, C_), Unary("-", D_)))


# ---------------------------------------------------------------------- round trip
TUTORIAL = [
    "function (I[M, N]) -> (O) { O[n: N] = +(I[m, n]); }",
    "function (I[M, N]) -> (O) { O[n: N+1] = +(I[m, n]); }",
    "function (A[M, L], B[L, N]) -> (C) {\n    C[i, j: M, N] = +(A[i, k] * B[k, j]);\n}",
    "function (I[M, N]) -> (O) {\n    O[n: N] = >(I[m, n]);\n}",
    "function (I) -> (O) {\n    Neg = -I;\n    O_Neg[] = >(Neg[i, j, k]);\n    O = -O_Neg;\n}",
    "function (I[X, Y]) -> (O) {\n    Sum[y: Y] = +(I[x, y]);\n    O = Sum / X;\n}",
    "function (I[X, Y]) -> (O) {\n    Sum[] = +(I[x, y]);\n    PartialMean = Sum / X;\n"
    "    O = PartialMean / Y;\n}",
    "function (I[X, Y]) -> (O) {\n    Sum[] = +(I[x, y]);\n    O = Sum / (X * Y);\n}",
    "function (I[N]) -> (O) {\n    O[i: N / 2] = >(I[2 * i + j]);\n}",
    "function (I[N]) -> (O) {\n    O[i: N / 2] = >(I[2 * i + j]), j < 2;\n}",
    "function (I[N]) -> (O) {\n    O[i: (N + 1) / 2] = >(I[2 * i + j]), j < 2;\n}",
    "function (I[N, M]) -> (O) {\n    O[2 * i: N] = +(I[2 * i, j]);\n}",
    "function (I[N]) -> (O) {\n    O[i: N] = +(I[k]), i - k < N;\n}",
    "function (I[N]) -> (O) {\n    O[i: N] = +(I[i - j]), j < N;\n}",
    "function (I[N, L, CI], K[LK, CI, CO]) -> (O) {O[n, x, co: N, L - LK + 1, CO] = "
    "+(I[n, x + k, ci] * K[k, ci, co]);}",
    "function (I[N, Lx, Ly, CI], K[LKx, LKy, CI, CO]) -> (O) {\n"
    "    O[n, x, y, co: N, Lx - 2 * (LKx - 1), Ly - 3 * (LKy - 1), CO] =\n"
    "            +(I[n, x + 2 * kx, y + 3 * ky, ci] * K[kx, ky, ci, co]);\n}",
    "function (I0[N0, N1], I1[M0, M1, M2], I2) -> (O0, O1) { O0 = I0; O1 = I1 + I2; }",
    "function (A, B, C, T, E) -> (O1, O2, O3, O4, O5, O6, O7, O8, O9, O10, O11, O12, O13, O14) {\n"
    "    O1 = A + B; O2 = A - B; O3 = A * B; O4 = A / B; O5 = A == B; O6 = A != B; O7 = A < B;\n"
    "    O8 = sqrt(A); O9 = exp(A); O10 = pow(A, B); O11 = sin(A); O12 = tanh(A); O13 = log(A);\n"
    "    O14 = C ? T : E;\n}",
]

MORE = [
    "function () -> (O) { O = 3; }",
    "function (A[N], D[N]) -> (O, P, Q) {\n    [[pid(x)]] O[i: N] = =(A[i]), i < 2 default D no_defract;\n"
    "    P[:] = +(A[i]);\n    Q[i: max(N, 2) - min(N, 1)] = <(A[2i]);\n}",
    "function (A[N], B[N], C[N]) -> (O, P) { O[i: N] ==(A[i] == B[i] ? C[i]); P[] = *(A[i] == B[i]); }",
    "function (A) -> (O) { O = -(-A) - -3 + - -2.5e1 * ~~A; }",
    "function (A, B, C) -> (O) { O = A - (B - C) + (A < B) + (A == (B == C)) + (A << (B << C)); }",
    "function (A, B, C) -> (O) { O = (A ? B : C) ? (A | B) & C : A ? B : C; }",
    "function (A, B, C) -> (O) { O = -(A + B) * ~(A - 1) / (B / C) ^ (A | ~-3); }",
    "function (A) -> (O) { Pad = (3 - 1) / 2; X = A + Pad; O = as_int(X, 8) >> 1.0E+2; }",
    "function (A[N]) -> (O) { O[i: N] = +(A[i / 2 - 1]), -i + 3 < N - 1; }",
]


@pytest.mark.parametrize("src", TUTORIAL + MORE)
def test_round_trip(src):
    p = parse(src)
    text = format_program(p)
    assert parse(text) == p
    assert format_program(parse(text)) == text  # printing is a fixed point
    assert str(p) == text


def test_round_trip_keeps_meaning_of_a_tutorial_program():
    p = parse(TUTORIAL[2])
    (c,) = p.stmts
    assert c.agg is AggOp.SUM and c.comb is CombOp.MUL
    assert [o.name for o in c.operands] == ["A", "B"]
    assert c.operands[0].indices == (Name("i"), Name("k"))
    assert "C[i, j: M, N] = +(A[i, k] * B[k, j]);" in format_program(p)


def _random_expr(rng: random.Random, depth: int) -> ast.Expr:
    """A random tree in the normal form the parser produces (no `-` applied to a literal)."""
    if depth == 0 or rng.random() < 0.2:
        k = rng.randrange(4)
        if k == 0:
            return IntLit(rng.randint(-5, 40))
        if k == 1:
            return FloatLit(rng.choice(["1.5", "-0.25", "2e3", "3.0E-2", "-7.0"]))
        return Name(rng.choice(["A", "B", "C", "N", "X_1"]))
    k = rng.randrange(10)
    sub = lambda: _random_expr(rng, depth - 1)  # noqa: E731
    if k < 6:
        return Binary(rng.choice(list(ast.BINARY_FUNCTIONS)), sub(), sub())
    if k == 6:
        operand = sub()
        op = "~" if isinstance(operand, (IntLit, FloatLit)) else rng.choice("-~")
        return Unary(op, operand)
    if k == 7:
        return Ternary(sub(), sub(), sub())
    return ast.Call(rng.choice(["exp", "max", "f"]), tuple(sub() for _ in range(rng.randint(0, 3))))


def test_random_expressions_round_trip():
    rng = random.Random(1234)
    for _ in range(400):
        e = _random_expr(rng, 4)
        text = format_expr(e)
        assert expr(text) == e, text


# --------------------------------------------------------------------- syntax errors
SYNTAX_ERRORS = [
    ("function (A) -> (O) {\n  O = A + .5;\n}", 2, 11, 2, "'.5'"),
    ("function (A) -> (O) {\n  O = A * 2.;\n}", 2, 11, 2, "'2.'"),
    ("function (A) -> (O) {\n  O = A + 1\n  P = A;\n}", 3, 3, 1, "';'"),
    ("function (A) -> (O) {\n  O = A\n}", 3, 1, 1, "';'"),
    ("function (A, B, C) -> (O) {\n  O = A < B < C;\n}", 2, 13, 1, "chained"),
    ("function (A, B, C) -> (O) { O = A == B != C; }", 1, 40, 2, "chained"),
    ("function (A[N]) -> (O) {\n  O[i: N] = +(A[i]), i <= N;\n}", 2, 24, 2, "'<='"),
    ("function (A[N]) -> (O) {\n  O[i: N] = +(A[i + j]), j >= 0;\n}", 2, 28, 2, "'>='"),
    ("function (A) -> (O) {\n  o = A;\n}", 2, 3, 1, "'o'"),
    ("function (A) -> (O) {\n  O = A;\n  out[i: 3] = +(A[i]);\n}", 3, 3, 3, "'out'"),
    ("function (A) -> (O) {\n  O = !A;\n}", 2, 7, 1, "'!'"),
    ("function (A, B) -> (O) {\n  O = A % B;\n}", 2, 9, 1, "'%'"),
    ("function (A[N]) -> (O) {\n  O[i: N] = A[i];\n}", 2, 13, 1, "aggregation"),
    ("function (A[N]) -> (O) {\n  O[i: N] = -(A[i]);\n}", 2, 13, 1, "aggregation"),
    ("function (A[N]) -> (O) {\n  O[i: N] = +(2 * A[i]);\n}", 2, 15, 1, "'2'"),
    ("function (A[N]) -> (O) {\n  O[i: N] = +(A[i] * 0.5);\n}", 2, 22, 3, "'0.5'"),
    ("function (A[N], B[N]) -> (O) {\n  O[i: N] = +(A[i] - B[i]);\n}", 2, 20, 1, "combination"),
    ("function (A[N]) -> (O[N]) { O = A; }", 1, 22, 1, "'['"),
    ("function (A[N]) -> (O, P[N]) { O = A; }", 1, 25, 1, "'['"),
    ("function (A[N]) -> (O) {\n  O[i: N] = +(A[i] * B[i] ? C[i]);\n}", 2, 27, 1, "conditional"),
    ("function (A) -> (O) { O = A; ", 1, 30, 1, "'}'"),
    ("function (A) -> (O) { O = A; } }", 1, 32, 1, "end of file"),
    ("function (a) -> (O) { O = 1; }", 1, 11, 1, "input name"),
    ("function (A) -> (O) { O = Exp(A); }", 1, 27, 3, "not a function"),
    ("function (A) -> (O) { O = A[0]; }", 1, 28, 1, "indexed"),
]


@pytest.mark.parametrize("src, line, col, length, words", SYNTAX_ERRORS)
def test_syntax_error_positions(src, line, col, length, words):
    e = syntax_error(src)
    assert (e.span.line, e.span.col, e.span.length) == (line, col, length), str(e)
    assert words in e.message
    text = str(e)
    assert text.startswith(f"<string>:{line}:{col}: syntax error: ")
    src_line = src.splitlines()[line - 1] if line <= len(src.splitlines()) else ""
    if src_line:
        shown = text.splitlines()
        assert shown[1] == "    " + src_line
        assert shown[2] == "    " + " " * (col - 1) + "^" + "~" * (min(length, len(src_line) - col + 1) - 1)


@pytest.mark.parametrize("src", [case[0] for case in SYNTAX_ERRORS])
def test_every_syntax_error_has_a_hint(src):
    e = syntax_error(src)
    assert e.hint and str(e).endswith(f"hint: {e.hint}")


def test_syntax_error_hints_suggest_fixes():
    assert "0.5" in syntax_error("function (A) -> (O) { O = .5; }").hint
    assert "2.0" in syntax_error("function (A) -> (O) { O = 2.; }").hint
    assert "'O'" in syntax_error("function (A) -> (O) { o = A; }").hint
    assert "N + 1" in syntax_error("function (A[N]) -> (O) { O[i: N] = +(A[i]), i <= N; }").hint


def test_error_reports_file_name():
    with pytest.raises(TileSyntaxError) as info:
        parse("function (A) -> (O) {\n  O = A +;\n}", "prog.tile")
    assert str(info.value).startswith("prog.tile:2:10: syntax error: expected an expression, found ';'")
