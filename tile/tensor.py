"""Device-resident tensors: ``tile.tensor(array, device=...)`` keeps data in a device's memory, so
inputs, weights and outputs stay there between calls of compiled programs instead of crossing the
bus every call.

A ``Tensor`` is a backend ``Buffer`` with a shape, a dtype and the events of the last work that
wrote or read it (work is asynchronous: a call may return before its kernels finish; reading or
writing from the host waits for them). This module knows devices only as the objects it is given
(the runner's, ``zeros_on``'s); ``tile.tensor`` and ``tile.empty`` (``tile.api``) find a device
by its id.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tile.dtypes import DType
from tile.errors import TileInputError


class Tensor:
    """A dense, row-major tensor in the memory of one device (host memory for ``llvm_cpu.0``).

    Made by ``tile.tensor`` / ``tile.empty`` or returned by a compiled program (``resident=True``
    or ``out=``); ``.numpy()`` copies it back."""

    __slots__ = ("_device", "_buffer", "_shape", "_dtype", "_events")

    def __init__(self, device, buffer, shape: tuple[int, ...], dtype: DType, events: Sequence = ()):
        self._device = device  # backends.hal.Device
        self._buffer = buffer  # backends.hal.Buffer of exactly nbytes
        self._shape = tuple(map(int, shape))
        self._dtype = dtype
        self._events = list(events)

    @classmethod
    def made(cls, device, buffer, shape: tuple[int, ...], dtype: DType, events: list) -> Tensor:
        """A tensor as ``Tensor(...)`` makes it, from a shape that is a tuple of ints already and a
        list of events of its own (the runner's results: no conversions)."""
        t = cls.__new__(cls)
        t._device, t._buffer, t._shape, t._dtype, t._events = device, buffer, shape, dtype, events
        return t

    @property
    def device(self) -> str:
        """The id of the device holding the data, e.g. ``"opencl_gpu.0"``."""
        return self._device.id

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype (as ``ndarray.dtype``); ``tile_dtype`` is the Tile one."""
        return np.dtype(self._dtype.numpy)

    @property
    def tile_dtype(self) -> DType:
        return self._dtype

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        return int(np.prod(self._shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def numpy(self) -> np.ndarray:
        """A host copy (waits for the work that writes this tensor)."""
        raw = self._buffer.read(self._events)
        return raw.view(self.dtype)[: self.size].reshape(self._shape)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype, copy=False)

    def write(self, array) -> None:
        """Replace the contents with ``array`` (same shape; converted to this tensor's dtype), in
        place: a program holding this tensor sees the new values at its next call."""
        arr = np.asarray(array)
        if tuple(arr.shape) != self._shape:
            raise TileInputError(
                f"cannot write an array of shape {tuple(arr.shape)} into a tensor of shape {self._shape}",
                None,
                hint="write an array of the tensor's shape, or make a new tensor with tile.tensor(array)",
            )
        data = np.ascontiguousarray(arr.astype(self.dtype, copy=False)).reshape(-1).view(np.uint8)
        self._events = [self._buffer.write(data, self._events)]

    def wait(self) -> Tensor:
        """Block until the work that writes or reads this tensor is done."""
        for e in self._events:
            e.wait()
        return self

    def __repr__(self) -> str:
        return f"tile.Tensor(shape={self._shape}, dtype={self._dtype.value}, device={self.device!r})"


def dtype_of(dtype, what: str) -> DType:
    """The Tile dtype ``dtype`` means: a ``DType``, a numpy dtype or scalar type, or a name, read
    as the command line reads it (``tile.inputs.parse_dtype``: ``"float"`` and Python's ``float``
    and ``int`` are refused, not taken as numpy's float64 and int64)."""
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str) or (isinstance(dtype, type) and dtype.__module__ == "builtins"):
        from tile.inputs import parse_dtype  # (not at import: it needs the typed IR)

        return parse_dtype(dtype if isinstance(dtype, str) else dtype.__name__, f" for {what}")
    try:
        return DType.of(np.dtype(dtype))
    except TypeError:
        raise TileInputError(
            f"{what} has dtype {dtype}, which Tile does not have",
            None,
            hint="use bool, int8..int64, uint8..uint64, float16/32/64 or ml_dtypes.bfloat16",
        ) from None


def zeros_on(device, shape: tuple[int, ...], dtype: DType) -> Tensor:
    """A zeroed tensor on a ``backends.hal.Device`` object (for callers that hold one)."""
    buf = device.executor.allocate(int(np.prod(shape, dtype=np.int64)) * dtype.numpy.itemsize)
    return Tensor(device, buf, shape, dtype, [buf.zero()])
