"""Gradients of programs at the nesting limit (issue 16): no RecursionError at first or second order,
and every printed gradient parses again (``tile.autodiff.nesting`` names deep parts)."""

from __future__ import annotations

import numpy as np

import ref_interp
from tile import ast
from tile.api import grad_values
from tile.autodiff import gradient
from tile.autodiff.nesting import split_deep
from tile.autodiff.simplify import expr_names
from tile.parser import MAX_NESTING, parse
from tile.printer import format_program


def _height(e: ast.Expr) -> int:
    return 1 + max((_height(k) for k in ast.children(e)), default=0)


def _product(depth: int) -> str:
    return "function (A[N]) -> (O) { O = " + " * ".join(["A"] * depth) + "; }"


def test_second_order_gradient_of_the_deepest_product():
    """O = A^d: the first gradient is d*A^(d-1)*DO, the second (seeded with DDA) d(d-1)*A^(d-2)*DO*DDA.
    A in {-1, 1} and small integer seeds keep every value exact."""
    depth = MAX_NESTING  # the deepest product the parser accepts
    prog = parse(_product(depth))
    first = gradient(prog, ["A"])
    assert parse(format_program(first.program)) == first.program  # prints within the limit
    second = gradient(first.program, ["A"])
    assert parse(format_program(second.program)) == second.program
    for s in (*first.program.stmts, *second.program.stmts):
        assert _height(s.expr) <= MAX_NESTING

    a = np.array([1, -1, 1, -1], np.float32)
    do = np.array([1, 2, -1, 3], np.float32)
    dda = np.array([2, 1, 1, -2], np.float32)
    got1 = grad_values(prog, {"A": a}, cotangents={"O": do})["A"]
    np.testing.assert_array_equal(got1, depth * a ** (depth - 1) * do)
    (cot,) = first.cotangents.values()
    feed = {"A": a, cot: do, second.cotangents[first.gradients["A"]]: dda}
    got2 = ref_interp.run(second.program, feed)[second.gradients["A"]]
    np.testing.assert_array_equal(got2, depth * (depth - 1) * a ** (depth - 2) * do * dda)


def test_split_deep_handles_any_depth_and_keeps_the_value():
    """A sum of 3,000 terms (as a second gradient builds): split iteratively, meaning kept."""
    expr: ast.Expr = ast.Name("A")
    for k in range(1, 3000):
        expr = ast.Binary("+", expr, ast.Binary("*", ast.Name("A"), ast.IntLit(k % 5)))
    stmt = ast.Assignment("O", ast.Call("as_float", (expr, ast.IntLit(32))))
    taken = {"A", "O"}

    def fresh(base: str) -> str:
        k = len(taken)
        taken.add(f"{base}_{k}")
        return f"{base}_{k}"

    stmts = split_deep([stmt], {"A"}, fresh, 16)
    assert all(_height(s.expr) <= 16 for s in stmts)
    assert stmts[-1].name == "O" and stmts[-1].expr.args[1] == ast.IntLit(32)  # parameters stay
    assert all(s.name in taken for s in stmts)
    prog = ast.Program((ast.Input("A", ("N",)),), (ast.Output("O"),), tuple(stmts))
    prog = parse(format_program(prog))
    a = np.array([1, -2, 3], np.float32)
    want = a + sum(a * (k % 5) for k in range(1, 3000))
    np.testing.assert_array_equal(ref_interp.run(prog, {"A": a})["O"], want)


def test_split_deep_leaves_shallow_statements_and_tensorless_parts_alone():
    shallow = ast.Assignment("O", ast.Binary("+", ast.Name("A"), ast.IntLit(1)))
    assert split_deep([shallow], {"A"}, lambda b: b + "_x", 4) == [shallow]
    literal: ast.Expr = ast.IntLit(1)
    for _ in range(10):  # no tensor read: its type depends on where it stands, so it stays
        literal = ast.Binary("+", literal, ast.IntLit(1))
    stmt = ast.Assignment("O", ast.Binary("*", ast.Name("A"), literal))
    (out,) = split_deep([stmt], {"A"}, lambda b: b + "_x", 4)
    assert out == stmt and expr_names(out.expr) == {"A"}
