"""PlaidML 0.7.0 as a ``tile.devices`` plugin: ``plaidml.llvm_cpu.0``, a whole-program device.

Optional: where PlaidML 0.7.0 is not installed, ``devices()`` lists it as unavailable with the
install command, having imported nothing and started no process. Where it is, a probe (a matrix
product in a worker process, once per process) decides whether the device is offered.
"""

from __future__ import annotations

from backends.hal import Found


def devices() -> Found:
    """The ``tile.devices`` entry point: ``plaidml.llvm_cpu.0`` where PlaidML 0.7.0 works here,
    else nothing and why (``python -m tile devices`` shows it)."""
    from backends.plaidml.worker import unavailable  # (not at import: the worker runs as __main__)

    why = unavailable()
    if why is not None:
        return Found([], {"plaidml": why})
    from backends.plaidml.device import PlaidMLDevice

    return Found([PlaidMLDevice()])


def __getattr__(name: str):
    if name == "PlaidMLDevice":  # imported on use: the worker process imports this package too
        from backends.plaidml.device import PlaidMLDevice

        return PlaidMLDevice
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["PlaidMLDevice", "devices"]
