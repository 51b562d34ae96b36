"""The executor of ``cuda.0``: buffers in CUDA memory, copies and launches on the caller's stream.

* **Memory.** Where PyTorch has initialized CUDA in this process, a buffer is a byte tensor from
  its caching allocator (the same memory, stream-ordered and safe under graph capture); else a
  stream-ordered allocation of the driver's (``cuMemAllocAsync``). ``CudaBuffer.over`` wraps memory
  someone else owns (a torch tensor's ``data_ptr()``, ``__cuda_array_interface__``, DLPack) without
  a copy, keeping its owner alive.
* **Order.** Every copy and launch goes on the current stream (``runtime.Cuda.stream``); an event of
  this device recorded there needs no wait, another is waited for on the host first. Only reads
  to the host wait (for the stream); a launch never does.
* **Events.** A launch records a CUDA event after it (``CudaEvent``: ``wait``, ``complete``);
  inside ``profiled()`` one before it too, so ``duration`` is its time on the device.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
import weakref
from collections.abc import Sequence

import numpy as np

from backends.cuda.runtime import Cuda, argument_array, check, cu
from backends.hal import Bound, Buffer, Event, Executor, Kernel, Library, check_copy, check_count

ARGV_SLOTS = 256  # argument arrays a kernel keeps, by buffer addresses


class CudaEvent(Event):
    """The point after an operation on a stream of device ``cuda``. Recording a CUDA event per
    operation would cost every launch a driver call, so an untimed point records nothing: waiting
    for it waits for its stream (everything enqueued there before, this operation included), and
    another stream that depends on it waits for an event recorded on this one when it asks
    (again everything before: later, never earlier). A timed point (``profiled()``) records a
    start and an end event around its operation."""

    __slots__ = ("cuda", "stream", "end", "start")

    def __init__(self, cuda: Cuda, stream, end=None, start=None):
        self._future = None
        self._duration = 0.0
        self.cuda, self.stream, self.end, self.start = cuda, stream, end, start

    def wait(self) -> CudaEvent:
        if self.end is not None:
            check(cu.cuEventSynchronize(self.end), "cuEventSynchronize")
        else:
            check(cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
        return self

    @property
    def complete(self) -> bool:
        err, = cu.cuEventQuery(self.end) if self.end is not None else cu.cuStreamQuery(self.stream)
        return err == cu.CUresult.CUDA_SUCCESS

    def marker(self):
        """An event that completes once this point has (recorded now if there is none)."""
        if self.end is None:
            self.end = _event(False)
            check(cu.cuEventRecord(self.end, self.stream), "cuEventRecord")
        return self.end

    def __del__(self):
        for ev in (self.end, self.start):  # (events this point recorded: no one else holds them)
            if ev is not None and cu is not None:
                try:
                    cu.cuEventDestroy(ev)
                except Exception:  # noqa: BLE001 - at interpreter exit the driver may be gone
                    pass

    @property
    def duration(self) -> float:
        self.wait()
        if self.start is None:
            raise ValueError("this CUDA launch was not profiled: run it inside executor.profiled()")
        return float(check(cu.cuEventElapsedTime(self.start, self.end), "cuEventElapsedTime")) * 1e-3


def _event(timed: bool):
    flags = cu.CUevent_flags.CU_EVENT_DEFAULT if timed else cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
    return check(cu.cuEventCreate(flags), "cuEventCreate")


class CudaBuffer(Buffer):
    """``size`` bytes of device memory at ``pointer``; ``owner`` keeps it alive (a torch tensor, an
    array-interface object, or the finalizer of our own allocation)."""

    def __init__(self, executor: CudaExecutor, size: int, pointer: int, owner=None):
        super().__init__(size)
        self.executor = executor
        self.pointer = pointer
        self.owner = owner

    @classmethod
    def over(cls, executor: CudaExecutor, pointer: int, size: int, owner) -> CudaBuffer:
        """A buffer over memory ``owner`` holds (not a copy)."""
        return cls(executor, size, int(pointer), owner)

    def _after(self, deps: Sequence[Event]):
        return self.executor.after(deps)

    def map_current(self, deps: Sequence[Event] = ()) -> np.ndarray:
        stream = self._after(deps)
        host = np.empty(self.size, dtype=np.uint8)
        if self.size:
            got = cu.cuMemcpyDtoHAsync(host.ctypes.data, self.pointer, self.size, stream)
            check(got, "cuMemcpyDtoHAsync")
        check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
        return host

    read = map_current

    def map_discard(self, deps: Sequence[Event] = ()) -> np.ndarray:
        for e in deps:
            e.wait()
        return np.zeros(self.size, dtype=np.uint8)

    def write(self, data: np.ndarray, deps: Sequence[Event] = ()) -> Event:
        data = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
        assert data.size == self.size, (data.size, self.size)
        stream = self._after(deps)
        if self.size:
            # (pageable memory: the call returns once the bytes are staged, so ``data`` may change)
            got = cu.cuMemcpyHtoDAsync(self.pointer, data.ctypes.data, self.size, stream)
            check(got, "cuMemcpyHtoDAsync")
        return self.executor.record(stream)

    unmap = write

    def zero(self, deps: Sequence[Event] = ()) -> Event:
        stream = self._after(deps)
        if self.size:
            check(cu.cuMemsetD8Async(self.pointer, 0, self.size, stream), "cuMemsetD8Async")
        return self.executor.record(stream)


class CudaProgram:
    """A library's PTX, loaded into the context once (on first launch)."""

    def __init__(self, ptx: bytes):
        self.ptx = ptx
        self.module = None
        self.lock = threading.Lock()

    def function(self, cuda: Cuda, name: str):
        with self.lock:
            if self.module is None:
                cuda.current()
                self.module = check(cu.cuModuleLoadData(self.ptx + b"\0"), "cuModuleLoadData (the PTX JIT)")
            return check(cu.cuModuleGetFunction(self.module, name.encode()), f"cuModuleGetFunction({name})")


