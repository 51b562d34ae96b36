"""The OpenCL backend: Stripe kernels -> OpenCL C (``backends.clike``) -> any OpenCL device.

The devices (``device``) are imported at first use, not with the package: NVIDIA's package
(``backends.cuda``) builds its shared memory and launches on this package's driver and executor,
and the devices build on those, so importing ``backends.opencl.driver`` must not load the devices.
"""

from __future__ import annotations

import pyopencl as cl

from backends.hal import Found

_LAZY = {
    "DeviceTypeError": "backends.opencl.compiler",
    "OpenCLDevice": "backends.opencl.device",
    "discover": "backends.opencl.device",
}


def devices() -> Found:
    """The ``tile.devices`` entry point: every OpenCL device that can compile a kernel; those that
    cannot, and a missing platform, are listed as unavailable with the reason."""
    from backends.opencl.device import discover

    why: dict[str, str] = {}
    try:
        found = discover(why)
    except cl.Error as e:  # no ICD loader or no platform
        return Found([], {"opencl": f"no OpenCL platform ({e})"})
    if not found and not why:
        why["opencl"] = "no OpenCL device on any platform"
    return Found(found, why)


def __getattr__(name: str):
    """``DeviceTypeError``, ``OpenCLDevice`` and ``discover``, from their modules at first use."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = ["DeviceTypeError", "OpenCLDevice", "devices", "discover"]
