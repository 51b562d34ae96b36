"""CUDA memory that an OpenCL device reads and writes in place (``cl_khr_external_memory``).

A block is memory made with CUDA's virtual memory calls, exported as a POSIX file descriptor and
imported into OpenCL (``clCreateBufferWithProperties`` with ``CL_EXTERNAL_MEMORY_HANDLE_OPAQUE_FD_KHR``),
so one allocation has a CUDA address (which a framework's CUDA tensor can view) and an OpenCL
buffer (which Tile's kernels take): nothing crosses the host. ``Sharing.for_device`` says whether
an OpenCL device can do it, and why not: the driver lacks the extensions, ``libcuda.so.1`` is not
there, no CUDA device has the OpenCL device's UUID (devices are matched by UUID, never by ordinal),
or a CUDA call fails. ``TILE_CUDA_SHARING=0`` turns it off.

Both APIs are reached through ctypes (no CUDA Python package): the CUDA driver API of
``libcuda.so.1``, with the structs of its documented layout, and the OpenCL library pyopencl loaded.
Blocks are pooled by size (a multiple of CUDA's allocation granularity) and reused. A block's
users keep the order themselves: OpenCL's work on it is waited for before CUDA work reads it, and
CUDA's before OpenCL's starts (``tile.torch_cuda`` does both).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from ctypes import POINTER, byref, c_char, c_char_p, c_int, c_size_t, c_uint, c_ulonglong, c_void_p

import pyopencl as cl

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

# CUDA driver API enums (cuda.h)
CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


class SharingError(RuntimeError):
    """A CUDA or OpenCL call of the sharing path failed (the message names it)."""


class CUmemLocation(ctypes.Structure):
    _fields_ = [("type", c_int), ("id", c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class CUmemAllocationProp(ctypes.Structure):
    _fields_ = [
        ("type", c_int),
        ("requestedHandleTypes", c_int),
        ("location", CUmemLocation),
        ("win32HandleMetaData", c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class CUmemAccessDesc(ctypes.Structure):
    _fields_ = [("location", CUmemLocation), ("flags", c_int)]


_U64 = c_ulonglong  # CUdeviceptr, CUmemGenericAllocationHandle, flags
# the calls used, by their exported names (cuda.h maps cuCtxPushCurrent to the _v2 symbol), and
# their argument types; every one returns a CUresult
_CUDA_CALLS = {
    "cuInit": (c_uint,),
    "cuDeviceGetCount": (POINTER(c_int),),
    "cuDeviceGet": (POINTER(c_int), c_int),
    "cuDeviceGetUuid_v2": (POINTER(c_char * 16), c_int),
    "cuDeviceGetUuid": (POINTER(c_char * 16), c_int),
    "cuDevicePrimaryCtxRetain": (POINTER(c_void_p), c_int),
    "cuCtxPushCurrent_v2": (c_void_p,),
    "cuCtxPopCurrent_v2": (POINTER(c_void_p),),
    "cuCtxSynchronize": (),
    "cuMemGetAllocationGranularity": (POINTER(c_size_t), POINTER(CUmemAllocationProp), c_int),
    "cuMemCreate": (POINTER(_U64), c_size_t, POINTER(CUmemAllocationProp), _U64),
    "cuMemExportToShareableHandle": (c_void_p, _U64, c_int, _U64),
    "cuMemAddressReserve": (POINTER(_U64), c_size_t, c_size_t, _U64, _U64),
    "cuMemMap": (_U64, c_size_t, c_size_t, _U64, _U64),
    "cuMemSetAccess": (_U64, c_size_t, POINTER(CUmemAccessDesc), c_size_t),
    "cuMemUnmap": (_U64, c_size_t),
    "cuMemAddressFree": (_U64, c_size_t),
    "cuMemRelease": (_U64,),
    "cuGetErrorName": (c_int, POINTER(c_char_p)),
}


class CudaDriver:
    """The CUDA driver API calls sharing needs, from ``libcuda.so.1``: ``driver.cuMemCreate(...)``
    calls it and raises ``SharingError`` naming the call and CUDA's error name when it fails."""

    def __init__(self, lib: ctypes.CDLL):
        self._lib = lib
        for name, args in _CUDA_CALLS.items():
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes, fn.restype = list(args), c_int

    @classmethod
    def load(cls, name: str = "libcuda.so.1") -> tuple[CudaDriver | None, str]:
        """The driver, or None and why not."""
        try:
            lib = ctypes.CDLL(name)
        except OSError as e:
            return None, f"{name} cannot be loaded ({e})"
        missing = [n for n in _CUDA_CALLS if n != "cuDeviceGetUuid_v2" and not hasattr(lib, n)]
        if missing:
            return None, f"{name} lacks {', '.join(missing)}"
        return cls(lib), ""

    def __getattr__(self, name: str):
        """The driver call ``name``, raising ``SharingError`` when it fails (kept: a launch makes
        several calls each time)."""
        fn = getattr(self._lib, name)

        def call(*args):
            rc = fn(*args)
            if rc != 0:
                raise SharingError(f"{name} failed: {self.error_name(rc)}")

        setattr(self, name, call)
        return call

    def error_name(self, rc: int) -> str:
        text = c_char_p()
        if self._lib.cuGetErrorName(rc, byref(text)) != 0 or not text.value:
            return f"CUresult {rc}"
        return text.value.decode()

    def uuids(self, ordinal: int) -> set[bytes]:
        """Device ``ordinal``'s UUID as both calls give it (``_v2`` names a MIG instance's own)."""
        found = set()
        dev = c_int()
        self.cuDeviceGet(byref(dev), ordinal)
        for name in ("cuDeviceGetUuid_v2", "cuDeviceGetUuid"):
            if hasattr(self._lib, name):
                raw = (c_char * 16)()
                getattr(self, name)(byref(raw), dev)
                found.add(bytes(raw))
        return found


