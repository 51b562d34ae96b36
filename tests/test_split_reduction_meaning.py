"""The ``split_reduction`` pass keeps meaning: Hypothesis-drawn reductions (every aggregation,
odd sizes, drawn parameters) and drawn programs through the Stripe interpreter, and runs of split
programs on llvm_cpu.0 and OpenCL against the Tile interpreter. The Before/Expected pairs are in
``test_pass_split_reduction.py``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ref_interp
import tile
from stripe.config import format_config, target_config
from tests.opencl_support import DEVICE_ID, requires_opencl
from tests.pass_support import assert_same_meaning, lowered, programs, run_pass

# ------------------------------------------------------------------------------ meaning
AGG = {"+": "add", "*": "mul", ">": "max", "<": "min"}
SHORT = [1, 2, 3, 5, 7]
LONG = [1, 3, 13, 31, 64, 97, 211, 1000]


@st.composite
def reductions(draw):
    """A reduction of one of four shapes (row, column, global, a window whose constraint mixes
    output and reduction indexes), short outputs and long reductions of odd sizes, every
    aggregation, integer inputs: int32 for ``*`` (wrapping products are
    exact in any order), small floats for the others."""
    agg = draw(st.sampled_from(sorted(AGG)))
    kind = draw(st.sampled_from(["row", "column", "global", "window"]))
    short, long = draw(st.sampled_from(SHORT)), draw(st.sampled_from(LONG))
    m, n = (long, short) if kind == "column" else (short, long)
    src = {
        "row": f"function (A[M, N]) -> (O) {{ O[i: M] = {agg}(A[i, j]); }}",
        "column": f"function (A[M, N]) -> (O) {{ O[j: N] = {agg}(A[i, j]); }}",
        "global": f"function (A[M, N]) -> (O) {{ O[] = {agg}(A[i, j]); }}",
        "window": f"function (A[M, N]) -> (O) {{ O[i: M] = {agg}(A[i, i + j]); }}",
    }[kind]
    dtype = np.int32 if agg == "*" else np.float32
    program = lowered(src, {"A": (m, n)}, dtype)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    inputs = {"A": rng.integers(-3, 4, (m, n)).astype(dtype)}
    return program, inputs


@st.composite
def params(draw):
    return {
        "reqs": ["contraction"],
        "interleave": draw(st.booleans()),
        "parallelism": draw(st.integers(1, 40)),
        "oversubscribe": draw(st.integers(1, 3)),
        "max_outputs": draw(st.sampled_from([0, 0, 5, 1000])),
        "min_reduction": draw(st.integers(2, 16)),
        "min_chunk": draw(st.integers(2, 5)),
        "lanes": draw(st.sampled_from([0, 0, 2, 3, 8])),
        "vector": draw(st.sampled_from([0, 0, 2, 4])),
        "only_po2": draw(st.booleans()),
    }


def test_meaning_is_kept_on_drawn_reductions():
    seen = {"all": 0, "changed": 0}

    @settings(derandomize=True, deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
    @given(reductions(), params())
    def check(case, p):
        program, inputs = case
        out = run_pass("split_reduction", p, program)  # verifies
        seen["all"] += 1
        seen["changed"] += out != program
        assert_same_meaning(program, out, inputs)
        # partials (and a combine whose output was just filled) that start from the identity
        assert_same_meaning(program, run_pass("split_reduction", {**p, "self_init": True}, program), inputs)

    check()
    assert seen["changed"] >= seen["all"] // 2, seen


def test_meaning_is_kept_on_drawn_programs():
    @settings(
        derandomize=True,
        deadline=None,
        max_examples=40,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(programs(), params())
    def check(case, p):
        program, inputs = case
        for self_init in (False, True):
            out = run_pass("split_reduction", {**p, "reqs": ["kernel"], "self_init": self_init}, program)
            assert_same_meaning(program, out, inputs)

    check()


# ------------------------------------------------------------------------------ devices
RUNS = [
    ("function (A[N]) -> (O) { O[] = >(A[i]); }", (1009,)),
    ("function (A[N]) -> (O) { O[] = +(A[i]); }", (1000,)),
    ("function (A[N]) -> (O) { O[] = <(A[i]); }", (3,)),
    ("function (A[M, N]) -> (O) { O[i: M] = +(A[i, j]); }", (3, 997)),
    ("function (A[M, N]) -> (O) { O[i: M] = >(A[i, j]); }", (1, 1000)),
    ("function (A[M, N]) -> (O) { O[j: N] = <(A[i, j]); }", (101, 3)),
    ("function (A[M, N]) -> (O) { O[j: N] = *(A[i, j]); }", (13, 1)),
    ("function (A[N]) -> (O) { O[i: 5] = <(A[i + j]); }", (40,)),
]


def _config(tmp_path, kind: str, interleave: bool, self_init: bool = False) -> str:
    """The device's built-in config with small thresholds, so that the cases above split."""
    data = json.loads(format_config(target_config(kind)))  # resolved: every step written out
    step = {
        "name": "split_small",
        "pass": "split_reduction",
        "params": {
            "reqs": ["contraction"],
            "interleave": interleave,
            "parallelism": 16,
            "min_reduction": 8,
            "min_chunk": 4,
            "vector": 0 if interleave else 4,
            "self_init": self_init,
        },
    }
    data["passes"] = [step, *(s for s in data["passes"] if s["pass"] != "split_reduction")]
    path = tmp_path / f"{kind}_split.json"
    path.write_text(json.dumps(data))
    return str(path)


def _run_all(device: str, config: str) -> None:
    rng = np.random.default_rng(3)
    for src, shape in RUNS:
        dtype = np.int32 if "*(" in src else np.float32
        a = rng.integers(-3, 4, shape).astype(dtype)
        got = tile.compile(src, device, {"config": config, "cache": False})({"A": a})
        want = ref_interp.run(src, {"A": a})
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{src} on {device}")


@pytest.mark.parametrize("interleave, self_init", [(False, False), (True, False), (False, True)])
def test_llvm_runs_split_reductions(tmp_path, interleave, self_init):
    _run_all("llvm_cpu.0", _config(tmp_path, "llvm_cpu", interleave, self_init))


@requires_opencl
@pytest.mark.parametrize("interleave, self_init", [(a, b) for b in (False, True) for a in (False, True)])
def test_opencl_runs_split_reductions(tmp_path, interleave, self_init):
    _run_all(DEVICE_ID, _config(tmp_path, "opencl_gpu", interleave, self_init))
