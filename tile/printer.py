"""Tile text from the syntax tree: ``parse(format_program(p)) == p``.

Expressions get the fewest parentheses the grammar in ``tile.parser`` needs; statements are
printed one per line, indented four spaces, in the spelling the parser accepts (``= =(`` for the
assign aggregation, ``A[..] == B[..] ? C[..]`` for the conditional combination).
"""

from __future__ import annotations

from tile import ast

# Binding strength of each operator (higher binds tighter); mirrors tile.parser._LEVELS.
_LEVEL = {
    "|": 1,
    "^": 2,
    "&": 3,
    "==": 4,
    "!=": 4,
    "<": 5,
    ">": 5,
    "<=": 5,
    ">=": 5,
    "<<": 6,
    ">>": 6,
    "+": 7,
    "-": 7,
    "*": 8,
    "/": 8,
}
_NONASSOC = {4, 5}
_UNARY, _PRIMARY = 9, 10


def _level(e: ast.Expr) -> int:
    if isinstance(e, ast.Ternary):
        return 0
    if isinstance(e, ast.Binary):
        return _LEVEL[e.op]
    if isinstance(e, ast.Unary):
        return _UNARY
    if isinstance(e, (ast.IntLit, ast.FloatLit)) and _text(e).startswith("-"):
        return _UNARY
    return _PRIMARY


def _text(e: ast.IntLit | ast.FloatLit) -> str:
    return str(e.value) if isinstance(e, ast.IntLit) else e.text


def _wrap(e: ast.Expr, need: bool) -> str:
    s = format_expr(e)
    return f"({s})" if need else s


def format_expr(e: ast.Expr) -> str:
    """One expression in Tile syntax."""
    if isinstance(e, (ast.IntLit, ast.FloatLit)):
        return _text(e)
    if isinstance(e, ast.Name):
        return e.name
    if isinstance(e, ast.Call):
        return f"{e.fn}({', '.join(format_expr(a) for a in e.args)})"
    if isinstance(e, ast.Unary):
        inner = _wrap(e.operand, _level(e.operand) < _UNARY)
        # `- -x` must not print as `--x`; `-(-3)` keeps its parentheses to stay a Unary.
        if inner.startswith("-") or (isinstance(e.operand, (ast.IntLit, ast.FloatLit))):
            inner = f"({inner})"  # `inner` is unwrapped here; reuse it (formatting twice was exponential)
        return f"{e.op}{inner}"
    if isinstance(e, ast.Binary):
        lvl = _LEVEL[e.op]
        strict = lvl in _NONASSOC
        lhs = _wrap(e.lhs, _level(e.lhs) < lvl or (strict and _level(e.lhs) == lvl))
        rhs = _wrap(e.rhs, _level(e.rhs) <= lvl)
        return f"{lhs} {e.op} {rhs}"
    if isinstance(e, ast.Ternary):
        cond = _wrap(e.cond, _level(e.cond) == 0)
        return f"{cond} ? {format_expr(e.then)} : {format_expr(e.other)}"
    raise AssertionError(f"unknown expression node {e!r}")


def format_ref(r: ast.TensorRef) -> str:
    return f"{r.name}[{', '.join(format_expr(i) for i in r.indices)}]"


def format_combination(comb: ast.CombOp, operands: list[str]) -> str:
    """The inside of ``agg(...)``: ``A[..]``, ``A[..] * B[..]`` or ``A[..] == B[..] ? C[..]``."""
    if comb is ast.CombOp.NONE:
        return operands[0]
    if comb is ast.CombOp.COND:
        return f"{operands[0]} == {operands[1]} ? {operands[2]}"
    return f" {comb.value} ".join(operands)


def format_statement(s: ast.Statement) -> str:
    """One statement, with its semicolon."""
    if isinstance(s, ast.Assignment):
        return f"{s.name} = {format_expr(s.expr)};"
    out = ", ".join(format_expr(i) for i in s.output.indices)
    if s.sizes:
        out = f"{out}: {', '.join(format_expr(x) for x in s.sizes)}"
    elif s.sizes is not None and s.output.indices:
        out = f"{out}:"
    body = format_combination(s.comb, [format_ref(o) for o in s.operands])
    text = f"{s.output.name}[{out}] = {s.agg.value}({body})"
    for c in s.constraints:
        text += f", {format_expr(c.poly)} < {format_expr(c.bound)}"
    if s.no_defract:
        text += " no_defract"
    if s.default is not None:
        text += f" default {s.default}"
    return text + ";"


def format_program(p: ast.Program) -> str:
    """A whole function, one statement per line."""

    def inp(i: ast.Input) -> str:
        return i.name if i.dims is None else f"{i.name}[{', '.join(i.dims)}]"

    head = f"function ({', '.join(inp(i) for i in p.inputs)}) -> ({', '.join(p.output_names)}) {{"
    body = [f"    {format_statement(s)}" for s in p.stmts]
    return "\n".join([head, *body, "}"]) + "\n"
