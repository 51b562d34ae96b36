"""Kernels of an OpenCL program launched through CUDA's driver API, on memory CUDA and OpenCL share.

NVIDIA's OpenCL gives a work-group 48 KiB of local memory and launches no tensor-memory copies'
maps; the kernels ``backends.cuda.tma`` writes need up to the device's opt-in maximum and two
``CUtensorMap``s. Their program is still compiled by OpenCL: its binary is PTX, which CUDA loads
(``cuModuleLoadData``, in the primary context ``share`` uses) and launches on a stream of
its own with the dynamic local memory the kernel's ``launch`` record asks for.

* **Who launches.** ``Launcher.for_device`` says whether a device can, and why not:
  memory sharing (``share.Sharing``) works, the CUDA device has compute capability 9.0
  (the kernels are ``sm_90a``), and the driver has the calls. It is on by default;
  ``TILE_CUDA_LAUNCH=0`` turns it off (every kernel then runs on OpenCL, as on other devices).
  The setting is read as a program is compiled; a program compiled before (they are kept per
  process) keeps its plan.
* **Memory.** ``LaunchingExecutor`` allocates every buffer in shared memory, which has a CUDA
  address: a block of its own from ``SHARED_MIN`` bytes, else a piece of one (``Slabs``). A
  buffer OpenCL alone allocated (another executor's) is copied into a shared block for a launch
  and back after it.
* **Order.** A launch waits for all the device's OpenCL work first (its queue is finished; the
  in-order queue gives no event to wait on in CUDA), and the device remembers the launch
  (``Driver.cuda_pending``): any OpenCL command enqueued after it waits for it first.
* **Tensor maps.** Encoded on the host for the buffers' CUDA addresses (``runtime.encode_tensor_map``,
  128-byte swizzle) and kept in device memory by key, so resident tensors, whose addresses
  repeat, cost one encode and copy each.
* **Driver calls.** Through NVIDIA's bindings (``cuda.bindings.driver``) and ``runtime``'s status
  checks: a failed call raises ``CudaError`` naming it.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
import weakref
from collections.abc import Sequence

import pyopencl as cl

from backends.cuda import runtime
from backends.cuda.runtime import CudaError, check
from backends.cuda.share import SharedCLBuffer, Sharing, SharingError, once_per_device
from backends.hal import Bound, Buffer, Event, Library
from backends.opencl.driver import Driver
from backends.opencl.executor import CLBuffer, OpenCLExecutor, OpenCLKernel
from tile.errors import TileDeviceError

SHARED_MIN = 1 << 20  # buffers this large or larger are shared blocks where the device launches
MAP_SLOTS = runtime.MAP_SLOTS  # tensor maps kept in device memory (128 bytes each)
# CUtensorMapDataType by Tile's name; TFLOAT32 copies float32 rounded to TF32, to nearest, ties to
# even (seen: 1 + 3·2^-12 -> 1 + 2^-10, 1 + 2^-11 -> 1, 1 + 2^-10 + 2^-11 -> 1 + 2^-9; FLOAT32's
# bits reach the unit as they are, and it ignores the low 13: toward zero)
MAP_TYPES = runtime.MAP_TYPES
# OpenCL's launch parameters (global and work-group offsets) that its PTX reads: 0 for a CUDA launch
# (a launched kernel reads only %envreg0, its work-group offset; the program's other kernels,
# which read more, are never launched from this module)
_OFFSET = re.compile(rb"%envreg[0-9]+")


class LaunchRefused(TileDeviceError, RuntimeError):
    """A kernel that must launch through CUDA on a device that cannot (the message says why)."""


class Launcher:
    """Launches one OpenCL device's launched kernels through CUDA (module docstring)."""

    _found: dict[int, tuple[Launcher | None, str]] = {}
    _found_lock = threading.Lock()

    @classmethod
    def for_device(cls, device) -> tuple[Launcher | None, str]:
        """The device's launcher, made once, or None and why not (one line)."""
        if os.environ.get("TILE_CUDA_LAUNCH", "1") == "0":
            return None, "turned off by TILE_CUDA_LAUNCH=0"
        found = once_per_device(cls._found, cls._found_lock, device, cls._probe)
        if found[0] is not None and found[0].device is not device:  # (its memory is in that context)
            return None, f"{found[0].device.id}, another driver of {device.name}, launches through CUDA"
        return found

    @classmethod
    def _probe(cls, device: Driver) -> tuple[Launcher | None, str]:
        sharing, why = Sharing.for_device(device)
        if sharing is None:
            return None, f"no memory shared with CUDA ({why})"
        try:
            return cls(device, sharing), ""
        except (CudaError, ValueError) as e:
            return None, str(e)

    def __init__(self, device: Driver, sharing: Sharing):
        cu = runtime.cu
        self.device, self.sharing = device, sharing
        attr = cu.CUdevice_attribute
        with sharing.current():
            major, minor, optin = (
                int(check(cu.cuDeviceGetAttribute(a, sharing.cuda_device), f"cuDeviceGetAttribute({a.name})"))
                for a in (attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                          attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                          attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN))
            if (major, minor) != (9, 0):
                cc = f"{major}.{minor}"
                raise ValueError(f"the CUDA device has compute capability {cc}, not 9.0 (sm_90a kernels)")
            self.stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
            self.maps_at = int(check(cu.cuMemAlloc(128 * MAP_SLOTS), f"cuMemAlloc({128 * MAP_SLOTS} bytes)"))
        self.launch_bytes = optin
        self.maps: dict[tuple, int] = {}  # key -> device address of its encoded map
        self.argvs: dict[tuple, tuple] = {}  # (kernel, buffer addresses) -> its launch arguments
        self.free: list[tuple] = []  # (start, end) CUevents of launches no one holds
        self.lock = threading.Lock()

    # ------------------------------------------------------------------ kernels
    def function(self, kernel: CudaKernel):
        """The kernel's ``CUfunction``: its program's PTX loaded once per program (``_OFFSET``), the
        dynamic local memory allowed."""
        cu = runtime.cu
        handle = kernel.handle
        with self.lock:
            module = getattr(handle, "cuda_module", None)
            if module is None:
                binary = bytes(handle.program().get_info(cl.program_info.BINARIES)[0])
                with self.sharing.current():
                    module = check(cu.cuModuleLoadData(_OFFSET.sub(b"0", binary) + b"\0"), "cuModuleLoadData")
                handle.cuda_module = module
            with self.sharing.current():
                fn = check(cu.cuModuleGetFunction(module, kernel.name.encode()),
                           f"cuModuleGetFunction({kernel.name})")
                most = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                check(cu.cuFuncSetAttribute(fn, most, kernel.launch["local_bytes"]), "cuFuncSetAttribute")
            return fn

    def tensor_map(self, pointer: int, dims, stride: int, box, dtype: str) -> int:
        """The device address of the tensor map over ``pointer`` (encoded and copied on first use;
        inside the CUDA context)."""
        key = (pointer, tuple(dims), stride, tuple(box), dtype)
        at = self.maps.get(key)
        if at is not None:
            return at
        if len(self.maps) == MAP_SLOTS:  # full: the launches reading them finish first
            check(runtime.cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
            self.maps.clear()
            self.argvs.clear()  # (they hold the maps' addresses)
        tmap = runtime.encode_tensor_map(pointer, dims, stride, box, dtype)
        at = self.maps_at + 128 * len(self.maps)
        check(runtime.cu.cuMemcpyHtoD(at, tmap.getPtr(), 128), "cuMemcpyHtoD (tensor map)")
        self.maps[key] = at
        return at

    def run(self, kernel: CudaKernel, params: Sequence[Buffer], deps: Sequence[Event]) -> Event:
        """Launch ``kernel`` on ``params`` after ``deps`` and the device's OpenCL work."""
        cu = runtime.cu
        fn = kernel.function()
        queue = self.device._queue or self.device.plain  # (not ``queue``: it waits for CUDA's work)
        for e in deps:
            if not (isinstance(e, CudaEvent) and e.launcher is self):
                e.wait()
        pointers, staged = [], []
        for p in params:
            at = getattr(p, "cuda_pointer", None)
            if at is None:  # a buffer OpenCL alone allocated: copied into a shared block
                block = self.sharing.allocate(p.size)
                cl.enqueue_copy(queue, block.buffer.buf, p.buf, byte_count=p.size)
                staged.append((p, block))
                at = block.cuda_pointer
            pointers.append(at)
        queue.finish()
        launch = kernel.launch
        with self.lock, self.sharing.current():
            argv = self.arguments(kernel, pointers)
            start, end = self.events()
            if self.device.profiled:  # (a profile reads the launch's time: its start too)
                check(cu.cuEventRecord(start, self.stream), "cuEventRecord")
            groups = -(-kernel.work_items // kernel.local)  # (OpenCL's kernels guard the rest)
            if groups:
                check(cu.cuLaunchKernel(fn, groups, 1, 1, kernel.local, 1, 1, launch["local_bytes"],
                                        self.stream, ctypes.addressof(argv), 0),
                      f"cuLaunchKernel({kernel.name})")
            check(cu.cuEventRecord(end, self.stream), "cuEventRecord")
        event = CudaEvent(self, start, end, self.device.profiled)
        if staged:
            event.wait()
            for p, block in staged:
                cl.enqueue_copy(queue, p.buf, block.buffer.buf, byte_count=p.size)
            queue.finish()
            for _, block in staged:
                block.give_back()
        else:
            self.device.cuda_pending = event
        return event

    def arguments(self, kernel: CudaKernel, pointers: list[int]) -> ctypes.Array:
        """``cuLaunchKernel``'s argument array for ``kernel`` on buffers at ``pointers`` (and its
        tensor maps over them), built once per kernel and addresses: resident calls repeat them,
        and building it was a large share of a launch's host time. (Inside the lock.)"""
        key = (id(kernel), *pointers)  # (the entry keeps the kernel alive: its id is not reused)
        got = self.argvs.get(key)
        if got is not None:
            return got[2]
        maps = [self.tensor_map(pointers[i], *rest) for i, *rest in kernel.launch["maps"]]
        argv, values = runtime.argument_array(pointers + maps)
        if len(self.argvs) >= MAP_SLOTS:
            self.argvs.clear()
        self.argvs[key] = (kernel, values, argv)  # (the kernel and values kept alive with it)
        return argv

    def events(self) -> tuple:
        """Two CUDA events (a launch's start and end): ones a finished launch gave back, else new.
        (Inside the CUDA context.)"""
        if self.free:
            return self.free.pop()
        cu = runtime.cu
        flags = cu.CUevent_flags.CU_EVENT_DEFAULT
        start = check(cu.cuEventCreate(flags), "cuEventCreate")
        return start, check(cu.cuEventCreate(flags), "cuEventCreate")


class CudaEvent(Event):
    """A launch on the launcher's stream: ``wait`` waits for it, ``duration`` is its time there."""

    def __init__(self, launcher: Launcher, start, end, timed: bool):
        super().__init__()
        self.launcher, self.start, self.end, self.timed = launcher, start, end, timed
        weakref.finalize(self, launcher.free.append, (start, end)).atexit = False

    def wait(self) -> CudaEvent:
        with self.launcher.sharing.current():
            check(runtime.cu.cuEventSynchronize(self.end), "cuEventSynchronize")
        return self

    @property
    def complete(self) -> bool:
        cu = runtime.cu
        with self.launcher.sharing.current():
            result = cu.cuEventQuery(self.end)
        if result[0] == cu.CUresult.CUDA_ERROR_NOT_READY:
            return False
        check(result, "cuEventQuery")
        return True

    @property
    def duration(self) -> float:
        """Seconds on the device; only a launch inside the executor's ``profiled()`` has them."""
        if not self.timed:
            raise SharingError("this CUDA launch was not profiled: launch it inside executor.profiled()")
        self.wait()
        with self.launcher.sharing.current():
            ms = check(runtime.cu.cuEventElapsedTime(self.start, self.end), "cuEventElapsedTime")
        return float(ms) * 1e-3


PLAIN = {"local_bytes": 0, "maps": []}  # the launch record of a kernel that needs nothing more


class CudaKernel(OpenCLKernel):
    """A kernel of an OpenCL program that ``Launcher`` launches: one with a ``launch`` record (it
    says how), or any other kernel of a program that has one (``PLAIN``; its work-group size is
    the one OpenCL would launch it with), so that a call's kernels all run in CUDA's context:
    switching between OpenCL's context and CUDA's costs more than a kernel
    (figures: bench/RESULTS.md, "Figures moved from docstrings")."""

    def __init__(self, device: Driver, library: Library, index: int, launcher: Launcher):
        super().__init__(device, library, index)
        self.launcher = launcher
        self.launch = library.extra["launch"][index] or PLAIN
        self.local = (library.extra.get("local_sizes") or [0] * (index + 1))[index]
        if not self.local:
            self.kernel()  # (sets ``local``: OpenCL's work-group size for it)
        self._function = None  # its CUfunction, loaded at the first launch

    def function(self):
        if self._function is None:
            self._function = self.launcher.function(self)
        return self._function

    def bind(self, params: Sequence[Buffer]) -> CudaBound:
        self.check(params)
        return CudaBound(self, params)


class CudaBound(Bound):
    __slots__ = ()

    def launch(self, params: Sequence[Buffer], deps: Sequence[Event] = ()) -> Event:
        kernel: CudaKernel = self.kernel  # type: ignore[assignment]
        return kernel.launcher.run(kernel, params, deps)


class Slabs:
    """Buffers smaller than ``SHARED_MIN`` as pieces of shared blocks (OpenCL sub-buffers): per
    size class, a power of two of at least the device's base address alignment, pieces of
    ``SHARED_MIN`` blocks; a freed piece serves the next buffer of its class."""

    def __init__(self, sharing: Sharing, align: int):
        self.sharing, self.align = sharing, align
        self.free: dict[int, list[tuple[object, int]]] = {}  # class -> (block, offset)
        self.lock = threading.Lock()

    def allocate(self, device: Driver, size: int) -> SharedCLBuffer:
        kind = max(self.align, 1 << max(0, size - 1).bit_length())
        with self.lock:
            pieces = self.free.setdefault(kind, [])
            if not pieces:
                block = self.sharing.allocate(SHARED_MIN)  # kept for the class
                pieces.extend((block, at) for at in range(block.size - kind, -1, -kind))
            block, at = pieces.pop()
        sub = block.buffer.buf.get_sub_region(at, max(size, 1))
        buf = SharedCLBuffer(device, sub, size, block.cuda_pointer + at)
        weakref.finalize(buf, pieces.append, (block, at)).atexit = False
        return buf


class LaunchingExecutor(OpenCLExecutor):
    """The OpenCL executor of a device that may launch through CUDA: every buffer is shared
    memory (a block of its own from ``SHARED_MIN`` bytes, else a piece of one, ``Slabs``), and
    every kernel of a program with a ``launch`` record is a ``CudaKernel``."""

    _slabs: Slabs | None = None

    def launcher(self) -> Launcher | None:
        return Launcher.for_device(self.device)[0]

    def allocate(self, size: int) -> CLBuffer:
        launcher = self.launcher()
        if launcher is None:
            return super().allocate(size)
        if size < SHARED_MIN:
            if self._slabs is None:
                align = max(16, int(self.device.cl_device.mem_base_addr_align) // 8)
                self._slabs = Slabs(launcher.sharing, align)
            return self._slabs.allocate(self.device, size)
        block = launcher.sharing.allocate(size)  # (perhaps larger: a whole number of granules)
        buf = SharedCLBuffer(self.device, block.buffer.buf, size, block.cuda_pointer)
        weakref.finalize(buf, block.give_back).atexit = False
        return buf

    def prepare(self, library: Library, index: int) -> OpenCLKernel:
        """A ``CudaKernel`` for every kernel of a program with a launch record (``CudaKernel``),
        else OpenCL's."""
        records = library.extra.get("launch") or ()
        if any(records):
            launcher = self.launcher()
            if launcher is None:
                why = Launcher.for_device(self.device)[1]
                raise LaunchRefused(f"{self.device.id} cannot launch kernel {library.extra['names'][index]} "
                                    f"through CUDA: {why}")
            return CudaKernel(self.device, library, index, launcher)
        return super().prepare(library, index)

