"""Binding: names, shapes and dtypes of a program given its inputs' types.

``bind(program, {name: TensorType})`` checks every rule that needs sizes (ranks, dimension
agreement, broadcasting, linear index polynomials, output sizes) and returns the typed program.
``bind_symbolic(program)`` does the same with one sympy symbol per input dimension, for
``python -m tile check`` without ``--shape``. A 0-D input used as a size (``tile.size_inputs``) is
a dimension whose value comes from its array: ``bind`` reads it from ``values``, and without one
(always in ``bind_symbolic``) it is a symbol too.
"""

from __future__ import annotations

from collections.abc import Mapping

import sympy

from tile import ast
from tile.asserts import check_assert, is_assert
from tile.binding.contraction import Contractions
from tile.binding.elementwise import Elementwise
from tile.binding.inputs import bind_input
from tile.binding.scope import Scope
from tile.dtypes import DType
from tile.errors import TileNameError
from tile.gc_pause import paused_gc
from tile.prng import pair_prng, state_inputs
from tile.shapes import is_concrete
from tile.simple_reduce import as_contraction, is_simple_reduce
from tile.size_inputs import size_uses
from tile.typed import BoundProgram, TAssign, TContraction, TensorType, TStatement


@paused_gc()  # a long program is hundreds of thousands of objects: no cycle hunts meanwhile
def bind(
    program: ast.Program, inputs: Mapping[str, TensorType], values: Mapping[str, object] | None = None
) -> BoundProgram:
    """Type ``program`` for inputs of the given types; every input must be given.

    ``values`` holds the arrays (or numbers) of the inputs, of which only the 0-D inputs used as
    sizes are read: their values are sizes, so they are part of the typed program. A size input
    missing from ``values`` gets a symbolic size.
    """
    return _Binder(program, inputs, values).run()


def bind_symbolic(
    program: ast.Program,
    dtypes: Mapping[str, DType] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> BoundProgram:
    """Type ``program`` with symbolic sizes (sympy) for inputs whose shape is not given.

    Inputs default to float32 (int32 when used as a size, uint32 when a PRNG state). An input
    declared without dims and without a given shape has an unknown rank; results depending on it
    elementwise have an unknown shape.
    """
    dtypes = dict(dtypes or {})
    shapes = dict(shapes or {})
    sizes = size_uses(program)
    for name in sizes:
        dtypes.setdefault(name, DType.INT32)  # a size is a whole number
    for name in state_inputs(program):
        dtypes.setdefault(name, DType.UINT32)  # a PRNG state is uint32
    known: dict[str, int] = {}  # dims fixed by the inputs whose shapes are given
    for inp in program.inputs:
        if inp.name in shapes and inp.dims is not None and len(inp.dims) == len(shapes[inp.name]):
            for d, size in zip(inp.dims, shapes[inp.name]):
                known.setdefault(d, int(size))
    types: dict[str, TensorType] = {}
    for inp in program.inputs:
        dt = dtypes.get(inp.name, DType.FLOAT32)
        if inp.name in shapes:
            types[inp.name] = TensorType(dt, tuple(shapes[inp.name]))
        elif inp.dims is None:
            types[inp.name] = TensorType(dt, None)
        else:
            types[inp.name] = TensorType(
                dt, tuple(known.get(d, sympy.Symbol(d, positive=True, integer=True)) for d in inp.dims)
            )
    # A size input naming a dimension that a given shape fixes has that value (`function (S, A[S])`).
    return _Binder(program, types, {n: known[n] for n in sizes if n in known}).run()


class _Binder:
    """Binds a program statement by statement, in order: its inputs (``tile.binding.inputs``), then
    each statement (a contraction by ``tile.binding.contraction``, an elementwise assignment by
    ``tile.binding.elementwise``; a ``simple_reduce`` is a contraction, an ``assert_`` a constant),
    then its outputs; ``tile.binding.scope`` holds the names bound so far."""

    def __init__(
        self,
        program: ast.Program,
        inputs: Mapping[str, TensorType],
        values: Mapping[str, object] | None = None,
    ):
        self.program = program
        self.given = inputs
        self.values = values or {}
        self.scope = Scope(program)
        self.contractions = Contractions(self.scope)
        self.elementwise = Elementwise(self.scope)

    def run(self) -> BoundProgram:
        scope = self.scope
        inputs = tuple(
            (inp.name, bind_input(scope, inp, self.given, self.values)) for inp in self.program.inputs
        )
        stmts: list[TStatement] = []
        for stmt in self.program.stmts:
            scope.check_new_name(
                stmt.name, stmt.output.span if isinstance(stmt, ast.Contraction) else stmt.span
            )
            if isinstance(stmt, ast.Assignment):
                bound: TStatement = self.assignment(stmt)
            else:
                bound = self.contractions.bind(stmt)
            stmts.append(bound)
            scope.types[stmt.name] = bound.type
            scope.defined[stmt.name] = stmt.span
        outputs = self.outputs()
        return BoundProgram(
            self.program,
            inputs,
            pair_prng(stmts, [(o.name, o.span) for o in self.program.outputs]),
            outputs,
            dict(scope.types),
            dict(scope.consts),
            tuple(scope.notes),
        )

    def assignment(self, stmt: ast.Assignment) -> TAssign | TContraction:
        scope = self.scope
        if is_simple_reduce(stmt.expr):
            size = lambda e: scope.const(e, "a size of simple_reduce")  # noqa: E731
            return self.contractions.bind(as_contraction(stmt, scope.lookup_tensor, size, scope.notes))
        if is_assert(stmt.expr):
            value = check_assert(stmt.expr, lambda e: scope.const(e, "an assertion"), scope.notes)
            scope.consts[stmt.name] = value.value
            return TAssign(stmt.name, value, stmt.span)
        expr = self.elementwise.expr(stmt.expr)
        if expr.type.dtype.is_int and expr.type.shape == ():
            value = scope.try_const(stmt.expr)
            if value is not None:
                # The constant is the value its integer tensor holds, wrap-around included.
                scope.consts[stmt.name] = _wrap(value, expr.type.dtype) if is_concrete(value) else value
        return TAssign(stmt.name, expr, stmt.span)

    def outputs(self) -> tuple[str, ...]:
        """The outputs' names, each computed by a statement and listed once."""
        outputs: list[str] = []
        for out in self.program.outputs:
            if out.name in self.given:
                raise TileNameError(
                    f"output '{out.name}' is an input",
                    out.span,
                    hint=f"outputs are computed: write `Out = {out.name};` and return Out",
                )
            if out.name not in self.scope.types:
                raise TileNameError(
                    f"output '{out.name}' is never computed",
                    out.span,
                    hint=f"add a statement `{out.name} = ...;` to the function body",
                )
            if out.name in outputs:
                raise TileNameError(
                    f"output '{out.name}' is listed twice",
                    out.span,
                    hint="list each output once in `-> (...)`",
                )
            outputs.append(out.name)
        return tuple(outputs)


def _wrap(value: int, dtype: DType) -> int:
    mod = 1 << dtype.bits
    v = value % mod
    return v - mod if dtype.is_signed and v >= mod >> 1 else v
