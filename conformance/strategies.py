"""Hypothesis strategies for valid Tile programs, with inputs: the conformance suite's families.

Each strategy draws a ``Case``: Tile source, input arrays, and how exactly a target must match the
interpreter (``exact``: integer-valued data whose every intermediate is exact in its type;
otherwise a tolerance in units of the output type's epsilon, scaled by the reduction length).

Families:
* ``contractions`` — rank 0–3 outputs, affine and rational index polynomials (strides, dilations,
  padding, skipping, reversal), constraints, output sizes smaller and larger than natural, every
  aggregation and combination, ``default``;
* ``elementwise`` — chains over every elementwise builtin with broadcasting and several dtypes;
* ``gradients`` — gradient programs of drawn contractions and chains (``tile.grad``);
* ``defracted`` — drawn contractions printed after reduce and defract, re-parsed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

AGGS = ["+", "*", ">", "<", "="]
INT_DTYPES = [np.int32, np.int8, np.int64, np.uint8]
FLOAT_DTYPES = [np.float32, np.float64]


@dataclass
class Case:
    family: str
    source: str
    inputs: dict[str, np.ndarray]
    exact: bool = True
    ulps: float = 0.0  # tolerance in output-type epsilons, times the reduction length
    length: int = 1
    notes: dict = field(default_factory=dict)


def _array(rng: np.random.Generator, shape, dtype, lo=-3, hi=3) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind == "u":
        lo = 0
    return rng.integers(lo, hi + 1, shape).astype(dtype)


# --------------------------------------------------------------------------- contractions
@st.composite
def conv_like(draw):
    """1-D/2-D convolutions and pools with stride, dilation, padding and odd output sizes."""
    rank = draw(st.integers(1, 2))
    size = [draw(st.integers(3, 7)) for _ in range(rank)]
    k = [draw(st.integers(1, 3)) for _ in range(rank)]
    stride = [draw(st.integers(1, 3)) for _ in range(rank)]
    dil = [draw(st.integers(1, 2)) for _ in range(rank)]
    pad = [draw(st.integers(0, 1)) for _ in range(rank)]
    natural = [
        max(1, (s + 2 * p - d * (kk - 1) - 1) // st_ + 1)
        for s, p, d, kk, st_ in zip(size, pad, dil, k, stride)
    ]
    out = [n + draw(st.integers(-1, 1)) for n in natural]
    out = [max(1, o) for o in out]
    xs = [f"x{i}" for i in range(rank)]
    ks = [f"k{i}" for i in range(rank)]
    idx = [f"{st_}*{x} + {d}*{kk} - {p}" for x, kk, st_, d, p in zip(xs, ks, stride, dil, pad)]
    pool = draw(st.booleans())
    agg = draw(st.sampled_from(["+", ">", "<"] if pool else ["+"]))
    if pool:
        cons = ", ".join(f"{kk} < {n}" for kk, n in zip(ks, k))
        body = (
            f"O[{', '.join(xs)}, c: {', '.join(map(str, out))}, C] = {agg}(I[{', '.join(idx)}, c]), {cons};"
        )
        header = f"function (I[{', '.join('X' + str(i) for i in range(rank))}, C]) -> (O)"
        shapes = {"I": (*size, 2)}
    else:
        body = (
            f"O[{', '.join(xs)}, co: {', '.join(map(str, out))}, CO] = "
            f"+(I[{', '.join(idx)}, ci] * K[{', '.join(ks)}, ci, co]);"
        )
        header = (
            f"function (I[{', '.join('X' + str(i) for i in range(rank))}, CI], "
            f"K[{', '.join('K' + str(i) for i in range(rank))}, CI, CO]) -> (O)"
        )
        shapes = {"I": (*size, 2), "K": (*k, 2, 3)}
    return f"{header} {{ {body} }}", shapes, int(np.prod(k)) * 2


@st.composite
def general(draw):
    """Affine contractions: multi-variable and rational output indices, constraints, every comb op."""
    nv = draw(st.integers(1, 3))
    vs = ["i", "j", "k"][:nv]
    out_rank = draw(st.integers(0, min(2, nv)))

    def poly(anchor: str | None) -> str:
        terms = []
        for v in vs:
            c = 1 if v == anchor else draw(st.sampled_from([0, 0, 0, 1, -1, 2]))
            if c:
                terms.append(f"{c}*{v}" if c != 1 else v)
        den = draw(st.sampled_from([1, 1, 1, 2])) if anchor is None else 1
        text = " + ".join(terms) or "0"
        off = draw(st.integers(-1, 1))
        text = f"({text})/{den}" if den != 1 else text
        return f"{text} + {off}" if off else text

    out_polys = [poly(vs[d]) if draw(st.booleans()) else vs[d] for d in range(out_rank)]
    comb = draw(st.sampled_from(["", "*", "+", "==", "?"]))
    n_ops = {"": 1, "*": 2, "+": 2, "==": 2, "?": 3}[comb]
    names = ["A", "B", "C"][:n_ops]
    op_polys = []
    for n in range(n_ops):
        rank = draw(st.integers(1, 2))
        op_polys.append([poly(vs[(n + d) % nv]) for d in range(rank)])
    cons = []
    for v in vs:  # every index bounded on its own
        if draw(st.integers(0, 3)) == 0:
            cons.append(f"{v} < {draw(st.integers(1, 4))}")
    agg = draw(st.sampled_from(AGGS if comb not in ("==",) else [">", "<"]))
    if agg == "=":
        agg = ">"  # `=` must not double-write; the interpreter's check is tested elsewhere
    sizes = [draw(st.integers(1, 5)) for _ in out_polys]
    outs = ", ".join(out_polys)
    out_spec = f"O[{outs}: {', '.join(map(str, sizes))}]" if out_polys else "O[]"
    refs = [f"{n}[{', '.join(p)}]" for n, p in zip(names, op_polys)]
    body = (
        refs[0]
        if comb == ""
        else f"{refs[0]} == {refs[1]} ? {refs[2]}"
        if comb == "?"
        else f" {comb} ".join(refs)
    )
    default = draw(st.booleans()) and comb != "=="
    tail = "".join(f", {c}" for c in cons) + (" default D" if default else "")
    header = ", ".join(names + (["D"] if default else []))
    src = f"function ({header}) -> (O) {{ {out_spec} = {agg}({body}){tail}; }}"
    shapes = {n: tuple(draw(st.integers(1, 4)) for _ in p) for n, p in zip(names, op_polys)}
    if default:
        shapes["D"] = tuple(sizes)
    return src, shapes, 16


@st.composite
def contractions(draw) -> Case:
    src, shapes, length = draw(st.one_of(conv_like(), general()))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = draw(st.sampled_from([np.float32, np.int32, np.float64]))
    inputs = {n: _array(rng, s, dtype) for n, s in shapes.items()}
    return Case("contraction", src, inputs, length=length)


# ---------------------------------------------------------------------------- elementwise
UNARY_EXACT = [
    "-{0}",
    "abs({0})",
    "relu({0})",
    "{0} * {0}",
    "floor({0} / 2)",
    "ceil({0} / 2)",
    "round({0} / 2)",
    "as_int({0}, 8)",
    "as_float({0}, 64)",
    "{0} > 0",
    "~({0} > 1)",
    "index({0}, 0)",
]
BINARY_EXACT = [
    "{0} + {1}",
    "{0} - {1}",
    "{0} * {1}",
    "{0} / {1}",
    "max({0}, {1})",
    "min({0}, {1})",
    "{0} == {1}",
    "{0} != {1}",
    "{0} < {1} ? {0} : {1}",
    "{0} <= {1}",
    "{0} >= {1}",
]
INT_ONLY = ["{0} & {1}", "{0} | {1}", "{0} ^ {1}", "{0} << 2", "{0} >> 1"]
UNARY_FLOAT = [
    "exp({0} / 4)",
    "log(abs({0}) + 1)",
    "sqrt(abs({0}))",
    "sin({0})",
    "cos({0})",
    "tan({0} / 4)",
    "sinh({0} / 2)",
    "cosh({0} / 2)",
    "tanh({0})",
    "asin({0} / 4)",
    "acos({0} / 4)",
    "atan({0})",
    "asinh({0})",
    "acosh(abs({0}) + 1)",
    "atanh({0} / 4)",
    "sigmoid({0})",
    "pow(abs({0}) + 1, 0.5)",
]


@st.composite
def elementwise(draw) -> Case:
    n, m = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    shapes = {"X": (n, m), "Y": draw(st.sampled_from([(n, m), (m,), (1, m), (n, 1), ()]))}
    int_mode = draw(st.booleans())
    dtype = draw(st.sampled_from(INT_DTYPES if int_mode else FLOAT_DTYPES))
    pool = UNARY_EXACT + BINARY_EXACT + (INT_ONLY if int_mode else []) + ([] if int_mode else UNARY_FLOAT)
    names, stmts, inexact = ["X", "Y"], [], False
    for k in range(draw(st.integers(1, 4))):
        template = draw(st.sampled_from(pool))
        inexact |= template in UNARY_FLOAT
        args = [draw(st.sampled_from(names)) for _ in range(2)]
        stmts.append(f"T{k} = {template.format(*args)};")
        names.append(f"T{k}")
    src = f"function (X, Y) -> ({names[-1]}) {{ {' '.join(stmts)} }}"
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = {k: _array(rng, s, dtype) for k, s in shapes.items()}
    return Case("elementwise", src, inputs, exact=not inexact, ulps=8.0)


# ------------------------------------------------------------------------- derived programs
@st.composite
def gradients(draw) -> Case:
    import tile
    from tile.printer import format_program

    base = draw(st.one_of(contractions(), elementwise()))
    floats = {k: v.astype(np.float64) for k, v in base.inputs.items()}
    try:
        g = tile.gradient(
            base.source,
            shapes={k: v.shape for k, v in floats.items()},
            dtypes={k: tile.dtypes.DType.FLOAT64 for k in floats},
        )
    except tile.TileError:
        from hypothesis import assume

        assume(False)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    feed = dict(floats)
    import ref_interp

    try:
        fwd = ref_interp.run(base.source, floats)
    except tile.TileError:
        from hypothesis import assume

        assume(False)
    for out, cot in g.cotangents.items():
        feed[cot] = _array(rng, fwd[out].shape, np.float64)
    return Case("gradient", format_program(g.program), feed, exact=base.exact, ulps=64.0, length=base.length)


@st.composite
def defracted(draw) -> Case:
    from hypothesis import assume

    import tile
    from ref_interp.run import input_types
    from tile.transforms import apply_stage
    from tile.transforms.emit import format_stage

    base = draw(contractions())
    try:
        prog = tile.parse(base.source)
        bound = tile.bind(prog, input_types(prog, base.inputs))
        text = format_stage(apply_stage(bound, "defracted"))
    except tile.TileError:
        assume(False)
    return Case("defracted", text, base.inputs, base.exact, base.ulps, base.length)


FAMILIES = {
    "contractions": contractions,
    "elementwise": elementwise,
    "gradients": gradients,
    "defracted": defracted,
}
