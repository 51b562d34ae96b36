"""The LLVM CPU backend: Stripe kernels -> LLVM IR -> MCJIT machine code, run on a thread pool."""

from backends.hal import Found
from backends.llvm.device import LlvmCpuDevice


def devices() -> Found:
    """The ``tile.devices`` entry point: the host CPU (``llvm_cpu.0``)."""
    return Found([LlvmCpuDevice()])


__all__ = ["LlvmCpuDevice", "devices"]
