"""The LLVM device's native thread pool (``backends.llvm.threads``): a worker that finished
watches for more work for a while (``spin_ns``) and then sleeps on its semaphore. Work handed to
a watching worker and work that must wake a sleeping one both run every chunk on its runner,
with no wake-up lost (that would hang) and results exact. Each path is forced by the watch time
(none: every hand-off wakes a sleeper; 50 ms: back-to-back calls find the workers watching)."""

from __future__ import annotations

import ctypes
import threading
import time

import numpy as np
import pytest

from backends.llvm import LlvmCpuDevice
from backends.llvm import threads as native
from backends.llvm.workers import _start_worker
from tests.llvm_runner import build, execute, lowered

pytestmark = pytest.mark.skipif(not native.available(), reason="no sem_* / sched_yield in this libc")

ROWS = "function (A[M, N]) -> (O) { O[i: M] = +(A[i, j]); }"
SHAPE = (600, 40)


def _sleeping(pool: native.NativePool) -> list[int]:
    return [
        ctypes.c_int64.from_address(pool._base + w * native.SLOT_BYTES + native._F_SLEEPING).value
        for w in range(pool.workers)
    ]


def _all_asleep(pool: native.NativePool) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if all(_sleeping(pool)):
            return True
        time.sleep(0.001)
    return False


def _calls(spin_ns: int | None, pause_every: int = 0):
    """Ten calls of a row sum split over 3 threads; yields the sleeping flags right after each."""
    dev = LlvmCpuDevice(threads=3)
    if spin_ns is not None:
        # (no stealing: a sleeping worker's wake-up may take longer than the default wait)
        dev.pool.native = native.NativePool(2, _start_worker, spin_ns=spin_ns, steal_ns=10**10)
    pool = dev.pool.native
    assert pool is not None
    program = lowered(ROWS, {"A": np.zeros(SHAPE, np.float32)})
    library, _ = build(program, None, dev)
    for k in range(10):
        a = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE) % 7 + k
        got, kernels = execute(program, {"A": a}, device=dev, library=library)
        flags = _sleeping(pool)
        np.testing.assert_array_equal(got["O"], a.sum(axis=1))
        assert len(set(kernels[-1].last_threads)) == 3
        yield pool, flags
        if pause_every and k % pause_every == pause_every - 1:
            assert _all_asleep(pool)  # after a pause every worker sleeps; the next call wakes it


def test_a_late_workers_chunks_run_on_the_caller():
    """With sleeping workers (no watching) and no wait, the caller takes over the posts the
    workers have not taken by the time its own chunks are done: every result exact (a chunk run
    twice would double its rows' sums, one run by nobody leave them zero), the chunks it took
    reported as its own, and the workers it overtook take later posts or lose them again."""
    dev = LlvmCpuDevice(threads=3)
    dev.pool.native = native.NativePool(2, _start_worker, spin_ns=0, steal_ns=0)
    program = lowered(ROWS, {"A": np.zeros(SHAPE, np.float32)})
    library, _ = build(program, None, dev)
    me, taken = threading.get_ident(), 0
    for k in range(40):
        a = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE) % 7 + k
        got, kernels = execute(program, {"A": a}, device=dev, library=library)
        np.testing.assert_array_equal(got["O"], a.sum(axis=1))
        ran = kernels[-1].last_threads
        assert len(ran) == 3 and ran[0] == me
        taken += ran[1] == me or ran[2] == me
    assert taken >= 1  # waking a sleeper takes tens of microseconds; the caller's chunk, a few


def test_every_hand_off_wakes_a_sleeping_worker():
    for pool, _ in _calls(spin_ns=0):
        assert _all_asleep(pool)


def test_back_to_back_calls_find_the_workers_watching():
    watching = sum(flags == [0, 0] for _, flags in _calls(spin_ns=50_000_000))
    assert watching >= 8  # (a host that stalls this process for 50 ms may miss one or two)


def test_the_default_pool_with_pauses():
    for _ in _calls(spin_ns=None, pause_every=3):
        pass


def test_calls_from_two_threads_share_the_pool_safely():
    """Two programs on one device called from two Python threads at once: each kernel's chunks are
    handed out whole (the pool runs one kernel at a time), every result exact, nothing hangs."""
    import threading

    dev = LlvmCpuDevice(threads=3)
    program = lowered(ROWS, {"A": np.zeros(SHAPE, np.float32)})
    library, _ = build(program, None, dev)
    errors: list[BaseException] = []

    def calls(seed: int) -> None:
        try:
            for k in range(40):
                a = np.full(SHAPE, seed * 100 + k, np.float32)
                got, _ = execute(program, {"A": a}, device=dev, library=library)
                np.testing.assert_array_equal(got["O"], a.sum(axis=1))
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    runners = [threading.Thread(target=calls, args=(s,), daemon=True) for s in (1, 2)]
    for t in runners:
        t.start()
    for t in runners:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in runners), "a call hung"
    assert not errors, errors[0]


def test_the_watch_time_comes_from_the_environment(monkeypatch):
    from backends.llvm.workers import env_watch_ns
    from tile.errors import TileRuntimeError

    assert env_watch_ns() == native.SPIN_NS
    monkeypatch.setenv("TILE_THREAD_WATCH_US", "0")
    assert env_watch_ns() == 0
    pool = LlvmCpuDevice(threads=3).pool.native
    assert pool is not None and pool.spin_ns == 0
    monkeypatch.setenv("TILE_THREAD_WATCH_US", "-5")
    with pytest.raises(TileRuntimeError, match="TILE_THREAD_WATCH_US is '-5', not a whole number"):
        env_watch_ns()


def test_the_steal_wait_comes_from_the_environment(monkeypatch):
    """``TILE_THREAD_STEAL_US`` (tests/conftest.py sets it high for the whole suite): read into the
    device's pool, a bad value refused by name."""
    from backends.llvm.workers import env_steal_ns
    from tile.errors import TileRuntimeError

    monkeypatch.delenv("TILE_THREAD_STEAL_US")
    assert env_steal_ns() == native.STEAL_NS
    monkeypatch.setenv("TILE_THREAD_STEAL_US", "20")
    pool = LlvmCpuDevice(threads=3).pool.native
    assert pool is not None and pool.steal_ns == 20_000
    monkeypatch.setenv("TILE_THREAD_STEAL_US", "soon")
    with pytest.raises(TileRuntimeError, match="TILE_THREAD_STEAL_US is 'soon', not a whole number"):
        env_steal_ns()
