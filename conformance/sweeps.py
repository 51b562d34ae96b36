"""Values and programs that tell every operation apart from its neighbours (issue 38, item 2).

A *sweep* is one program with an output per operation of a family: every elementwise template
applied to the same two inputs, or every aggregation over the same rows. Its inputs are built to
separate each operation from the ones a code generator could mistake it for:

* ties (``X == Y`` at some points), for ``<`` against ``<=`` and for ``max`` against ``min``;
* a row of only negative values (a ``max`` starting at 0 shows) and one of only positive values
  (a ``min`` starting at 0 shows);
* nan, ±0 and ±inf in floats; INT_MIN, INT_MAX, -1 and 0 in integers (overflow, ``INT_MIN / -1``);
* halves (rounding ties) and values float16 and bfloat16 cannot hold (1 + 2^-11, 2049, 257,
  65520, 2^-30);
* odd extents (5 x 7), which leave a remainder for any tiling.

Every value is exact to compare: elementwise results are single correctly rounded operations,
and a sum or product over values that are integers, ±inf or nan gives the same bits in any order.
"""

from __future__ import annotations

import functools

import numpy as np

ROWS, COLS = 5, 7


def float_rows(dtype) -> tuple[np.ndarray, np.ndarray]:
    """``X`` and ``Y`` (5 x 7) for float programs: row 0 only negative, row 1 only positive, row 2
    nan and infinities, row 3 ties with ``Y`` and signed zeros, row 4 values float16/bfloat16 round."""
    nan, inf = np.nan, np.inf
    x = [
        [-3, -1, -2, -7, -5, -1, -4],
        [1, 2, 3, 0.5, 4, 6, 2],
        [nan, inf, -inf, 1, -1, nan, 3],
        [2, 2, -2, 1.5, 2.5, -0.0, 0.0],
        [1 + 2.0**-11, 2049, 257, 65520, 2.0**-30, -2.5, 0.5],
    ]
    y = [
        [-3, 1, -1, -7, 2, -2, 4],
        [1, -2, 4, 0.5, -1, 6, 3],
        [1, inf, 2, nan, -inf, 0, 3],
        [2, -2, -2, 1.5, 0.5, 0.0, -0.0],
        [1, 2048, 256, 2, -3, -2.5, 1],
    ]
    with np.errstate(over="ignore"):
        return np.array(x).astype(dtype), np.array(y).astype(dtype)


def int_rows(dtype) -> tuple[np.ndarray, np.ndarray]:
    """``X`` and ``Y`` (5 x 7) for integer programs: negative and positive rows, the type's
    extremes with -1 and 0 (``INT_MIN / -1``, ``x / 0``), ties, odd values for the shifts."""
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    x = [
        [-3, -1, -2, -7, -5, -1, -4],
        [1, 2, 3, 5, 4, 6, 2],
        [lo, hi, lo, hi, 0, -1, 1],
        [2, 2, -2, 7, -7, 0, 3],
        [hi - 1, lo + 1, 100, -100, 127, -128, 9],
    ]
    y = [
        [-3, 1, -1, -7, 2, -2, 4],
        [1, -2, 4, 5, -1, 6, 3],
        [-1, 1, 0, -1, lo, 2, hi],
        [2, -2, -2, 2, 3, 5, -3],
        [2, 3, 28, 3, 1, -1, -9],
    ]
    if info.min == 0:  # unsigned: the negative values wrap to large ones, as a cast would
        return (np.array(x) % (hi + 1)).astype(dtype), (np.array(y) % (hi + 1)).astype(dtype)
    return np.array(x).clip(lo, hi).astype(dtype), np.array(y).clip(lo, hi).astype(dtype)


def rows(dtype) -> tuple[np.ndarray, np.ndarray]:
    dtype = np.dtype(dtype)
    return float_rows(dtype) if dtype.kind == "f" else int_rows(dtype)


def shuffled(rng: np.random.Generator, a: np.ndarray) -> np.ndarray:
    """``a`` with each row's values in a new order (the kinds of value stay in their rows)."""
    return np.stack([rng.permutation(r) for r in a]) if a.ndim == 2 else a


AGGREGATIONS = {  # name -> a statement over X (5 x 7) and Y (7): each a different aggregation or shape
    "max": "{o}[i: 5] = >(X[i, j]);",
    "min": "{o}[i: 5] = <(X[i, j]);",
    "sum": "{o}[i: 5] = +(X[i, j]);",
    "prod": "{o}[i: 5] = *(X[i, j]);",
    "dot": "{o}[i: 5] = +(X[i, j] * Y[j]);",
    "max_plus": "{o}[i: 5] = >(X[i, j] + Y[j]);",
    "min_mul": "{o}[i: 5] = <(X[i, j] * Y[j]);",
    "col_max": "{o}[j: 7] = >(X[i, j]);",
    "col_min": "{o}[j: 7] = <(X[i, j]);",
    "window": "{o}[i, j: 5, 7] = +(X[i, j + k]), k < 3;",
    "stride": "{o}[i, j: 5, 4] = >(X[i, 2*j]);",
    "shift": "{o}[i, j: 5, 7] = =(X[i, j - 1]);",
    "eq": "{o}[i: 5] = +(X[i, j] == Y[j] ? X[i, j]);",
    "larger": "{o}[i, j: 6, 8] = +(X[i, j]);",
}


