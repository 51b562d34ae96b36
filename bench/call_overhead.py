"""``python -m bench.call_overhead [DEVICE ...] [--calls N] [--rounds R]``: what one whole call
with resident tensors costs on the host, for programs whose kernels take a few microseconds.

Per device (default ``llvm_cpu.0`` and ``opencl_cpu.0``, those available), for a resident call
``f(X=x, resident=True)`` then ``.wait()`` of a 1024-element sum (its answer checked): the wall
time per call and the calling thread's CPU time per call (``time.thread_time``: the host work,
the driver's included, without the time spent blocked), the median and the minimum over
``--rounds`` rounds of ``--calls`` calls, and the kernels' own time (``profile()``). On OpenCL
devices also the driver's floor: the same kernels enqueued straight through pyopencl, back to
back, and waited for, which no caller of the API can beat, on the plain queue calls use and on
the profiling queue ``profile()`` uses; and "python only": the call with pyopencl's kernel enqueue
stubbed out (an event that is done at once), Tile's own host work, the minimum of the rounds.
bench/RESULTS.md ("per-call overhead of resident OpenCL calls", "per-call overhead, second round")
has figures and what a profile of the call showed.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator

import numpy as np

import tile

SUM = "function (X[N]) -> (S) { S[] = +(X[i]); }"
N = 1024


def per_call(fn: Callable[[], None], calls: int, rounds: int) -> tuple[list[float], list[float]]:
    """(wall, thread CPU) microseconds per call of each round, after a warm-up round."""
    for _ in range(calls):
        fn()
    wall, cpu = [], []
    for _ in range(rounds):
        w, c = time.perf_counter(), time.thread_time()
        for _ in range(calls):
            fn()
        wall.append((time.perf_counter() - w) / calls * 1e6)
        cpu.append((time.thread_time() - c) / calls * 1e6)
    return wall, cpu


def driver_floor(exe) -> Callable[[], None] | None:
    """The last call's kernels enqueued through pyopencl as they are bound, then waited for
    (None off OpenCL)."""
    compiled = exe._last
    kernels = [getattr(k, "_kernel", None) for k in compiled.kernels]
    if any(k is None for k in kernels):
        return None
    import pyopencl as cl

    launches = [(k._kernel, *k._sizes) for k in compiled.kernels]
    device = compiled.kernels[0].device

    def floor() -> None:
        event = None
        queue = device.queue  # the plain one, or the profiling one inside ``device.profiling()``
        for kernel, size, local in launches:
            event = cl.enqueue_nd_range_kernel(queue, kernel, size, local)
        event.wait()

    return floor


def profiling(exe) -> contextlib.AbstractContextManager:
    """The OpenCL device's profiling queue in use while entered (a plain context where there
    is only one queue, as before profiling was opt-in)."""
    device = exe._last.kernels[0].device
    return device.profiling() if hasattr(device, "profiling") else contextlib.nullcontext()


class _Done:
    """A stand-in OpenCL event: done at once."""

    def wait(self) -> None:
        pass


@contextlib.contextmanager
def stubbed() -> Iterator[None]:
    """pyopencl's kernel enqueue replaced by one that enqueues nothing (what is left of a call
    is Tile's own Python)."""
    from backends.opencl import executor

    real = executor._enqueue_nd_range
    done = _Done()
    executor._enqueue_nd_range = lambda *args: done
    try:
        yield
    finally:
        executor._enqueue_nd_range = real


IDLE_US = 5.0


def after_idle(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` after ``IDLE_US`` of host work (a busy loop, subtracted from the figures), as a
    caller does between calls: a driver whose threads sleep when idle for a moment pays their
    waking in the first launch."""

    def run() -> None:
        end = time.perf_counter() + IDLE_US * 1e-6
        while time.perf_counter() < end:
            pass
        fn()

    return run


def measure(device: str, calls: int, rounds: int) -> list[str]:
    exe = tile.compile(SUM, device=device)
    x = tile.tensor(np.arange(N, dtype=np.float32) % 7, device=device)
    got = exe(X=x, resident=True)["S"].numpy()
    assert got == (np.arange(N) % 7).sum(), got

    def call() -> None:
        exe(X=x, resident=True)["S"].wait()

    rows = []
    variants: list[tuple[str, Callable[[], None], float]] = [("call", call, 0.0)]
    floor = driver_floor(exe)
    if floor is not None:
        variants += [("driver floor", floor, 0.0), ("driver, idle", after_idle(floor), IDLE_US)]
        variants += [("driver, prof.", floor, 0.0), ("python only", call, 0.0)]
    for what, fn, less in variants:
        within = {"driver, prof.": profiling, "python only": lambda exe: stubbed()}.get(what)
        with within(exe) if within else contextlib.nullcontext():
            wall, cpu = per_call(fn, calls, rounds)
        wall, cpu = [w - less for w in wall], [c - less for c in cpu]
        rows.append(
            f"{device:14s} {what:13s} wall {statistics.median(wall):6.2f} us (min {min(wall):6.2f}), "
            f"host CPU {statistics.median(cpu):6.2f} us (min {min(cpu):6.2f})"
        )
    exe(X=x, resident=True)["S"].wait()
    kernels = sum(s for _, s in exe.profile()) * 1e6
    rows.append(f"{device:14s} kernels       {kernels:6.1f} us ({len(exe.profile())} kernels, profiled)")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.call_overhead", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("devices", nargs="*", default=["llvm_cpu.0", "opencl_cpu.0"])
    parser.add_argument("--calls", type=int, default=2000, help="calls per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds (default 7)")
    args = parser.parse_args(argv)
    from backends import registry

    for device in args.devices:
        try:
            registry.get(device)
        except tile.TileError as e:
            print(f"{device}: skipped ({str(e).splitlines()[0]})", file=sys.stderr)
            continue
        for row in measure(device, args.calls, args.rounds):
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
