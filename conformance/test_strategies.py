"""The generators cover what the families promise: every output rank 0–5, every aggregation, the
structural builtins, mixed programs, the flat form; and nearly everything they draw is valid."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, given, seed, settings

import ref_interp
import tile
from conformance import strategies, sweeps
from tile.builtins import BUILTINS
from tile.inputs import input_types
from tile.typed import TAssign, calls


def draw_many(strategy, n: int) -> list:
    """``n`` draws from one fixed seed: the same sample on every machine and in every checkout
    (``derandomize`` alone seeds from the test function, which differs between checkouts)."""
    seen: list = []

    @seed(20261122)
    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(case):
        seen.append(case)

    collect()
    return seen


def test_contractions_cover_every_rank_and_aggregation():
    cases = [c for c in draw_many(strategies.contractions(), 300) if "O_max" not in c.source]  # no sweeps
    ranks = set()
    for c in cases:
        m = re.search(r"\bO\[([^:\]]*)[:\]]", c.source)
        ranks.add(0 if not m.group(1).strip() else m.group(1).count(",") + 1)
    assert ranks == {0, 1, 2, 3, 4, 5}
    aggs = {re.search(r"\] = (.)\(", c.source).group(1) for c in cases}
    assert aggs == {"+", "*", ">", "<", "="}
    dtypes = {str(a.dtype) for c in cases for a in c.inputs.values()}
    assert {"float32", "float64", "int8", "uint8", "int32", "int64"} <= dtypes
    assert any(len({a.dtype for a in c.inputs.values()}) > 1 for c in cases)  # mixed types too
    assert any("default" in c.source for c in cases)


def test_elementwise_reaches_the_structural_builtins():
    # (the casts and index come from fixed templates: see test_every_elementwise_builtin_is_drawn)
    text = " ".join(c.source for c in draw_many(strategies.elementwise(), 400))
    for fn in ("reshape(", "shape(", "gather(", "scatter(", "builtin_softmax(", "builtin_logsoftmax("):
        assert fn in text, fn


def test_mixed_programs_combine_contractions_and_elementwise_statements():
    cases = draw_many(strategies.mixed(), 200)
    both = [c for c in cases if "= +(" in c.source and re.search(r"T\d = ", c.source)]
    assert both
    assert any(re.search(r"-> \(T\d, T\d\)", c.source) for c in cases)  # several outputs


def test_flat_family_reads_one_dimensional_views():
    cases = draw_many(strategies.flat(), 60)
    assert all("_1d = reshape(" in c.source for c in cases)


def test_drawn_programs_are_mostly_valid():
    for family in ("elementwise", "mixed", "flat"):
        cases = draw_many(strategies.FAMILIES[family](), 100)
        invalid = 0
        for c in cases:
            try:
                ref_interp.run(c.source, c.inputs)
            except tile.TileError:
                invalid += 1
        assert invalid <= len(cases) // 10, family


def test_every_elementwise_builtin_is_drawn():
    """Each builtin is in a template the chains draw from, or in a drawn structural program."""
    found: set = set()
    templates = strategies.UNARY_EXACT + strategies.BINARY_EXACT + strategies.CASTS
    for dtype, pool in (("float32", templates + strategies.UNARY_FLOAT), ("int32", strategies.INT_ONLY)):
        for t in pool:
            src = f"function (X, Y) -> (T) {{ T = {t.format('X', 'Y')}; }}"
            prog = tile.parse(src)
            ins = {"X": np.ones((2, 3), dtype), "Y": np.ones((2, 3), dtype)}
            found.update(c.fn for c in calls(tile.bind(prog, input_types(prog, ins)).stmts[0].expr))
    for c in draw_many(strategies.structural(), 300):
        prog = tile.parse(c.source)
        for stmt, syntax in zip(tile.bind(prog, input_types(prog, c.inputs)).stmts, prog.stmts):
            if isinstance(stmt, TAssign):
                found.update(c.fn for c in calls(stmt.expr))
            else:  # simple_reduce is bound as the `+` contraction it stands for
                found.add(syntax.expr.fn)
    assert set(BUILTINS) - found == set()


def test_sized_family_takes_its_sizes_as_inputs():
    """Both layouts, ranks 1 and 2, an empty output now and then, every contraction dtype; the sizes
    are 0-D int32 inputs named in the output sizes."""
    cases = draw_many(strategies.sized(), 150)
    assert all(re.search(r": N, (CI, )?D0", c.source) for c in cases)
    assert {len([n for n in c.inputs if n.startswith("D")]) for c in cases} == {1, 2}  # ranks
    assert any("O[N, CO," in c.source for c in cases) and any("O[N, L0" in c.source for c in cases)
    assert any(c.inputs["D0"] == 0 for c in cases)
    assert all(c.inputs["D0"].shape == () and c.inputs["D0"].dtype == np.int32 for c in cases)
    assert {str(c.inputs["O"].dtype) for c in cases} >= {"float32", "int8", "uint8", "int64"}


def test_the_sweeps_come_early():
    """The sweeps (every aggregation, every exact builtin at once) are among the first draws."""
    first_c = [c for c in draw_many(strategies.contractions(), 20) if "O_max" in c.source]
    first_e = [c for c in draw_many(strategies.elementwise(), 20) if "O20 =" in c.source]
    assert first_c and all(f"O_{k}" in first_c[0].source for k in sweeps.AGGREGATIONS)
    assert first_e
    for template in strategies.UNARY_EXACT + strategies.BINARY_EXACT + strategies.CASTS:
        assert template.format("X", "Y") in first_e[0].source, template


def test_sweep_values_tell_operations_apart():
    for dtype in strategies.FLOAT_DTYPES + strategies.INT_DTYPES:
        x, y = sweeps.rows(dtype)
        assert (x == y).any() and (x != y).any()  # ties and differences
        kind = np.dtype(dtype).kind
        if kind != "u":
            assert (x[0] < 0).all()  # a row only negative: max starting from 0 shows
        assert (x[1] > 0).all()  # a row only positive: min starting from 0 shows
        if kind == "f":
            assert np.isnan(x).any() and np.isposinf(x).any() and np.isneginf(x).any()
            assert (np.signbit(x) & (x == 0)).any()  # -0
        else:
            info = np.iinfo(dtype)
            assert info.min in x and info.max in x
            if kind == "i":
                assert ((x == info.min) & (y == -1)).any()  # INT_MIN / -1
    x, _ = sweeps.rows(np.float32)
    assert (x.astype(np.float16).astype(np.float32) != x).any()  # float16 rounds some
    assert (x.astype(ml_dtypes.bfloat16).astype(np.float32) != x).any()  # so does bfloat16
    assert x.shape[1] % 2 and x.shape[1] % 4  # odd extents: a remainder for any tiling


def test_contraction_sweep_values_are_exact_in_any_order():
    for dtype in strategies.CONTRACTION_DTYPES:
        x, _ = sweeps.contraction_rows(dtype)
        if np.dtype(dtype).kind == "f":  # halves of small integers: sums and products of 7 are exact
            finite = x[np.isfinite(x)]
            assert (finite * 2 == np.round(finite * 2)).all()
            assert (abs(finite) < (16 if dtype != np.float64 else 2**26)).all()