class Context:
    """``with Context(driver, ctx):`` makes the CUDA context current for the calls inside."""

    def __init__(self, driver: CudaDriver, ctx: c_void_p):
        self.driver, self.ctx = driver, ctx

    def __enter__(self):
        self.driver.cuCtxPushCurrent_v2(self.ctx)

    def __exit__(self, *exc):
        self.driver.cuCtxPopCurrent_v2(byref(c_void_p()))


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
        cuda, why = CudaDriver.load()
        if cuda is None:
            return None, why
        try:
            cl_lib = _opencl_library()
            if not hasattr(cl_lib, "clCreateBufferWithProperties"):
                return None, "the OpenCL library has no clCreateBufferWithProperties (OpenCL 3.0)"
            uuid = _cl_uuid(cl_lib, device.cl_device)
            cuda.cuInit(0)
            count = c_int()
            cuda.cuDeviceGetCount(byref(count))
            ordinal = next((i for i in range(count.value) if uuid in cuda.uuids(i)), None)
            if ordinal is None:
                return None, f"no CUDA device has {device.id}'s UUID {uuid.hex()}"
            return cls(device, cuda, cl_lib, ordinal), ""
        except (SharingError, OSError) as e:
            return None, str(e)

    def __init__(self, device: Driver, cuda: CudaDriver, cl_lib: ctypes.CDLL, ordinal: int):
        self.device = device
        self.ordinal = ordinal
        self._cuda = cuda
        self._cl = cl_lib
        dev = c_int()
        cuda.cuDeviceGet(byref(dev), ordinal)
        self.cuda_device = dev.value  # the CUdevice
        self._ctx = c_void_p()
        cuda.cuDevicePrimaryCtxRetain(byref(self._ctx), dev)  # the context torch's runtime uses
        self._prop = CUmemAllocationProp()
        self._prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
        self._prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        self._prop.location = CUmemLocation(CU_MEM_LOCATION_TYPE_DEVICE, dev.value)
        self._access = CUmemAccessDesc(self._prop.location, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        gran = c_size_t()
        with Context(cuda, self._ctx):
            minimum = CU_MEM_ALLOC_GRANULARITY_MINIMUM
            cuda.cuMemGetAllocationGranularity(byref(gran), byref(self._prop), minimum)
        self.granularity = int(gran.value) or 1
        self._free: dict[int, list[Block]] = {}  # idle blocks by size
        self._idle = 0  # their bytes
        self.blocks = 0  # blocks made and not freed (in use or idle)
        self._lock = threading.Lock()

    @property
    def cuda(self) -> CudaDriver:
        """The CUDA driver calls (each raising ``SharingError`` when it fails)."""
        return self._cuda

    @property
    def cuda_library(self) -> ctypes.CDLL:
        """``libcuda.so.1`` itself (for a call whose result is not only success or failure)."""
        return self._cuda._lib

    def current(self) -> Context:
        """``with sharing.current():`` makes the CUDA context current for the calls inside."""
        return Context(self._cuda, self._ctx)

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
            with Context(self._cuda, self._ctx):
                self._cuda.cuCtxSynchronize()
            for b in idle:
                self._release(b)

    def _give_back(self, block: Block) -> None:
        with self._lock:
            self._free.setdefault(block.size, []).append(block)
            self._idle += block.size

    def _create(self, size: int) -> Block:
        cuda = self._cuda
        undo = []  # what a failure part-way must take back, in reverse
        try:
            with Context(cuda, self._ctx):
                handle = c_ulonglong()
                cuda.cuMemCreate(byref(handle), size, byref(self._prop), 0)
                undo.append(lambda: cuda.cuMemRelease(handle))
                ptr = c_ulonglong()
                cuda.cuMemAddressReserve(byref(ptr), size, 0, 0, 0)
                undo.append(lambda: cuda.cuMemAddressFree(ptr, size))
                cuda.cuMemMap(ptr, size, 0, handle, 0)
                undo.append(lambda: cuda.cuMemUnmap(ptr, size))
                cuda.cuMemSetAccess(ptr, size, byref(self._access), 1)
                fd = c_int(-1)
                fd_type = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                cuda.cuMemExportToShareableHandle(byref(fd), handle, fd_type, 0)
                try:
                    buf = _import_fd(self._cl, self.device, fd.value, size)
                finally:
                    os.close(fd.value)
        except Exception:
            with Context(cuda, self._ctx):
                for step in reversed(undo):
                    try:
                        step()
                    except Exception:  # noqa: BLE001 - the first failure is the one to report
                        pass
            raise
        with self._lock:
            self.blocks += 1
        at = int(ptr.value)
        return Block(self, size, at, int(handle.value), SharedCLBuffer(self.device, buf, size, at))

    def _release(self, block: Block) -> None:
        """Free a block nothing uses: the OpenCL buffer first, then CUDA's mapping, its addresses
        and its memory."""
        block.buffer.buf.release()
        cuda = self._cuda
        with Context(cuda, self._ctx):
            cuda.cuMemUnmap(block.cuda_pointer, block.size)
            cuda.cuMemAddressFree(block.cuda_pointer, block.size)
            cuda.cuMemRelease(block.handle)
        with self._lock:
            self.blocks -= 1
