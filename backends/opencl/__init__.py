"""The OpenCL backend: Stripe kernels -> OpenCL C (``backends.clike``) -> any OpenCL device."""

import pyopencl as cl

from backends.hal import Found
from backends.opencl.compiler import DeviceTypeError
from backends.opencl.device import OpenCLDevice, discover


def devices() -> Found:
    """The ``tile.devices`` entry point: every OpenCL device that can compile a kernel; those that
    cannot, and a missing platform, are listed as unavailable with the reason."""
    why: dict[str, str] = {}
    try:
        found = discover(why)
    except cl.Error as e:  # no ICD loader or no platform
        return Found([], {"opencl": f"no OpenCL platform ({e})"})
    if not found and not why:
        why["opencl"] = "no OpenCL device on any platform"
    return Found(found, why)


__all__ = ["DeviceTypeError", "OpenCLDevice", "devices", "discover"]
