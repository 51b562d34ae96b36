"""The CUDA compiler of ``cuda.0``: Stripe kernels -> CUDA C++ (``backends.clike`` with the
``dialect.CudaTarget``) -> PTX (``nvrtc``), loaded by the executor into the device's context.

The kernels are the ones ``opencl_gpu.0`` runs (the portable ones and the tensor-core GEMMs of
``backends.cuda``), so a difference between the two targets is a difference of the toolchains, not
of the generated arithmetic. A program with ``sm_90a`` instructions (Hopper's warp-group products)
is compiled for ``compute_90`` and its PTX retargeted (``ptx.for_sm90a``), as the OpenCL path does.

Settings (all optional, parsed once into ``backends.options.CudaOptions``): ``cache`` (False: no
disk cache of PTX), ``fast_math``, ``strict``, ``local_size`` (threads a block for kernels without a
required size, default 128), ``tiled`` (False: GEMM nests as plain loops), ``generic``
(``backends.clike.generic``: kernels equal up to integers to ones built before run one PTX module
per bucket, their integers as ``long`` arguments after the buffers; the templates' PTX is compiled
apart and cached on disk by its source like any other). The driver's ``BuildFacts`` bring the
matrix units and ``buffer_dtypes`` (as the OpenCL compiler's).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from pathlib import Path

from backends.clike import generate
from backends.clike import generic as generic_kernels
from backends.clike.helpers import helper_source
from backends.cuda.dialect import CudaTarget, translate
from backends.cuda.nvrtc import cached, compile_ptx, options
from backends.cuda.ptx import declare_dynamic, for_sm90a, needs_sm90a
from backends.cuda.tma import DYNAMIC
from backends.hal import Compiler, KernelInfo, Library
from backends.options import NO_FACTS, BuildFacts, CudaOptions


class CudaCompiler(Compiler):
    """Builds a ``Library`` whose ``handle`` is the PTX text; ``facts`` is the device's
    (``runtime.Cuda``: compute capability, shared memory, multiprocessors)."""

    def __init__(self, facts):
        self.facts = facts
        self.generic = generic_kernels.Registry()  # this device's shape-generic buckets

    def target(self, opts: CudaOptions, facts: BuildFacts = NO_FACTS) -> CudaTarget:
        f = self.facts
        t = CudaTarget(
            fp64=True,
            fp16=True,
            exact_div=True,
            fast_math=opts.fast_math,
            half_extension=False,
            contract=not opts.strict,
        )
        t.workgroups = opts.tiled
        t.matrix_units = dict(facts.matrix_units)
        t.local_bytes = int(f.shared_bytes)
        t.launch_bytes = int(f.optin_bytes)
        t.compute_units = int(f.sms)
        return t

    def source(self, kernels: Sequence[KernelInfo], opts: CudaOptions, facts: BuildFacts = NO_FACTS,
               skip=()):
        """The program's CUDA source and its kernels' generated forms (None for those in ``skip``)."""
        t = self.target(opts, facts)
        sources = generate(t, list(kernels), dict(facts.buffer_dtypes), skip=skip)
        body = "\n\n".join(helper_source(t) + [s.text for s in sources if s is not None])
        text = "\n".join(t.header()) + "\n\n" + translate(body) + "\n"
        return text, sources

    def build(self, kernels: Sequence[KernelInfo], settings: dict, facts: BuildFacts = NO_FACTS) -> Library:
        start = time.perf_counter()
        opts = CudaOptions.parse(settings)
        plan = self.generic_plan(list(kernels), opts, facts) if opts.generic else None
        uses = plan.uses if plan is not None else {}
        text, sources = self.source(kernels, opts, facts, skip=uses)
        if len(uses) < len(kernels):
            ptx, status, key = compile_ptx(text, tuple(self.facts.capability), opts.cache)
        else:  # every kernel generic: no module of its own
            ptx, status, key = b"", "none", ""
        sm90a = needs_sm90a(text)
        extra = {
            "cache": status,
            "ptx_key": key,
            "sm90a": sm90a,
            "work_items": [uses[j].work if s is None else s.work_items for j, s in enumerate(sources)],
            "local_size": opts.local_size,
            "local_sizes": [uses[j].local if s is None else s.local for j, s in enumerate(sources)],
            "names": [uses[j].form.symbol if s is None else s.name for j, s in enumerate(sources)],
            "launch": [None if s is None else s.launch for s in sources],
        }
        if plan is not None:
            built = sum(u.built for u in uses.values())
            extra["generic"] = {"uses": uses, "kernels": len(uses), "built": built}
        return Library(list(kernels), source=text, handle=_final(ptx, sm90a) if ptx else ptx,
                       build_seconds=time.perf_counter() - start, extra=extra)

    def generic_plan(self, kernels: list[KernelInfo], opts: CudaOptions, facts: BuildFacts):
        """The kernels that run shape-generic functions (``backends.clike.generic``), the templates
        this program completes compiled into one PTX module of their own (a ``GenericModule``)."""
        reg, dtypes = self.generic, dict(facts.buffer_dtypes)
        plan = generic_kernels.assign(self.target(opts, facts), kernels, dtypes, reg)
        if not plan.todo:
            return plan
        t = self.target(opts, facts)  # its own: the templates' module has its own helpers
        made = generic_kernels.emit(t, kernels, dtypes, plan, reg, "tile_g")
        if made:
            body = "\n\n".join([*helper_source(t), *(s.text for _, s in made)])
            text = "\n".join(t.header()) + "\n\n" + translate(body) + "\n"
            ptx, _, key = compile_ptx(text, tuple(self.facts.capability), opts.cache)
            generic_kernels.record(made, GenericModule(text, ptx, key), plan, reg)
        return plan

    # -- the program cache (backends.progcache): a warm process loads the PTX, generates nothing
    def cache_identity(self) -> dict:
        f = self.facts
        return {"capability": list(f.capability), "shared": f.shared_bytes, "optin": f.optin_bytes,
                "sms": f.sms, "options": options(tuple(f.capability)), "code": _code_identity()}

    def snapshot(self, library: Library) -> dict:
        keep = ("ptx_key", "sm90a", "work_items", "local_size", "local_sizes", "names", "launch")
        # a library with generic kernels is built again in a new process (``restore``: its forms
        # are this process's buckets; the templates' PTX then comes from the disk cache)
        generic = bool((library.extra.get("generic") or {}).get("kernels"))
        return {**{k: library.extra[k] for k in keep}, "generic": generic}

    def restore(self, kernels: Sequence[KernelInfo], settings: dict, snap: dict) -> Library | None:
        """The library ``build`` made when ``snapshot`` gave ``snap``, its PTX from the disk cache;
        None when the entry is gone (then ``build``)."""
        start = time.perf_counter()
        ptx = cached(snap.get("ptx_key", "")) if CudaOptions.parse(settings).cache else None
        if ptx is None or len(snap.get("names", ())) != len(kernels) or snap.get("generic"):
            return None
        extra = {**snap, "cache": "hit"}
        return Library(list(kernels), source="", handle=_final(ptx, bool(snap["sm90a"])),
                       build_seconds=time.perf_counter() - start, extra=extra)


class GenericModule:
    """The PTX of shape-generic templates (``generic_plan``), loaded by the executor once per
    process (``loaded``: its ``executor.CudaProgram``)."""

    def __init__(self, source: str, ptx: bytes, key: str):
        self.source, self.ptx, self.key = source, ptx, key
        self.loaded = None


def _final(ptx: bytes, sm90a: bool) -> bytes:
    """NVRTC's PTX made the program meant: retargeted to ``sm_90a`` where it has warp-group
    products, the launched kernels' dynamic shared memory declared."""
    if sm90a:
        return for_sm90a(ptx)
    return declare_dynamic(ptx) if DYNAMIC.encode() in ptx else ptx


_identity: str | None = None


def _code_identity() -> str:
    """SHA-256 of the sources that generate CUDA code (this package, ``backends.clike``, the OpenCL
    dialect it prints through): a program cache entry must change when they do."""
    global _identity
    if _identity is None:
        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for f in sorted([*root.glob("cuda/*.py"), *root.glob("clike/*.py"), root / "opencl" / "target.py"]):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
        _identity = h.hexdigest()
    return _identity


__all__ = ["CudaCompiler"]
