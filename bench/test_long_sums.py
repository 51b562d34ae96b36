"""Long float32 ``+`` reductions on ``llvm_cpu``, summed in blocks (``backends/llvm/partials.py``,
the default ``sum_block`` 4096) against one running sum per element (``sum_block`` 0, the code
generator before issue 24), in the same run, with numpy at the same thread count. Each case
records its time, its ratio to numpy and its relative error against a float64 sum (``rel_err``),
so the table shows what the blocks cost and what they buy.

Run: ``python -m pytest bench/test_long_sums.py --benchmark-only [--threads 1,all]
[--benchmark-json=RUN.json]``, then ``python -m bench report RUN.json``.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import tile
from bench.cases import Case, Family, best_of, record, rounds_for

GLOBAL = "function (A[N]) -> (O) { O[] = +(A[i]); }"
ROW = "function (A[M, N]) -> (O) { O[i: M] = +(A[i, j]); }"
COLUMN = "function (A[M, N]) -> (O) { O[j: N] = +(A[i, j]); }"
OUTER = "function (A[M], B[N]) -> (O) { O[] = +(A[i] * B[j]); }"
MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"


def _random(*shape: int):
    return lambda n, r: {"A": r.random(shape, dtype=np.float32)}


def _family(name, source, make, numpy, work, unit, desc, size) -> Family:
    return Family(name, source, make, numpy, work, unit, desc, (), (size,), terms=lambda x: 1 << 24)


def _bytes(x) -> float:
    return float(sum(v.nbytes for v in x.values()))


def _pair(m: int, k: int, n: int) -> dict:
    """``A`` of ``m x k`` and ``B`` of ``k x n``, uniform in [0, 1)."""
    r = np.random.default_rng(k)
    return {"A": r.random((m, k), dtype=np.float32), "B": r.random((k, n), dtype=np.float32)}


CASES = [
    Case(_family("long_global_sum", GLOBAL, _random(1 << 24), lambda x: x["A"].sum(keepdims=False),
                 _bytes, "GB/s", "n (sum of n floats)", 1 << 24), 1 << 24),
    Case(_family("long_row_sum", ROW, _random(64, 1 << 20), lambda x: x["A"].sum(1), _bytes, "GB/s",
                 "n (64 rows of n)", 1 << 20), 1 << 20),
    Case(_family("long_row_sum4", ROW, _random(4, 1 << 22), lambda x: x["A"].sum(1), _bytes, "GB/s",
                 "n (4 rows of n)", 1 << 22), 1 << 22),
    Case(_family("long_column_sum", COLUMN, _random(1 << 22, 4), lambda x: x["A"].sum(0), _bytes,
                 "GB/s", "n (n rows of 4)", 1 << 22), 1 << 22),
    Case(_family("outer_sum", OUTER,
                 lambda n, r: {"A": r.random(n, dtype=np.float32), "B": r.random(n, dtype=np.float32)},
                 lambda x: np.float32(np.einsum("i,j->", x["A"], x["B"])),
                 lambda x: 2.0 * x["A"].size * x["B"].size, "GFLOP/s", "n (sum of A[i]*B[j], n x n)",
                 10_000), 10_000),
    Case(_family("long_k_matmul", MATMUL,
                 lambda k, r: _pair(4, k, 4),
                 lambda x: x["A"] @ x["B"], lambda x: 2.0 * 16 * x["A"].shape[1], "GFLOP/s",
                 "K (4xK times Kx4)", 1 << 22), 1 << 22),
    Case(_family("matmul", MATMUL,
                 lambda n, r: _pair(n, n, n), lambda x: x["A"] @ x["B"],
                 lambda x: 2.0 * x["A"].shape[0] ** 3, "GFLOP/s", "n (n×n times n×n)", 1024), 1024),
]


def _exact(case: Case, inputs) -> np.ndarray:
    """The answer in float64 (the reference for the error)."""
    wide = {k: v.astype(np.float64) for k, v in inputs.items()}
    if case.family.name == "outer_sum":
        return np.asarray(wide["A"].sum() * wide["B"].sum())
    return np.asarray(case.family.numpy(wide))


@pytest.mark.parametrize("sum_block", [0, 4096], ids=["one_sum", "blocks4096"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_long_sum(benchmark, case, sum_block, threads):
    target = "llvm_cpu.0"
    inputs = case.inputs()
    t0 = time.perf_counter()
    settings = {"cache": False, "threads": threads, "sum_block": sum_block}
    exe = tile.compile(case.family.source, target, settings)
    exe(inputs)
    compile_s = time.perf_counter() - t0
    resident = {k: tile.tensor(v, device=target) for k, v in inputs.items()}

    def run():
        for t in exe(resident, resident=True).values():
            t.wait()

    t0 = time.perf_counter()
    run()
    benchmark.pedantic(run, rounds=rounds_for(time.perf_counter() - t0), warmup_rounds=1)
    (got,) = exe(inputs).values()
    exact = _exact(case, inputs)
    err = float(np.max(np.abs(got.astype(np.float64) - exact) / np.abs(exact)))
    with threadpool_limits(threads):  # numpy's BLAS gets Tile's thread count (its sums run on one)
        ref = best_of(lambda: case.reference(inputs))
    notes = {"threads": threads, "sum_block": sum_block, "rel_err": err}
    record(benchmark, case, f"{target} {threads}t sb{sum_block}", inputs, benchmark.stats.stats.min,
           compile_s, {f"numpy {threads}t": ref}, notes)
    assert err < 1e-2  # a sanity bound; tests/test_llvm_long_sums.py holds the tight ones
