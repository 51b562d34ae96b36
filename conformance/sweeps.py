"""Values and programs that tell every operation apart from its neighbours (issue 38, item 2).

A *sweep* is one program with an output per operation of a family: every elementwise template
applied to the same two inputs, or every aggregation over the same rows. Its inputs are built to
separate each operation from the ones a code generator could mistake it for:

* ties (``X == Y`` at some points), for ``<`` against ``<=`` and for ``max`` against ``min``;
* a row of only negative values (a ``max`` starting at 0 shows) and one of only positive values
  (a ``min`` starting at 0 shows);
* rows of only the extremes: all +inf and all -inf in floats (a ``min`` starting at the largest
  finite value, a ``max`` at its negative, shows), all INT_MIN and all INT_MAX in integers;
* finite values beyond the range of the next narrower type, of both signs (float64 above
  float32's largest, float32 above float16's; integers that 8 and 16 bits wrap): a temporary, an
  accumulator or an identity held in a narrower type shows;
* nan, ±0 and ±inf in floats; INT_MIN, INT_MAX, -1 and 0 in integers (overflow, ``INT_MIN / -1``);
* halves (rounding ties) and values float16 and bfloat16 cannot hold (1 + 2^-11, 2049, 257,
  65520, 2^-30);
* odd extents (9 x 7), which leave a remainder for any tiling; and, drawn as often as not, the same
  rows repeated to 37 x 43, which are also more than one vector, block or work-group of any
  usual size, so a tile edge past the first tile shows;
* operands broadcast along either axis (a row, a column) and a 0-D operand;
* every integer type at once (``INTEGER_TYPES``, beside the one drawn): the operations whose result
  an integer's width and signedness decide (``INT_CORE``: wrap-around, division and remainder,
  comparisons, shifts right, widening), and every float type (``FLOAT_TYPES``) in chains of two
  operations (``CHAINS``) on values where a temporary held wider or narrower than the type, or a
  fused multiply-add, changes the result.

Every value is exact to compare: elementwise results are single correctly rounded operations,
and a sum or product over values that are integers, ±inf or nan, or small integer multiples of one
power of two, gives the same bits in any order.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

ROWS, COLS = 9, 7
LARGE = (37, 43)  # odd, prime, and past one tile of 32
INTEGER_TYPES = tuple(np.dtype(f"{s}int{b}") for s in ("", "u") for b in (8, 16, 32, 64))
FLOAT_TYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32), np.dtype(np.float64))


def _scale(dtype, headroom: int) -> float:
    """``2^e`` with ``e`` that many binary orders below the type's overflow: beyond the next
    narrower float type's range (float64: 2^1008 > float32's max), and still headroom for sums."""
    return 2.0 ** (np.finfo(dtype).maxexp - headroom)


HUGE = [1, 3, 2, 5, 1, 7, 4]  # small coefficients of a power of two: their sums are exact


def float_rows(dtype) -> tuple[np.ndarray, np.ndarray]:
    """``X`` and ``Y`` (9 x 7) for float programs: row 0 only negative, row 1 only positive, row 2
    nan and infinities, row 3 ties with ``Y`` and signed zeros, row 4 values float16/bfloat16 round,
    row 5 only +inf, row 6 only -inf, rows 7 and 8 finite values beyond the next narrower type's
    range (and the type's largest), positive and negative."""
    nan, inf = np.nan, np.inf
    dtype = np.dtype(dtype)
    big, top = _scale(dtype, 5), float(np.finfo(dtype).max)
    huge = [top, *(big * np.array(HUGE[1:]))]
    x = [
        [-3, -1, -2, -7, -5, -1, -4],
        [1, 2, 3, 0.5, 4, 6, 2],
        [nan, inf, -inf, 1, -1, nan, 3],
        [2, 2, -2, 1.5, 2.5, -0.0, 0.0],
        [1 + 2.0**-11, 2049, 257, 65520, 2.0**-30, -2.5, 0.5],
        [inf] * COLS,
        [-inf] * COLS,
        huge,
        [-v for v in huge],
    ]
    y = [
        [-3, 1, -1, -7, 2, -2, 4],
        [1, -2, 4, 0.5, -1, 6, 3],
        [1, inf, 2, nan, -inf, 0, 3],
        [2, -2, -2, 1.5, 0.5, 0.0, -0.0],
        [1, 2048, 256, 2, -3, -2.5, 1],
        [inf, -inf, 1, -1, 0, nan, -0.0],
        [-inf, inf, 2, -2, -0.0, 3, 0],
        [2, big, -1, 0.5, -big, 3, top],
        [-top, 3, big, -0.5, 1, -big, 2],
    ]
    with np.errstate(over="ignore"):
        return np.array(x).astype(dtype), np.array(y).astype(dtype)


def int_rows(dtype) -> tuple[np.ndarray, np.ndarray]:
    """``X`` and ``Y`` (9 x 7) for integer programs: negative and positive rows, the type's
    extremes with -1 and 0 (``INT_MIN / -1``, ``x / 0``), ties, odd values for the shifts, a row of
    only INT_MIN and one of only INT_MAX, and values that 8 and 16 bits wrap (both signs)."""
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    wide = [255, 256, 65535, 65536, -129, -32769, 1 << 30]
    x = [
        [-3, -1, -2, -7, -5, -1, -4],
        [1, 2, 3, 5, 4, 6, 2],
        [lo, hi, lo, hi, 0, -1, 1],
        [2, 2, -2, 7, -7, 0, 3],
        [hi - 1, lo + 1, 100, -100, 127, -128, 9],
        [lo] * COLS,
        [hi] * COLS,
        wide,
        [-v for v in wide],
    ]
    y = [
        [-3, 1, -1, -7, 2, -2, 4],
        [1, -2, 4, 5, -1, 6, 3],
        [-1, 1, 0, -1, lo, 2, hi],
        [2, -2, -2, 2, 3, 5, -3],
        [2, 3, 28, 3, 1, -1, -9],
        [-1, 1, 2, -2, lo, hi, 3],
        [hi, -1, 2, lo, 1, -2, 3],
        [3, -2, 7, -1, 2, 5, -3],
        [-3, 2, 256, 1, -2, 255, 3],
    ]
    bits = 8 * np.dtype(dtype).itemsize
    # every value wrapped to the type, as a cast would (unsigned: the negative ones become large)
    wrap = (lambda a: a % (1 << bits)) if lo == 0 else (lambda a: (a - lo) % (1 << bits) + lo)
    return wrap(np.array(x, dtype=object)).astype(dtype), wrap(np.array(y, dtype=object)).astype(dtype)


def rows(dtype) -> tuple[np.ndarray, np.ndarray]:
    dtype = np.dtype(dtype)
    return float_rows(dtype) if dtype.kind == "f" else int_rows(dtype)


def shuffled(rng: np.random.Generator, a: np.ndarray) -> np.ndarray:
    """``a`` with each row's values in a new order (the kinds of value stay in their rows)."""
    return np.stack([rng.permutation(r) for r in a]) if a.ndim == 2 else a


def tiled(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` repeated along each axis and cut to ``shape`` (rows keep their kinds of value when the
    column count grows; rows of every kind recur when the row count grows)."""
    reps = [-(-s // d) for s, d in zip(shape, a.shape)]
    return np.tile(a, reps)[tuple(slice(0, s) for s in shape)]


# name -> a statement over X (n x m), Y (m) and Z (m x 3): each a different aggregation, shape or
# constraint ({h}: ceil(m / 2); {c}: m - 2)
AGGREGATIONS = {
    "max": "{o}[i: {n}] = >(X[i, j]);",
    "min": "{o}[i: {n}] = <(X[i, j]);",
    "sum": "{o}[i: {n}] = +(X[i, j]);",
    "prod": "{o}[i: {n}] = *(X[i, j]);",
    "dot": "{o}[i: {n}] = +(X[i, j] * Y[j]);",
    "max_plus": "{o}[i: {n}] = >(X[i, j] + Y[j]);",
    "min_mul": "{o}[i: {n}] = <(X[i, j] * Y[j]);",
    "col_max": "{o}[j: {m}] = >(X[i, j]);",
    "col_min": "{o}[j: {m}] = <(X[i, j]);",
    "col_sum": "{o}[j: {m}] = +(X[i, j]);",
    "matmul": "{o}[i, k: {n}, 3] = +(X[i, j] * Z[j, k]);",
    "window": "{o}[i, j: {n}, {m}] = +(X[i, j + k]), k < 3;",
    "stride": "{o}[i, j: {n}, {h}] = >(X[i, 2*j]);",
    "shift": "{o}[i, j: {n}, {m}] = =(X[i, j - 1]);",
    "eq": "{o}[i: {n}] = +(X[i, j] == Y[j] ? X[i, j]);",
    "masked_min": "{o}[i: {n}] = <(X[i, j]), j < {c};",
    "triangle_max": "{o}[i: {n}] = >(X[i, j]), i - j < {n};",
    "larger": "{o}[i, j: {n1}, {m1}] = +(X[i, j]);",
}


def contraction_rows(dtype) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` for sums and products, whose order may differ between targets: every value an
    integer, ±0, ±inf or nan, or a small integer times one power of two (row 4 of the floats,
    which float16 rounds, becomes integers; in float64, integers that a float32 accumulator
    rounds; rows 7 and 8 lose the type's largest value, whose sums with others overflow or not by
    their order)."""
    x, y = rows(dtype)
    if np.dtype(dtype).kind == "f":
        x[4] = np.array([7, -7, 3, 9, -9, 11, 1], dtype=dtype)
        if np.dtype(dtype) == np.float64:  # exact in float64 in any order, not in a float32 accumulator
            x[4] = np.array([2.0**24, 1, 1, -3, 2.0**25, 1, 7])
        big = _scale(dtype, 16)  # room for sums of 43 products with Y and Z
        x[7], x[8] = big * np.array(HUGE), -big * np.array(HUGE[::-1])
        y = np.array([1, -2, 4, 0, -1, 6, 3], dtype=dtype)[None].repeat(ROWS, 0)
    return x, y[1]


# what an integer type's width and signedness decide in a contraction: the accumulator's width (a
# sum that wraps), the comparison and the identity of max; for each integer type beside the drawn one
INT_AGGREGATIONS = {"max": ">", "sum": "+"}


def contraction_program(
    dtype, seed: int, large: bool = False, all_types: bool = True
) -> tuple[str, dict[str, np.ndarray], int]:
    """Every aggregation of ``AGGREGATIONS`` as one program's outputs, its inputs, its length;
    ``large``: over the rows repeated to ``LARGE`` (float products left out: 43 factors round);
    ``all_types``: and ``INT_AGGREGATIONS`` over ``X_k`` (the ``rows`` of every other integer
    type)."""
    rng = np.random.default_rng(seed)
    x, y = contraction_rows(dtype)
    z = np.stack([y, y[::-1], np.roll(y, 3)], axis=1)  # m x 3, integers with a zero in each column
    if large:
        x, y, z = tiled(x, LARGE), tiled(y, LARGE[1:]), tiled(z, (LARGE[1], 3))
    n, m = x.shape
    sizes = {"n": n, "m": m, "h": (m + 1) // 2, "c": m - 2, "n1": n + 1, "m1": m + 1}
    float_large = large and np.dtype(dtype).kind == "f"
    names = [k for k in AGGREGATIONS if not (float_large and k == "prod")]
    outs = [f"O_{k}" for k in names]
    body = [AGGREGATIONS[k].format(o=o, **sizes) for o, k in zip(outs, names)]
    inputs = {"X": shuffled(rng, x), "Y": rng.permutation(y), "Z": rng.permutation(z)}
    for t, other in enumerate(INTEGER_TYPES):
        if other == np.dtype(dtype) or not all_types:
            continue
        xt = rows(other)[0]
        inputs[f"X_{t}"] = shuffled(rng, tiled(xt, LARGE) if large else xt)
        for k, agg in INT_AGGREGATIONS.items():
            outs.append(f"O_{k}_{t}")
            body.append(f"{outs[-1]}[i: N{t}] = {agg}(X_{t}[i, j]);")
    params = ["X[N, M]", "Y[M]", "Z[M, K]"] + [f"{k}[N{k[2:]}, M{k[2:]}]" for k in inputs if k[:2] == "X_"]
    src = f"function ({', '.join(params)}) -> ({', '.join(outs)}) {{ {' '.join(body)} }}"
    return src, inputs, m


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


# what an integer type's width and signedness decide, for each integer type of an elementwise sweep
INT_CORE = [
    "{0} * {1}",
    "{0} / {1}",
    "mod({0}, {1} == 0 ? 2 : {1})",
    "{0} < {1} ? {0} : {1}",
    "{0} >> 1",
    "as_float({0}, 64)",
]
# two float operations each, over ``chain_operands``: exact in the type only if it rounds after each
CHAINS = ["{p} * {p} + {r}", "({p} + {s}) - {p}"]


def chain_operands(dtype) -> dict[str, np.ndarray]:
    """``P``, ``R``, ``S`` (``COLS`` values of the float type) for ``CHAINS``, with ``e`` the type's
    epsilon and ``c`` a power of two (of either sign) per column: ``P = c(1 + e)``, ``R = -c^2(1 +
    2e)``, ``S = c e / 4``. Rounded after each operation, ``P * P + R`` and ``(P + S) - P`` are 0;
    with a wider temporary (or a fused multiply-add) they are ``c^2 e^2`` and ``c e / 4``; with a
    narrower one, ``1 + e`` itself rounds. The last column is exact either way (1, -1, 0)."""
    dtype = np.dtype(dtype)
    eps = float(ml_dtypes.finfo(dtype).eps)
    c = np.array([1.0, -1.0, 2.0, -0.5, 8.0, 0.25])
    p, r, s = c * (1 + eps), -(c * c) * (1 + 2 * eps), c * eps / 4
    p, r, s = np.append(p, 1.0), np.append(r, -1.0), np.append(s, 0.0)
    return {"P": p.astype(dtype), "R": r.astype(dtype), "S": s.astype(dtype)}


def every_type(rng, large: bool, skip=()) -> tuple[dict[str, np.ndarray], list[str]]:
    """Inputs and expressions of every integer type's ``INT_CORE`` (``X_k``, ``Y_k``: its ``rows``)
    but the types in ``skip``, and every float type's ``CHAINS`` (``P_k``, ``R_k``, ``S_k``)."""
    inputs, exprs = {}, []
    for k, dtype in enumerate(INTEGER_TYPES):
        if dtype in skip:
            continue
        ops = _operands(dtype, rng, large)
        inputs.update({f"X_{k}": ops["X"], f"Y_{k}": ops["Y"]})
        exprs += [t.format(f"X_{k}", f"Y_{k}") for t in INT_CORE]
    for k, dtype in enumerate(FLOAT_TYPES):
        inputs.update({f"{n}_{k}": v for n, v in chain_operands(dtype).items()})
        exprs += [t.format(p=f"P_{k}", r=f"R_{k}", s=f"S_{k}") for t in CHAINS]
    return inputs, exprs


def _operands(dtype, rng, large: bool) -> dict[str, np.ndarray]:
    """``X``, ``Y`` (``rows``, columns in a drawn order), the row ``R``, the column ``C``, the 0-D
    ``S``."""
    x, y = rows(dtype)
    s = np.array(y[1, 1])  # -2 (unsigned: wrapped)
    perm = rng.permutation(COLS)  # the same for X and Y: the ties stay aligned
    x, y = x[:, perm], y[:, perm]
    if large:
        x, y = tiled(x, LARGE), tiled(y, LARGE)
    return {"X": x, "Y": y, "R": y[3].copy(), "C": y[:, 1:2].copy(), "S": s}


# operations whose result is a zero of either sign on the rows' ±0 (and on -0.5 / 2 for ceil): an
# output compares -0 equal to +0, so each is divided into 1, which gives -inf or +inf
ZERO_SIGNS = ["-{0}", "{0} * {1}", "{0} + {1}", "{0} - {1}", "ceil({0} / 4)", "abs({0})"]


def _exprs(dtype, templates: list[str], closed: bool, suffix: str = "") -> list[str]:
    x, y, r, c, s = (f"{n}{suffix}" for n in "XYRCS")
    if closed:  # for devices of one type: only what computes in ``dtype`` alone
        templates = [t for t in templates if _closed(t, np.dtype(dtype).name)]
    exprs = [t.format(x, y) for t in templates]
    if not closed:  # a cast's result computed with further (a width or rounding the output type hides)
        exprs += [f"as_float({e}, 64) * 3" for e in exprs if e.startswith(("as_", "round_tf32"))]
        if np.dtype(dtype).kind == "f":
            exprs += [f"1 / ({t.format(x, y)})" for t in ZERO_SIGNS]
    return exprs + [f"{x} - {r}", f"{c} - {x}", f"{x} * {s}"] + ([] if closed else [f"{r} < {x}"])


def elementwise_program(
    dtype,
    seed: int,
    templates: list[str],
    closed: bool = False,
    large: bool = False,
    also=None,
    all_types: bool = True,
) -> tuple[str, dict[str, np.ndarray]]:
    """Every template (``{0}``, ``{1}``: the operands) applied to ``X`` and ``Y`` as one program's
    outputs; each cast's result again through ``as_float(..., 64) * 3``; and ``X - R``, ``R < X``,
    ``C - X``, ``X * S`` with a row ``R`` broadcast over ``X``'s rows, a column ``C`` over its
    columns and a 0-D ``S``. ``closed``: only the templates that compute in ``dtype`` alone;
    ``large``: the rows repeated to ``LARGE``; ``also``: ``(dtype, templates)`` of a second type,
    on ``X2``, ``Y2``, ... in the same program (a float and an integer type in one example); and
    with ``all_types``, unless ``closed``, ``every_type``'s outputs: every other integer type's
    ``INT_CORE`` and every float type's ``CHAINS``."""
    rng = np.random.default_rng(seed)
    inputs, exprs = _operands(dtype, rng, large), _exprs(dtype, templates, closed)
    if also is not None:
        inputs.update({f"{k}2": v for k, v in _operands(also[0], rng, large).items()})
        exprs += _exprs(also[0], also[1], closed, "2")
    if all_types and not closed:
        more, made = every_type(rng, large, {np.dtype(dtype), *([np.dtype(also[0])] if also else [])})
        inputs.update(more)
        exprs += made
    stmts = [f"O{k} = {e};" for k, e in enumerate(exprs)]
    outs = ", ".join(f"O{k}" for k in range(len(stmts)))
    src = f"function ({', '.join(inputs)}) -> ({outs}) {{ {' '.join(stmts)} }}"
    return src, inputs


# The structural builtins over Z's rows, with the float functions of ``transcendental_program``:
# a structural chain draws them only now and then (a default run's coverage once listed the
# softmaxes and simple_reduce unexercised). simple_reduce and scatter sum halves: exact; the
# indices are Z's values as integers, some out of range (gather and scatter clamp them).
ROW_FUNCTIONS = [
    f"builtin_softmax({{0}}, 3, {COLS})", f"builtin_logsoftmax({{0}}, 3, {COLS})",
    f"simple_reduce({{0}}, 1, {COLS})", "simple_reduce({0}, 3, 1)",
    "gather({0}, as_int({0}, 32))", "scatter({0}, as_int({0}, 32), {0})",
]


def transcendental_program(dtype, seed: int, templates: list[str]) -> tuple[str, dict[str, np.ndarray]]:
    """Every float template on finite values: integers and halves in [-3, 3], zero and ties."""
    rng = np.random.default_rng(seed)
    z = (rng.integers(-6, 7, (3, COLS)) / 2).astype(dtype)
    stmts = [f"O{k} = {t.format('Z')};" for k, t in enumerate(templates)]
    outs = ", ".join(f"O{k}" for k in range(len(stmts)))
    return f"function (Z) -> ({outs}) {{ {' '.join(stmts)} }}", {"Z": z}


def within(program, bound, runs_dtype, runs_operation):
    """``program`` (parsed; ``bound`` for its inputs) narrowed to the outputs a target runs: a
    sweep holds every integer and float type at once, so a device that lacks one type (or declares
    a subset of types or operations, ``conformance.capabilities``) would meet every sweep as
    unsupported; it gets the sweep's other outputs instead. ``runs_dtype(DType)`` and
    ``runs_operation(name)`` say what the target runs. Returns the narrowed ``tile.ast.Program``
    (only the statements computing in types and with operations it runs, and the inputs they
    read), or None: nothing to drop, nothing left, or statements that read each other's results
    (only independent outputs are dropped, as in a sweep)."""
    import dataclasses

    from conformance.coverage import sites
    from tile import ast
    from tile.typed import TAccess, TAssign, TCall, TContraction, TRef

    inputs = {name for name, _ in bound.inputs}
    reads: dict[str, set[str]] = {}
    dtypes: dict[str, set] = {}
    for s in bound.stmts:
        if s.name not in bound.outputs or s.name in reads:
            return None  # an intermediate, or an output written twice: not independent outputs
        if isinstance(s, TContraction):
            reads[s.name] = {r.tensor for r in s.operands} | ({s.default} if s.default else set())
            dtypes[s.name] = {s.type.dtype, *(bound.types[n].dtype for n in reads[s.name])}
        else:
            assert isinstance(s, TAssign)
            names, types, stack = set(), {bound.types[s.name].dtype}, [s.expr]
            while stack:
                e = stack.pop()
                types.add(e.type.dtype)
                if isinstance(e, (TRef, TAccess)):
                    names.add(e.name if isinstance(e, TRef) else e.tensor)
                stack.extend(e.args if isinstance(e, TCall) else ())
            reads[s.name], dtypes[s.name] = names, types
        if not reads[s.name] <= inputs:
            return None
    stmt_names = [s.output.name if isinstance(s, ast.Contraction) else s.name for s in program.stmts]
    if set(stmt_names) != set(reads):
        return None
    runs = {n for n in reads if all(runs_dtype(d) for d in dtypes[n])}
    runs -= {stmt_names[site.stmt] for site in sites(program, bound.constants) if not runs_operation(site.op)}
    if not runs or runs == set(reads):
        return None
    needed = set().union(*(reads[n] for n in runs))
    return dataclasses.replace(
        program,
        inputs=tuple(i for i in program.inputs if i.name in needed),
        outputs=tuple(o for o in program.outputs if o.name in runs),
        stmts=tuple(s for s, n in zip(program.stmts, stmt_names) if n in runs),
    )
