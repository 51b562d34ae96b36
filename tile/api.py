"""The Python API on numpy arrays: gradients by value (compile() arrives with the backends)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tile import ast
from tile.autodiff import gradient
from tile.dtypes import DType
from tile.parser import parse


def grad_values(
    program: str | ast.Program,
    inputs: Mapping[str, np.ndarray],
    wrt: Sequence[str] | None = None,
    seed: Mapping[str, np.ndarray] | None = None,
    precision: str = "native",
    custom: Mapping[str, str | ast.Program] | None = None,
) -> dict[str, np.ndarray]:
    """``{input: gradient}`` of ``sum(seed[O] * O)`` over the outputs, by the reference interpreter.

    ``seed`` gives cotangents by output name; outputs not in it get all-ones, so the default is
    the gradient of the sum of all outputs.
    """
    import ref_interp  # the oracle; imported here so the language package does not depend on it

    prog = parse(program) if isinstance(program, str) else program
    arrays = {k: np.asarray(v) for k, v in inputs.items()}
    dtypes = {k: DType.of(v.dtype) for k, v in arrays.items()}
    shapes = {k: tuple(v.shape) for k, v in arrays.items()}
    g = gradient(prog, wrt, custom=custom, dtypes=dtypes, shapes=shapes)
    forward = ref_interp.run(prog, arrays, precision) if g.cotangents else {}
    feed = dict(arrays)
    for out, cot in g.cotangents.items():
        given = (seed or {}).get(out)
        value = forward[out]
        dtype = np.float64 if value.dtype == object else value.dtype
        feed[cot] = np.asarray(given) if given is not None else np.ones(value.shape, dtype=dtype)
    result = ref_interp.run(g.program, feed, precision)
    return {x: result[name] for x, name in g.gradients.items()}
