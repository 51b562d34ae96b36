"""Keeping generated expressions shallow: deep parts become temporaries.

A gradient's expressions nest deeper than the ones they differentiate: the adjoint of the deepest
factor of ``A * A * ... * A`` carries every other factor, and a tensor read many times sums as many
contributions, one ``+`` level each (the second gradient of a 63-factor product sums thousands).
Printed, such a program would not parse again (the parser accepts ``MAX_NESTING`` levels), and
every stage that recurses over expressions (dead-code analysis, binder, printer, interpreter, the
next gradient) could run past Python's recursion limit. So, before anything else walks them, the
generated statements pass through ``split_deep``: any subexpression that would make its statement
deeper than the limit is computed by a statement of its own. The walk here is iterative, so it
handles any depth. Splitting keeps the meaning: an elementwise subexpression that reads a tensor
is the same tensor whether it is written inline or named (broadcasting composes, and its type is
the one the binder gives it either way); only tensor arguments of builtins are split off, never
their compile-time parameters, and never a part that reads no tensor (a literal's type depends on
where it stands).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from tile import ast
from tile.builtins import BUILTINS


def split_deep(
    stmts: Iterable[ast.Statement], tensors: set[str], fresh: Callable[[str], str], limit: int
) -> list[ast.Statement]:
    """``stmts`` with each assignment nesting deeper than ``limit`` levels (a name or literal is
    one level, as the parser counts) preceded by new assignments ``<name>_p = <part>`` of its deep
    parts. ``tensors``: the names of tensors (inputs and statements), ``fresh``: a name not yet
    taken, from a base. Parts shared by several places are named once."""
    assert limit >= 2, limit
    out: list[ast.Statement] = []
    for s in stmts:
        if isinstance(s, ast.Assignment):
            parts: list[ast.Statement] = []
            expr = _Splitter(tensors, fresh, f"{s.name}_p", limit, parts).run(s.expr)
            out += parts
            s = s if expr is s.expr else dataclasses.replace(s, expr=expr)
        out.append(s)
    return out


def _children(e: ast.Expr) -> tuple[ast.Expr, ...]:
    if isinstance(e, ast.Binary):
        return (e.lhs, e.rhs)
    if isinstance(e, ast.Unary):
        return (e.operand,)
    if isinstance(e, ast.Ternary):
        return (e.cond, e.then, e.other)
    if isinstance(e, ast.Call):
        return e.args
    return ()


def _rebuilt(e: ast.Expr, kids: list[ast.Expr]) -> ast.Expr:
    if all(a is b for a, b in zip(kids, _children(e))):
        return e
    if isinstance(e, ast.Binary):
        return dataclasses.replace(e, lhs=kids[0], rhs=kids[1])
    if isinstance(e, ast.Unary):
        return dataclasses.replace(e, operand=kids[0])
    if isinstance(e, ast.Ternary):
        return dataclasses.replace(e, cond=kids[0], then=kids[1], other=kids[2])
    assert isinstance(e, ast.Call)
    return dataclasses.replace(e, args=tuple(kids))


def _splittable(e: ast.Expr, k: int) -> bool:
    """Whether child ``k`` of ``e`` is a tensor operand (not a builtin's compile-time parameter)."""
    if isinstance(e, ast.Call):
        b = BUILTINS.get(e.fn)
        return b is not None and k < b.tensors
    return True


class _Splitter:
    def __init__(
        self, tensors: set[str], fresh: Callable[[str], str], base: str, limit: int, out: list[ast.Statement]
    ):
        self.tensors = tensors
        self.fresh = fresh
        self.base = base
        self.limit = limit
        self.out = out
        # id(original node) -> (its new form, height, reads a tensor); the originals stay alive
        self.done: dict[int, tuple[ast.Expr, int, bool]] = {}
        self.named: dict[int, ast.Name] = {}  # id(original part) -> the temporary holding it

    def run(self, root: ast.Expr) -> ast.Expr:
        stack: list[tuple[ast.Expr, bool]] = [(root, False)]
        while stack:
            e, ready = stack.pop()
            if id(e) in self.done:
                continue
            kids = _children(e)
            if kids and not ready:
                stack.append((e, True))
                stack.extend((k, False) for k in reversed(kids) if id(k) not in self.done)
                continue
            self.done[id(e)] = self.visit(e, kids)
        return self.done[id(root)][0]

    def visit(self, e: ast.Expr, kids: tuple[ast.Expr, ...]) -> tuple[ast.Expr, int, bool]:
        if not kids:
            return e, 1, isinstance(e, ast.Name) and e.name in self.tensors
        new = [self.done[id(k)][0] for k in kids]
        heights = [self.done[id(k)][1] for k in kids]
        reads = any(self.done[id(k)][2] for k in kids)
        # Children deep enough to push this node past the limit become temporaries, deepest first.
        for k in sorted(range(len(kids)), key=lambda j: -heights[j]):
            if 1 + max(heights) <= self.limit:
                break
            if heights[k] > 1 and self.done[id(kids[k])][2] and _splittable(e, k):
                new[k] = self.name(kids[k], new[k])
                heights[k] = 1
        return _rebuilt(e, new), 1 + max(heights), reads

    def name(self, part: ast.Expr, expr: ast.Expr) -> ast.Name:
        if id(part) not in self.named:
            temp = self.fresh(self.base)
            self.out.append(ast.Assignment(temp, expr))
            self.tensors.add(temp)
            self.named[id(part)] = ast.Name(temp)
        return self.named[id(part)]
