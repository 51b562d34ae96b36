"""Forward mode (Jacobian-vector products) from reverse mode, Tile to Tile.

A program's gradient program ``g(x, u) = J(x)^T u`` (``tile.autodiff.gradient``) is linear in the
cotangents ``u``, so the Jacobian-vector product is its gradient with respect to ``u``, seeded with
the tangents ``t``: ``J(x) t = d/du <g(x, u), t>``. Reverse mode applied twice gives a Tile program
whose inputs are the forward inputs, the cotangents (read by nothing once differentiated, since
``g`` is linear in them: fed zeros) and one tangent per differentiated input, and whose outputs are
the tangents of the outputs. Like every derived program it is ordinary Tile: it runs everywhere,
and it can be differentiated again (either mode), so forward mode nests to any order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from tile import ast
from tile.autodiff.grad import gradient
from tile.bind import bind_symbolic
from tile.dtypes import DType
from tile.parser import parse


@dataclasses.dataclass(frozen=True)
class Linearization:
    """A JVP program with the names it chose: ``{input: its tangent input}``, ``{output: its
    tangent output}`` (float outputs only), and ``{output: the reverse pass's cotangent input}``:
    inputs of the program that no output depends on, to be fed zeros of the output's shape."""

    program: ast.Program
    tangents: dict[str, str]
    outputs: dict[str, str]
    zeros: dict[str, str]


def linearize(
    program: str | ast.Program,
    wrt: Sequence[str],
    outputs: Sequence[str] | None = None,
    *,
    dtypes: Mapping[str, DType] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> Linearization:
    """The JVP program of ``program`` for tangents of the inputs ``wrt``, giving the tangents of
    ``outputs`` (default: every float output). ``dtypes``/``shapes`` as for ``gradient``. A
    program whose gradient cannot be derived is refused with the same error."""
    if isinstance(program, str):
        program = parse(program)
    g = gradient(program, wrt, outputs, dtypes=dtypes, shapes=shapes)
    bound = bind_symbolic(program, dtypes, shapes)
    g_dtypes = dict(dtypes or {})
    g_shapes = dict(shapes or {})
    for out, cot in g.cotangents.items():
        g_dtypes[cot] = bound.types[out].dtype
        shape = bound.types[out].shape
        if shapes is not None and shape is not None and all(isinstance(d, int) for d in shape):
            g_shapes[cot] = tuple(shape)
    reads = {i.name for i in g.program.inputs}
    us = [cot for cot in g.cotangents.values() if cot in reads]
    grads = [g.gradients[x] for x in wrt]
    h = gradient(g.program, us, grads, dtypes=g_dtypes, shapes=g_shapes or None)
    tangents = {x: h.cotangents[g.gradients[x]] for x in wrt}
    outs = {o: h.gradients[cot] for o, cot in g.cotangents.items() if cot in h.gradients}
    declared = {i.name for i in h.program.inputs}
    zeros = {o: cot for o, cot in g.cotangents.items() if cot in declared}
    return Linearization(h.program, tangents, outs, zeros)
