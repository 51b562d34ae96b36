"""Shared C-like code generation from Stripe kernels (plain C in ``CTarget``; dialects override)."""

from backends.clike.kernel import KernelEmitter, KernelSource
from backends.clike.program import generate
from backends.clike.target import CTarget, Value, const_convert
from backends.clike.views import View
from backends.hal import kernel_symbol

__all__ = [
    "CTarget",
    "KernelEmitter",
    "KernelSource",
    "Value",
    "View",
    "const_convert",
    "generate",
    "kernel_symbol",
]
