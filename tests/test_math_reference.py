"""The math accuracy family's reference and bounds (``conformance/math_accuracy.py``): the exact
rounding, the double bracket against mpmath alone, the ulp measure and its special-value rules, the
interpreter (strict mode's definition) within the strict bounds, a wrong target caught with a
failure folder, and docs/semantics.md §8.6's table equal to ``BOUNDS``."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import ref_interp
from conformance import math_accuracy as ma

REPO = Path(__file__).resolve().parent.parent
F16, BF16, F32 = ma.FORMATS["float16"], ma.FORMATS["bfloat16"], ma.FORMATS["float32"]


def _exact(d: float) -> tuple[int, int, int]:
    """A finite double as (sign, integer mantissa, exponent), exactly."""
    m, e = np.frexp(abs(d))
    return int(np.signbit(d)), int(m * 2**53), int(e) - 53


@pytest.mark.parametrize("fmt", list(ma.FORMATS.values()), ids=lambda f: f.name)
def test_round_exact_is_the_conversion_of_numpy_and_tile_precision(fmt):
    """Doubles across every binade of the format, its subnormals and past its overflow, and exact
    midpoints (ties to even): ``round_exact`` agrees with numpy's (float16, float32) and
    ``tile.precision.to_bfloat16``'s one rounding, bit for bit."""
    rng = np.random.default_rng(5)
    mags = np.exp2(rng.uniform(fmt.emin - fmt.p - 2, fmt.emax + 2, 20000))
    d = mags * rng.choice([-1.0, 1.0], mags.size)
    grid = fmt.round(d).astype(np.float64)
    with np.errstate(over="ignore"):
        above = np.nextafter(grid.astype(fmt.dtype), np.inf).astype(fmt.dtype).astype(np.float64)
    mids = (grid + above) / 2
    d = np.concatenate([d, mids[np.isfinite(mids)], [0.0, -0.0, 65520.0, 65519.99, 2.0**-25, 2.0**-26]])
    mine = np.array([ma.round_exact(*_exact(float(v)), fmt) for v in d]).astype(fmt.dtype)
    theirs = fmt.round(d)
    assert np.array_equal(mine.view(fmt.bits), theirs.view(fmt.bits))


def test_an_exact_midpoint_rounds_to_even():
    """pow(169, 1.5) = 2197, halfway between the float16 values 2196 and 2198: no bracket decides
    it, mpmath's neither, and it rounds to even (2196, whose last significand bit is 0)."""
    cr, _, slow = ma.correctly_rounded("pow", F16, np.array([169.0], np.float16), np.array([1.5], np.float16))
    assert slow == 1 and float(cr[0]) == 2196.0
    cr, _, _ = ma.correctly_rounded("pow", F16, np.array([169.0], np.float16), np.array([0.5], np.float16))
    assert float(cr[0]) == 13.0


@pytest.mark.parametrize("fmt", list(ma.FORMATS.values()), ids=lambda f: f.name)
def test_the_double_bracket_agrees_with_mpmath_alone(fmt):
    """For every function, 150 inputs drawn from the family's own (finite results): the reference
    (the C library's double, mpmath only near a midpoint) equals mpmath's correct rounding (Ziv's
    loop, ``ma._ziv``) bit for bit. A libm outside ``DOUBLE_ULPS`` would show here."""
    ins = ma.inputs(fmt, 20000, seed=7)
    rng = np.random.default_rng(11)
    for fn in ma.FUNCTIONS:
        y = ins["B"] if fn == "pow" else None
        cr, d, _ = ma.correctly_rounded(fn, fmt, ins["A"], y)
        ok = np.flatnonzero(np.isfinite(d) & (d != 0) & np.isfinite(ma._f64(ins["A"])))
        for i in rng.choice(ok, 150, replace=False):
            x = float(ins["A"][i])
            want = ma._ziv(fn, fmt, x, None if y is None else float(y[i]))
            assert float(cr[i]) == want, (fn, fmt.name, x, float(cr[i]), want)


def test_ulp_errors_and_the_special_value_rules():
    cr = np.array([1.0, 1.0, np.inf, np.nan, 1.0, 0.0, 1e-6], np.float32)
    exact = np.array([1.0, 1.0, np.inf, np.nan, 1.0 + 2**-25, 0.0, 1e-6])
    got = np.array([np.nextafter(np.float32(1), np.float32(2)), np.nan, 3.4e38, -np.nan, 1.0, -0.0, 1e-6],
                   np.float32)
    err = ma.ulp_errors(F32, got, exact, cr)
    assert err[0] == 1.0  # one ulp above
    assert err[1] == np.inf and err[2] == np.inf  # nan for a number; the largest finite for inf
    assert err[3] == 0.0 and err[5] == 0.0  # any nan for nan; a zero's sign is no ulp
    assert err[4] == 0.25
    tiny = np.array([2.0**-130]), np.array([0.0], np.float32)  # exact value below the normal range
    assert ma.ulp_errors(F32, tiny[1], tiny[0], np.float32(tiny[0]))[0] == 2.0**-130 / 2.0**-149
    assert ma.ulp_errors(F32, tiny[1], tiny[0], np.float32(tiny[0]), flush=True)[0] == 0.0


