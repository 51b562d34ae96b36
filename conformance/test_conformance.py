"""Every program family, compiled for the target, against the reference interpreter."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given

import ref_interp
import tile
from conformance.strategies import Case, contractions, defracted, elementwise, gradients
from tile.inputs import input_types


def check(case: Case, device) -> None:
    try:
        prog = tile.parse(case.source)
        bound = tile.bind(prog, input_types(prog, case.inputs))
        want = ref_interp.run(bound, case.inputs)
    except tile.TileError:
        assume(False)  # not a valid program for these inputs (empty, double write, ...)
        return
    for t in bound.types.values():
        if not device.capabilities.supports(t.dtype):
            assume(False)
    got = tile.compile(prog, device.id)(case.inputs)
    assert set(got) == set(want)
    for name in want:
        w, g = want[name], got[name]
        assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, g.shape, w.dtype, w.shape)
        if case.exact or w.dtype.kind not in "fc":
            np.testing.assert_array_equal(g, w, err_msg=f"{name} of\n{case.source}")
        else:
            # the coarsest float type anywhere in the program bounds how far rounding can differ
            eps = max(np.finfo(t.dtype.numpy).eps for t in bound.types.values() if t.dtype.is_float)
            tol = case.ulps * eps * max(case.length, 1) * np.maximum(1.0, np.abs(w.astype(np.float64)))
            bad = ~((np.abs(g.astype(np.float64) - w) <= tol) | (np.isnan(g) & np.isnan(w)) | (g == w))
            assert not bad.any(), f"{name}: {g[bad]} vs {w[bad]} of\n{case.source}"


@given(contractions())
def test_contractions(device, case):
    check(case, device)


@given(elementwise())
def test_elementwise(device, case):
    check(case, device)


@given(gradients())
def test_gradients(device, case):
    check(case, device)


@given(defracted())
def test_defracted(device, case):
    check(case, device)
