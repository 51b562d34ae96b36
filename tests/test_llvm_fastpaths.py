"""The LLVM CPU backend's fast paths keep their promises (docs/semantics.md §5.2, §8.3):

* float32 ``exp``/``tanh``/``log`` outside strict mode (``backends.llvm.vmath``) are within 1 ulp of
  the correctly rounded value over a dense sweep of bit patterns and exact at the edges (overflow,
  underflow through the subnormals, ±inf, nan, ±0); strict mode keeps the C library's calls;
* ``max``/``min`` follow numpy: nan wins, and of two equal values the later (``max(-0, +0)`` is
  +0), bit for bit in strict mode; reordered aggregations still return nan when one value is;
* split reductions (every aggregation of ``llvm_cpu``'s ``split_reduction``) give exact sums of
  integer-valued data;
* the native parallel-for (``backends.llvm.threads``) runs every chunk once, on the threads the
  count settings ask for, as the Python pool does; small kernels whose dependencies are done run
  on the calling thread, kernels with stack scratch (the micro-kernel's panels) never do.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import threading

import numpy as np
import pytest

import ref_interp
import tile
from backends.hal import Event
from backends.llvm import LlvmCpuDevice
from backends.llvm.device import WorkerPool
from backends.llvm.schedule import plan
from ref_interp.stripe_exec import run_stripe
from tests.llvm_runner import DEVICE, build, execute, lowered

pytestmark = pytest.mark.usefixtures("private_cache")


def _ordered(x: np.ndarray) -> np.ndarray:
    """float32 bit patterns as integers that count ulps across zero."""
    i = x.astype(np.float32).view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def _sweep() -> np.ndarray:
    edges = [0.0, -0.0, np.inf, -np.inf, np.nan, 88.72, 88.73, -87.33, -103.2, -103.3, -104.0, 1e-45]
    edges += [-1e-45, 1.0, -1.0, 1e-30, 1e-7, 0.5, 2.0, np.finfo(np.float32).max, 9.0, -9.0]
    dense = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([np.array(edges, np.float32), dense])


@pytest.mark.parametrize("fn", ["exp", "tanh", "log"])
def test_vector_math_within_one_ulp(fn):
    x = _sweep()
    got = tile.compile(f"function (X) -> (Y) {{ Y = {fn}(X); }}", "llvm_cpu.0")(X=x)["Y"]
    with np.errstate(all="ignore"):
        want = getattr(np, fn)(x.astype(np.float64)).astype(np.float32)  # correctly rounded but rarely
    assert got.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert np.abs(_ordered(got[ok]) - _ordered(want[ok])).max() <= 1
    # the edges exactly, signs of zeros and infinities included
    edge = ok[:22]
    np.testing.assert_array_equal(got[:22][edge], want[:22][edge])
    np.testing.assert_array_equal(np.signbit(got[:22][edge]), np.signbit(want[:22][edge]))


def test_vector_exp_reaches_subnormals_and_overflows():
    x = np.array([-87.5, -100.0, -103.9, -104.0, 88.7, 88.8, -np.inf, np.inf], np.float32)
    got = tile.compile("function (X) -> (Y) { Y = exp(X); }", "llvm_cpu.0")(X=x)["Y"]
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    assert 0 < got[2] < np.finfo(np.float32).tiny and got[3] == 0 and got[5] == np.inf


def test_strict_mode_keeps_the_c_library():
    src = "function (X) -> (Y) { Y = exp(X) + tanh(X) + log(X); }"
    p = lowered(src, {"X": np.ones(64, np.float32)})
    fast, _ = build(p)
    strict, _ = build(p, {"strict": True})
    for name in ("exp", "tanh", "log"):  # the double routines, rounded once (docs/semantics.md §8.3)
        assert f'@"{name}"' in strict.source or f"@{name}(" in strict.source
        assert f"@{name}(" not in fast.source and f'@"{name}"' not in fast.source


@pytest.mark.parametrize("settings", [{}, {"strict": True}])
def test_elementwise_max_min_follow_numpy(settings):
    a = np.array([-0.0, 0.0, np.nan, 1.0, np.nan, -0.0], np.float32)
    b = np.array([0.0, -0.0, 1.0, np.nan, np.nan, -0.0], np.float32)
    f = tile.compile("function (A, B) -> (X, N) { X = max(A, B); N = min(A, B); }", "llvm_cpu.0", settings)
    got = f(A=a, B=b)
    for name, ref in (("X", np.maximum), ("N", np.minimum)):
        want = ref(a, b)
        np.testing.assert_array_equal(got[name], want)
        np.testing.assert_array_equal(np.signbit(got[name]), np.signbit(want))


@pytest.mark.parametrize("agg", [">", "<"])
def test_strict_max_aggregation_is_bit_identical(agg):
    src = f"function (A[N]) -> (O) {{ O[] = {agg}(A[i]); }}"
    for values in ([-0.0, 0.0], [0.0, -0.0], [-0.0, 0.0, -0.0], [1.0, np.nan, 2.0]):
        a = np.array(values * 30000, np.float32)  # long enough to be split when not strict
        got = tile.compile(src, "llvm_cpu.0", {"strict": True})(A=a)["O"]
        want = ref_interp.run(src, {"A": a})["O"]
        assert got.tobytes() == want.tobytes() or (np.isnan(got) and np.isnan(want))


@pytest.mark.parametrize("agg", [">", "<"])
@pytest.mark.parametrize("where", [0, 77_777, 199_999])
def test_reordered_max_aggregation_keeps_nan(agg, where):
    src = f"function (A[M, N]) -> (O) {{ O[] = {agg}(A[i, j]); }}"
    a = np.random.default_rng(where).integers(-50, 50, (400, 500)).astype(np.float32)
    f = tile.compile(src, "llvm_cpu.0")
    assert f(A=a)["O"] == (a.max() if agg == ">" else a.min())
    a.reshape(-1)[where] = np.nan
    assert np.isnan(f(A=a)["O"])


@pytest.mark.parametrize("agg, ref", [("+", np.sum), ("*", np.prod), (">", np.max), ("<", np.min)])
@pytest.mark.parametrize("threads", [1, 3])
def test_split_reductions_are_exact_on_integers(agg, ref, threads):
    src = f"function (A[M, N]) -> (O) {{ O[] = {agg}(A[i, j]); }}"
    rng = np.random.default_rng(7)
    if agg == "*":  # a product of ±1 and a few 2s: exact in any order
        a = rng.choice(np.array([1.0, -1.0], np.float32), (301, 1003))
        a.reshape(-1)[rng.integers(0, a.size, 20)] = 2.0
    else:
        a = rng.integers(-9, 10, (301, 1003)).astype(np.float32)
    f = tile.compile(src, "llvm_cpu.0", {"threads": threads})
    assert f(A=a)["O"] == ref(a.astype(np.float64))


def test_split_float_sum_within_the_reduction_tolerance():
    a = np.random.default_rng(3).standard_normal((512, 999)).astype(np.float32)
    got = tile.compile("function (A[M, N]) -> (O) { O[] = +(A[i, j]); }", "llvm_cpu.0")(A=a)["O"]
    want = a.astype(np.float64).sum()
    assert abs(float(got) - want) <= 4 * np.finfo(np.float32).eps * a.size * max(1.0, np.abs(a).max())


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_thread_pools_run_every_chunk(native, threads):
    dev = LlvmCpuDevice(threads=3)
    dev.pool = dev.executor.pool = WorkerPool(3, native=native)
    program = lowered("function (A[N]) -> (O) { O = A * 2 + 1; }", {"A": np.zeros(100_003, np.float32)})
    a = np.arange(100_003, dtype=np.float32)
    got, kernels = execute(program, {"A": a}, {"threads": threads, "min_parallel_points": 1}, device=dev)
    np.testing.assert_array_equal(got["O"], a * 2 + 1)
    ran = kernels[-1].last_threads
    assert len(ran) == threads and len(set(ran)) == min(threads, 3)
    assert (dev.pool.native is not None) == native


def test_the_native_pool_serves_repeated_and_interleaved_kernels():
    f = tile.compile("function (A[N]) -> (O, S) { O = A * A; S[] = +(A[i]); }", "llvm_cpu.0")
    for n in (70_000, 200_000, 70_000):
        a = np.arange(n, dtype=np.float32) % 7
        out = f(A=a)
        np.testing.assert_array_equal(out["O"], a * a)
        assert out["S"] == a.astype(np.float64).sum()


def test_small_kernels_run_on_the_calling_thread_and_large_scratch_does_not():
    # two reductions of 8 x 1024 points: no K block (a whole inner row of 1024 points) fits the
    # inline allowance (backends/llvm/inline_blocks.py) at any vector width down to SSE's (at 256
    # points AVX2's narrower panels fit it), so the packed panel stays whole
    program = lowered(
        "function (A[M, K, L], B[K, L, N]) -> (C) { C[i, j: M, N] = +(A[i, k, l] * B[k, l, j]); }",
        {"A": np.ones((64, 8, 1024)), "B": np.ones((8, 1024, 64))},
    )
    a = np.random.default_rng(1).integers(-3, 4, (64, 8, 1024)).astype(np.float32)
    b = np.random.default_rng(2).integers(-3, 4, (8, 1024, 64)).astype(np.float32)
    for inline in (True, False):
        got, kernels = execute(program, {"A": a, "B": b}, {"inline": inline, "parallel": False})
        np.testing.assert_array_equal(got["C"], np.einsum("ikl,klj->ij", a, b))
        matmul = kernels[-1]
        assert not matmul.inline  # its packed panel lives on the stack: the dispatcher's 64 MiB
        assert matmul.last_threads[0] != threading.get_ident()
    program = lowered("function (A[N]) -> (O) { O = A + 1; }", {"A": np.zeros(10)})
    for inline in (True, False):
        got, kernels = execute(program, {"A": np.arange(10, dtype=np.float32)}, {"inline": inline})
        np.testing.assert_array_equal(got["O"], np.arange(1, 11, dtype=np.float32))
        assert kernels[-1].inline == inline
        assert (kernels[-1].last_threads[0] == threading.get_ident()) == inline


def _split_sum_in_child(queue) -> None:
    f = tile.compile("function (A[N]) -> (O) { O = A * 3; }", "llvm_cpu.0", {"min_parallel_points": 1})
    queue.put(float(f(A=np.ones(100_000, np.float32))["O"].sum()))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_workers():
    dev = LlvmCpuDevice(threads=3)
    program = lowered("function (A[N]) -> (O) { O = A + 1; }", {"A": np.zeros(50_000, np.float32)})
    execute(program, {"A": np.zeros(50_000, np.float32)}, {"min_parallel_points": 1}, device=dev)
    tile.compile("function (A[N]) -> (O) { O = A * 3; }", "llvm_cpu.0", {"min_parallel_points": 1})(
        A=np.ones(100_000, np.float32)
    )  # the default device's workers are running in the parent
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_split_sum_in_child, args=(queue,))
    child.start()
    child.join(60)
    if child.is_alive():  # hung waiting for workers that did not survive the fork
        child.kill()
    assert child.exitcode == 0 and queue.get(timeout=5) == 300_000.0


@pytest.mark.parametrize(
    "src, inner",
    [
        ("function (X[M, N]) -> (O) { O[j: N] = +(X[i, j]); }", True),  # columns: j stays innermost
        ("function (X[M, N]) -> (O) { O[i: M] = +(X[i, j]); }", False),  # rows: i outermost
        ("function (X[A, B, C]) -> (O) { O[a, c: A, C] = +(X[a, b, c]); }", True),  # c, a of 2 points
    ],
)
def test_threads_divide_the_contiguous_output_index_innermost(src, inner):
    x = np.random.default_rng(5).standard_normal((2, 300, 203) if "A, B" in src else (300, 203))
    x = x.astype(np.float32)
    program = lowered(src, {"X": x})
    k = program.stmts[0].stmts[-1]
    s = plan(k, tuple(r.source for r in k.refs), threads=3)
    assert (s.split_at == len(s.order) - 1) == inner and (s.split_at == 0) != inner
    assert k.idxs[s.split_index].name in s.owned
    want = run_stripe(program, {"X": x})  # strict: each element's sum in the interpreter's order
    for threads in (1, 3):
        got, kernels = execute(
            program, {"X": x}, {"strict": True, "threads": threads, "min_parallel_points": 1}
        )
        assert got["O"].tobytes() == want["O"].tobytes()
        assert len(set(kernels[-1].last_threads)) == min(threads, DEVICE.pool.size)


def test_a_failed_dependency_leaves_the_executor_running_inline():
    ex = LlvmCpuDevice(threads=1).executor
    pending: cf.Future = cf.Future()
    queued = ex.submit([Event(pending)], lambda: None, True)  # its dependency is not done: queued
    pending.set_exception(RuntimeError("an earlier copy failed"))
    with pytest.raises(RuntimeError, match="earlier copy"):
        queued.wait()
    ran = []
    ex.submit([Event.done()], lambda: ran.append(threading.get_ident()), True)
    assert ran == [threading.get_ident()]  # nothing queued any more: run on this thread
