"""NVIDIA's hooks into the OpenCL backend (``backends.opencl.vendors``): the tensor-core GEMM
kernels for a plan naming the matrix unit (``render.unit_emitter``), the ``sm_90a`` rebuild of a
program with warp-group products (``ptx``), the executor that launches some kernels through
CUDA on memory shared with OpenCL (``launch``) and the local memory those get (``launched``).
OpenCL imports this module by name (``vendors.VENDORS``); it imports OpenCL, never the other way."""

from __future__ import annotations

from backends.cuda.launch import Launcher, LaunchingExecutor
from backends.cuda.ptx import for_sm90a, needs_sm90a
from backends.opencl.vendors import Vendor, register


def unit_emitter(t, g, ptrs, tiles, unit, epilogue):
    """``render.unit_emitter``, imported at its first use: the planner and renderer load with the
    first tensor-core kernel, not with every OpenCL device (and ``launched`` brings the passes)."""
    from backends.cuda.render import unit_emitter as emitter

    return emitter(t, g, ptrs, tiles, unit, epilogue)


def unit_here(device, unit):
    """``unit`` on an OpenCL device that launches the ``tma`` kernel through CUDA: with the local
    memory it launches with (``launched.with_local``); None where the unit has no launched kernel."""
    if not unit.backend:
        return None
    from backends.cuda import launched

    facts = launched.of(unit)
    if facts is None or not facts.tiles:
        return None
    return launched.with_local(unit, device.launch_bytes() / 1024)


def launch_bytes(device) -> int:
    """The dynamic local memory of kernels launched through CUDA on ``device`` (0: none are)."""
    launcher, _ = Launcher.for_device(device)
    return launcher.launch_bytes if launcher is not None else 0


register(Vendor(
    name="nvidia",
    unit_emitter=unit_emitter,
    rebuilds=needs_sm90a,
    rebuild=for_sm90a,
    rebuild_hint=(
        "the sm_90a PTX of its warp-group products; to leave them out, compile with a config that "
        '{"extends": "opencl_gpu", "hardware": {"matrix_units": {"tensor_core": {"warpgroup": null}}}}: '
        "the warp-level mma.sync kernels run instead"
    ),
    executor=LaunchingExecutor,
    launch_bytes=launch_bytes,
    unit_here=unit_here,
))
