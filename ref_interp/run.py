"""The interpreter's entry point: ``run(program, inputs, precision=...) -> outputs``."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ref_interp import contraction
from ref_interp.elementwise import apply
from ref_interp.numerics import Numerics
from tile import ast
from tile.bind import bind
from tile.dtypes import DType
from tile.errors import TileIndexError
from tile.inputs import input_types
from tile.parser import parse
from tile.size_inputs import require_sizes
from tile.transforms import FlatContraction, apply_stage, as_contraction
from tile.typed import BoundProgram, TAssign, TCall, TConst, TExpr, TRef


def as_program(source: str | ast.Program, name: str = "<string>") -> ast.Program:
    return parse(source, name) if isinstance(source, str) else source


def run(
    program: str | ast.Program | BoundProgram,
    inputs: Mapping[str, np.ndarray] | None = None,
    precision: str = "native",
    *,
    max_points: int | None = None,
    stage: str = "tile",
    name: str = "<string>",
) -> dict[str, np.ndarray]:
    """Evaluate a Tile program exactly as the language defines it.

    ``program`` is Tile source text, a parsed ``Program`` or a ``BoundProgram``; ``inputs`` maps
    each declared input to an array. ``precision`` is ``native`` (declared dtypes), ``float64``
    (float tensors in float64), ``exact`` (float tensors as ``Fraction`` object arrays), or
    ``tf32`` / ``3xtf32`` (native, with float32 matrix products' operands rounded as a matrix unit
    does; docs/semantics.md §8.1.1).
    ``stage`` evaluates the contractions after a transform (``reduced``, ``defracted`` or
    ``flat``, see ``tile.transforms``); every stage has the same meaning, so the same answer.
    Returns every output by name.
    """
    nx = Numerics(precision)
    inputs = dict(inputs or {})
    if isinstance(program, BoundProgram):
        bound = program
        require_sizes(bound)
    else:
        prog = as_program(program, name)
        bound = bind(prog, input_types(prog, inputs), inputs)
    written = {s.name: s for s in bound.stmts}  # as written, for locating errors of later stages
    bound = apply_stage(bound, stage)
    env: dict[str, np.ndarray] = {}
    for in_name, t in bound.inputs:
        env[in_name] = nx.cast(np.asarray(inputs[in_name]), t.dtype)
    for stmt in bound.stmts:
        if isinstance(stmt, TAssign):
            value = nx.cast(_eval(stmt.expr, env, nx), stmt.type.dtype)
            env[stmt.name] = np.broadcast_to(value, stmt.type.shape)
        elif isinstance(stmt, FlatContraction):
            flat_env = {k: v.reshape(-1) for k, v in env.items()}
            box = {v: (0, r - 1) for v, r in zip(stmt.names, stmt.ranges)}
            try:
                value = contraction.evaluate(
                    as_contraction(stmt), flat_env, nx, max_points, box, stmt.type.shape
                )
            except TileIndexError:
                # The flat form has lost the source's conditions: let the contraction as written
                # name the one that empties the index space (it is empty too).
                contraction.evaluate(written[stmt.name], env, nx, max_points)
                raise
            env[stmt.name] = value.reshape(stmt.type.shape)
        else:
            env[stmt.name] = contraction.evaluate(stmt, env, nx, max_points)
    return {o: np.array(env[o], copy=True) for o in bound.outputs}


def _eval(e: TExpr, env: dict[str, np.ndarray], nx: Numerics) -> np.ndarray:
    if isinstance(e, TConst):
        # A float literal keeps its exact decimal value until the operation that uses it converts
        # it to that operation's type: `X_f64 * 0.1` multiplies by the double nearest 0.1.
        return nx.const(e.value, DType.FLOAT64 if e.type.dtype.is_float else e.type.dtype)
    if isinstance(e, TRef):
        return env[e.name]
    assert isinstance(e, TCall)
    return apply(nx, e, [_eval(a, env, nx) for a in e.args])
