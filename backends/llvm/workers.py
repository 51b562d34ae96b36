"""The LLVM CPU device's threads: the worker pool a split kernel's chunks run on (native workers,
``backends.llvm.threads``, where they can be started; else Python threads), their stacks, and the
environment variables that size them (``TILE_NUM_THREADS``, ``TILE_THREAD_WATCH_US``)."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import queue
import threading
from collections.abc import Sequence

from backends.llvm import threads
from backends.llvm.threads import NativePool
from tile.errors import TileRuntimeError


def _env_count(name: str, least: int, hint: str) -> int | None:
    """Environment variable ``name`` as a whole number of at least ``least`` (unset or empty: None)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < least:
        what = "a positive integer" if least > 0 else "a whole number"
        raise TileRuntimeError(f"{name} is '{raw}', not {what}", None, hint=hint)
    return int(raw)


def env_threads() -> int | None:
    """``TILE_NUM_THREADS``: the thread pool's size (unset or empty: one thread per core)."""
    hint = "set it to the number of threads the CPU device may use (e.g. 4), or unset it"
    return _env_count("TILE_NUM_THREADS", 1, hint)


def env_watch_ns() -> int:
    """``TILE_THREAD_WATCH_US``: how long a worker thread that finished watches for more work
    before it sleeps, in microseconds (default 250; 0: it sleeps at once, for a CPU quota that
    should not pay for watching threads)."""
    hint = "set it to microseconds (e.g. 250, or 0 for no watching), or unset it"
    us = _env_count("TILE_THREAD_WATCH_US", 0, hint)
    return threads.SPIN_NS if us is None else us * 1000


def env_steal_ns() -> int:
    """``TILE_THREAD_STEAL_US``: how long a call waits for a worker thread that has not taken its
    chunks before it runs them itself, in microseconds (default 100; ``backends.llvm.threads``)."""
    hint = "set it to microseconds (e.g. 100), or unset it"
    us = _env_count("TILE_THREAD_STEAL_US", 0, hint)
    return threads.STEAL_NS if us is None else us * 1000


KERNEL_STACK_BYTES = 64 << 20  # room for the micro-kernel's packed panels (up to 2 MiB each)
INLINE_STACK_BYTES = 64 << 10  # kernels with more scratch run on the dispatcher's large stack


@contextlib.contextmanager
def kernel_stacks():
    """Threads started inside get ``KERNEL_STACK_BYTES`` of stack: kernels keep scratch there,
    and a thread's default stack may be 2 MiB (glibc, when the stack limit is unlimited)."""
    old = threading.stack_size(KERNEL_STACK_BYTES)
    try:
        yield
    finally:
        threading.stack_size(old)


def _start_worker(body) -> threading.Thread:
    with kernel_stacks():
        t = threading.Thread(target=body, daemon=True, name="tile-llvm")
        t.start()
    return t


class WorkerPool:
    """Fixed worker threads, each with its own queue: chunk ``k`` of a call runs on worker
    ``k % size``, so a split kernel is spread over the threads deterministically."""

    def __init__(self, size: int, native: bool = True):
        self.size = max(1, size)
        self._queues: list[queue.SimpleQueue] = []
        self._lock = threading.Lock()
        # kernels' chunks go to native workers (``threads``): no Python between chunks
        self.native = None
        if native and threads.available():
            self.native = NativePool(self.size - 1, _start_worker, env_watch_ns(), env_steal_ns())

    def _start(self) -> None:
        with self._lock:
            while len(self._queues) < self.size:
                q: queue.SimpleQueue = queue.SimpleQueue()
                with kernel_stacks():
                    threading.Thread(target=self._work, args=(q,), daemon=True, name="tile-llvm").start()
                self._queues.append(q)

    @staticmethod
    def _work(q: queue.SimpleQueue) -> None:
        while True:
            fn, args, fut = q.get()
            try:
                fn(*args)
                fut.set_result(threading.get_ident())
            except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
                fut.set_exception(e)

    def run_kernel(self, fn, address: int, table, chunks: Sequence[tuple[int, int]]) -> list[int]:
        """Run the kernel function ``fn`` (at ``address``) on every ``(lo, hi)`` chunk; the
        thread id that ran each (chunk ``k``: the caller for ``k % size == 0``, else a worker)."""
        if self.native is not None:
            return self.native.run(address, table, list(chunks))
        return self.map(fn, [(table, lo, hi) for lo, hi in chunks])

    def map(self, fn, chunks: Sequence[tuple]) -> list[int]:
        """Run ``fn(*chunk)`` for every chunk; return the thread id that ran each."""
        self._start()
        futures = []
        for k, args in enumerate(chunks):
            fut: cf.Future = cf.Future()
            self._queues[k % self.size].put((fn, args, fut))
            futures.append(fut)
        return [f.result() for f in futures]


__all__ = ["INLINE_STACK_BYTES", "KERNEL_STACK_BYTES", "WorkerPool", "env_steal_ns", "env_threads",
           "env_watch_ns", "kernel_stacks"]
