"""What a vendor's package adds to OpenCL's devices, registered here: OpenCL imports no vendor.

A vendor's package builds on this backend (its kernels are OpenCL C, its launches and shared
memory use this package's driver and executor), so the imports run one way: the vendor imports
``backends.opencl``, and reaches OpenCL's code paths through the hooks it registers here
(``register``). The hooks are asked in registration order; a hook that does not apply returns
None. ``VENDORS`` names the modules that register, imported by name the first time a hook is
asked for, so a device without a vendor's hardware (PoCL) still finds none applies.

The hooks: ``unit_emitter`` (the kernel of a tiled GEMM whose plan names a matrix unit, as
``CTarget.unit_emitter``), ``rebuild`` (a program whose generated source needs a binary OpenCL C
cannot give: the built binary in, the binary to load out, and ``rebuilds`` says which sources),
``executor`` (the executor of a device, where the vendor runs some kernels its own way),
``launch_bytes`` (the local memory such kernels may have on a device) and ``unit_here`` (a
matrix unit of the hardware model as a device has it, with what the vendor's kernels need).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

VENDORS = ("backends.cuda.opencl_vendor",)  # modules that call ``register`` when imported


@dataclass(frozen=True)
class Vendor:
    name: str
    unit_emitter: Callable[..., Any] | None = None  # (target, gemm, ptrs, tiles, unit, epilogue)
    rebuilds: Callable[[str], bool] | None = None  # (source) -> whether its binary is rebuilt
    rebuild: Callable[[bytes], bytes] | None = None  # (built binary) -> the binary to load
    rebuild_hint: str = ""  # what to do when the rebuilt binary does not build
    executor: Callable[[Any], Any] | None = None  # (device) -> its executor, or None
    launch_bytes: Callable[[Any], int] | None = None  # (device) -> local memory of its launches
    unit_here: Callable[[Any, Any], Any] | None = None  # (device, matrix unit) -> the unit there


_registered: list[Vendor] = []
_loaded = False
_lock = threading.Lock()  # guards ``_registered``
_loading = threading.Lock()  # one thread imports ``VENDORS`` (their ``register`` takes ``_lock``)


def register(vendor: Vendor) -> None:
    """Adds (or replaces, by name) a vendor's hooks."""
    with _lock:
        _registered[:] = [v for v in _registered if v.name != vendor.name] + [vendor]


def vendors() -> tuple[Vendor, ...]:
    """The registered vendors, after importing ``VENDORS`` once (a module that is not there
    registers nothing; one that fails to import raises)."""
    global _loaded
    if not _loaded:
        with _loading:
            if not _loaded:
                for name in VENDORS:
                    try:
                        importlib.import_module(name)
                    except ModuleNotFoundError as e:
                        if e.name is None or not name.startswith(e.name):
                            raise
                _loaded = True
    with _lock:
        return tuple(_registered)


def first(hook: str, *args) -> Any:
    """The first registered ``hook``'s answer for ``args`` that is not None (None: none applies)."""
    for v in vendors():
        fn = getattr(v, hook)
        got = fn(*args) if fn is not None else None
        if got is not None:
            return got
    return None


def rebuilding(source: str) -> Vendor | None:
    """The vendor whose ``rebuild`` the program of ``source`` needs, or None."""
    return next((v for v in vendors() if v.rebuilds is not None and v.rebuilds(source)), None)
