"""The LLVM device's cheaper pipeline for small programs (``backends.llvm.opt_level.opt_level``): a
program of kernels that run in microseconds is optimized at ``-O1``, any larger one at ``-O3``, an
``opt`` setting wins; the level is part of the object cache's key; the answers do not change where
docs/semantics.md allows no reassociation (``strict``), and stay exact on integer-valued inputs."""

from __future__ import annotations

import numpy as np
import pytest

import tile

pytestmark = pytest.mark.usefixtures("private_cache")

MLP = """function (X[B, I], W[I, O], Bias[O]) -> (Y, S) {
  P[b, o: B, O] = +(X[b, i] * W[i, o]);
  Y = relu(P + Bias);
  S[o: O] = +(Y[b, o]);
}"""


def _inputs(b, i, o, floats=False, seed=0):
    rng = np.random.default_rng(seed)
    draw = (lambda s: rng.standard_normal(s)) if floats else (lambda s: rng.integers(-3, 4, s))
    return {"X": draw((b, i)).astype(np.float32), "W": draw((i, o)).astype(np.float32),
            "Bias": draw((o,)).astype(np.float32)}


def _compiled(x, settings=None):
    exe = tile.compile(MLP, "llvm_cpu.0", settings)
    return exe, exe.prepare(x)


@pytest.mark.parametrize("size, settings, level", [
    ((6, 8, 5), None, 1),  # every kernel a few hundred operations
    ((96, 128, 96), None, 3),  # a 2.4 MFLOP product
    ((6, 8, 5), {"opt": 3}, 3),
    ((96, 128, 96), {"opt": 2}, 2),
])
def test_the_pipeline_level_follows_the_kernels_size_unless_set(size, settings, level):
    x = _inputs(*size)
    exe, cp = _compiled(x, settings)
    assert cp.library.extra["opt"] == level
    want = tile.compile(MLP, "interp")(x)
    got = exe(x)
    for name, w in want.items():
        np.testing.assert_array_equal(got[name], w)  # integer-valued: exact at any level


def test_the_level_is_part_of_the_object_key():
    x = _inputs(6, 8, 5)
    _, cheap = _compiled(x)
    _, full = _compiled(x, {"opt": 1})
    _, o3 = _compiled(x, {"opt": 3})
    assert cheap.library.extra["opt"] == 1 and o3.library.extra["opt"] == 3
    assert cheap.library.extra["cache_key"] != o3.library.extra["cache_key"]
    assert full.library.extra["cache_key"] != o3.library.extra["cache_key"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_strict_float_results_are_bit_identical_at_either_level(seed):
    x = _inputs(7, 9, 6, floats=True, seed=seed)
    cheap_exe, cheap = _compiled(x, {"strict": True, "cache": False})
    full_exe, full = _compiled(x, {"strict": True, "cache": False, "opt": 3})
    assert (cheap.library.extra["opt"], full.library.extra["opt"]) == (1, 3)
    a, b = cheap_exe(x), full_exe(x)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
