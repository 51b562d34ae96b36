"""A resident call on ``llvm_cpu.0`` (every input a ``tile.Tensor``, ``out=`` a tensor for every
output) runs through ``backends.lane.resident_call``: the program's kernels on the tensors'
addresses, with the general path's results; anything the lane cannot take goes the general way.
Exact comparisons on small-integer inputs."""

from __future__ import annotations

import numpy as np
import pytest

import tile
from backends.runner import CompiledProgram

pytestmark = pytest.mark.usefixtures("private_cache")

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n: M, N] = +(A[m, k] * B[k, n]); }"
TWO = "function (A[M, K], B[K, N]) -> (C, D) { C[m, n: M, N] = +(A[m, k] * B[k, n]); D = C * 2 + 1; }"


def ints(seed, shape):
    return np.random.default_rng(seed).integers(-3, 4, shape).astype(np.float32)


@pytest.fixture
def general_path_counted(monkeypatch):
    """Counts the general path's calls (``CompiledProgram.run``)."""
    calls = []
    real = CompiledProgram.run

    def counted(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CompiledProgram, "run", counted)
    return calls


def test_a_resident_loop_runs_on_the_lane_with_the_general_paths_results(general_path_counted):
    f = tile.compile(TWO, device="llvm_cpu.0")
    c, d = tile.empty((5, 3), np.float32), tile.empty((5, 3), np.float32)
    a, b = tile.tensor(ints(0, (5, 7))), tile.tensor(ints(1, (7, 3)))
    f(A=a, B=b, out={"C": c, "D": d})  # the first call: the general path
    assert len(general_path_counted) == 1
    for seed in range(3):  # new values written into the same tensors: the lane reads them
        an, bn = ints(seed + 2, (5, 7)), ints(seed + 9, (7, 3))
        a.write(an)
        b.write(bn)
        got = f(A=a, B=b, out={"C": c, "D": d})
        assert got["C"] is c and got["D"] is d
        assert np.array_equal(c.numpy(), an @ bn) and np.array_equal(d.numpy(), (an @ bn) * 2 + 1)
    assert len(general_path_counted) == 1  # every later call took the lane
    prog = f._last
    assert prog._resident_lane not in (None, False)


def test_what_the_lane_leaves_to_the_general_path(general_path_counted, monkeypatch):
    f = tile.compile(MATMUL, device="llvm_cpu.0")
    a, b = tile.tensor(ints(0, (4, 4))), tile.tensor(ints(1, (4, 4)))
    c = tile.empty((4, 4), np.float32)
    f(A=a, B=b, out={"C": c})
    n = len(general_path_counted)
    f(A=a, B=a, out={"C": c})  # one buffer for two inputs
    assert np.array_equal(c.numpy(), a.numpy() @ a.numpy())
    f(A=a.numpy(), B=b, out={"C": c})  # a numpy input
    assert np.array_equal(c.numpy(), a.numpy() @ b.numpy())
    r = f(A=a, B=b)  # no out=
    assert np.array_equal(r["C"], a.numpy() @ b.numpy())
    monkeypatch.setenv("TILE_DEBUG", "1")  # (per-kernel times are the general path's)
    f(A=a, B=b, out={"C": c})
    assert len(general_path_counted) == n + 4


def test_places_no_statement_writes_are_zeros_whatever_out_held():
    """O's odd places are never written by the sum: zeros (the program's own fill, or the general
    path's zeroing, which the lane leaves to it), whatever ``out`` held before."""
    f = tile.compile("function (A[N]) -> (O) { O[2 * i: 2 * N] = +(A[i]); }", device="llvm_cpu.0")
    a = tile.tensor(np.arange(1.0, 4.0, dtype=np.float32))
    o = tile.tensor(np.full(6, 7.0, np.float32))
    for _ in range(2):
        f(A=a, out={"O": o})
        assert np.array_equal(o.numpy(), np.array([1, 0, 2, 0, 3, 0], np.float32))
        o.write(np.full(6, 7.0, np.float32))
    lane = f._last._resident_lane
    assert lane is False or not any(lane.zeroed_outputs)
