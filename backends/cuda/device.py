"""The device ``cuda.<n>``: NVIDIA GPUs through CUDA itself, with no OpenCL in the way.

Kernels are compiled by NVRTC (``compiler``) and launched through the driver on the caller's
stream (``executor``), in the primary context PyTorch uses, so a torch CUDA tensor's memory is
a buffer of this device as it is (``tile.torch`` hands kernels their ``data_ptr()``s; ``tile.tensor``
wraps a torch tensor, ``__cuda_array_interface__`` or DLPack object). The Stripe config is ``cuda``
(tensor cores where the device has them). Needs the optional extra ``[cuda]`` (``cuda-bindings``)
and a driver; ``python -m tile devices`` says why there is no such device where it cannot be made.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from backends.cuda import foreign
from backends.cuda.compiler import CudaCompiler
from backends.cuda.executor import CudaBuffer, CudaExecutor
from backends.cuda.nvrtc import compiler
from backends.cuda.runtime import Cuda, device_count, unavailable
from backends.hal import Capabilities, Device, Found, MemoryLimit
from tile.dtypes import DType
from tile.errors import TileInputError


class CudaDevice(Device):
    optimizer = "cuda"
    tiled_optimizer = "opencl_gpu_tiled"

    def __init__(self, ordinal: int):
        self.cuda = Cuda(ordinal)
        c = self.cuda
        self.id = f"cuda.{ordinal}"
        major, minor = c.capability
        self.description = (
            f"{c.name} through CUDA (compute capability {major}.{minor}, {c.sms} multiprocessors, "
            f"driver {c.driver_version // 1000}.{c.driver_version % 1000 // 10}, NVRTC)"
        )
        self.capabilities = Capabilities(frozenset(DType), fp64=True, fp16=True, atomics=True)
        self.compiler = CudaCompiler(c)
        self.executor = CudaExecutor(c)

    def memory_bytes(self) -> MemoryLimit:
        total = self.cuda.total_bytes
        return MemoryLimit(total=total, per_buffer=total, what=f"{self.id}'s memory (cuDeviceTotalMem)")

    def hardware(self, hw):
        """The config's model with this device's shared memory, multiprocessors, block size and
        clock; its matrix units where the device has them (``unit_here``)."""
        c = self.cuda
        mems = dict(hw.mem_units)
        if "LOCAL" in mems:
            mems["LOCAL"] = replace(mems["LOCAL"], size_KiB=c.shared_bytes / 1024)
        if "GLOBAL" in mems:
            mems["GLOBAL"] = replace(mems["GLOBAL"], size_KiB=c.total_bytes / 1024)
        units = {k: replace(u, count=c.sms, threads=c.max_threads) for k, u in hw.exec_units.items()}
        matrix = {k: self.unit_here(u) for k, u in hw.matrix_units.items() if self.has_unit(u)}
        return replace(hw, clock_mhz=c.clock_mhz or hw.clock_mhz, mem_units=mems, exec_units=units,
                       matrix_units=matrix)

    def has_unit(self, unit) -> bool:
        if unit.vendor and unit.vendor.lower() != "nvidia":
            return False
        return tuple(self.cuda.capability) >= tuple(unit.min_capability)

    def unit_here(self, unit):
        """``unit`` with its warp-group products only on exactly their compute capability, and the
        launch's shared memory (every kernel of this device is launched through CUDA)."""
        wg = unit.warpgroup
        if wg is None:
            return unit
        if tuple(self.cuda.capability) != tuple(wg.capability):
            return replace(unit, warpgroup=None)
        from backends.cuda.launched import with_local  # (the launch facts moved out of stripe/)

        return with_local(unit, self.cuda.optin_bytes / 1024)

    def wrap(self, obj, what: str = "the array"):
        """``obj``'s CUDA memory as a ``tile.Tensor`` of this device, not a copy (a torch CUDA
        tensor, ``__cuda_array_interface__`` or DLPack: ``foreign``); None where ``obj`` is not
        CUDA data. Data on another GPU is refused."""
        from tile.tensor import Tensor

        if type(obj).__module__.startswith("torch") and getattr(obj, "requires_grad", False):
            obj = obj.detach()
        stream = self.cuda.stream()
        got = foreign.view(obj, int(stream) if int(stream) else 1, what)
        if got is None:
            return None
        if got.ordinal != self.cuda.ordinal:
            raise TileInputError(f"{what} is on CUDA device {got.ordinal}, not on {self.id}",
                                 None, hint=f"pass device='cuda.{got.ordinal}', or move the data")
        nbytes = int(np.prod(got.shape, dtype=np.int64)) * got.dtype.numpy.itemsize
        buf = CudaBuffer.over(self.executor, got.pointer, nbytes, got.owner)
        return Tensor(self, buf, got.shape, got.dtype)

    def __repr__(self) -> str:
        return f"CudaDevice({self.id!r}, {self.cuda.name!r})"


def devices() -> Found:
    """The ``tile.devices`` entry point: one ``cuda.<n>`` per CUDA device, or why there are none."""
    why = unavailable()
    if why is None and compiler() is None:
        why = "no CUDA compiler: NVRTC (libnvrtc, installed with cuda-bindings or PyTorch) not found"
    if why is not None:
        return Found([], {"cuda": why})
    found, skipped = [], {}
    for n in range(device_count()):
        try:
            found.append(CudaDevice(n))
        except Exception as e:  # noqa: BLE001 - one broken device does not hide the others
            skipped[f"cuda.{n}"] = f"{type(e).__name__}: {e}"
    return Found(found, skipped)


__all__ = ["CudaDevice", "devices"]
