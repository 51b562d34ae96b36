"""Device enumeration: every available target, by a stable id like ``llvm_cpu.0``.

``interp`` (the reference interpreter) is always there. A backend whose dependencies are missing
is simply absent; ``unavailable()`` says why, for ``python -m tile devices`` and skip reasons.
"""

from __future__ import annotations

from backends.hal import Device

_devices: dict[str, Device] | None = None
_why_not: dict[str, str] = {}


def _discover() -> dict[str, Device]:
    found: dict[str, Device] = {}
    try:
        from backends.llvm import LlvmCpuDevice
    except ImportError as e:  # llvmlite missing or broken
        _why_not["llvm_cpu"] = f"llvmlite is not importable ({e})"
    else:
        dev = LlvmCpuDevice()
        found[dev.id] = dev
    try:
        import pyopencl as cl

        from backends.opencl import discover as discover_opencl
    except ImportError as e:  # pyopencl missing or broken
        _why_not["opencl"] = f"pyopencl is not importable ({e})"
    else:
        try:
            opencl = discover_opencl(_why_not)
        except cl.Error as e:  # no ICD loader or no platform
            _why_not["opencl"] = f"no OpenCL platform ({e})"
        else:
            if not opencl and not any(k.startswith("opencl") for k in _why_not):
                _why_not["opencl"] = "no OpenCL device on any platform"
            for dev in opencl:
                found[dev.id] = dev
    return found


def devices() -> dict[str, Device]:
    """Every available compiled device by id (the interpreter is not a Device: see ``ids``)."""
    global _devices
    if _devices is None:
        _devices = _discover()
    return _devices


def ids() -> list[str]:
    """Every target id usable with ``tile.compile`` and ``--target``: ``interp`` and the devices."""
    return ["interp", *devices()]


def get(device_id: str) -> Device:
    devs = devices()
    if device_id not in devs:
        known = ", ".join(ids())
        why = next((f" ({w})" for k, w in _why_not.items() if device_id.startswith(k)), "")
        raise KeyError(f"no device '{device_id}'{why}; available: {known}")
    return devs[device_id]


def unavailable() -> dict[str, str]:
    devices()
    return dict(_why_not)
