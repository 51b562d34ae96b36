"""0-D inputs used as sizes: which inputs a program needs as compile-time integers, and their values.

PlaidML's op library passes some sizes as 0-D inputs: a transposed convolution takes its output
size ``D0`` as an input and computes its padding from it (``Pad0 = ... D0 ...;``). Such an input
is a dimension whose value comes from the bound array instead of from a shape, so it must hold a
non-negative whole number, and that number is part of what the program is compiled for.

Which inputs are sizes is read from the source alone (no types needed), so the API can key its
compiled programs on their values before binding, and ``tile check`` can treat them as symbolic
sizes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from tile import ast
from tile.builtins import BUILTINS, VALUE_FREE_PARAMS
from tile.errors import Span, TileInputError
from tile.typed import BoundProgram


@dataclass(frozen=True, slots=True)
class SizeUse:
    """Where an input is first used as a size, and in what role (for error messages)."""

    span: Span
    what: str  # "in an output size", "through 'Pad0', in an index expression", ...


def size_uses(program: ast.Program) -> dict[str, SizeUse]:
    """Each input the program uses as a size, with its first such use.

    A use as a size is a name in an output size, a constraint, an index expression, a
    compile-time builtin argument (``reshape(I, D0, 3)``) or another input's dimensions
    (``function (D0, DI[N, D0])``, as gradient programs declare), or in the right-hand side of an
    assignment whose name is itself used as a size: named constants such as
    ``Pad0 = (D0 - 1) / 2;`` pass the use on to the names they are computed from.
    """
    uses: dict[str, list[SizeUse]] = {}

    def add(e: ast.Expr, what: str) -> None:
        for name in _names(e):
            uses.setdefault(name.name, []).append(SizeUse(name.span, what))

    inputs = {i.name for i in program.inputs}
    for inp in program.inputs:  # `function (D0, DI[N, D0, CI])`: D0 names a dimension
        for dim, span in zip(inp.dims or (), inp.dim_spans or [inp.span] * len(inp.dims or ())):
            if dim in inputs:
                uses.setdefault(dim, []).append(SizeUse(span, f"as a dimension of '{inp.name}'"))
    for stmt in program.stmts:
        if isinstance(stmt, ast.Contraction):
            for s in stmt.sizes or ():
                add(s, "in an output size")
            for k in stmt.constraints:
                add(k.poly, "in a constraint")
                add(k.bound, "in a constraint bound")
            for ref in (stmt.output, *stmt.operands):
                for i in ref.indices:
                    add(i, "in an index expression")
        else:
            for fn, arg in _builtin_params(stmt.expr):
                add(arg, f"as an argument of '{fn}'")
    # A named constant's own uses are all later in the program, so walking backwards sees each
    # one before the statement that defines it.
    for stmt in reversed(program.stmts):
        if isinstance(stmt, ast.Assignment) and stmt.name in uses:
            add(stmt.expr, f"through '{stmt.name}', {_first(uses[stmt.name]).what}")
    return {n: _first(us) for n, us in uses.items() if n in inputs}


def _first(uses: list[SizeUse]) -> SizeUse:
    return min(uses, key=lambda u: (u.span.line, u.span.col))


def size_value(name: str, value: object, use: SizeUse, declared: Span | None) -> int:
    """The size a 0-D input holds: a whole number from 0 to 2**63 - 1, else a located error."""
    v = np.asarray(value).item()
    used = f"input '{name}' is used as a size ({use.what}) but holds {v}"
    where = f" (declared at line {declared.line})" if declared is not None and declared.line else ""
    hint = (
        f"an input used as a size must hold a non-negative whole number: pass e.g. "
        f"np.int32(8) for '{name}'{where}"
    )
    if isinstance(v, float) and not (math.isfinite(v) and v == int(v)):
        raise TileInputError(f"{used}, which is not a whole number", use.span, hint)
    v = int(v)
    if v < 0:
        raise TileInputError(f"{used}, which is negative", use.span, hint)
    if v >= 2**63:
        raise TileInputError(f"{used}, which does not fit in int64", use.span, hint)
    return v


def size_key(names: Mapping[str, SizeUse], arrays: Mapping[str, object]) -> tuple:
    """The values of the size inputs among ``arrays``, for keying what was compiled for them.

    An array that is not one number keys as ``None``: binding refuses it before anything is kept.
    """
    out = []
    for n in sorted(names):
        if n in arrays:
            arr = np.asarray(arrays[n])
            out.append((n, arr.item() if arr.size == 1 else None))
    return tuple(out)


def require_sizes(bound: BoundProgram) -> None:
    """Refuse to run a program bound without its size inputs' values (or bound symbolically):
    it has no sizes to run with."""
    unknown = {n for n, v in bound.constants.items() if not isinstance(v, int)}
    if not unknown:
        return
    where = [i.span for i in bound.program.inputs if i.name in unknown or unknown & set(i.dims or ())]
    raise TileInputError(
        f"the program was bound with symbolic sizes ({', '.join(sorted(unknown))}); it cannot run",
        where[0] if where else None,
        hint="bind it to its inputs: bind(program, input_types(program, arrays), arrays) gives "
        "0-D inputs used as sizes their values",
    )


def _names(e: ast.Expr) -> Iterator[ast.Name]:
    """The upper-case names (dimensions, constants, tensors) used in ``e``."""
    if isinstance(e, ast.Name):
        if not e.is_index:
            yield e
    for c in ast.children(e):
        yield from _names(c)


def _builtin_params(e: ast.Expr) -> Iterator[tuple[str, ast.Expr]]:
    """``(function, argument)`` for the compile-time integer arguments of the builtin calls in ``e``."""
    if not isinstance(e, ast.Call):
        for c in ast.children(e):
            yield from _builtin_params(c)
    else:
        b = BUILTINS.get(e.fn)
        # A call of the wrong arity has no compile-time arguments: binding reports its arity.
        nparams = len(e.args) - b.tensors if b is not None else -1
        ok = b is not None and nparams >= 0 and (b.params < 0 or nparams == b.params)
        ntensors = b.tensors if ok else len(e.args)
        for a in e.args[:ntensors]:
            yield from _builtin_params(a)
        for a in e.args[ntensors:]:
            if e.fn in VALUE_FREE_PARAMS:  # any scalar will do there: an input is no size
                yield from _builtin_params(a)
            else:
                yield e.fn, a
