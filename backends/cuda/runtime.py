"""The CUDA driver for ``cuda.0``, through NVIDIA's maintained bindings (``cuda-bindings``:
``cuda.bindings.driver``), not ctypes declarations of our own.

* **Context.** The device's primary context, the one PyTorch and the CUDA runtime use, so pointers
  from either are valid here and ours are valid there. ``Cuda.current()`` makes it current on the
  calling thread (once per thread).
* **Stream.** Work goes on the caller's current stream: PyTorch's (``torch.cuda.current_stream``)
  where PyTorch has initialized CUDA in this process, else the legacy default stream. Nothing
  waits on the host for a launch, so calls can be captured in a CUDA graph.
* **Errors.** Every call's status is checked; a failure raises ``CudaError`` naming the call and
  CUDA's name for the status.
"""

from __future__ import annotations

import ctypes
import sys
import threading

try:
    from cuda.bindings import driver as cu
except ImportError:  # the optional extra [cuda] is not installed
    cu = None

MAP_SLOTS = 1024  # tensor maps kept in device memory (128 bytes each)
# CUtensorMapDataType by Tile's name for the element (TFLOAT32: float32 rounded to TF32 on load)
MAP_TYPES = {"float16": 6, "float32": 7, "bfloat16": 9, "tfloat32": 11}
MAP_SWIZZLE_128B, MAP_L2_128B = 3, 2


class CudaError(RuntimeError):
    """A CUDA driver call failed (the message names the call and the status)."""


def unavailable() -> str | None:
    """Why the CUDA driver cannot be used here (one line), or None."""
    if cu is None:
        return "the CUDA bindings are not installed (pip install 'tile[cuda]': cuda-bindings)"
    try:
        err, = cu.cuInit(0)
    except Exception as e:  # noqa: BLE001 - no driver library: the bindings raise their own errors
        return f"no NVIDIA driver (libcuda) here: {type(e).__name__}: {str(e).strip()}"
    if err != cu.CUresult.CUDA_SUCCESS:
        return f"cuInit failed ({_name(err)})"
    return None


def _name(err) -> str:
    try:
        got, text = cu.cuGetErrorName(err)
        return text.decode() if got == cu.CUresult.CUDA_SUCCESS else str(err)
    except Exception:  # noqa: BLE001 - a status the driver cannot name
        return str(err)


