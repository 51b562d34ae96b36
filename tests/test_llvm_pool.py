"""The LLVM device's native thread pool (``backends.llvm.threads``): workers that finished watch
for more work for ``SPIN_NS`` and then sleep on their semaphores. Calls back to back hand work to
watching workers, calls after a pause wake sleeping ones; both must run every chunk on its runner,
with no wake-up lost (that would hang) and results exact."""

from __future__ import annotations

import ctypes
import time

import numpy as np
import pytest

from backends.llvm import LlvmCpuDevice
from backends.llvm import threads as native
from tests.llvm_runner import execute, lowered

pytestmark = pytest.mark.skipif(not native.available(), reason="no sem_* / sched_yield in this libc")

ROWS = "function (A[M, N]) -> (O) { O[i: M] = +(A[i, j]); }"


def _sleeping(pool: native.NativePool) -> list[int]:
    return [
        ctypes.c_int64.from_address(pool._base + w * native.SLOT_BYTES + native._F_SLEEPING).value
        for w in range(pool.workers)
    ]


def test_work_reaches_watching_and_sleeping_workers():
    dev = LlvmCpuDevice(threads=3)
    shape = (600, 40)
    program = lowered(ROWS, {"A": np.zeros(shape, np.float32)})
    pool = dev.pool.native
    assert pool is not None
    asleep = awake = 0
    for k in range(24):
        a = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) % 7 + k
        got, kernels = execute(program, {"A": a}, device=dev)
        np.testing.assert_array_equal(got["O"], a.sum(axis=1))
        assert len(set(kernels[-1].last_threads)) == 3
        if k % 4 == 3:  # a pause: the workers go to sleep, and the next call must wake them
            time.sleep(3 * native.SPIN_NS / 1e9)
            asleep += _sleeping(pool) == [1, 1]
        else:
            awake += _sleeping(pool) == [0, 0]  # still watching right after the call
    assert asleep == 6 and awake >= 12  # (a slow host may let a watch run out now and then)
