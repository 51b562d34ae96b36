"""The ``c_cpu.0`` device: the HAL classes a backend implements, over generated C and ctypes.

* ``CCompiler.build`` generates one C source for all of a program's kernels (``codegen``), builds
  it with the system compiler into a shared library (``toolchain``, cached on disk) and loads it.
* ``CExecutor`` allocates host buffers (``backends.hal.HostBuffer``: the runner may hand numpy
  inputs to the kernels in place) and copies between them.
* ``CKernel.run`` calls a kernel's function with its buffers' addresses, on the calling thread
  once its dependencies are done; the returned event is already complete.
"""

from __future__ import annotations

import ctypes
import shutil
import time
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path

from backends.hal import (
    Bound,
    Buffer,
    Capabilities,
    Compiler,
    Device,
    Event,
    Executor,
    HostBuffer,
    Kernel,
    KernelInfo,
    Library,
    wait_all,
)
from tile.dtypes import DType

from tile_c_backend import codegen, toolchain

_KERNEL = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p))


class CCompiler(Compiler):
    def __init__(self, compiler: tuple[str, ...]):
        self.compiler = compiler

    def build(self, kernels: Sequence[KernelInfo], settings: dict) -> Library:
        """Settings read: ``cache`` (False: build afresh and keep nothing on disk)."""
        start = time.perf_counter()
        source, symbols = codegen.generate(kernels)
        use_cache = settings.get("cache", True) is not False
        path = toolchain.build(self.compiler, source, use_cache)
        try:
            handle = ctypes.CDLL(str(path))
        except OSError:  # a cached library that does not load (damaged on disk): build it again
            path.unlink(missing_ok=True)
            path = toolchain.build(self.compiler, source, use_cache)
            handle = ctypes.CDLL(str(path))
        if not use_cache:  # loaded: the file is no longer needed
            shutil.rmtree(path.parent, ignore_errors=True)
        functions = [_KERNEL((s, handle)) for s in symbols]
        return Library(
            list(kernels),
            source,
            handle,
            time.perf_counter() - start,
            {"functions": functions, "path": str(path)},
        )


class CKernel(Kernel):
    def __init__(self, library: Library, index: int):
        self.info = library.kernels[index]
        self.library = library  # keeps the shared library loaded
        self.function = library.extra["functions"][index]

    def run(self, params: Sequence[Buffer], deps: Sequence[Event] = ()) -> Event:
        return self._call(_addresses(params), deps)

    def bind(self, params: Sequence[Buffer]) -> Bound:
        return _BoundC(self, params)

    def _call(self, addresses, deps: Sequence[Event]) -> Event:
        wait_all(deps)
        start = time.perf_counter()
        self.function(addresses)
        return Event.done(time.perf_counter() - start)


class _BoundC(Bound):
    """A kernel with its buffers' address array made once (the runner reuses the buffers)."""

    __slots__ = ("addresses",)

    def __init__(self, kernel: CKernel, params: Sequence[Buffer]):
        super().__init__(kernel, params)
        self.addresses = _addresses(params)

    def launch(self, params: Sequence[Buffer], deps: Sequence[Event] = ()) -> Event:
        return self.kernel._call(self.addresses, deps)


def _addresses(params: Sequence[Buffer]):
    for p in params:
        if not isinstance(p, HostBuffer):
            raise TypeError(f"c_cpu.0 runs on host buffers, not {type(p).__name__}")
    return (ctypes.c_void_p * max(len(params), 1))(*(p.address for p in params))


class CExecutor(Executor):
    host_memory = True  # kernels read HostBuffers where they are

    def allocate(self, size: int) -> Buffer:
        return HostBuffer(size)

    def copy(self, src, src_offset, dst, dst_offset, length, deps=()) -> Event:
        wait_all(deps)
        dst.data[dst_offset : dst_offset + length] = src.data[src_offset : src_offset + length]
        return Event.done()

    def prepare(self, library: Library, index: int) -> Kernel:
        return CKernel(library, index)


class CDevice(Device):
    """The host CPU through the system C compiler: one thread, plain loops, the interpreter's
    order of aggregation (so float results equal its own)."""

    id = "c_cpu.0"
    # The Stripe passes the runner applies before ``build``: this package's own config (fusing
    # elementwise chains). ``""`` would hand over the lowered program's kernels as they are.
    optimizer = str(Path(__file__).with_name("c_cpu.json"))
    tiled_optimizer = ""  # no second, tiled pipeline for conformance to run

    def __init__(self, compiler: list[str]):
        self.compiler_command = tuple(compiler)
        self.compiler = CCompiler(self.compiler_command)
        self.executor = CExecutor()

    @property
    def description(self) -> str:
        return (
            f"generated C built by {toolchain.version(self.compiler_command)} (example plugin tile_c_backend)"
        )

    @cached_property
    def capabilities(self) -> Capabilities:
        """Every Tile dtype but bfloat16; float16 only where the compiler has ``_Float16`` (asked
        once, when first needed)."""
        half = toolchain.has_float16(self.compiler_command)
        dtypes = frozenset(d for d in DType if (d is not DType.FLOAT16 or half) and d is not DType.BFLOAT16)
        return Capabilities(dtypes, fp64=True, fp16=half, atomics=False)
