"""``assert_<name>(c)``: a check of sizes when the program is bound, as PlaidML's op library writes it.

PlaidML 0.7's own ``plaidml/op.py`` emits them: grouped and depthwise convolutions (Keras'
``depthwise_conv2d``) add ``Assert = assert_group_count(G == CI);`` and the Winograd convolution
``Assert = assert_winograd_valid(BI - CI + 1 == BO);``. So a port of that library meets them, and
the binder accepts them: the call must be the whole right-hand side of its statement, ``c`` an
integer expression of dimensions and integer constants, optionally one comparison
(``== != < > <= >=``) of two such expressions. ``c == 0`` is a located ``TileShapeError`` naming
the assertion; otherwise the statement is the int32 constant ``c`` (1 for a true comparison).
With symbolic sizes (``tile check``) a condition that cannot be decided is assumed true and the
assumption is noted. (PlaidML itself checked them only on its direct path, and its composer
dropped the unused ``Assert`` value, so there they often went unchecked.)
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import sympy

from tile import ast
from tile.dtypes import DType
from tile.errors import TileShapeError
from tile.shapes import is_concrete
from tile.typed import Size, TConst, TensorType

_COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, ">": operator.gt, "<=": operator.le}
_COMPARE[">="] = operator.ge
_SYMBOLIC = {"==": sympy.Eq, "!=": sympy.Ne, "<": sympy.Lt, ">": sympy.Gt, "<=": sympy.Le, ">=": sympy.Ge}


def is_assert(e: ast.Expr) -> bool:
    return isinstance(e, ast.Call) and e.fn.startswith("assert_")


def check_assert(call: ast.Call, size: Callable[[ast.Expr], Size], notes: list[str]) -> TConst:
    """The int32 constant an ``assert_<name>(c)`` statement holds; a located error when c is 0."""
    if len(call.args) != 1:
        raise TileShapeError(
            f"'{call.fn}' takes one condition, got {len(call.args)} argument(s)",
            call.span,
            hint=f"e.g. Assert = {call.fn}(G == CI);",
        )
    (cond,) = call.args
    if isinstance(cond, ast.Binary) and cond.op in _COMPARE:
        lhs, rhs = size(cond.lhs), size(cond.rhs)
        if is_concrete(lhs) and is_concrete(rhs):
            value: Size = int(_COMPARE[cond.op](lhs, rhs))
        else:
            decided = sympy.simplify(_SYMBOLIC[cond.op](lhs, rhs))
            value = 1 if decided is sympy.true else 0 if decided is sympy.false else None
            if value is None:
                notes.append(f"assumed {lhs} {cond.op} {rhs} ({call.fn})")
                value = 1
    else:
        value = size(cond)
    if is_concrete(value) and value == 0:
        raise TileShapeError(
            f"assertion {call.fn} failed: {_show(cond)} is false for these sizes",
            call.span,
            hint="the program's author requires this of the input sizes; check the shapes passed",
        )
    return TConst(value, TensorType(DType.INT32, ()), call.span)


def _show(e: ast.Expr) -> str:
    from tile.printer import format_expr

    return format_expr(e)
