"""``bench.gemm_shapes``'s pure parts, here without a GPU: the listed and held-out sizes, the error
measure, the budget, the table; and each case kind measured end to end at tiny sizes on
``llvm_cpu.0`` against PyTorch on the CPU (the programs, the layouts PyTorch is given, the float64
reference)."""

from __future__ import annotations

import io
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from bench import gemm_shapes as gs


def test_the_listed_sizes_cover_every_category_and_the_quick_ones_are_listed():
    specs = gs.listed()
    assert {s.category for s in specs} == set(gs.CATEGORIES)
    assert {s.kind for s in specs if s.category == "conv"} == set(gs.CONVS)
    assert len({s.label for s in specs}) == len(specs)  # labels name the cases
    quick = gs.quick()
    assert [s.label for s in quick] == [s.label for s in specs if s.label in gs.QUICK]
    assert len(quick) == len(gs.QUICK) and {s.category for s in quick} == set(gs.CATEGORIES)


def test_held_out_sizes_are_seeded_new_and_cover_every_category():
    listed = {(s.kind, s.dims, s.dtype, s.precision) for s in gs.listed()}
    a, b = gs.held_out(41), gs.held_out(41)
    assert a == b and a != gs.held_out(42)
    assert not {(s.kind, s.dims, s.dtype, s.precision) for s in a} & listed
    for per in (1, 3):
        got = gs.held_out(7, per)
        assert [s.category for s in got] == [c for c in gs.CATEGORIES for _ in range(per)]
    for s in gs.held_out(5, 20):
        assert s.flops <= 4e11
        if s.category == "small_m":
            assert 1 <= s.dims[0] <= 64 and min(s.dims[1:]) >= 1024
        if s.kind in ("grouped", "depthwise"):
            assert s.dims[3] % s.groups == 0 and s.dims[4] % s.groups == 0
        if s.kind == "stride2":
            assert s.dims[1] % 2 == 0
    unaligned = [s for s in gs.held_out(5, 20) if s.category == "unaligned"]
    assert any(d % 8 for s in unaligned for d in s.dims)


def test_max_error_in_float64():
    exact = np.array([1.0, 2.0, 3.0 + 2.0**-30])
    assert gs.max_error(np.array([1, 2, 3], np.float16), exact) == 2.0**-30
    assert gs.max_error(np.array([1, 2.5, 3], ml_dtypes.bfloat16), exact) == 0.5
    assert gs.max_error(np.array([1, np.nan, 3], np.float32), exact) == np.inf
    assert gs.max_error(np.array([1, np.inf, 3], np.float16), exact) == np.inf  # (not 1.8e308)
    assert gs.max_error(np.zeros(0), np.zeros(0)) == 0.0


def test_the_budget_stops_new_cases_and_lists_them():
    specs = gs.quick()[:4]
    now = [0.0]

    def clock():
        return now[0]

    def measure(spec):
        now[0] += 30.0
        if spec is specs[1]:
            raise RuntimeError("no kernel\nmore")
        return _row(spec, 1.0, 2.0 if spec is specs[0] else 0.5)

    rows = gs.run(specs, measure, budget=95.0, clock=clock, out=io.StringIO())
    assert [r.get("skipped") for r in rows] == [None, None, None, "budget"]  # 90 + 30 > 95: no fourth
    assert rows[1]["error"] == "RuntimeError: no kernel"
    text = gs.table(rows)
    lines = text.splitlines()
    assert len(lines) == 2 + len(rows) + 2
    assert all(ln.count("|") == lines[0].count("|") for ln in lines[: 2 + len(rows)])
    assert "skipped (budget)" in text and "failed: RuntimeError: no kernel" in text
    assert "| 2.00 (0.8) |" in text and "| 0.50 (0.8) **low** |" in text
    assert "1 of 2 measured cases meet both goals; 2 not measured." in text


def _row(spec, tile_s, peer_s, tile_err=1e-3, peer_err=2e-3):
    return dict(category=spec.category, case=spec.label, peer=spec.peer, tile_ms=tile_s * 1e3,
                peer_ms=peer_s * 1e3, ratio=peer_s / tile_s, goal=spec.goal, tile_tflops=1.0,
                peer_tflops=1.0, tile_err=tile_err, peer_err=peer_err, err_ok=tile_err <= peer_err,
                kernels=["k0"])


def test_a_row_below_its_goal_or_worse_than_the_peer_is_marked():
    spec = gs.listed()[0]
    low = gs.table_row(_row(spec, 2.0, 1.0))
    worse = gs.table_row(_row(spec, 1.0, 1.0, tile_err=3e-3))
    assert "**low**" in low and "**worse**" not in low
    assert "**worse**" in worse and "**low**" not in worse


TINY = [
    gs.Spec("small_m", "mm", (3, 40, 200)),
    gs.Spec("precision", "mm", (17, 9, 33), "bfloat16"),
    gs.Spec("precision", "mm", (17, 9, 33), "float32", "3xtf32"),
    gs.Spec("batched", "bmm", (3, 5, 16, 7)),
    gs.Spec("conv", "conv3x3", (2, 5, 5, 8, 6)),
    gs.Spec("conv", "conv1x1", (2, 5, 5, 8, 6)),
    gs.Spec("conv", "stride2", (2, 6, 6, 8, 6)),
    gs.Spec("conv", "grouped", (2, 5, 5, 8, 12), groups=4),
    gs.Spec("conv", "depthwise", (2, 5, 5, 8, 8), groups=8),
]


@pytest.mark.parametrize("spec", TINY, ids=lambda s: s.label)
def test_each_kind_measures_end_to_end_on_the_cpu(spec):
    """Tile and PyTorch compute the same result from the same data: both errors against the
    float64 result within the rounding bound."""
    pytest.importorskip("torch", reason="torch is not installed")
    from backends import registry

    if "llvm_cpu.0" not in registry.devices():
        pytest.skip("no llvm_cpu.0 here")
    if spec.dtype == "float16" and spec.kind != "mm":
        spec = replace(spec, dtype="float32")  # (layouts: exact enough in float32)
    row = gs.measure(spec, "llvm_cpu.0", "cpu", reps=1)
    terms = spec.dims[2] if spec.kind in ("mm", "bmm") else 9 * spec.dims[3] // spec.groups
    u = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}[spec.dtype]
    # the final rounding and the float32 sum's gamma bound, times S = sum |a b|, below ``terms``
    # for standard normal data (E|a||b| = 2/pi) at these sizes; a wrong layout errs by sqrt(terms)
    bound = (2 * u + terms * 2.0**-23) * terms
    assert row["tile_err"] <= bound and row["peer_err"] <= bound, (row, bound)
    assert row["tile_ms"] > 0 and row["peer_ms"] > 0 and row["ratio"] == row["peer_ms"] / row["tile_ms"]
    assert row["case"] == spec.label and row["err_ok"] == (row["tile_err"] <= row["peer_err"])
