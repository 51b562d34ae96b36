"""The precision modes' tolerances (``conformance/precision.py``) are tight enough to catch a wrong
answer and wide enough for every answer the mode allows.

The answers are made here with numpy (the float64 product, float32 BLAS, operands rounded by
``tile.precision``'s TF32 helpers, a float16 running sum), so the interpreter is not checked
against itself. The last tests run a deliberately wrong target through
``test_conformance.check``, the suite's own path.
"""

from __future__ import annotations

from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

import ref_interp
from conformance import precision, report, targets
from conformance import test_conformance as suite
from conformance.report import compare
from conformance.strategies import PRODUCT_SOURCES, Case
from tile.dtypes import DType
from tile.precision import UNIT_ROUNDOFF, round_tf32, split_3xtf32

M, K, N = 8, 64, 8


def operands(dtype=np.float32, seed=3):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, K)).astype(dtype), rng.standard_normal((K, N)).astype(dtype)


def f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def answers(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """float32 answers a target may give: exact (then rounded), float32, TF32, 3xTF32."""
    ha, la = split_3xtf32(a)
    hb, lb = split_3xtf32(b)
    three = f64(ha) @ f64(hb) + f64(ha) @ f64(lb) + f64(la) @ f64(hb)
    return {
        "exact": (f64(a) @ f64(b)).astype(np.float32),
        "float32": a @ b,
        "tf32": (f64(round_tf32(a)) @ f64(round_tf32(b))).astype(np.float32),
        "3xtf32": three.astype(np.float32),
    }


def tolerance(mode: str, dtype: DType, a, b):
    return precision.product_tolerance(mode, dtype, K, float((np.abs(f64(a)) @ np.abs(f64(b))).max()))


def ok(mode: str, dtype: DType, a, b, want, got) -> bool:
    return compare({"C": want}, {"C": got}, tolerance(mode, dtype, a, b)) is None


def test_the_tolerance_is_twice_the_error_bound_of_a_sum_of_products():
    a, b = operands()
    s = (np.abs(f64(a)) @ np.abs(f64(b))).max()
    assert precision.magnitude(PRODUCT_SOURCES["matmul"], {"A": a, "B": b}) == s
    # a matrix unit's float32 additions may round toward zero: a whole ulp (2^-23) a step
    modes = (("native", 2.0**-24, 2.0**-24), ("tf32", 2.0**-11, 2.0**-23), ("3xtf32", 2.0**-22, 2.0**-23))
    for mode, u, acc in modes:
        tol = tolerance(mode, DType.FLOAT32, a, b)
        assert not tol.relative
        assert tol.ulps * tol.eps * tol.length == pytest.approx(2 * (5 * u + K * acc) * s)
    # float16 and bfloat16: the output's rounding, and a running sum the target may keep narrow
    assert precision.unit_roundoff("tf32", DType.FLOAT16) == 2.0**-11
    assert precision.accumulation_roundoff("native", DType.BFLOAT16) == 2.0**-8


@pytest.mark.parametrize("mode", ["native", "tf32", "3xtf32"])
def test_every_answer_the_mode_allows_passes(mode):
    a, b = operands()
    got = answers(a, b)
    want = got[mode if mode != "native" else "float32"]
    # a target may use the mode's unit or compute full float32; the exact answer is always fine
    for allowed in ("exact", "float32", mode if mode != "native" else "float32"):
        assert ok(mode, DType.FLOAT32, a, b, want, got[allowed]), allowed


@pytest.mark.parametrize(
    "mode, wrong",
    [("native", "tf32"), ("3xtf32", "tf32")],  # TF32 where float32 accuracy was asked for
)
def test_a_less_accurate_mode_fails(mode, wrong):
    a, b = operands()
    got = answers(a, b)
    want = got["float32" if mode == "native" else mode]
    assert not ok(mode, DType.FLOAT32, a, b, want, got[wrong])


@pytest.mark.parametrize("mode", ["native", "tf32", "3xtf32"])
@pytest.mark.parametrize("dtype", [DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16])
def test_one_element_off_by_twice_the_tolerance_fails(mode, dtype):
    a, b = operands(dtype.numpy)
    want = (f64(a) @ f64(b)).astype(dtype.numpy)
    tol = tolerance(mode, dtype, a, b)
    limit = tol.ulps * tol.eps * tol.length
    bad = want.copy()
    bad[2, 3] = f64(want[2, 3]) + 2 * limit
    assert compare({"C": want}, {"C": want.copy()}, tol) is None
    assert "C[2, 3]" in compare({"C": want}, {"C": bad}, tol)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_a_narrow_running_sum_passes_against_float32_accumulation(dtype):
    """Today's backends sum float16/bfloat16 products in the narrow type; the interpreter sums them
    in float32 (semantics §8.1): within the tolerance, so both stay conformant."""
    a, b = operands(dtype, seed=5)
    want = (f64(a) @ f64(b)).astype(np.float32).astype(dtype)
    run = np.zeros((M, N), dtype)
    for k in range(K):
        run = (f64(run) + f64((f64(a[:, k:k + 1]) * f64(b[k:k + 1, :])).astype(dtype))).astype(dtype)
    assert ok("native", DType.of(np.dtype(dtype)), a, b, want, run)


def test_the_general_families_scale_by_the_mode_in_float32_programs():
    assert precision.program_eps("native", [DType.FLOAT32]) == 2.0**-23  # float32's epsilon
    assert precision.program_eps("tf32", [DType.FLOAT32]) == 2.0**-10
    assert precision.program_eps("tf32", [DType.FLOAT64]) == 2.0**-52  # no float32 product
    assert precision.program_eps("3xtf32", [DType.FLOAT32, DType.FLOAT16]) == 2.0**-10
    assert precision.program_eps("native", [DType.BFLOAT16]) == 2 * UNIT_ROUNDOFF["bfloat16"]


# ---------------------------------------------------------------- through the suite's check
class _Fake:
    """A device that answers the interpreter's result in ``mode``, optionally spoiled."""

    id = "fake.0"
    capabilities = SimpleNamespace(supports=lambda dtype: True)

    def __init__(self, mode: str, spoil: float = 0.0):
        self.mode, self.spoil = mode, spoil


@pytest.fixture
def fake_compile(monkeypatch, tmp_path):
    monkeypatch.setattr(report, "FAILURES", tmp_path)
    monkeypatch.setattr(report, "STATS", report.Stats())  # not counted in the run's summary
    made: list[_Fake] = []

    def compile_(prog, device_id, settings=None):
        dev = made[-1]
        assert (settings or {}).get("precision", "native") == dev.mode  # the setting reaches it

        def run(inputs):
            out = ref_interp.run(prog, inputs, "float64")  # a full-precision target
            out["C"] = out["C"].astype(np.float32)
            out["C"][0, 0] += dev.spoil
            return out

        return run

    monkeypatch.setattr(suite.tile, "compile", compile_)
    return made


@pytest.mark.parametrize("mode", ["native", "tf32", "3xtf32"])
def test_check_passes_a_right_target_and_fails_a_wrong_one(fake_compile, mode):
    a, b = operands()
    case = Case("products", PRODUCT_SOURCES["matmul"], {"A": a, "B": b}, False, 8.0, K, {"dtype": "float32"})
    settings = {} if mode == "native" else {"precision": mode}
    right = _Fake(mode)
    fake_compile.append(right)
    suite.check(case, targets.Subject("fake.0", right, None, settings))
    wrong = _Fake(mode, spoil=1.0)  # a sum of size ~8 off by 1: beyond even TF32's bound (~0.2)
    fake_compile.append(wrong)
    with pytest.raises(AssertionError, match=r"C: 1 of 64 elements differ: C\[0, 0\]"):
        suite.check(case, targets.Subject("fake.0", wrong, None, settings))