def test_a_signaling_nan_may_propagate_only_outside_strict_mode():
    a = np.array([0x7F810000, 0x7FC00000], np.uint32).view(np.float32)  # signaling, quiet
    ins = {"A": a, "B": np.zeros(2, np.float32)}
    ref = ma.correctly_rounded("pow", F32, ins["A"], ins["B"])[:2]
    assert list(ref[0]) == [1.0, 1.0]
    got = np.array([np.nan, 1.0], np.float32)
    assert ma.measure("pow", F32, "default", got, ins, ref)[0].over == 0
    assert ma.measure("pow", F32, "strict", got, ins, ref)[0].over == 1
    assert list(ma.signaling_nan(F32, a)) == [True, False]


@pytest.mark.parametrize("dtype, count", [("float16", 0), ("bfloat16", 0), ("float32", 20000)])
def test_the_interpreter_is_within_the_strict_bounds(dtype, count):
    """The interpreter defines strict mode (§8.3): every function within its strict bound on all
    16-bit inputs and a float32 sample, and correctly rounded wherever the bound is 0.5+."""
    fmt = ma.FORMATS[dtype]
    ins = ma.inputs(fmt, count)
    got = ref_interp.run(ma.program(), ins)
    for fn in ma.FUNCTIONS:
        ref = ma.correctly_rounded(fn, fmt, ins["A"], ins["B"] if fn == "pow" else None)[:2]
        m, _ = ma.measure(fn, fmt, "strict", got[f"O_{fn}"], ins, ref)
        assert m.over == 0, m.problem()
        if m.bound == ma.STRICT_ULPS:
            assert m.not_rounded == 0, m


def test_a_wrong_target_fails_with_a_folder(broken):
    """The broken device adds 1 to each output's first element: float16 x = 0 gives exp 2, not 1."""
    from backends import registry
    from conformance.test_math_accuracy import check_accuracy

    with pytest.raises(AssertionError) as err:
        check_accuracy(registry.get("broken_cpu.0"), "float16")
    message = str(err.value)
    head = "exp on float16 in default mode: 1 of 65536 inputs beyond 1 ulp, the worst 1024 ulp at x = 0.0"
    assert head in message
    folders = sorted(p.name for p in broken.iterdir())
    assert any(f.startswith("math_accuracy-broken_cpu.0-") for f in folders)
    rows = report_rows()
    assert any(r["function"] == "exp" and r["mode"] == "strict" and r["max_ulp"] == 1024 for r in rows)


def report_rows() -> list[dict]:
    from conformance import report

    return report.STATS.tables["math_accuracy"]


@pytest.fixture
def broken(monkeypatch, tmp_path):
    from backends import registry
    from conformance import report
    from conformance.test_report import BROKEN, BrokenDevice

    if "llvm_cpu.0" not in registry.devices():
        pytest.skip(f"the broken device wraps llvm_cpu.0: {registry.unavailable()}")
    monkeypatch.setitem(registry.devices(), BROKEN, BrokenDevice())
    monkeypatch.setattr(report, "FAILURES", tmp_path / "failures")
    monkeypatch.setattr(report, "STATS", report.Stats())
    return tmp_path / "failures"


def _cell(text: str) -> ma.Bound:
    text = text.strip()
    flush = text.endswith("(flush)")
    number = text.removesuffix("(flush)").strip()
    return ma.Bound(ma.STRICT_ULPS if number == "0.5+" else float(number), flush)


def test_the_documented_table_is_bounds():
    text = (REPO / "docs" / "semantics.md").read_text()
    section = text[text.index("### 8.6 Accuracy of the float functions"):text.index("## 9. Errors")]
    rows = re.findall(r"^\| `(\w+)` \|([^|]+)\|([^|]+)\|([^|]+)\|", section, re.M)
    assert [r[0] for r in rows] == list(ma.FUNCTIONS)
    for fn, strict, narrow, wide in rows:
        for dtype in ma.FORMATS:
            assert ma.BOUNDS["strict"][dtype][fn] == _cell(strict), (fn, dtype)
        assert ma.BOUNDS["default"]["float16"][fn] == _cell(narrow), fn
        assert ma.BOUNDS["default"]["bfloat16"][fn] == _cell(narrow), fn
        assert ma.BOUNDS["default"]["float32"][fn] == _cell(wide), fn
    assert "0.5 + 2^-20" in section and ma.STRICT_ULPS == 0.5 + 2.0**-20
