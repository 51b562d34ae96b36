"""Each rewrite of ``conformance.metamorphic`` preserves the interpreter's results, bit for bit, on
drawn programs (the conformance strategies' contractions, elementwise chains and mixed programs):
that is what makes the ``metamorphic`` family's variants comparable. Each test also needs the
rewrite to apply to some drawn program (Hypothesis reports an unsatisfiable test otherwise)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import ref_interp
import tile
from conformance import metamorphic as mm
from conformance.strategies import contractions, elementwise, mixed

pytestmark = pytest.mark.filterwarnings("ignore::tile.errors.TileIndexWarning")

BASES = {
    "opaque_dead_branch": st.one_of(elementwise(), mixed(), contractions()),
    "reassociate_integers": st.one_of(elementwise(), mixed()),
    "transpose_input": st.one_of(contractions(), mixed(), elementwise()),
    "split_statement": st.one_of(elementwise(), mixed()),
    "inline_temporary": st.one_of(elementwise(), mixed()),
    "rename_indices": st.one_of(contractions(), mixed()),
    "identity_constraint": st.one_of(contractions(), mixed()),
}


def _run(source: str, inputs: dict):
    try:
        return ref_interp.run(source, inputs)
    except tile.TileError as e:
        return type(e).__name__


def same(a, b) -> bool:
    """Equal outputs: same names, dtypes, shapes and bits (nans alike), or the same refusal."""
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    if set(a) != set(b):
        return False
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.dtype.kind == "f" or x.dtype.name == "bfloat16":
            nan = np.isnan(x.astype(np.float64)) & np.isnan(y.astype(np.float64))
            if not np.all((x.view(f"u{x.itemsize}") == y.view(f"u{y.itemsize}")) | nan):
                return False
        elif not np.array_equal(x, y):
            return False
    return True


@pytest.mark.parametrize("name", list(mm.REWRITES))
def test_each_rewrite_preserves_the_interpreters_results(name):
    @settings(max_examples=60, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(BASES[name], st.integers(0, 2**16))
    def check(case, seed):
        try:
            base = mm.Variant(tile.parse(case.source), case.inputs)
            want = _run(case.source, case.inputs)
        except tile.TileError:
            assume(False)
        assume(not isinstance(want, str))  # a program the interpreter refuses has nothing to keep
        try:
            out = mm.REWRITES[name](base, random.Random(seed))
        except tile.TileError:
            assume(False)  # (binding failed: the drawn program is invalid for its inputs)
        assume(out is not None)
        text = out.source
        assert tile.parse(text) == out.program  # prints and parses back
        got = _run(text, out.inputs)
        assert same(want, got), f"{name} changed the results of\n{case.source}\ninto\n{text}\n{want}\n{got}"

    check()


def test_apply_chains_rewrites_and_names_those_that_applied():
    src = "function (A[N, M], B[M]) -> (O) { T = A + B; O[i: N] = +(T[i, j]); }"
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.array([1, 2, 3], np.int32)
    v = mm.Variant(tile.parse(src), {"A": a, "B": b})
    names = ["transpose_input", "rename_indices", "identity_constraint", "split_statement"]
    out, done = mm.apply(v, names, 3)
    assert done == ["transpose_input", "rename_indices", "identity_constraint"]  # T = A + B has no inner node
    assert same(ref_interp.run(src, v.inputs), ref_interp.run(out.source, out.inputs))
    assert "AT0" in out.inputs and out.inputs["AT0"].shape == (3, 2)
