"""The LLVM CPU backend: Stripe kernels -> LLVM IR -> MCJIT machine code, run on a thread pool."""

from backends.llvm.device import LlvmCpuDevice

__all__ = ["LlvmCpuDevice"]
