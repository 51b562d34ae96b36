"""An out-of-tree Tile backend: Stripe kernels -> C source -> the system C compiler -> ctypes.

Tile finds it through the ``tile.devices`` entry point ``c_cpu = "tile_c_backend:devices"``
(see ``pyproject.toml``); ``devices`` returns the one device, ``c_cpu.0``, or says why there is
none. README.md is the guide to the code.
"""

from __future__ import annotations

from backends.hal import Found

from tile_c_backend.device import CDevice
from tile_c_backend.toolchain import find_compiler


def devices() -> Found:
    """The ``tile.devices`` entry point: ``c_cpu.0`` when a C compiler is on the PATH."""
    compiler = find_compiler()
    if compiler is None:
        return Found([], {"c_cpu.0": "no C compiler found (set CC, or put cc on the PATH)"})
    return Found([CDevice(compiler)])


__all__ = ["CDevice", "devices"]
