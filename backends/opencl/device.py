"""OpenCL devices: every device of every platform, by a stable id, with what its driver supports.

``discover()`` lists each OpenCL device as ``opencl_<kind>.<n>`` (kind ``gpu``, ``cpu`` or
``accelerator``; ``n`` counts the devices of that kind across the platforms in platform order), so
ids stay the same from run to run on one machine. Capabilities come from the driver: float64 when
``double_fp_config`` is non-zero, float16 when the device has ``cl_khr_fp16``. What the driver
reports, its context and queue are the ``driver.Driver`` each ``OpenCLDevice`` is, which the
compiler and the executor work through.
"""

from __future__ import annotations

from dataclasses import replace

import pyopencl as cl

from backends.hal import Capabilities, Device, MemoryLimit
from backends.opencl import vendors
from backends.opencl.compiler import OpenCLCompiler
from backends.opencl.driver import Driver
from backends.opencl.executor import OpenCLExecutor
from tile.dtypes import DType

_KINDS = (
    (cl.device_type.GPU, "gpu"),
    (cl.device_type.CPU, "cpu"),
    (cl.device_type.ACCELERATOR, "accelerator"),
)


def _kind(d: cl.Device) -> str:
    for flag, name in _KINDS:
        if d.type & flag:
            return name
    return "other"


class OpenCLDevice(Driver, Device):
    """One OpenCL device. float64 is there when the driver reports a double configuration.
    float16 is always there: the generated code keeps float16 values in float registers, rounds
    once per operation and reaches memory through the core ``vload_half``/``vstore_half_rte``, so it
    needs no ``cl_khr_fp16`` (``half_extension`` records whether the driver has it anyway).
    ``fp16``/``fp64`` override both (tests use them for the refusal path)."""

    def __init__(
        self, cl_device: cl.Device, device_id: str, fp16: bool | None = None, fp64: bool | None = None
    ):
        super().__init__(cl_device, device_id, fp16, fp64)
        d = cl_device
        dtypes = {
            dt
            for dt in DType
            if (dt is not DType.FLOAT16 or self.fp16) and (dt is not DType.FLOAT64 or self.fp64)
        }
        atomics = "cl_khr_global_int32_base_atomics" in self.extensions
        atomics = atomics or not d.version.startswith("OpenCL 1.0")
        self.capabilities = Capabilities(frozenset(dtypes), fp64=self.fp64, fp16=self.fp16, atomics=atomics)
        self.description = (
            f"{self.name} through OpenCL ({d.platform.name.strip()}, {d.version.strip()}, driver "
            f"{d.driver_version.strip()})"
        )
        self.compiler = OpenCLCompiler(self)
        self.executor = vendors.first("executor", self) or OpenCLExecutor(self)

    tiled_optimizer = "opencl_gpu_tiled"  # on a CPU device too: conformance runs it everywhere

    @property
    def optimizer(self) -> str:
        """``opencl_cpu`` for a CPU device (PoCL): its long reductions split into per-core chunks;
        ``opencl_gpu`` for every other device type."""
        return "opencl_cpu" if self.cl_device.type & cl.device_type.CPU else "opencl_gpu"

    def memory_bytes(self) -> MemoryLimit:
        """The driver's ``global_mem_size`` for all buffers, ``max_mem_alloc_size`` for one."""
        d = self.cl_device
        return MemoryLimit(
            total=int(d.global_mem_size),
            per_buffer=int(d.max_mem_alloc_size),
            what=f"{self.id}'s global memory (global_mem_size / max_mem_alloc_size)",
        )

    def hardware(self, hw):
        """From the device query: ``__local`` memory size, work-group size, compute units, clock."""
        d = self.cl_device
        mems = dict(hw.mem_units)
        if "LOCAL" in mems:
            mems["LOCAL"] = replace(mems["LOCAL"], size_KiB=int(d.local_mem_size) / 1024)
        if "GLOBAL" in mems:
            mems["GLOBAL"] = replace(mems["GLOBAL"], size_KiB=int(d.global_mem_size) / 1024)
        units = {
            k: replace(u, count=int(d.max_compute_units), threads=self.max_work_group)
            for k, u in hw.exec_units.items()
        }
        clock = float(d.max_clock_frequency or hw.clock_mhz)
        matrix = {k: self.unit_here(u) for k, u in hw.matrix_units.items() if self.has_unit(u)}
        return replace(hw, clock_mhz=clock, mem_units=mems, exec_units=units, matrix_units=matrix)

    def unit_here(self, unit):
        """``unit`` as this device has it: without its warp-group products (``MatrixUnit.warpgroup``)
        unless the device reports exactly their compute capability; with what its vendor adds
        (``vendors``: the local memory of kernels it launches its own way)."""
        wg = unit.warpgroup
        if wg is not None and capability(self.cl_device) != tuple(wg.capability):
            return replace(unit, warpgroup=None)
        return vendors.first("unit_here", self, unit) or unit

    def launch_bytes(self) -> int:
        """The dynamic local memory of kernels a vendor launches its own way (``vendors``; 0: none)."""
        return vendors.first("launch_bytes", self) or 0

    def has_unit(self, unit) -> bool:
        """Whether this device has the matrix unit ``unit`` (``stripe.hardware.MatrixUnit``): its
        vendor, and a compute capability of at least the unit's (NVIDIA's, from the
        ``cl_nv_device_attribute_query`` extension; a device without it has no such unit)."""
        if unit.vendor and unit.vendor.lower() not in str(self.cl_device.vendor).lower():
            return False
        return capability(self.cl_device) >= tuple(unit.min_capability)

    def __repr__(self) -> str:
        return f"OpenCLDevice({self.id!r}, {self.name!r})"


def capability(d: cl.Device) -> tuple[int, int]:
    """An NVIDIA device's compute capability, (0, 0) where the driver does not report one."""
    if "cl_nv_device_attribute_query" not in str(d.extensions):
        return (0, 0)
    try:
        return (int(d.compute_capability_major_nv), int(d.compute_capability_minor_nv))
    except (cl.Error, AttributeError):
        return (0, 0)


def discover(unusable: dict[str, str] | None = None) -> list[OpenCLDevice]:
    """Every device of every OpenCL platform that can compile a kernel (``cl.Error`` when there is
    no platform at all). A device whose compiler fails keeps its id but is left out, with the
    reason in ``unusable`` (a broken driver is not a device)."""
    counts: dict[str, int] = {}
    found = []
    for platform in cl.get_platforms():
        try:
            devices = platform.get_devices()
        except cl.Error:  # a platform without devices
            continue
        for d in devices:
            kind = _kind(d)
            n = counts.get(kind, 0)
            counts[kind] = n + 1
            dev = OpenCLDevice(d, f"opencl_{kind}.{n}")
            why = dev.probe()
            if why is None:
                found.append(dev)
            elif unusable is not None:
                unusable[dev.id] = f"{dev.name}: {why}"
    return found
