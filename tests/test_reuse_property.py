"""Buffer reuse on drawn programs: one compiled program called three times (inputs, other inputs,
the first again; numpy outputs, then resident ones) gives the interpreter's answer every time, and
a resident output returned earlier is unchanged by later calls. Exact cases only (integer-valued
data, so any summation order gives the same answer); conformance's ``mixed``, ``elementwise``
and ``contractions`` families (every aggregation with ``default``, elementwise chains through the
structural builtins: scatter, gather, reshape, softmax; several outputs)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import ref_interp
import tile
from conformance.strategies import contractions, elementwise, mixed
from tests.opencl_support import DEVICE_ID as OPENCL

pytestmark = pytest.mark.usefixtures("private_cache")

DEVICES = [
    "llvm_cpu.0",
    pytest.param(OPENCL, marks=pytest.mark.skipif(OPENCL is None, reason="no usable OpenCL device")),
]
HYP = settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)


def _other(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Different values of the same shapes, dtypes and range: each array's elements reversed and
    rolled (an index input stays in range)."""
    return {k: np.roll(v.reshape(-1)[::-1], 1).reshape(v.shape).copy() for k, v in arrays.items()}


def _want(source: str, inputs: dict):
    try:
        return ref_interp.run(source, inputs)
    except tile.TileError:
        assume(False)  # a program the interpreter refuses: conformance checks the refusal


def _same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k, w in want.items():
        g = got[k].numpy() if isinstance(got[k], tile.Tensor) else got[k]
        np.testing.assert_array_equal(g, w, err_msg=k)


@pytest.mark.parametrize("dev", DEVICES)
@HYP
@given(case=st.one_of(mixed(), elementwise(), contractions()))
def test_three_calls_of_one_program(dev, case):
    assume(case.exact)
    first, second = case.inputs, _other(case.inputs)
    want1 = _want(case.source, first)
    want2 = _want(case.source, second)
    try:
        exe = tile.compile(case.source, dev)
        got1 = exe(first)
    except tile.TileError:
        assume(False)  # a dtype the device lacks, a refusal: conformance's business
    _same(got1, want1)
    kept = exe(second, resident=True)
    _same(kept, want2)
    _same(exe(first), want1)
    _same(exe(first, resident=True), want1)
    _same(kept, want2)  # the tensors an earlier call returned are its own
