"""tile.bounds as the transforms use it: merge_parallel, remove_implied, poly_interval, index_box
and check_bounded, against hand computation and brute-force enumeration of integer points."""

from __future__ import annotations

import dataclasses
import itertools
from fractions import Fraction

import numpy as np
import pytest

import ref_interp
import tile
from tile.affine import Affine
from tile.bind import bind
from tile.bounds import (
    Range,
    check_bounded,
    index_box,
    merge_parallel,
    plain_box,
    poly_interval,
    ranges,
    remove_implied,
)
from tile.dtypes import DType
from tile.errors import Span, TileIndexError
from tile.transforms import STAGES
from tile.typed import TContraction, TensorType

S = Span(1, 1)
i, j = Affine.var("i"), Affine.var("j")


def rng(poly: Affine, lo, hi, origin: str = "c") -> Range:
    return Range(poly, Fraction(lo), Fraction(hi), origin, S)


def holds(conds: list[Range], env: dict[str, int]) -> bool:
    return all(r.lo <= r.poly.evaluate(env) <= r.hi for r in conds)


def same_integer_points(a: list[Range], b: list[Range], names=("i", "j"), span=range(-12, 13)) -> None:
    for point in itertools.product(span, repeat=len(names)):
        env = dict(zip(names, point))
        assert holds(a, env) == holds(b, env), env


def contraction(src: str, **shapes: tuple[int, ...]) -> TContraction:
    types = {k: TensorType(DType.FLOAT32, v) for k, v in shapes.items()}
    (c,) = [s for s in bind(tile.parse(src), types).stmts if isinstance(s, TContraction)]
    return c


# ----------------------------------------------------------------------------- merge_parallel
def test_merge_parallel_intersects_multiples():
    conds = [rng(i * 2 + 1, 0, 9, "first"), rng(i, 0, 6, "second")]
    (merged,) = merge_parallel(conds)
    # i in [-1/2, 4] and [0, 6]: i in [0, 4], kept in the first condition's form 2*i + 1
    assert (merged.poly, merged.lo, merged.hi) == (i * 2 + 1, 1, 9)
    assert merged.origin == "first (merged with 1 more)"
    same_integer_points([merged], conds, names=("i",))


def test_merge_parallel_negative_and_multivariable():
    conds = [rng(-i + 5, 0, 3), rng(i * 2, 0, 20)]
    (merged,) = merge_parallel(conds)
    assert merged.poly == -i + 5 and (merged.lo, merged.hi) == (0, 3)
    same_integer_points([merged], conds, names=("i",))
    conds = [rng(i + j, 0, 5), rng(i * 2 + j * 2 - 1, 0, 8), rng(-i * 3 - j * 3, -12, 0)]
    (merged,) = merge_parallel(conds)
    # i + j in [1/2, 9/2] and [0, 4]; each polynomial is an integer at a valid tuple: [1, 4]
    assert merged.poly == i + j and (merged.lo, merged.hi) == (1, 4)
    same_integer_points([merged], conds)


def test_merge_parallel_keeps_other_directions_and_constants():
    conds = [rng(i + j, 0, 5), rng(i - j, 0, 5), rng(Affine.constant(2), 0, 3), rng(j * 2, 0, 4)]
    out = merge_parallel(conds)
    assert out[0] == conds[2]  # constant conditions first, as they are
    assert [r.poly for r in out[1:]] == [i + j, i - j, j * 2]
    assert out[1:] == [conds[0], conds[1], conds[3]]


# ----------------------------------------------------------------- remove_implied, poly_interval
def test_poly_interval_is_the_exact_range_over_the_box():
    box = {"i": (0, 4), "j": (-1, 2)}
    p = i * 2 - j * 3 + 1
    lo, hi = poly_interval(p, box)
    values = [p.evaluate({"i": a, "j": b}) for a in range(0, 5) for b in range(-1, 3)]
    assert (lo, hi) == (min(values), max(values)) == (-5, 12)
    assert poly_interval(i / 2, box) == (0, 2)


def test_remove_implied_drops_only_what_the_box_guarantees():
    box = {"i": (0, 4), "j": (0, 2)}
    implied = rng(i + j, 0, 6)
    tight = rng(i + j, 0, 5)
    fractional = rng(i / 2, 0, 2)  # the box implies its range, not that i is even
    lower = rng(i * 2 - j, -2, 8)
    assert remove_implied([implied, tight, fractional, lower], box) == [tight, fractional]


# -------------------------------------------------------------------------------- index_box
def brute_box(c: TContraction, span=range(-12, 13)) -> dict[str, tuple[int, int]]:
    names = list(c.index_names)
    conds = ranges(c)
    valid = []
    for point in itertools.product(span, repeat=len(names)):
        env = dict(zip(names, point))
        if all(r.poly.evaluate(env).denominator == 1 and r.lo <= r.poly.evaluate(env) <= r.hi for r in conds):
            valid.append(point)
    return {v: (min(p[k] for p in valid), max(p[k] for p in valid)) for k, v in enumerate(names)}


