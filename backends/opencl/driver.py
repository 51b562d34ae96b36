"""One OpenCL device as its driver reports it, and the driver objects every part shares.

A ``Driver`` holds what the device's query says (name, float64 and float16 support, correctly
rounded division, work-group size, the identity a program binary is cached under) and makes the
context and the in-order, profiling command queue on first use (so listing devices stays cheap),
and keeps the pool that builds programs off the critical path. The compiler, the executor and the
HAL device (``device.OpenCLDevice``, which is one) all work through it. ``quiet_build`` builds a
program the way every caller here wants it built.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import warnings

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
        self._queue: cl.CommandQueue | None = None
        self.build_pool = cf.ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"tile-{device_id}-build")

    @property
    def context(self) -> cl.Context:
        with self._lock:
            if self._context is None:
                self._context = cl.Context([self.cl_device])
            return self._context

    @property
    def queue(self) -> cl.CommandQueue:
        ctx = self.context
        with self._lock:
            if self._queue is None:
                props = cl.command_queue_properties.PROFILING_ENABLE
                self._queue = cl.CommandQueue(ctx, self.cl_device, properties=props)
            return self._queue

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
