"""The CUDA compiler of ``cuda.0``: Stripe kernels -> CUDA C++ (``backends.clike`` with the
``dialect.CudaTarget``) -> PTX (``nvrtc``), loaded by the executor into the device's context.

The kernels are the ones ``opencl_gpu.0`` runs (the portable ones and the tensor-core GEMMs of
``backends.cuda``), so a difference between the two targets is a difference of the toolchains, not
of the generated arithmetic. A program with ``sm_90a`` instructions (Hopper's warp-group products)
is compiled for ``compute_90`` and its PTX retargeted (``ptx.for_sm90a``), as the OpenCL path does.

Settings (all optional): ``cache`` (False: no disk cache of PTX), ``fast_math``, ``strict``,
``local_size`` (threads a block for kernels without a required size, default 128), ``tiled``
(False: GEMM nests as plain loops), ``matrix_units``, ``buffer_dtypes`` (as the OpenCL compiler's).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from backends.clike import generate
from backends.clike.helpers import helper_source
from backends.cuda.dialect import CudaTarget, translate
from backends.cuda.nvrtc import compile_ptx
from backends.cuda.ptx import declare_dynamic, for_sm90a, needs_sm90a
from backends.cuda.tma import DYNAMIC
from backends.hal import Compiler, KernelInfo, Library


class CudaCompiler(Compiler):
    """Builds a ``Library`` whose ``handle`` is the PTX text; ``facts`` is the device's
    (``runtime.Cuda``: compute capability, shared memory, multiprocessors)."""

    def __init__(self, facts):
        self.facts = facts

    def target(self, settings: dict) -> CudaTarget:
        f = self.facts
        t = CudaTarget(
            fp64=True,
            fp16=True,
            exact_div=True,
            fast_math=bool(settings.get("fast_math", False)),
            half_extension=False,
            contract=not settings.get("strict", False),
        )
        t.workgroups = bool(settings.get("tiled", True))
        t.matrix_units = dict(settings.get("matrix_units") or {})
        t.local_bytes = int(f.shared_bytes)
        t.launch_bytes = int(f.optin_bytes)
        t.compute_units = int(f.sms)
        return t

    def source(self, kernels: Sequence[KernelInfo], settings: dict):
        """The program's CUDA source and its kernels' generated forms."""
        t = self.target(settings)
        sources = generate(t, list(kernels), settings.get("buffer_dtypes") or {})
        body = "\n\n".join(helper_source(t) + [s.text for s in sources])
        text = "\n".join(t.header()) + "\n\n" + translate(body) + "\n"
        return text, sources

    def build(self, kernels: Sequence[KernelInfo], settings: dict) -> Library:
        start = time.perf_counter()
        settings = dict(settings or {})
        text, sources = self.source(kernels, settings)
        ptx, status = compile_ptx(text, tuple(self.facts.capability), bool(settings.get("cache", True)))
        if needs_sm90a(text):
            ptx = for_sm90a(ptx)
        elif DYNAMIC.encode() in ptx:
            ptx = declare_dynamic(ptx)
        extra = {
            "cache": status,
            "work_items": [s.work_items for s in sources],
            "local_size": int(settings.get("local_size", 128)),
            "local_sizes": [s.local for s in sources],
            "names": [s.name for s in sources],
            "launch": [s.launch for s in sources],
        }
        return Library(list(kernels), source=text, handle=ptx, build_seconds=time.perf_counter() - start,
                       extra=extra)


__all__ = ["CudaCompiler"]
