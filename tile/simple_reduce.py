"""``simple_reduce(T, d1, ..., dk)``: sum T down to a trailing-aligned shape, as a ``+`` contraction.

PlaidML's gradients emit it to undo broadcasting, and its TypeCheck rewrites it into a contraction
before anything else sees it; so does the binder here (``as_contraction``), so the interpreter,
every transform, every backend and autodiff get it as an ordinary contraction. With ``r`` the rank
of T, the target sizes align with T's last ``k`` dimensions; T's first ``r - k`` dimensions are
summed, and so is every aligned dimension whose target size is 1::

    R = simple_reduce(T, 1, N);      // T[A, B, N]
    R[0, i2: 1, N] = +(T[i0, i1, i2]);

A target size must be 1 or T's size there. The call must be the whole right-hand side of its
statement (PlaidML's programs write it so; a nested call is an error with a hint).
"""

from __future__ import annotations

from collections.abc import Callable

from tile import ast
from tile.errors import Span, TileShapeError, TileTypeError
from tile.shapes import fmt_shape, is_concrete, may_equal
from tile.typed import Size, TensorType

_FORM = "R = simple_reduce(T, d1, ..., dk);"


def is_simple_reduce(e: ast.Expr) -> bool:
    return isinstance(e, ast.Call) and e.fn == "simple_reduce"


def nested_rule(types, params, span, names, notes) -> TensorType:
    """The type rule met only by a call nested inside an expression: always an error."""
    raise TileTypeError(
        "simple_reduce must be the whole right-hand side of its statement",
        span,
        hint=f"give the reduction its own name: {_FORM}",
    )


def as_contraction(
    stmt: ast.Assignment,
    source: Callable[[str, Span], TensorType],
    size: Callable[[ast.Expr], Size],
    notes: list[str],
) -> ast.Contraction:
    """The ``+`` contraction ``stmt`` (``R = simple_reduce(T, d..)``) stands for.

    ``source(name, span)`` gives the type of the tensor named by the first argument, ``size`` the
    value of a size argument.
    """
    call = stmt.expr
    assert isinstance(call, ast.Call)
    if not call.args or not isinstance(call.args[0], ast.Name) or call.args[0].is_index:
        raise TileTypeError(
            "simple_reduce reduces a tensor named by its first argument",
            call.span,
            hint=f"compute the operand in a statement of its own first: {_FORM}",
        )
    tensor = call.args[0]
    t = source(tensor.name, tensor.span)
    targets = [size(a) for a in call.args[1:]]
    if t.shape is None:
        raise TileShapeError(
            f"the rank of '{tensor.name}' is unknown, so simple_reduce cannot align its sizes",
            call.span,
            hint=f"declare its dimensions, e.g. {tensor.name}[N, M]",
        )
    rank, k = len(t.shape), len(targets)
    if k > rank:
        raise TileShapeError(
            f"simple_reduce of '{tensor.name}' with shape {fmt_shape(t.shape)} to {k} sizes: "
            "a reduction cannot add dimensions",
            call.span,
            hint="give at most one size per dimension of the operand, aligned from the right",
        )
    out_idx: list[ast.Expr] = []
    for j, (want, arg) in enumerate(zip(targets, call.args[1:])):
        have = t.shape[rank - k + j]
        one = is_concrete(want) and want == 1
        if not one and not may_equal(want, have, notes, "simple_reduce size"):
            raise TileShapeError(
                f"simple_reduce of '{tensor.name}' with shape {fmt_shape(t.shape)} to "
                f"{fmt_shape(tuple(targets))}: size {want} is neither 1 nor {have}",
                arg.span,
                hint="each size, aligned from the right, is 1 (summed) or the operand's size (kept)",
            )
        out_idx.append(ast.IntLit(0, arg.span) if one else ast.Name(f"i{rank - k + j}", arg.span))
    operand = ast.TensorRef(
        tensor.name, tuple(ast.Name(f"i{d}", tensor.span) for d in range(rank)), tensor.span
    )
    return ast.Contraction(
        ast.TensorRef(stmt.name, tuple(out_idx), stmt.span),
        tuple(call.args[1:]),
        ast.AggOp.SUM,
        ast.CombOp.NONE,
        (operand,),
        span=stmt.span,
    )
