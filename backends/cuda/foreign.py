"""Device memory that someone else owns, as a buffer of ``cuda.<n>`` without a copy: a torch CUDA
tensor, any object with ``__cuda_array_interface__`` (CuPy, Numba, JAX on GPU), or a DLPack
producer (``__dlpack__``).

``view(obj)`` reads where the data is (pointer, shape, Tile dtype, the CUDA device ordinal) and
what keeps it alive. Only C-contiguous data can be wrapped; anything else is refused with what to
do instead (``.contiguous()``). A DLPack capsule is consumed as the protocol asks (renamed
``used_dltensor``), and its deleter runs when the wrapping buffer is freed.
"""

from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass

import numpy as np

from tile.dtypes import DType
from tile.errors import TileInputError

KDL_CUDA = 2
_DL_CODES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 6: "bool"}


@dataclass
class Foreign:
    pointer: int
    shape: tuple[int, ...]
    dtype: DType
    ordinal: int
    owner: object  # kept alive as long as the buffer over the memory


def _refuse(what: str, hint: str) -> TileInputError:
    return TileInputError(what, None, hint=hint)


def _contiguous(shape, strides, itemsize: int, what: str) -> None:
    """Refuse strides (in bytes) that are not C-contiguous for ``shape``."""
    if strides is None:
        return
    want = itemsize
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size > 1 and stride != want:
            raise _refuse(f"{what} is not C-contiguous (strides {tuple(strides)} bytes for shape "
                          f"{tuple(shape)})", "pass a contiguous tensor (e.g. x.contiguous())")
        want *= size


def from_interface(obj, what: str = "the array") -> Foreign:
    """From ``__cuda_array_interface__`` (version 2 or 3)."""
    cai = obj.__cuda_array_interface__
    shape = tuple(int(d) for d in cai["shape"])
    typestr = cai["typestr"]
    try:
        dtype = DType.of(np.dtype(typestr))
    except TypeError:
        raise _refuse(f"{what} has element type {typestr}, which Tile does not have",
                      "use bool, integer, float16, float32 or float64 data") from None
    _contiguous(shape, cai.get("strides"), np.dtype(typestr).itemsize, what)
    pointer = int(cai["data"][0])
    ordinal = _ordinal_of(pointer)
    return Foreign(pointer, shape, dtype, ordinal, obj)


def _ordinal_of(pointer: int) -> int:
    """The CUDA device holding ``pointer`` (0 where the driver cannot tell: a null pointer)."""
    from backends.cuda.runtime import cu

    if not pointer:
        return 0
    err, value = cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, pointer)
    return int(value) if err == cu.CUresult.CUDA_SUCCESS else 0


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManaged(ctypes.Structure):
    pass


_DLManaged._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManaged))),
]

_api = ctypes.pythonapi
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dl_dtype(t: _DLDataType, what: str) -> DType:
    kind = _DL_CODES.get(t.code)
    name = None if kind is None or t.lanes != 1 else ("bool" if kind == "bool" else f"{kind}{t.bits}")
    try:
        return DType(name)
    except ValueError:
        raise _refuse(f"{what} has DLPack type code {t.code}, {t.bits} bits, {t.lanes} lanes, which "
                      "Tile does not have", "use bool, integer, float16, bfloat16, float32 or float64 data",
                      ) from None


def from_dlpack(obj, stream: int, what: str = "the array") -> Foreign:
    """From a DLPack producer, synchronized to ``stream`` (the consumer's, DLPack's numbering:
    1 for the legacy default stream)."""
    device_type, _ = obj.__dlpack_device__()
    if int(device_type) != KDL_CUDA:
        raise _refuse(f"{what} is not in CUDA memory (DLPack device type {int(device_type)})",
                      "move it to the GPU first, or pass a host array (it is copied)")
    capsule = obj.__dlpack__(stream=stream)
    address = _api.PyCapsule_GetPointer(capsule, b"dltensor")
    managed = _DLManaged.from_address(address)
    t = managed.dl_tensor
    dtype = _dl_dtype(t.dtype, what)
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    size = dtype.numpy.itemsize
    strides = None if not t.strides else tuple(int(t.strides[i]) * size for i in range(t.ndim))
    _contiguous(shape, strides, dtype.numpy.itemsize, what)
    _api.PyCapsule_SetName(capsule, b"used_dltensor")
    owner = _Deleter(address, managed.deleter, obj)
    return Foreign(int(t.data or 0) + int(t.byte_offset), shape, dtype, int(t.device.device_id), owner)


class _Deleter:
    """Calls a consumed DLPack tensor's deleter once the memory is no longer used."""

    def __init__(self, address: int, deleter, producer):
        self.producer = producer  # (kept alive too)
        if deleter:
            weakref.finalize(self, deleter, ctypes.cast(address, ctypes.POINTER(_DLManaged)))


def view(obj, stream: int, what: str = "the array") -> Foreign | None:
    """Where ``obj``'s CUDA data is, or None if it is not a CUDA array of any kind we know."""
    if hasattr(obj, "__cuda_array_interface__"):
        try:
            return from_interface(obj, what)
        except (AttributeError, RuntimeError, TypeError):  # (torch: a tensor that requires grad, bfloat16)
            pass
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        device_type, _ = obj.__dlpack_device__()
        if int(device_type) == KDL_CUDA:
            return from_dlpack(obj, stream, what)
    return None


__all__ = ["Foreign", "from_dlpack", "from_interface", "view"]
