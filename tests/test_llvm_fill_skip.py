"""A matmul's zero fill on ``llvm_cpu.0``: when the micro-kernel starts the output from zero itself
(``backends/llvm/fills.py``), the fill kernel is not launched at all, on a cold build, an object
cache hit and a program-cache restore alike; results stay equal to the interpreter's (integer
values: exact) across sizes, long reductions (past one cache block), one and two threads, and
resident calls. Where the micro-kernel does not run (integers, a fused epilogue), nothing is
skipped."""

from __future__ import annotations

import numpy as np
import pytest

import tile
from backends import registry

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n: M, N] = +(A[m, k] * B[k, n]); }"
MATMUL_RELU = """function (A[M, K], B[K, N]) -> (R) {
  C[m, n: M, N] = +(A[m, k] * B[k, n]);
  R = relu(C);
}"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILE_CACHE_DIR", str(tmp_path))
    return tmp_path


def _ints(shape, seed, dtype):
    return np.random.default_rng(seed).integers(-3, 4, shape).astype(dtype)


def _run(src, m, k, n, dtype=np.float32, settings=None):
    """(the compiled program, its output) for a fresh executable's call, checked against the
    interpreter."""
    x = {"A": _ints((m, k), 1, dtype), "B": _ints((k, n), 2, dtype)}
    exe = tile.compile(src, "llvm_cpu.0", settings)
    got = exe(x)
    want = tile.compile(src, "interp")(x)
    for name, w in want.items():
        np.testing.assert_array_equal(got[name], w)
    return exe._last, exe, x


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,n", [(64, 64, 64), (3, 9, 5), (7, 300, 13), (67, 1500, 129), (300, 5, 3)])
def test_a_matmul_runs_without_its_fill_kernel(cache, m, k, n, threads):
    cp, exe, x = _run(MATMUL, m, k, n, settings={"threads": threads})
    assert len(cp.infos) == 2 and cp.infos[0].block.has_tags("zero")  # lowered with its fill
    assert cp.library.extra["skipped"] == [0]
    assert [name for name, _ in cp.profile()] == [cp.symbol(1)]  # only the matmul ran
    # resident and out= calls, again and again on the same output: the micro-kernel overwrites it
    a, b = tile.tensor(x["A"]), tile.tensor(x["B"])
    out = tile.empty((m, n), np.float32)
    out.numpy()  # (materialized; the poisoned buffer of the conformance suite is not assumed)
    want = x["A"].astype(np.float64) @ x["B"].astype(np.float64)
    for _ in range(3):
        np.testing.assert_array_equal(exe(A=a, B=b, out={"C": out})["C"].numpy(), want)
        np.testing.assert_array_equal(exe(A=a, B=b, resident=True)["C"].numpy(), want)


def test_float64_skips_its_fill_too(cache):
    cp, _, _ = _run(MATMUL, 33, 70, 45, np.float64)
    assert cp.library.extra["skipped"] == [0]


@pytest.mark.parametrize(
    "src,dtype", [(MATMUL, np.int32), (MATMUL_RELU, np.float32)], ids=["int", "epilogue"]
)
def test_nothing_is_skipped_where_the_fill_is_not_taken_over(cache, src, dtype):
    cp, _, _ = _run(src, 20, 30, 40, dtype)
    zero_kernels = [j for j, info in enumerate(cp.infos) if info.block.has_tags("zero")]
    assert cp.library.extra["skipped"] == []
    assert len(cp.profile()) == len(cp.infos)
    if src is MATMUL:
        assert zero_kernels == [0]  # the int matmul's fill runs: plain loops add into C


def test_an_object_cache_hit_and_a_restore_skip_the_same_fill(cache):
    first, _, _ = _run(MATMUL, 40, 50, 60, settings={"threads": 1})
    device = registry.get("llvm_cpu.0")
    # generated (and checked against the foresight), then loaded from the object cache
    built = [device.compiler.build(first.infos, {"threads": 1, "cache": c}) for c in (False, True)]
    assert [lib.extra["cache"] for lib in built] == ["off", "hit"]
    assert [lib.extra["skipped"] for lib in built] == [[0], [0]]
    snap = device.compiler.snapshot(first.library)
    restored = device.compiler.restore(first.infos, {"threads": 1}, snap)
    assert restored is not None and restored.extra["skipped"] == [0]
    old = {k: v for k, v in snap.items() if k != "skipped"}  # a snapshot from before: rebuilt
    assert device.compiler.restore(first.infos, {"threads": 1}, old) is None
    again, _, _ = _run(MATMUL, 40, 50, 60, settings={"threads": 1})  # from the program cache
    assert again.library.extra["program_cache"] == "hit" and again.library.extra["skipped"] == [0]