def contraction_rows(dtype) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` for sums and products, whose order may differ between targets: every value an
    integer, ±0, ±inf or nan (row 4 of the floats, which float16 rounds, becomes integers; in
    float64, integers that a float32 accumulator rounds)."""
    x, y = rows(dtype)
    if np.dtype(dtype).kind == "f":
        x[4] = np.array([7, -7, 3, 9, -9, 11, 1], dtype=dtype)
        if np.dtype(dtype) == np.float64:  # exact in float64 in any order, not in a float32 accumulator
            x[4] = np.array([2.0**24, 1, 1, -3, 2.0**25, 1, 7])
        y = np.array([1, -2, 4, 0, -1, 6, 3], dtype=dtype)[None].repeat(ROWS, 0)
    return x, y[1]


def contraction_program(dtype, seed: int) -> tuple[str, dict[str, np.ndarray], int]:
    """Every aggregation of ``AGGREGATIONS`` as one program's outputs, its inputs, its length."""
    rng = np.random.default_rng(seed)
    x, y = contraction_rows(dtype)
    outs = [f"O_{k}" for k in AGGREGATIONS]
    body = " ".join(t.format(o=o) for o, t in zip(outs, AGGREGATIONS.values()))
    src = f"function (X[N, M], Y[M]) -> ({', '.join(outs)}) {{ {body} }}"
    return src, {"X": shuffled(rng, x), "Y": rng.permutation(y)}, COLS


@functools.cache
def _closed(template: str, dtype: str) -> bool:
    """Whether ``template`` on two ``dtype`` operands computes in ``dtype`` alone (no bool, no
    cast): what a device with that one type can run."""
    import tile
    from tile.inputs import input_types
    from tile.typed import TAssign, TCall

    a = np.zeros((2, 2), dtype)
    src = f"function (X, Y) -> (O) {{ O = {template.format('X', 'Y')}; }}"
    prog = tile.parse(src)
    bound = tile.bind(prog, input_types(prog, {"X": a, "Y": a}), {"X": a, "Y": a})
    stack, seen = [s.expr for s in bound.stmts if isinstance(s, TAssign)], set()
    while stack:
        e = stack.pop()
        seen.add(e.type.dtype)
        if isinstance(e, TCall):
            stack.extend(e.args)
    return len(seen) == 1


def elementwise_program(
    dtype, seed: int, templates: list[str], closed: bool = False
) -> tuple[str, dict[str, np.ndarray]]:
    """Every template (``{0}``, ``{1}``: the operands) applied to ``X`` and ``Y`` as one program's
    outputs; each cast's result again through ``as_float(..., 64) * 3``; and ``X - R``, ``R < X``
    with a row ``R`` broadcast over ``X``'s rows. ``closed``: only the templates that compute in
    ``dtype`` alone."""
    rng = np.random.default_rng(seed)
    x, y = rows(dtype)
    perm = rng.permutation(COLS)  # the same for X and Y: the ties stay aligned
    x, y = x[:, perm], y[:, perm]
    if closed:  # for devices of one type: only what computes in ``dtype`` alone
        templates = [t for t in templates if _closed(t, np.dtype(dtype).name)]
    exprs = [t.format("X", "Y") for t in templates]
    if not closed:  # a cast's result computed with further (a width or rounding the output type hides)
        exprs += [f"as_float({e}, 64) * 3" for e in exprs if e.startswith(("as_", "round_tf32"))]
    exprs += ["X - R"] + ([] if closed else ["R < X"])
    stmts = [f"O{k} = {e};" for k, e in enumerate(exprs)]
    outs = ", ".join(f"O{k}" for k in range(len(stmts)))
    src = f"function (X, Y, R) -> ({outs}) {{ {' '.join(stmts)} }}"
    return src, {"X": x, "Y": y, "R": y[3].copy()}


def transcendental_program(dtype, seed: int, templates: list[str]) -> tuple[str, dict[str, np.ndarray]]:
    """Every float template on finite values: integers and halves in [-3, 3], zero and ties."""
    rng = np.random.default_rng(seed)
    z = (rng.integers(-6, 7, (3, COLS)) / 2).astype(dtype)
    stmts = [f"O{k} = {t.format('Z')};" for k, t in enumerate(templates)]
    outs = ", ".join(f"O{k}" for k in range(len(stmts)))
    return f"function (Z) -> ({outs}) {{ {' '.join(stmts)} }}", {"Z": z}
