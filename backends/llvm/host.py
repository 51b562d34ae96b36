"""The host CPU as LLVM sees it: its name and features, and target machines for it.

``host_target`` initializes LLVM's native target once per process (and loads libm, which the
generated code calls); every MCJIT engine, the device's modules and the thread pool's runtime
(``threads``), is built on a fresh ``target_machine``, since an engine owns the one it is given.
"""

from __future__ import annotations

import ctypes.util
import threading

import llvmlite.binding as llvm

_init_lock = threading.Lock()
_target: tuple[str, str] | None = None


def host_target() -> tuple[str, str]:
    """The host CPU's name and feature string (LLVM initialized once)."""
    global _target
    with _init_lock:
        if _target is None:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            libm = ctypes.util.find_library("m")
            if libm:
                llvm.load_library_permanently(libm)
            cpu = llvm.get_host_cpu_name()
            features = llvm.get_host_cpu_features().flatten()
            _target = (cpu, features)
        return _target


def target_machine(cpu: str, features: str) -> llvm.TargetMachine:
    """A fresh host target machine: the MCJIT engine takes ownership of the one it is given."""
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(cpu=cpu, features=features, opt=3, codemodel="jitdefault")


__all__ = ["host_target", "target_machine"]