_MODULES = threading.Lock()


def _module(generic) -> CudaProgram:
    """The ``CudaProgram`` of a ``compiler.GenericModule`` (made once, shared by its kernels)."""
    with _MODULES:
        if generic.loaded is None:
            generic.loaded = CudaProgram(generic.ptx)
        return generic.loaded


class CudaKernel(Kernel):
    def __init__(self, executor: CudaExecutor, library: Library, index: int):
        self.executor = executor
        self.cuda = executor.cuda
        self.info = library.kernels[index]
        extra = library.extra
        self.name = extra["names"][index]
        self.work_items = int(extra["work_items"][index])
        self.launch = (extra.get("launch") or [None] * (index + 1))[index]
        need = (extra.get("local_sizes") or [0] * (index + 1))[index]
        self.required = bool(need) or bool(self.launch)  # (its code assumes the block size)
        self.local = int(need) if need else int(extra.get("local_size", 128))
        self.shared = int(self.launch["local_bytes"]) if self.launch else 0
        if not isinstance(library.handle, CudaProgram):
            library.handle = CudaProgram(library.handle)
        self.program: CudaProgram = library.handle
        self.values: list[int] = []  # a shape-generic kernel's integers (``long`` arguments after the rest)
        use = (extra.get("generic") or {}).get("uses", {}).get(index)
        if use is not None:  # its form's module (``backends.clike.generic``), loaded once per process
            self.program = _module(use.form.program)
            self.values = [v & (1 << 64) - 1 for v in use.values]
        self._fn = None
        self.argvs: dict[tuple, tuple] = {}  # buffer addresses -> (argument array, storage, address)

    def function(self):
        if self._fn is None:
            fn = self.program.function(self.cuda, self.name)
            attr = cu.CUfunction_attribute
            if self.shared:
                check(cu.cuFuncSetAttribute(fn, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                            self.shared), "cuFuncSetAttribute")
            most = check(cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn),
                         "cuFuncGetAttribute")
            if self.local > most:
                if self.required:
                    raise RuntimeError(f"kernel {self.name} needs {self.local} threads a block; the "
                                       f"device allows it {most}")
                self.local = int(most)
            self._fn = fn
        return self._fn

    def arguments(self, pointers: tuple[int, ...]) -> int:
        """The address of ``cuLaunchKernel``'s argument array for buffers at ``pointers`` (and the
        tensor maps over them). torch's caching allocator hands a steady loop the same addresses
        each call: each array is made once per kernel and addresses (``ARGV_SLOTS`` kept)."""
        got = self.argvs.get(pointers)
        if got is None:
            maps = []
            if self.launch:
                maps = [self.cuda.tensor_map(pointers[i], *rest) for i, *rest in self.launch["maps"]]
            argv, storage = argument_array([*pointers, *maps, *self.values])
            if len(self.argvs) >= ARGV_SLOTS:
                self.argvs.clear()
            got = self.argvs[pointers] = (argv, storage, ctypes.addressof(argv))
        return got[2]

    def check(self, params: Sequence[Buffer]) -> None:
        check_count(self.info, params)
        for p in params:
            if not isinstance(p, CudaBuffer):
                raise TypeError(f"kernel '{self.info.name}' runs on CudaBuffers, got {type(p).__name__}")

    def bind(self, params: Sequence[Buffer]) -> CudaBound:
        self.check(params)
        return CudaBound(self, params)

    def run(self, params: Sequence[Buffer], deps: Sequence[Event] = ()) -> Event:
        return self.bind(params).launch(params, deps)


