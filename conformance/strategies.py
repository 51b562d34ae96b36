"""Hypothesis strategies for valid Tile programs, with inputs: the conformance suite's families.

Each strategy draws a ``Case``: Tile source, input arrays, and how exactly a target must match the
interpreter (``exact``: integer-valued data whose every intermediate is exact in its type;
otherwise a tolerance in units of the output type's epsilon, scaled by the reduction length).

Families:
* ``contractions`` — rank 0–5 outputs, affine and rational index polynomials (strides, dilations,
  padding, skipping, reversal), constraints, output sizes smaller and larger than natural, every
  aggregation and combination, ``default``; six dtypes, now and then mixed within one program;
* ``elementwise`` — chains over every elementwise builtin with broadcasting and mixed dtypes, and
  chains through the structural builtins (reshape, shape, gather, scatter, softmaxes, casts);
* ``mixed`` — contractions and elementwise statements feeding each other, several outputs;
* ``gradients`` — gradient programs of drawn contractions, chains and mixed programs
  (``tile.gradient``);
* ``defracted`` — drawn contractions and mixed programs printed after reduce and defract;
* ``flat`` — the same printed at the flat stage as Tile over 1-D views of every tensor;
* ``sized`` — programs whose output sizes are 0-D inputs (a compiled target builds for their values);
* ``optimized`` — contractions, chains and mixed programs through every target config's passes,
  each pass checked by the Stripe interpreter (``conformance.optimized``), then on the target;
* ``products`` — matmuls, batched matmuls and convolutions (the GEMM shape) of random normal
  float32/float16/bfloat16 data, checked in each precision mode (``conformance.precision``).

The contractions are drawn in ``conformance.contraction_strategies``, the elementwise programs and
their builtin templates in ``conformance.elementwise_strategies``, ``Case`` and the small integer
inputs in ``conformance.case``; this module gathers them (every name is importable from here) and
draws the families built on them.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from conformance.case import AGGS, CONTRACTION_DTYPES, FLOAT_DTYPES, INT_DTYPES, Case, small_ints
from conformance.contraction_strategies import (
    contraction_sweep,
    contractions,
    conv_like,
    drawn_contractions,
    general,
    high_rank,
)
from conformance.conv_transpose import ConvT, size_arrays
from conformance.elementwise_strategies import (
    BINARY_EXACT,
    CASTS,
    INT_ONLY,
    ROUND_TF32,
    UNARY_EXACT,
    UNARY_FLOAT,
    chain,
    elementwise,
    elementwise_sweep,
    structural,
)

__all__ = [
    "AGGS", "BINARY_EXACT", "CASTS", "CONTRACTION_DTYPES", "FAMILIES", "FLOAT_DTYPES", "INT_DTYPES",
    "INT_ONLY", "PRODUCT_DTYPES", "PRODUCT_SOURCES", "ROUND_TF32", "UNARY_EXACT", "UNARY_FLOAT", "Case",
    "chain", "contraction_sweep", "contractions", "conv_like", "defracted", "drawn_contractions",
    "elementwise", "elementwise_sweep", "flat", "general", "gradient_exact", "gradients", "high_rank",
    "mixed", "optimized", "products", "sized", "structural", "transposed",
]


# ------------------------------------------------------------------------------- mixed programs
# sqrt is not Lipschitz at 0: an operand that already carries rounding (a sum of rounded values,
# added in the interpreter's order and in the target's) may differ by d, and its square roots by
# sqrt(d), beyond every ulps bound. The 10^6-example campaign found one: a sum of square roots that
# cancels to 0.0 in one order and to 1.2e-7 in another, whose square roots are 0.0 and 3.5e-4. So
# such an operand takes the root of abs(x) + 1, where the root's slope is at most 1/2; an exact
# operand (integers, sums of them) still takes sqrt(abs(x)), zeros included.
_SQRT = "sqrt(abs({0}))"
_SQRT_OFF_ZERO = "sqrt(abs({0}) + 1)"
assert _SQRT in UNARY_FLOAT


@st.composite
def mixed(draw) -> Case:
    """Contractions and elementwise statements feeding each other — reductions along an axis,
    transposes, matmuls with new inputs, shifted windows, unary and broadcast binary builtins —
    with an intermediate sometimes returned as a second output."""
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int32]))
    is_float = np.dtype(dtype).kind == "f"
    shapes = {"X": tuple(draw(st.integers(1, 4)) for _ in range(draw(st.integers(1, 3))))}
    cur, stmts, inexact, length = "X", [], False, 1
    made: list[str] = []
    for k in range(draw(st.integers(2, 4))):
        name, sc = f"T{k}", shapes[cur]
        r = len(sc)
        idx = [f"i{d}" for d in range(r)]
        kinds = ["unary", "binary"] + (["reduce", "matmul", "window"] if r else [])
        kinds += ["transpose"] if r > 1 else []
        kind = draw(st.sampled_from(kinds))
        if kind == "reduce":
            axis = draw(st.integers(0, r - 1))
            keep = [d for d in range(r) if d != axis]
            shape = tuple(sc[d] for d in keep)
            out = ", ".join(idx[d] for d in keep)
            spec = f"{name}[{out}: {', '.join(map(str, shape))}]" if keep else f"{name}[]"
            agg = draw(st.sampled_from(["+", ">", "<"]))
            stmt = f"{spec} = {agg}({cur}[{', '.join(idx)}]);"
            length *= sc[axis]
        elif kind == "transpose":
            perm = draw(st.permutations(range(r)))
            shape = tuple(sc[p] for p in perm)
            stmt = (
                f"{name}[{', '.join(idx[p] for p in perm)}: {', '.join(map(str, shape))}] = "
                f"=({cur}[{', '.join(idx)}]);"
            )
        elif kind == "matmul":
            w, cols = f"W{k}", draw(st.integers(1, 3))
            shapes[w] = (sc[-1], cols)
            shape = sc[:-1] + (cols,)
            lead = idx[:-1]
            stmt = (
                f"{name}[{', '.join(lead + ['j'])}: {', '.join(map(str, shape))}] = "
                f"+({cur}[{', '.join(lead + ['q'])}] * {w}[q, j]);"
            )
            length *= sc[-1]
        elif kind == "window":
            width, agg = draw(st.integers(2, 3)), draw(st.sampled_from(["+", ">"]))
            shape = sc
            stmt = (
                f"{name}[{', '.join(idx)}: {', '.join(map(str, sc))}] = "
                f"{agg}({cur}[{', '.join(idx[:-1] + [idx[-1] + ' + q'])}]), q < {width};"
            )
            length *= width
        elif kind == "unary":
            template = draw(st.sampled_from(UNARY_EXACT[:-1] + (UNARY_FLOAT if is_float else [])))
            if inexact and template == _SQRT:
                template = _SQRT_OFF_ZERO
            inexact |= template in UNARY_FLOAT or template == ROUND_TF32 or template == _SQRT_OFF_ZERO
            stmt, shape = f"{name} = {template.format(cur)};", sc
        else:
            b = f"B{k}"
            shapes[b] = draw(st.sampled_from([sc, sc[1:], sc[-1:], ()]))
            template = draw(st.sampled_from(BINARY_EXACT))
            inexact |= "/" in template and is_float  # a quotient summed later rounds in any order
            stmt, shape = f"{name} = {template.format(cur, b)};", sc
        stmts.append(stmt)
        shapes[name] = tuple(shape)
        made.append(name)
        cur = name
    outs = [cur] + ([draw(st.sampled_from(made[:-1]))] if len(made) > 1 and draw(st.booleans()) else [])
    ins = [n for n in shapes if n not in made]
    src = f"function ({', '.join(ins)}) -> ({', '.join(outs)}) {{ {' '.join(stmts)} }}"
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = {n: small_ints(rng, shapes[n], dtype) for n in ins}
    return Case("mixed", src, inputs, exact=not inexact, ulps=64.0, length=length)


# ------------------------------------------------------------------------- derived programs
@st.composite
def gradients(draw) -> Case:
    import tile
    from tile.printer import format_program

    base = draw(st.one_of(contractions(), elementwise(), mixed()))
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
        feed[cot] = small_ints(rng, fwd[out].shape, np.float64)
    exact = gradient_exact(base)
    return Case("gradient", format_program(g.program), feed, exact=exact, ulps=64.0, length=base.length)


_PRODUCT_AGGREGATION = re.compile(r"=\s*\*\(")


def gradient_exact(base: Case) -> bool:
    """Whether the gradient of ``base`` (in float64) compares exactly: where ``base`` does, unless it
    aggregates a product. A product's gradient is the product of the other factors (``tile.gradient``
    divides the product of the nonzero ones by each), and in float64 a product of 43 integers near
    255 (a contraction sweep's uint8 rows at the large extents) is not exact, so the order a target
    multiplies in shows: 15 of ~100 gradient chunks of a 40,000-example campaign failed so on
    llvm_cpu.0 (1 ulp in 2.4e101), the interpreter and the target both right.

    Nor where it divides: an int32 program's ``/`` is exact integer division, but its gradient runs
    in float64, where ``T0 / B1`` and ``DT1 * T0 / (B1 * B1)`` round, and a sum of them rounds in
    any order (5 gradient examples of the 10^6-example campaign, 1 ulp each)."""
    return base.exact and not _PRODUCT_AGGREGATION.search(base.source) and "/" not in base.source


def _staged(draw, stage: str) -> tuple[Case, str]:
    """A drawn contraction or mixed program, and its text after ``stage`` (flat: as Tile over 1-D
    views, see ``tile.transforms.emit.format_flat_program``)."""
    import tile
    from tile.inputs import input_types
    from tile.transforms import apply_stage
    from tile.transforms.emit import format_flat_program, format_stage
    from tile.typed import TAssign

    base = draw(st.one_of(contractions(), mixed()))
    try:
        prog = tile.parse(base.source)
        bound = apply_stage(tile.bind(prog, input_types(prog, base.inputs)), stage)
        text = format_flat_program(bound) if stage == "flat" else format_stage(bound)
        assume(any(not isinstance(x, TAssign) for x in bound.stmts))  # else the stage changes nothing
    except tile.TileError:
        assume(False)
    return base, text


@st.composite
def defracted(draw) -> Case:
    base, text = _staged(draw, "defracted")
    return Case("defracted", text, base.inputs, base.exact, base.ulps, base.length)


@st.composite
def flat(draw) -> Case:
    base, text = _staged(draw, "flat")
    return Case("flat", text, base.inputs, base.exact, base.ulps, base.length)


@st.composite
def optimized(draw) -> Case:
    """A contraction, elementwise chain or mixed program whose every config's passes are checked
    (``conformance.optimized``) before the target runs it. The sweeps only at their small extents
    and in their drawn types: the Stripe interpreter runs every pass step of every config on each
    example."""
    small = dict(large=False, all_types=False)
    base = draw(st.one_of(contractions(**small), elementwise(**small), mixed()))
    return Case("optimized", base.source, base.inputs, base.exact, base.ulps, base.length)


# ------------------------------------------------------------------- sizes given as inputs
@st.composite
def transposed(draw) -> tuple[ConvT, tuple[int, ...]]:
    """PlaidML's transposed convolutions (``conformance/conv_transpose.py``) of rank 1-2: any
    padding, stride, dilation and layout, and an output size of 0-9 per axis, which the program
    takes as 0-D inputs ``D0, D1`` (docs/semantics.md §6.3.1)."""
    rank = draw(st.integers(1, 2))
    dims = st.lists(st.integers(1, 3), min_size=rank, max_size=rank).map(tuple)
    kernel, strides, dilation = draw(dims), draw(dims), draw(dims)
    padding = draw(st.sampled_from(["valid", "same_upper", "same_lower", "0", "1", "2"]))
    first = draw(st.booleans())
    spatial = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    size = tuple(draw(st.lists(st.integers(0, 9), min_size=rank, max_size=rank)))
    o_shape = (1, 2, *spatial) if first else (1, *spatial, 2)
    return ConvT(kernel, strides, padding, o_shape, 2, (size,), dilation, first), size


@st.composite
def sized(draw) -> Case:
    """Programs whose output sizes are 0-D inputs: a compiled target builds for their values."""
    c, size = draw(transposed())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    o, k = c.inputs(rng, draw(st.sampled_from(CONTRACTION_DTYPES)))
    length = int(np.prod(c.kernel)) * k.shape[-1]  # each output element sums kernel points x CO
    return Case("sized", c.source(), {"O": o, "K": k, **size_arrays(size)}, length=length)


PRODUCT_DTYPES = [np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
PRODUCT_SOURCES = {
    "matmul": "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }",
    "batched": "function (A[P, M, K], B[P, K, N]) -> (C) "
    "{ C[p, i, j: P, M, N] = +(A[p, i, k] * B[p, k, j]); }",
    "conv": "function (A[M, W, C], B[R, C, N]) -> (O) "
    "{ O[m, x, n: M, W - R + 1, N] = +(A[m, x + r, c] * B[r, c, n]); }",
}


# a product of at least this many multiply-adds is large enough for a GPU's matrix unit
# (``stripe.passes.tensorize``'s ``min_macs`` is 2^18): a 16-bit one the unit's tiles decline (few
# columns, a short innermost reduction: a convolution's 3 x 12 taps and channels) then runs the
# tiled SIMT kernel on half operands, which no smaller product reaches (a grouped convolution gave
# non-finite outputs there on the H100 before 41fb157, and no family caught it)
LARGE_MACS = 300_000


@st.composite
def large_sizes(draw, kind: str, taps: int) -> tuple[int, int, int, int]:
    """``(m, n, k, width)`` of a product of ``kind`` (``taps``: the convolution's) of about
    ``LARGE_MACS`` multiply-adds or more: few columns, a short reduction, the rows making up the
    rest (``width``: the convolution's output columns)."""
    n, k = draw(st.integers(1, 8)), draw(st.integers(2, 24))
    width = draw(st.integers(24, 72)) if kind == "conv" else 1
    per_row = n * k * (taps * width if kind == "conv" else 2 if kind == "batched" else 1)
    return -(-LARGE_MACS // per_row), n, k, width


@st.composite
def products(draw) -> Case:
    """A matrix product of random normal data (values unlike integers, so every rounding shows):
    ``notes`` keep the dtype and the reduction length for ``conformance.precision``. A quarter of
    the draws are large (``large_sizes``)."""
    kind = draw(st.sampled_from(sorted(PRODUCT_SOURCES)))
    dtype = draw(st.sampled_from(PRODUCT_DTYPES))
    m, n, k = draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(1, 64))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    r, width = draw(st.integers(1, 3)), 2
    if draw(st.integers(0, 3)) == 0:  # now and then past LARGE_MACS (``large_sizes``)
        m, n, k, width = draw(large_sizes(kind, r))
    if kind == "matmul":
        shapes, length = ((m, k), (k, n)), k
    elif kind == "batched":
        shapes, length = ((2, m, k), (2, k, n)), k
    else:
        shapes, length = ((m, r + width, k), (r, k, n)), r * k
    a, b = (rng.standard_normal(s).astype(dtype) for s in shapes)
    notes = {"dtype": dtype.name, "length": length}
    return Case("products", PRODUCT_SOURCES[kind], {"A": a, "B": b}, False, 8.0, length, notes)


FAMILIES = {
    "contractions": contractions,
    "elementwise": elementwise,
    "mixed": mixed,
    "gradients": gradients,
    "defracted": defracted,
    "flat": flat,
    "optimized": optimized,
    "sized": sized,
    "products": products,
}