@pytest.mark.parametrize("src, shapes, want", [
    # j is bounded only through i + j and i - j; interval propagation alone gives i <= 9
    ("function (A[N], B[M]) -> (O) { O[i: 10] = +(A[i + j] * B[i - j]); }", {"A": (4,), "B": (4,)},
     {"i": (0, 3), "j": (-1, 1)}),
    ("function (A[N], B[M]) -> (O) { O[i: 10] = +(A[(i + j)/2] * B[j]); }", {"A": (3,), "B": (4,)},
     {"i": (0, 4), "j": (0, 3)}),
    ("function (I[N]) -> (O) { O[x: 5] = +(I[x + k - 1]), k < 3; }", {"I": (5,)},
     {"x": (0, 4), "k": (0, 2)}),
    # j - i in [0, 1] and 2*i + j <= 6: the rational maximum of j is 8/3, at i = 5/3
    ("function (A[N]) -> (O) { O[i: 8] = +(A[2*i + j]), j - i < 2, i - j + 1 < 2; }", {"A": (7,)},
     {"i": (0, 2), "j": (0, 2)}),
], ids=["diamond", "half", "conv", "constraints"])
def test_index_box_is_exact(src, shapes, want):
    c = contraction(src, **shapes)
    assert index_box(c) == want
    assert brute_box(c) == want


@pytest.mark.parametrize("src, shapes, plain", [
    ("function (A[M, K], B[K, N]) -> (O) { O[i, j: M, N] = +(A[i, k] * B[k, j]); }",
     {"A": (5, 3), "B": (3, 4)}, True),
    ("function (I[N]) -> (O) { O[x: 6] = +(I[x + 2]); }", {"I": (5,)}, True),  # O is longer: x <= 2
    ("function (I[N]) -> (O) { O[x: 5] = +(I[x - 1]), x < 3; }", {"I": (5,)}, True),
    ("function (I[N]) -> (O) { O[x: 5] = +(I[x + k - 1]), k < 3; }", {"I": (5,)}, False),  # two indexes
    ("function (I[N]) -> (O) { O[x: 5] = +(I[2*x]); }", {"I": (5,)}, False),  # a coefficient of 2
    ("function (I[N]) -> (O) { O[x: 3] = +(I[x + 5]); }", {"I": (5,)}, False),  # empty: index_box says why
], ids=["matmul", "offset", "constraint", "conv", "stride", "empty"])
def test_plain_box_is_index_box_where_it_answers(src, shapes, plain):
    """The shortcut lowering takes for spaces of lone indexes: the exact box, or None."""
    c = contraction(src, **shapes)
    got = plain_box(c)
    assert (got is not None) == plain
    if plain:
        assert got == index_box(c) == brute_box(c)
        assert list(got) == list(c.index_names)  # the interpreter's order


def test_index_box_errors_name_the_culprit():
    src = "function (A[N]) -> (O) { O[i: 3] = +(A[i + 5]); }"
    with pytest.raises(TileIndexError) as e:
        index_box(contraction(src, A=(4,)))
    assert "dimension 0 of 'A' (size 4)" in e.value.message
    assert (e.value.span.line, e.value.span.col) == (1, src.index("i + 5") + 1)
    src = "function (A[N]) -> (O) { O[i: 3] = +(A[3*i - 1]); }"  # i in [1/3, 2/3]
    with pytest.raises(TileIndexError, match="holds no integer"):
        index_box(contraction(src, A=(2,)))


def test_rationally_feasible_but_integer_empty_is_located_at_every_stage():
    """2*i + 3*j == 1 has rational solutions in the box, but no integer one."""
    src = "function (B[N]) -> (O) { O[i: 3] = +(B[j]), 2*i + 3*j - 1 < 1; }"
    for stage in STAGES:
        with pytest.raises(TileIndexError) as e:
            ref_interp.run(src, {"B": np.ones(3, np.float32)}, "exact", stage=stage)
        assert e.value.span is not None and e.value.span.source is not None, stage
        assert (e.value.span.line, e.value.span.col) == (1, src.index("2*i") + 1), stage
        assert "`2*i + 3*j - 1 < 1`" in e.value.message, stage  # the user's constraint empties it


# ----------------------------------------------------------------------------- check_bounded
def test_check_bounded():
    ok = contraction("function (A[N], B[M]) -> (O) { O[i: 10] = +(A[i + j] * B[i - j]); }", A=(4,), B=(4,))
    check_bounded(ok)  # j = ((i + j) - (i - j)) / 2 is bounded
    a, b = ok.operands
    bad = dataclasses.replace(ok, operands=(dataclasses.replace(a, polys=(i,)),
                                            dataclasses.replace(b, polys=(j - Affine.var("k"),))))
    with pytest.raises(TileIndexError, match="index 'j' of 'O' is unbounded"):
        check_bounded(bad)
    src = "function (A[N], B[M]) -> (O) { O[i: 3] = +(A[i] * B[j - k]); }"
    with pytest.raises(TileIndexError, match="unbounded") as e:
        contraction(src, A=(3,), B=(3,))
    assert (e.value.span.line, e.value.span.col) == (1, src.index("j - k") + 1)
