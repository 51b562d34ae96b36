"""Typing a program's inputs: each given type checked against its declaration, its named dimensions
bound as compile-time integers (equal wherever a name recurs), and a 0-D input used as a size
(``tile.size_inputs``) made a dimension holding its array's value (a symbol when none is given)."""

from __future__ import annotations

from collections.abc import Mapping

import sympy

from tile import ast
from tile.binding.scope import Scope
from tile.errors import TileInputError, TileNameError, TileShapeError
from tile.shapes import fmt_shape, same_size
from tile.size_inputs import size_value
from tile.typed import Size, TensorType


def bind_input(
    scope: Scope, inp: ast.Input, given: Mapping[str, TensorType], values: Mapping[str, object]
) -> TensorType:
    """The type of input ``inp``, now in ``scope`` with its dimensions."""
    # A size input is a dimension: an earlier input may have a dimension of its name (the two
    # must then agree, which _size_input checks), as gradient programs declare `DI[N, D0, CI]`.
    dim_first = inp.name in scope.size_uses and inp.name not in scope.defined
    if inp.name in scope.defined or (inp.name in scope.consts and not dim_first):
        raise TileNameError(
            f"'{inp.name}' is already defined",
            inp.span,
            hint="each input and dimension needs its own name",
        )
    if inp.name not in given:
        raise TileInputError(
            f"no value given for input '{inp.name}'", inp.span, hint="pass an array for every input"
        )
    t = given[inp.name]
    scope.defined[inp.name] = inp.span
    if inp.dims is not None:
        _bind_dims(scope, inp, t)
    if inp.name in scope.size_uses:
        t = _size_input(scope, inp, t, values)
    scope.types[inp.name] = t
    return t


def _bind_dims(scope: Scope, inp: ast.Input, t: TensorType) -> None:
    """Each declared dimension of ``inp`` bound to its size in ``t`` (a symbol for an unknown rank)."""
    assert inp.dims is not None
    if t.shape is not None and len(t.shape) != len(inp.dims):
        raise TileInputError(
            f"input '{inp.name}' is declared with {len(inp.dims)} dimension(s) "
            f"[{', '.join(inp.dims)}] but the given array has shape {fmt_shape(t.shape)}",
            inp.span,
            hint="pass an array of the declared rank, or fix the declaration",
        )
    for k, (dim, dspan) in enumerate(zip(inp.dims, inp.dim_spans or [inp.span] * len(inp.dims))):
        if dim in scope.defined and dim not in scope.size_uses:
            raise TileNameError(
                f"dimension '{dim}' has the name of a tensor",
                dspan,
                hint="tensors and dimensions need different names",
            )
        size = t.shape[k] if t.shape is not None else sympy.Symbol(dim, positive=True, integer=True)
        if dim in scope.consts:
            if not same_size(scope.consts[dim], size):
                raise TileInputError(
                    f"dimension '{dim}' is {scope.consts[dim]} from an earlier input but "
                    f"{size} in '{inp.name}' (shape {fmt_shape(t.shape)})",
                    dspan,
                    hint=f"inputs sharing the dimension name '{dim}' must have equal sizes there",
                )
        else:
            scope.consts[dim] = size


def _size_input(scope: Scope, inp: ast.Input, t: TensorType, values: Mapping[str, object]) -> TensorType:
    """Make the 0-D input ``inp``, used as a size, a dimension holding its array's value."""
    use = scope.size_uses[inp.name]
    if t.shape is None:  # symbolic check of an input declared without dims: a size is 0-D
        t = TensorType(t.dtype, ())
    if t.shape != ():
        raise TileShapeError(
            f"input '{inp.name}' is used as a size ({use.what}) but has shape {fmt_shape(t.shape)}",
            use.span,
            hint=f"only a 0-D input can be a size: declare '{inp.name}' without dimensions and pass "
            "one number (e.g. np.int32(8)), or use a dimension of another input",
        )
    if inp.name in values:
        size: Size = size_value(inp.name, values[inp.name], use, inp.span)
    else:
        size = sympy.Symbol(inp.name, positive=True, integer=True)  # as a dimension's
    if inp.name in scope.consts and not same_size(scope.consts[inp.name], size):
        raise TileInputError(
            f"input '{inp.name}' holds {size} but is {scope.consts[inp.name]} as a dimension of an "
            "earlier input",
            inp.span,
            hint=f"a dimension named like the size input '{inp.name}' must have its value",
        )
    scope.consts[inp.name] = size
    return t