def check(result, what: str):
    """The values of a binding call's ``(status, *values)`` result, or ``CudaError``."""
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise CudaError(f"{what} failed: {_name(err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def device_count() -> int:
    return int(check(cu.cuDeviceGetCount(), "cuDeviceGetCount"))


def primary_context(ordinal: int) -> tuple:
    """Device ``ordinal``'s ``CUdevice`` and its primary context (retained: the one PyTorch uses)."""
    device = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
    return device, check(cu.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")


class pushed:  # noqa: N801 - used as ``with pushed(ctx):``
    """``with pushed(context):`` makes ``context`` current for the calls inside, then restores the
    thread's previous one (for callers that share the thread with other CUDA users: OpenCL's)."""

    __slots__ = ("context",)

    def __init__(self, context):
        self.context = context

    def __enter__(self):
        check(cu.cuCtxPushCurrent(self.context), "cuCtxPushCurrent")

    def __exit__(self, *exc):
        check(cu.cuCtxPopCurrent(), "cuCtxPopCurrent")


def uuids(ordinal: int) -> set[bytes]:
    """Device ``ordinal``'s UUID as the driver's calls give it (bindings for CUDA 12 have
    ``cuDeviceGetUuid_v2``, a MIG instance's own; CUDA 13's ``cuDeviceGetUuid`` is that call)."""
    device = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
    found = set()
    for name in ("cuDeviceGetUuid_v2", "cuDeviceGetUuid"):
        call = getattr(cu, name, None)
        if call is not None:
            found.add(bytes(check(call(device), name).bytes))
    return found


def encode_tensor_map(pointer: int, dims, stride: int, box, dtype: str):
    """The ``CUtensorMap`` (encoded on the host, 128-byte swizzle) over the 2-D tensor at device
    address ``pointer``: ``dims`` elements of ``dtype``, rows ``stride`` bytes apart, copied in
    ``box`` tiles. (Its 128 bytes are at ``getPtr()``.)"""
    u64, u32 = cu.cuuint64_t, cu.cuuint32_t  # (the bindings take no plain ints in lists)
    return check(cu.cuTensorMapEncodeTiled(
        cu.CUtensorMapDataType(MAP_TYPES[dtype]), len(dims), pointer, [u64(d) for d in dims],
        [u64(stride)], [u32(b) for b in box], [u32(1)] * len(box), cu.CUtensorMapInterleave(0),
        cu.CUtensorMapSwizzle(MAP_SWIZZLE_128B), cu.CUtensorMapL2promotion(MAP_L2_128B),
        cu.CUtensorMapFloatOOBfill(0),
    ), "cuTensorMapEncodeTiled")


class Cuda:
    """One CUDA device's primary context, its facts, and the helpers every launch needs."""

    def __init__(self, ordinal: int):
        self.ordinal = ordinal
        self.device, self.context = primary_context(ordinal)
        self._local = threading.local()
        self.current()
        attr = cu.CUdevice_attribute
        self.capability = (self.attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                           self.attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
        self.shared_bytes = self.attribute(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)
        self.optin_bytes = self.attribute(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        self.sms = self.attribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        self.max_threads = self.attribute(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
        try:  # (kHz; a driver may stop reporting it)
            self.clock_mhz = self.attribute(attr.CU_DEVICE_ATTRIBUTE_CLOCK_RATE) / 1000.0
        except CudaError:
            self.clock_mhz = 0.0
        self.name = check(cu.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        self.name = self.name.split(b"\0")[0].decode()
        self.total_bytes = int(check(cu.cuDeviceTotalMem(self.device), "cuDeviceTotalMem"))
        self.driver_version = int(check(cu.cuDriverGetVersion(), "cuDriverGetVersion"))
        self._streams: dict[int, object] = {}
        self._raw = None  # torch's current-stream getter, once torch has initialized CUDA
        self.maps: dict[tuple, int] = {}  # key -> device address of its encoded tensor map
        self.maps_at = 0
        self.lock = threading.Lock()

    def attribute(self, which) -> int:
        return int(check(cu.cuDeviceGetAttribute(which, self.device), f"cuDeviceGetAttribute({which.name})"))

    def current(self) -> None:
        """Make the primary context current on this thread (once per thread)."""
        if getattr(self._local, "set", False):
            return
        check(cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        self._local.set = True

    # ------------------------------------------------------------------ streams
    def stream(self):
        """The caller's current stream (module docstring) as a ``CUstream``."""
        handle = 0
        raw = self._raw
        if raw is not None:
            handle = raw(self.ordinal)
        else:
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_initialized():  # (it stays so: kept from now on)
                raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # (no Stream object: ~1 us)
                if raw is None:
                    raw = lambda ordinal: torch.cuda.current_stream(ordinal).cuda_stream  # noqa: E731
                self._raw = raw
                handle = raw(self.ordinal)
        got = self._streams.get(handle)
        if got is None:
            got = self._streams[handle] = cu.CUstream(handle)
        return got

    # ------------------------------------------------------------------ memory
    def allocate(self, nbytes: int) -> int:
        self.current()
        return int(check(cu.cuMemAlloc(max(nbytes, 1)), f"cuMemAlloc({nbytes} bytes)"))

    # ------------------------------------------------------------------ tensor maps
    def tensor_map(self, pointer: int, dims, stride: int, box, dtype: str) -> int:
        """The device address of the tensor map over ``pointer`` (encoded on the host, 128-byte
        swizzle, and copied into device memory on first use; kept by key, as resident tensors'
        addresses repeat)."""
        key = (pointer, tuple(dims), stride, tuple(box), dtype)
        at = self.maps.get(key)
        if at is not None:
            return at
        with self.lock:
            if not self.maps_at:
                self.maps_at = self.allocate(128 * MAP_SLOTS)
            if len(self.maps) == MAP_SLOTS:  # full: the launches reading them finish first
                check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
                self.maps.clear()
            tmap = encode_tensor_map(pointer, dims, stride, box, dtype)
            at = self.maps_at + 128 * len(self.maps)
            check(cu.cuMemcpyHtoD(at, tmap.getPtr(), 128), "cuMemcpyHtoD (tensor map)")
            self.maps[key] = at
            return at


def argument_array(values: list[int]) -> tuple[ctypes.Array, list]:
    """``cuLaunchKernel``'s ``void**`` for 64-bit arguments ``values`` (pointers, map addresses),
    with the storage it points into (keep both alive while the array is in use)."""
    storage = [ctypes.c_uint64(v) for v in values]
    argv = (ctypes.c_void_p * len(values))(*[ctypes.addressof(s) for s in storage])
    return argv, storage


__all__ = ["Cuda", "CudaError", "argument_array", "check", "cu", "device_count", "encode_tensor_map",
           "primary_context", "pushed", "unavailable", "uuids"]