class CudaBound(Bound):
    """A kernel and its argument array for one list of buffers (pointers and tensor maps)."""

    __slots__ = ("address",)

    def __init__(self, kernel: CudaKernel, params: Sequence[Buffer]):
        super().__init__(kernel, params)
        self.address = kernel.arguments(tuple(p.pointer for p in params))

    def launch(self, params: Sequence[Buffer], deps: Sequence[Event] = ()) -> Event:
        kernel: CudaKernel = self.kernel  # type: ignore[assignment]
        ex = kernel.executor
        fn = kernel.function()
        stream = ex.after(deps)
        start = None
        if ex.timing:
            start = _event(True)
            check(cu.cuEventRecord(start, stream), "cuEventRecord")
        groups = -(-kernel.work_items // kernel.local)
        if groups:
            check(cu.cuLaunchKernel(fn, groups, 1, 1, kernel.local, 1, 1, kernel.shared, stream,
                                    self.address, 0),
                  f"cuLaunchKernel({kernel.name})")
        return ex.record(stream, start=start)


class CudaExecutor(Executor):
    timed_by_default = False

    def __init__(self, cuda: Cuda):
        self.cuda = cuda
        self.timing = False

    @contextlib.contextmanager
    def profiled(self):
        was, self.timing = self.timing, True
        try:
            yield
        finally:
            self.timing = was

    # ------------------------------------------------------------------ order
    def after(self, deps: Sequence[Event]):
        """The current stream, once ``deps`` are met on it (events of this device's other streams
        are waited for on the device, any other on the host)."""
        cuda = self.cuda
        cuda.current()
        stream = cuda.stream()
        capturing = None
        for e in deps:
            if type(e) is CudaEvent:
                if e.stream is not stream:
                    if capturing is None:
                        capturing = _capturing(stream)
                    if not capturing:  # (a graph being captured cannot wait for work outside it:
                        # ordering it before the capture is the caller's, as torch's own kernels)
                        check(cu.cuStreamWaitEvent(stream, e.marker(), 0), "cuStreamWaitEvent")
            elif not (capturing if capturing is not None else _capturing(stream)):
                e.wait()
        return stream

    def record(self, stream, timed: bool = False, start=None) -> CudaEvent:
        """The point after the last operation enqueued on ``stream``: a timed one records an event
        (``start``: the event before the operation); else nothing is recorded (``CudaEvent``)."""
        if not (timed or start is not None):
            return CudaEvent(self.cuda, stream)
        end = _event(True)
        check(cu.cuEventRecord(end, stream), "cuEventRecord")
        return CudaEvent(self.cuda, stream, end, start)

    # ------------------------------------------------------------------ memory
    def allocate(self, size: int) -> CudaBuffer:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            t = torch.empty(max(size, 1), dtype=torch.uint8, device=f"cuda:{self.cuda.ordinal}")
            return CudaBuffer(self, size, t.data_ptr(), t)
        stream = self.after(())
        pointer = int(check(cu.cuMemAllocAsync(max(size, 1), stream), f"cuMemAllocAsync({size} bytes)"))
        buf = CudaBuffer(self, size, pointer)
        weakref.finalize(buf, _free_async, self.cuda, pointer)
        return buf

    def copy(self, src: Buffer, src_offset: int, dst: Buffer, dst_offset: int, length: int,
             deps: Sequence[Event] = ()) -> Event:
        if not isinstance(src, CudaBuffer) or not isinstance(dst, CudaBuffer):
            raise TypeError("CUDA copies are between CudaBuffers")
        check_copy(src, src_offset, dst, dst_offset, length)
        stream = self.after(deps)
        if length:
            check(cu.cuMemcpyDtoDAsync(dst.pointer + dst_offset, src.pointer + src_offset, length, stream),
                  "cuMemcpyDtoDAsync")
        return self.record(stream)

    def prepare(self, library: Library, index: int) -> CudaKernel:
        return CudaKernel(self, library, index)

    # ------------------------------------------------------------------ raw calls (backends.lane)
    def raw_launcher(self, kernel: CudaKernel):
        fn = kernel.function()  # (may lower its block size: first)
        groups, local, shared = -(-kernel.work_items // kernel.local), kernel.local, kernel.shared
        arguments, launch, ok = kernel.arguments, cu.cuLaunchKernel, cu.CUresult.CUDA_SUCCESS

        def go(addresses, stream) -> None:
            if groups:
                got = launch(fn, groups, 1, 1, local, 1, 1, shared, stream, arguments(addresses), 0)
                if got[0] != ok:
                    check(got, f"cuLaunchKernel({kernel.name})")
        return go

    def raw_address(self, buffer) -> int:
        return buffer.pointer

    def raw_stream(self):
        self.cuda.current()
        return self.cuda.stream()

    def raw_after(self, events, stream) -> None:
        for e in events:  # (a lane's last point on this stream: nothing to do)
            if type(e) is not CudaEvent or e.stream is not stream:
                self.after(events)
                return

    def raw_zero(self, address: int, nbytes: int, stream) -> None:
        check(cu.cuMemsetD8Async(address, 0, nbytes, stream), "cuMemsetD8Async")

    def raw_point(self, stream) -> list:
        return [CudaEvent(self.cuda, stream)]

    def raw_unmarked(self, point) -> bool:
        return point[0].end is None  # (a recorded marker is a fixed point: older than what follows)


def _capturing(stream) -> bool:
    """Whether ``stream`` is capturing a CUDA graph (``torch.cuda.graph``)."""
    status = check(cu.cuStreamIsCapturing(stream), "cuStreamIsCapturing")
    return status != cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def _free_async(cuda: Cuda, pointer: int) -> None:
    try:
        cuda.current()
        cu.cuMemFreeAsync(pointer, cuda.stream())
    except Exception:  # noqa: BLE001 - at interpreter exit the driver may be gone
        pass


__all__ = ["CudaBuffer", "CudaEvent", "CudaExecutor", "CudaKernel"]
