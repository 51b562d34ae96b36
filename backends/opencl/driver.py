"""One OpenCL device as its driver reports it, and the driver objects every part shares.

A ``Driver`` holds what the device's query says (name, float64 and float16 support, correctly
rounded division, work-group size, the identity a program binary is cached under) and makes the
context and the in-order command queue on first use (so listing devices stays cheap), and keeps
the pool that builds programs off the critical path.

Commands go to a plain queue; a second, profiling queue (events with the device's start and end
times) takes them instead only while ``profiling()`` is entered, as a profile is taken, since
profiling can cost each enqueue on some drivers. ``queue`` is the one commands go to now; each
switch finishes the other queue first, so the device still runs commands in the order they were
enqueued (``executor.wait_list`` leaves a queue's own events to it). The compiler, the executor and the
HAL device (``device.OpenCLDevice``, which is one) all work through it. ``quiet_build`` builds a
program the way every caller here wants it built.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import threading
import warnings
from collections.abc import Iterator

import pyopencl as cl


def quiet_build(program: cl.Program, options: list[str]) -> cl.Program:
    """Build without pyopencl's own source cache, and without its warning about a non-empty build
    log (drivers log notes such as NVIDIA's "kernel, so overriding noinline attribute")."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cl.CompilerWarning)
        return program.build(options=options, cache_dir=False)


class Driver:
    """The driver's view of ``cl_device``, known by ``device_id``; ``fp16``/``fp64`` override
    whether the device has float16 and float64 (``device.OpenCLDevice`` says when it has them)."""

    def __init__(
        self, cl_device: cl.Device, device_id: str, fp16: bool | None = None, fp64: bool | None = None
    ):
        d = cl_device
        self.cl_device = d
        self.id = device_id
        self.name = d.name.strip()
        self.extensions = frozenset(d.extensions.split())
        try:
            double_config = d.double_fp_config
        except cl.Error:
            double_config = 0
        self.half_extension = "cl_khr_fp16" in self.extensions
        self.fp64 = bool(double_config) if fp64 is None else fp64
        self.fp16 = True if fp16 is None else fp16
        self.exact_div = bool(d.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT)
        platform = d.platform
        self.identity = {
            "name": self.name,
            "vendor": d.vendor.strip(),
            "version": d.version.strip(),
            "driver": d.driver_version.strip(),
            "platform": platform.name.strip(),
            "platform_version": platform.version.strip(),
            "fp16": self.fp16,
            "fp64": self.fp64,
        }
        self.max_work_group = int(d.max_work_group_size)
        self._lock = threading.Lock()
        self._context: cl.Context | None = None
        self._queue: cl.CommandQueue | None = None  # the one commands go to now (``queue``)
        self._plain: cl.CommandQueue | None = None
        self._profiling: cl.CommandQueue | None = None
        self._depth = 0  # ``profiling()`` entered and not left
        self.cuda_pending = None  # the last CUDA launch OpenCL commands must wait for (``cuda.launch``)
        self.build_pool = cf.ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"tile-{device_id}-build")

    @property
    def context(self) -> cl.Context:
        with self._lock:
            if self._context is None:
                self._context = cl.Context([self.cl_device])
            return self._context

    @property
    def queue(self) -> cl.CommandQueue:
        """The in-order queue commands go to now: the plain one, or the profiling one inside
        ``profiling()``."""
        if self.cuda_pending is not None:
            self.settle()
        q = self._queue
        if q is not None:
            return q
        ctx = self.context
        with self._lock:
            if self._plain is None:
                self._plain = self._queue = cl.CommandQueue(ctx, self.cl_device)
            return self._queue  # type: ignore[return-value]

    @property
    def plain(self) -> cl.CommandQueue:
        """The plain queue (``queue`` outside ``profiling()``)."""
        if self._plain is None:
            self.queue  # noqa: B018 - makes it
        return self._plain  # type: ignore[return-value]

    @contextlib.contextmanager
    def profiling(self) -> Iterator[cl.CommandQueue]:
        """Commands enqueued inside go to the profiling queue (their events time them); the plain
        queue is finished on the way in and the profiling one on the way out, so commands run in
        the order they were enqueued across the switch. Nests."""
        plain, ctx = self.plain, self.context
        if self.cuda_pending is not None:
            self.settle()
        with self._lock:
            if self._depth == 0:
                if self._profiling is None:
                    props = cl.command_queue_properties.PROFILING_ENABLE
                    self._profiling = cl.CommandQueue(ctx, self.cl_device, properties=props)
                plain.finish()
                self._queue = self._profiling
            self._depth += 1
        try:
            yield self._profiling  # type: ignore[misc]
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._profiling.finish()  # type: ignore[union-attr]
                    self._queue = self._plain

    @property
    def profiled(self) -> bool:
        """Whether commands are being profiled now (inside ``profiling()``)."""
        return self._depth > 0

    def settle(self) -> None:
        """Wait for the last kernel launched through CUDA (``backends.cuda.launch``): OpenCL's commands
        after it may read or overwrite its buffers."""
        pending, self.cuda_pending = self.cuda_pending, None
        if pending is not None:
            pending.wait()

    def launch_bytes(self) -> int:
        """The local memory a kernel launched through CUDA may have (0: none are)."""
        return 0

    def probe(self) -> str | None:
        """Why the device cannot compile a trivial kernel (None: it can)."""
        try:
            quiet_build(cl.Program(self.context, _PROBE), [])
        except cl.Error as e:
            first = next((ln.strip() for ln in str(e).splitlines() if "error" in ln.lower()), str(e))
            return f"its OpenCL compiler fails on a trivial kernel: {first[:200]}"
        return None


_PROBE = "__kernel void tile_probe(__global int* a) { a[get_global_id(0)] = 1; }"

__all__ = ["Driver", "quiet_build"]
