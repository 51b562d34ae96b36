"""The names a program has bound so far, and the integers known at compile time.

``Scope`` holds the tables every part of the binder reads: tensor types, compile-time integers
(dimensions, size inputs, integer scalars with a known value), where each name was defined, and the
notes for the user. It answers lookups with located errors (an unknown name suggests a close one)
and evaluates compile-time integer expressions (``const``).
"""

from __future__ import annotations

from tile import ast
from tile.errors import Span, TileNameError, TileTypeError, unknown_name
from tile.shapes import size_binop
from tile.size_inputs import size_uses
from tile.typed import Size, TensorType


class Scope:
    def __init__(self, program: ast.Program):
        self.size_uses = size_uses(program)  # the 0-D inputs used as sizes, by name
        self.types: dict[str, TensorType] = {}
        self.consts: dict[str, Size] = {}
        self.defined: dict[str, Span] = {}
        self.notes: list[str] = []
        self.later = {s.name: s.span for s in program.stmts}

    # ------------------------------------------------------------------------- names
    def check_new_name(self, name: str, span: Span) -> None:
        if name in self.defined or name in self.consts:
            where = self.defined.get(name)
            at = f" (first defined at line {where.line})" if where is not None and where.line else ""
            raise TileNameError(
                f"'{name}' is already defined{at}",
                span,
                hint="Tile values are immutable: give the new value a new name",
            )
        if name[0].islower():
            raise TileNameError(
                f"'{name}' must start with an upper-case letter",
                span,
                hint=f"tensor names start with an upper-case letter: '{name.capitalize()}'",
            )

    def lookup_tensor(self, name: str, span: Span) -> TensorType:
        if name in self.types:
            return self.types[name]
        if name in self.consts:
            raise TileTypeError(
                f"'{name}' is a dimension, not a tensor",
                span,
                hint="dimensions can be used in sizes, index expressions and elementwise code",
            )
        raise self.unknown(name, span)

    def unknown(self, name: str, span: Span) -> TileNameError:
        return unknown_name(name, span, [*self.types, *self.consts], self.later)

    # ---------------------------------------------------------- compile-time integers
    def try_const(self, e: ast.Expr) -> Size | None:
        try:
            return self.const(e, "")
        except (TileTypeError, TileNameError):
            return None

    def const(self, e: ast.Expr, what: str) -> Size:
        """An integer expression of dimensions and integer constants; ``/`` truncates."""
        if isinstance(e, ast.IntLit):
            return e.value
        if isinstance(e, ast.Name):
            if e.name in self.consts:
                return self.consts[e.name]
            if e.is_index:
                raise TileTypeError(
                    f"index '{e.name}' cannot be used in {what}",
                    e.span,
                    hint="sizes and bounds are built from dimensions and integers",
                )
            if e.name in self.types:
                raise TileTypeError(
                    f"tensor '{e.name}' cannot be used in {what}",
                    e.span,
                    hint="only dimensions and integer constants are known at compile time",
                )
            raise self.unknown(e.name, e.span)
        if isinstance(e, ast.Unary) and e.op == "-":
            return size_binop("-", 0, self.const(e.operand, what))
        if isinstance(e, ast.Binary) and e.op in "+-*/":
            return size_binop(e.op, self.const(e.lhs, what), self.const(e.rhs, what))
        if isinstance(e, ast.Call) and e.fn in ("max", "min") and len(e.args) == 2:
            return size_binop(e.fn, self.const(e.args[0], what), self.const(e.args[1], what))
        raise TileTypeError(
            f"{what or 'this'} must be an integer expression of dimensions",
            e.span,
            hint="use integers, dimensions, + - * / (truncating), max and min",
        )
