"""CUDA memory that an OpenCL device reads and writes in place (``cl_khr_external_memory``).

A block is memory made with CUDA's virtual memory calls, exported as a POSIX file descriptor and
imported into OpenCL (``clCreateBufferWithProperties`` with ``CL_EXTERNAL_MEMORY_HANDLE_OPAQUE_FD_KHR``),
so one allocation has a CUDA address (which a framework's CUDA tensor can view) and an OpenCL
buffer (which Tile's kernels take): nothing crosses the host. ``Sharing.for_device`` says whether
an OpenCL device can do it, and why not: the driver lacks the extensions, the CUDA bindings or the
NVIDIA driver are not there, no CUDA device has the OpenCL device's UUID (devices are matched by
UUID, never by ordinal), or a CUDA call fails. ``TILE_CUDA_SHARING=0`` turns it off.

CUDA is reached through NVIDIA's bindings (``cuda.bindings.driver``, via ``runtime``: its status
checks, which raise ``CudaError`` naming the call, and the device's primary context, the one
PyTorch uses). OpenCL's side (``clCreateBufferWithProperties`` with an external-memory fd, the
device UUID) has no maintained binding in pyopencl, so those two calls alone are ctypes
declarations, made on the OpenCL library pyopencl loaded.

Blocks are pooled by size (a multiple of CUDA's allocation granularity) and reused. A block's
users keep the order themselves: OpenCL's work on it is waited for before CUDA work reads it, and
CUDA's before OpenCL's starts (``tile.torch_cuda`` does both).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from ctypes import POINTER, byref, c_char, c_int, c_size_t, c_uint, c_ulonglong, c_void_p

import pyopencl as cl

from backends.cuda import runtime
from backends.cuda.runtime import CudaError, check
from backends.hal import Buffer
from backends.opencl.driver import Driver
from backends.opencl.executor import CLBuffer

EXTENSIONS = ("cl_khr_external_memory", "cl_khr_external_memory_opaque_fd", "cl_khr_device_uuid")
IDLE_BYTES = 1 << 30  # idle pooled blocks beyond this are freed at the next allocation

# OpenCL (cl_khr_external_memory, cl_khr_device_uuid)
CL_MEM_READ_WRITE = 1
CL_EXTERNAL_MEMORY_HANDLE_OPAQUE_FD_KHR = 0x2060
CL_MEM_DEVICE_HANDLE_LIST_KHR = 0x2051
CL_MEM_DEVICE_HANDLE_LIST_END_KHR = 0
CL_DEVICE_UUID_KHR = 0x106A


class SharingError(RuntimeError):
    """An OpenCL call of the sharing path failed (the message names it; CUDA's raise ``CudaError``)."""


def allocation(device: int) -> tuple:
    """What every block is made with on the ``CUdevice`` ``device``: the ``CUmemAllocationProp``
    (pinned device memory that can be exported as a POSIX file descriptor) and the
    ``CUmemAccessDesc`` (that device reads and writes it)."""
    cu = runtime.cu
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    access = cu.CUmemAccessDesc()
    access.location.type = prop.location.type
    access.location.id = device
    access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return prop, access


def _opencl_library() -> ctypes.CDLL:
    """The OpenCL library pyopencl loaded (its wheel bundles an ICD loader), found among the
    process's mapped files; else the system's."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if os.path.basename(path).startswith("libOpenCL"):
                return ctypes.CDLL(path)
    return ctypes.CDLL(ctypes.util.find_library("OpenCL") or "libOpenCL.so.1")


def _cl_uuid(lib: ctypes.CDLL, device: cl.Device) -> bytes:
    fn = lib.clGetDeviceInfo
    fn.argtypes = [c_void_p, c_uint, c_size_t, c_void_p, POINTER(c_size_t)]
    fn.restype = c_int
    raw = (c_char * 16)()
    rc = fn(c_void_p(device.int_ptr), CL_DEVICE_UUID_KHR, 16, raw, None)
    if rc != 0:
        raise SharingError(f"clGetDeviceInfo(CL_DEVICE_UUID_KHR) failed: OpenCL error {rc}")
    return bytes(raw)


def _import_fd(lib: ctypes.CDLL, device: Driver, fd: int, size: int) -> cl.Buffer:
    """An OpenCL buffer over the memory exported as ``fd``. OpenCL gets a duplicate of ``fd``
    (whether a successful import takes ownership of it is not clear); the caller closes ``fd``."""
    fn = lib.clCreateBufferWithProperties
    fn.argtypes = [c_void_p, c_void_p, c_ulonglong, c_size_t, c_void_p, POINTER(c_int)]
    fn.restype = c_void_p
    dup = os.dup(fd)
    props = (ctypes.c_uint64 * 6)(
        CL_EXTERNAL_MEMORY_HANDLE_OPAQUE_FD_KHR, dup,
        CL_MEM_DEVICE_HANDLE_LIST_KHR, device.cl_device.int_ptr, CL_MEM_DEVICE_HANDLE_LIST_END_KHR,
        0,
    )
    err = c_int(0)
    mem = fn(c_void_p(device.context.int_ptr), props, CL_MEM_READ_WRITE, size, None, byref(err))
    if err.value != 0 or not mem:
        os.close(dup)
        what = "clCreateBufferWithProperties (opaque fd import)"
        raise SharingError(f"{what} failed: OpenCL error {err.value}")
    return cl.Buffer.from_int_ptr(mem, retain=False)


class SharedCLBuffer(CLBuffer):
    """A ``CLBuffer`` over an OpenCL buffer imported from CUDA memory: it allocates nothing."""

    def __init__(self, device: Driver, buf: cl.Buffer, size: int, cuda_pointer: int | None = None):
        Buffer.__init__(self, size)  # not CLBuffer.__init__, which allocates
        self.device = device
        self.buf = buf
        self.cuda_pointer = cuda_pointer  # its CUDA address (``launch`` launches on it)


class Block:
    """``size`` bytes of shared memory: ``cuda_pointer`` in CUDA, ``buffer`` (a ``CLBuffer``) in
    OpenCL. ``give_back()`` returns it to its pool."""

    __slots__ = ("sharing", "size", "cuda_pointer", "handle", "buffer")

    def __init__(self, sharing: Sharing, size: int, cuda_pointer: int, handle: int, buffer: SharedCLBuffer):
        self.sharing = sharing
        self.size = size
        self.cuda_pointer = cuda_pointer
        self.handle = handle
        self.buffer = buffer

    def give_back(self) -> None:
        self.sharing._give_back(self)


def once_per_device(found: dict, lock: threading.Lock, device, probe):
    """``probe(device)``'s answer for a ``backends`` OpenCL device, made once per OpenCL device
    (kept in ``found`` by ``cl_device_id``), or None and why not when it is not one."""
    if not isinstance(device, Driver):
        return None, f"{device.id} is not an OpenCL device"
    key = device.cl_device.int_ptr
    with lock:
        got = found.get(key)
        if got is None:
            got = found[key] = probe(device)
    return got


class Sharing:
    """Memory shared between one OpenCL device and the CUDA device with its UUID (``ordinal``)."""

    _found: dict[int, tuple[Sharing | None, str]] = {}  # by cl_device_id
    _found_lock = threading.Lock()

    @classmethod
    def for_device(cls, device) -> tuple[Sharing | None, str]:
        """The sharing for a ``backends`` OpenCL device, made once, or None and why not (one line)."""
        if os.environ.get("TILE_CUDA_SHARING", "1") == "0":
            return None, "TILE_CUDA_SHARING=0 turns it off"
        return once_per_device(cls._found, cls._found_lock, device, cls._probe)

    @classmethod
    def _probe(cls, device: Driver) -> tuple[Sharing | None, str]:
        missing = [e for e in EXTENSIONS if e not in device.extensions]
        if missing:
            return None, f"{device.id}'s OpenCL driver lacks {', '.join(missing)}"
        why = runtime.unavailable()  # (no bindings: it says to install the [cuda] extra)
        if why is not None:
            return None, why
        try:
            cl_lib = _opencl_library()
            if not hasattr(cl_lib, "clCreateBufferWithProperties"):
                return None, "the OpenCL library has no clCreateBufferWithProperties (OpenCL 3.0)"
            uuid = _cl_uuid(cl_lib, device.cl_device)
            count = runtime.device_count()
            ordinal = next((i for i in range(count) if uuid in runtime.uuids(i)), None)
            if ordinal is None:
                return None, f"no CUDA device has {device.id}'s UUID {uuid.hex()}"
            return cls(device, cl_lib, ordinal), ""
        except (SharingError, CudaError, OSError) as e:
            return None, str(e)

    def __init__(self, device: Driver, cl_lib: ctypes.CDLL, ordinal: int):
        cu = runtime.cu
        self.device = device
        self.ordinal = ordinal
        self._cl = cl_lib
        self.cuda_device, self._ctx = runtime.primary_context(ordinal)  # (the context torch uses)
        self._prop, self._access = allocation(int(self.cuda_device))
        with self.current():
            minimum = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
            gran = check(cu.cuMemGetAllocationGranularity(self._prop, minimum),
                         "cuMemGetAllocationGranularity")
        self.granularity = int(gran) or 1
        self._free: dict[int, list[Block]] = {}  # idle blocks by size
        self._idle = 0  # their bytes
        self.blocks = 0  # blocks made and not freed (in use or idle)
        self._lock = threading.Lock()

    def current(self) -> runtime.pushed:
        """``with sharing.current():`` makes the CUDA context current for the calls inside."""
        return runtime.pushed(self._ctx)

    def allocate(self, nbytes: int) -> Block:
        """A block of at least ``nbytes`` (at least one granule): an idle one of that size, else new."""
        size = max(1, -(-nbytes // self.granularity)) * self.granularity
        with self._lock:
            idle = self._free.get(size)
            if idle:
                self._idle -= size
                return idle.pop()
            over = self._idle + size > IDLE_BYTES
        if over:
            self.trim()
        return self._create(size)

    def trim(self) -> None:
        """Free every idle block (waits for the CUDA context's work first: a tensor that viewed one
        may have been dropped while a kernel still read it)."""
        with self._lock:
            idle = [b for blocks in self._free.values() for b in blocks]
            self._free.clear()
            self._idle = 0
        if idle:
            with self.current():
                check(runtime.cu.cuCtxSynchronize(), "cuCtxSynchronize")
            for b in idle:
                self._release(b)

    def _give_back(self, block: Block) -> None:
        with self._lock:
            self._free.setdefault(block.size, []).append(block)
            self._idle += block.size

    def _create(self, size: int) -> Block:
        """A new block of ``size`` bytes: CUDA memory made (``cuMemCreate``), given addresses
        (``cuMemAddressReserve``, ``cuMemMap``, ``cuMemSetAccess``), exported as a file descriptor
        and imported into OpenCL; a failure part-way takes back what was done, in reverse."""
        cu = runtime.cu
        undo = []
        try:
            with self.current():
                handle = check(cu.cuMemCreate(size, self._prop, 0), "cuMemCreate")
                undo.append(lambda: cu.cuMemRelease(handle))
                ptr = check(cu.cuMemAddressReserve(size, 0, 0, 0), "cuMemAddressReserve")
                undo.append(lambda: cu.cuMemAddressFree(ptr, size))
                check(cu.cuMemMap(ptr, size, 0, handle, 0), "cuMemMap")
                undo.append(lambda: cu.cuMemUnmap(ptr, size))
                check(cu.cuMemSetAccess(ptr, size, [self._access], 1), "cuMemSetAccess")
                fd_type = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                fd = int(check(cu.cuMemExportToShareableHandle(handle, fd_type, 0),
                               "cuMemExportToShareableHandle"))
                try:
                    buf = _import_fd(self._cl, self.device, fd, size)
                finally:
                    os.close(fd)
        except Exception:
            with self.current():
                for step in reversed(undo):
                    try:
                        step()  # (a binding call returns its status: a failure here raises nothing)
                    except Exception:  # noqa: BLE001 - the first failure is the one to report
                        pass
            raise
        with self._lock:
            self.blocks += 1
        at = int(ptr)
        return Block(self, size, at, int(handle), SharedCLBuffer(self.device, buf, size, at))

    def _release(self, block: Block) -> None:
        """Free a block nothing uses: the OpenCL buffer first, then CUDA's mapping, its addresses
        and its memory."""
        block.buffer.buf.release()
        cu = runtime.cu
        with self.current():
            check(cu.cuMemUnmap(block.cuda_pointer, block.size), "cuMemUnmap")
            check(cu.cuMemAddressFree(block.cuda_pointer, block.size), "cuMemAddressFree")
            check(cu.cuMemRelease(block.handle), "cuMemRelease")
        with self._lock:
            self.blocks -= 1
