"""Every transform stage keeps a contraction's meaning, on Hypothesis-generated contractions.

Contractions have multivariable and rational output indices (``O[2*i + j, k]``, ``O[(i + 2*k)/2]``,
``O[3*i - 2*j + 1]``), constraints, every aggregation (``=`` only where nothing is written twice) and
one or two operands. The expected value comes from ``tests/bruteforce.py`` (a naive evaluator of
the language definition that imports neither ``tile`` nor ``ref_interp``). Checked:

* the interpreter in exact precision gives that value at stages tile, reduced, defracted and flat;
* the defracted form has only integer coefficients;
* the flat form, enumerated from its own fields, has exactly the original's valid tuples, the same
  value, and no output element reached from two different values of the output-owning indices;
* the printed reduced/defracted programs re-parse, bind and evaluate to the same value;
* a contraction without valid tuples is a located TileIndexError at every stage.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ref_interp
import tile
from tests.bruteforce import Poly, Spec, evaluate
from tests.test_transforms import assert_exact, check_ownership, flat_value
from tile.bind import bind
from tile.bounds import ranges
from tile.dtypes import DType
from tile.errors import TileIndexError
from tile.transforms import STAGES, apply_stage, transform
from tile.transforms.emit import format_flat_program, format_stage
from tile.typed import TContraction, TensorType

PROPS = settings(derandomize=True, deadline=None, max_examples=400,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
VARS = "ijk"


# --------------------------------------------------------------------------------- strategies
def interval(p: Poly, box: dict[str, tuple[int, int]]) -> tuple[Fraction, Fraction]:
    lo = hi = Fraction(p.const, p.den)
    for v, c in p.coeffs:
        a, b = Fraction(c * box[v][0], p.den), Fraction(c * box[v][1], p.den)
        lo, hi = lo + min(a, b), hi + max(a, b)
    return lo, hi


@st.composite
def home(draw, v: str):
    """A dimension indexed by ``v`` alone (bounds ``v``): ``(poly, size, v's rough range)``."""
    e = draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["plain", "plain", "shift", "double", "half", "flip"]))
    if kind == "plain":
        return Poly(((v, 1),)), e, (0, e - 1)
    if kind == "shift":
        return Poly(((v, 1),), 1), e, (-1, e - 2)
    if kind == "double":
        return Poly(((v, 2),)), 2 * e - 1, (0, e - 1)
    if kind == "half":
        return Poly(((v, 1),), 0, 2), e, (0, 2 * e - 2)
    return Poly(((v, -1),), e - 1), e, (0, e - 1)


@st.composite
def mixed(draw, variables: str, box, dens=(1,), max_vars: int = 2) -> tuple[Poly, int]:
    """A polynomial of 1-``max_vars`` variables, shifted so most of its values over ``box`` are
    ``>= 0``, and a dimension size that holds most of them (sometimes one or two short)."""
    chosen = draw(st.lists(st.sampled_from(variables), min_size=1, max_size=max_vars, unique=True))
    coeffs = tuple((v, draw(st.sampled_from([1, 1, 2, 3, -1, -2]))) for v in sorted(chosen))
    den = draw(st.sampled_from(dens))
    low = sum(min(c * box[v][0], c * box[v][1]) for v, c in coeffs)
    p = Poly(coeffs, -low + draw(st.integers(-1, 1)), den)
    _, hi = interval(p, box)
    return p, max(1, int(hi) + 1 - draw(st.integers(0, 2)))


@st.composite
def spec_case(draw):
    variables = VARS[:draw(st.integers(1, 3))]
    n_ops = draw(st.integers(1, 2))
    comb = "" if n_ops == 1 else draw(st.sampled_from(["*", "+"]))
    # operands: each variable's home dimension somewhere, plus 0-1 mixed dimensions each
    dims: list[list[tuple[Poly, int]]] = [[] for _ in range(n_ops)]
    box = {}
    for v in variables:
        p, size, box[v] = draw(home(v))
        dims[draw(st.integers(0, n_ops - 1))].append((p, size))
    for t in range(n_ops):
        if not dims[t] or draw(st.booleans()):
            dims[t].insert(draw(st.integers(0, len(dims[t]))), draw(mixed(variables, box)))
    out = [draw(mixed(variables, box, dens=(1, 1, 2, 3), max_vars=3)) for _ in range(draw(st.integers(1, 2)))]
    constraints = tuple(draw(st.lists(mixed(variables, box), max_size=1)))
    agg = draw(st.sampled_from(["+", "+", "*", ">", "<", "="]))
    spec = Spec(agg, comb, tuple(s for _, s in out), tuple(p for p, _ in out),
                tuple(tuple(p for p, _ in d) for d in dims), constraints)
    shapes = {name: tuple(s for _, s in d) for name, d in zip(spec.operands, dims)}
    seed = draw(st.integers(0, 2**16))
    inputs = {n: np.random.default_rng(seed + k).integers(-3, 4, size=s).astype(np.float32)
              for k, (n, s) in enumerate(shapes.items())}
    result = evaluate(spec, inputs, "exact")
    if agg == "=" and result.duplicate:  # `=` may not write an element twice: use max instead
        spec = dataclasses.replace(spec, agg=">")
        result = evaluate(spec, inputs, "exact")
    return spec, inputs, result


def bound_contraction(spec: Spec, inputs: dict):
    types = {k: TensorType(DType.FLOAT32, v.shape) for k, v in inputs.items()}
    b = bind(tile.parse(spec.source()), types)
    (c,) = [s for s in b.stmts if isinstance(s, TContraction)]
    return b, c


# ------------------------------------------------------------------------------------ properties
@PROPS
@given(spec_case())
def test_every_stage_has_the_same_meaning(case):
    spec, inputs, result = case
    src = spec.source()
    if result.valid == 0:
        for stage in STAGES:
            try:
                ref_interp.run(src, inputs, "exact", stage=stage)
            except TileIndexError as e:
                assert e.span is not None and e.span.source is not None, (stage, src)
            else:
                raise AssertionError(f"no valid tuple, yet stage {stage} ran:\n{src}")
        return
    for stage in STAGES:
        got = ref_interp.run(src, inputs, "exact", stage=stage)["O"]
        assert got.dtype == object
        assert_exact(got, result.value)
    _, c = bound_contraction(spec, inputs)
    d = transform(c, "defracted")
    assert all(r.poly.is_integral for r in ranges(d)), src
    f = transform(c, "flat")
    tuples = check_ownership(f)
    assert len(tuples) == result.valid, src  # each valid tuple exactly once
    assert_exact(flat_value(f, inputs), result.value)


@settings(PROPS, max_examples=200)
@given(spec_case())
def test_printed_stages_reparse_to_the_same_meaning(case):
    spec, inputs, result = case
    if result.valid == 0:
        return
    b, _ = bound_contraction(spec, inputs)
    for stage in ("reduced", "defracted"):
        text = format_stage(apply_stage(b, stage))
        assert_exact(ref_interp.run(text, inputs, "exact")["O"], result.value)
    # the flat stage as Tile over 1-D views (constraints carry every bound the views lose)
    flat = apply_stage(b, "flat")
    try:
        text = format_flat_program(flat)
    except TileIndexError as e:  # a digit only constraints use: no Tile spelling, said plainly
        (f,) = flat.stmts
        hidden = [n for k, n in enumerate(f.names) if not any(a.strides[k] for a in (f.output, *f.operands))]
        assert hidden and all(n in e.message for n in hidden), e
        return
    assert_exact(ref_interp.run(text, inputs, "exact")["O"], result.value)
