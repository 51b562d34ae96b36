"""The OpenCL compiler: Stripe kernels -> one OpenCL C program, built off the critical path.

``build`` generates the source at once (``backends.clike`` with the ``OpenCLTarget`` dialect),
refuses a program that needs float16 or float64 the device lacks (``DeviceTypeError``, a
``TileTypeError``), and hands the driver's compilation to the device's build pool: the ``Library``
comes back immediately and its kernels wait for the program only when they first run, so the runner
allocates and uploads buffers meanwhile. A program binary found in the disk cache (``cache``) is
loaded instead of compiled. A program whose source a vendor rebuilds (``vendors``: instructions
OpenCL C cannot target) is compiled, then rebuilt by that vendor's hook; the cache keeps the
rebuilt binary.

Settings (all optional): ``cache`` (False: no disk cache), ``async`` (False: build before
returning), ``fast_math`` (``mad`` for multiply-accumulate and ``native_*`` functions: faster, not
exact), ``local_size`` (work-group size, default 64; a tiled contraction sets its own),
``tiled`` (False: the ``gemm_tile`` pass's nests run as nested loops, like any kernel; their tiles
are the pass's, which the autotuner varies through its ``choices``), ``generic`` (kernels equal up
to integers to ones built before run one program per bucket, their integers as arguments:
``backends.clike.generic``; the templates' program is built apart, cached on disk by its text like
any other, and a program all of whose kernels are bound to built forms builds nothing); parsed once into
``backends.options.OpenclOptions``. The driver's ``BuildFacts`` bring the matrix units and
``buffer_dtypes`` (buffer name -> dtype, for ``KernelInfo``s without them). Float ``/`` and
``sqrt`` are correctly rounded: with ``-cl-fp32-correctly-rounded-divide-sqrt`` where the device
supports it, else through double.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

import pyopencl as cl

from backends.clike import generate
from backends.clike import generic as generic_kernels
from backends.clike.helpers import helper_source
from backends.hal import Compiler, KernelInfo, Library
from backends.opencl.cache import BinaryCache, cache_key
from backends.opencl.driver import Driver, quiet_build
from backends.opencl.target import OpenCLTarget
from backends.opencl.vendors import Vendor, rebuilding
from backends.options import NO_FACTS, BuildFacts, OpenclOptions
from tile.dtypes import DType
from tile.errors import TileTypeError


class DeviceTypeError(TileTypeError):
    """A program needs an element type (float16, float64) that the device does not have."""


COMPILED = [0]  # programs compiled from source in this process (not loaded from the disk cache)


class ProgramHandle:
    """A program being built: ``program()`` waits for it (and re-raises a build failure)."""

    def __init__(
        self, device: Driver, source: str, options: list[str], cache: BinaryCache, extra: dict
    ):
        self.device = device
        self.source = source
        self.options = options
        self.cache = cache
        self.extra = extra  # the Library's: "cache" becomes hit/miss/off once built
        self.names: list[str] = []
        self.work_items: list[int] = []
        self.future: Future | None = None
        self._program: cl.Program | None = None
        self._lock = threading.Lock()

    def build(self) -> cl.Program:
        dev = self.device
        ctx = dev.context
        status = "off" if not self.cache.enabled else "miss"
        start = time.perf_counter()
        program = None
        binary = self.cache.load()
        if binary is not None:
            try:
                program = quiet_build(cl.Program(ctx, [dev.cl_device], [binary]), self.options)
                status = "hit"
            except cl.Error:
                program = None  # a stale or foreign binary: compile
        if program is None:
            COMPILED[0] += 1
            try:
                program = quiet_build(cl.Program(ctx, self.source), self.options)
            except cl.Error as e:
                raise RuntimeError(
                    f"OpenCL could not build the generated program for {dev.id} ({dev.name}): {e}\n"
                    "(TILE_DEBUG=3 prints the source)"
                ) from None
            vendor = rebuilding(self.source)
            if vendor is not None:
                program = self.rebuilt(program, vendor)
            if status == "miss":
                binaries = program.get_info(cl.program_info.BINARIES)
                if binaries and binaries[0]:
                    self.cache.store(bytes(binaries[0]))
        self.extra["cache"] = status
        self.extra["driver_build_seconds"] = time.perf_counter() - start
        return program

    def rebuilt(self, program: cl.Program, vendor: Vendor) -> cl.Program:
        """``program`` (built from the source) rebuilt by ``vendor``'s hook (``vendors``)."""
        dev = self.device
        assert vendor.rebuild is not None
        try:
            binary = vendor.rebuild(bytes(program.get_info(cl.program_info.BINARIES)[0]))
            return quiet_build(cl.Program(dev.context, [dev.cl_device], [binary]), self.options)
        except (ValueError, cl.Error) as e:
            raise RuntimeError(
                f"OpenCL could not build the generated program's binary as {vendor.name} rebuilt it "
                f"for {dev.id} ({dev.name}): {e}\n({vendor.rebuild_hint})"
            ) from None

    def start(self, asynchronous: bool) -> None:
        if asynchronous:
            self.future = self.device.build_pool.submit(self.build)
        else:
            self._program = self.build()

    def program(self) -> cl.Program:
        with self._lock:
            if self._program is None:
                assert self.future is not None
                self._program = self.future.result()
            return self._program


class OpenCLCompiler(Compiler):
    def __init__(self, device: Driver):
        self.device = device
        self.generic = generic_kernels.Registry()  # this device's shape-generic buckets

    def target(self, opts: OpenclOptions, facts: BuildFacts = NO_FACTS) -> OpenCLTarget:
        dev = self.device
        t = OpenCLTarget(
            fp64=dev.fp64,
            fp16=dev.fp16,
            exact_div=dev.exact_div,
            fast_math=opts.fast_math,
            half_extension=dev.half_extension,
            contract=not opts.strict,
        )
        t.workgroups = opts.tiled
        t.matrix_units = dict(facts.matrix_units)
        t.local_bytes = int(dev.cl_device.local_mem_size)
        t.launch_bytes = dev.launch_bytes()
        t.compute_units = int(dev.cl_device.max_compute_units)
        return t

    def build(self, kernels: Sequence[KernelInfo], settings: dict, facts: BuildFacts = NO_FACTS) -> Library:
        start = time.perf_counter()
        settings = dict(settings or {})
        opts = OpenclOptions.parse(settings)
        dev = self.device
        t = self.target(opts, facts)
        dtypes = dict(facts.buffer_dtypes)
        plan = self.generic_plan(list(kernels), dtypes, opts, settings, facts) if opts.generic else None
        uses = plan.uses if plan is not None else {}
        sources = generate(t, list(kernels), dtypes, skip=uses)
        if uses and any(s is not None and s.launch for s in sources):
            # a program with a kernel its vendor launches has all its kernels launched there
            # (``vendors``' executor), which passes no run-time integers: every one specialized
            uses = {}
            sources = generate(t, list(kernels), dtypes)
        self.check(t)
        helpers = helper_source(t)
        mine = [s for s in sources if s is not None]
        text = "\n\n".join(["\n".join(t.header())] + helpers + [s.text for s in mine]) + "\n"
        options = self.options()
        cache = BinaryCache(
            cache_key(text, " ".join(options), settings, dev.identity), opts.cache
        )
        extra = {
            "cache": "off" if not cache.enabled else "pending",
            "cache_key": cache.key,
            "cache_path": str(cache.path),
            "work_items": [uses[j].work if s is None else s.work_items for j, s in enumerate(sources)],
            "owned": [uses[j].form.owned if s is None else s.owned for j, s in enumerate(sources)],
            "options": options,
            "local_size": opts.local_size,
            "local_sizes": [uses[j].local if s is None else s.local for j, s in enumerate(sources)],
            # as generated: a tiled kernel's carries its tiles; a generic one's is its form's
            "names": [uses[j].form.symbol if s is None else s.name for j, s in enumerate(sources)],
            "launch": [None if s is None else s.launch for s in sources],  # a kernel launched through
            # CUDA: how (``cuda.launch``)
        }
        if plan is not None:
            built = sum(u.built for u in uses.values())
            extra["generic"] = {"uses": uses, "kernels": len(uses), "built": built}
        handle = ProgramHandle(dev, text, options, cache, extra)
        handle.names = extra["names"]
        handle.work_items = extra["work_items"]
        if mine:  # (every kernel generic: no program of its own)
            handle.start(opts.async_)
        else:
            extra["cache"] = "none"
        return Library(
            list(kernels), source=text, handle=handle, build_seconds=time.perf_counter() - start, extra=extra
        )

    def options(self) -> list[str]:
        return ["-cl-fp32-correctly-rounded-divide-sqrt"] if self.device.exact_div else []

    def generic_plan(self, kernels: list[KernelInfo], dtypes: dict, opts: OpenclOptions, settings: dict,
                     facts: BuildFacts) -> generic_kernels.Plan:
        """The kernels that run shape-generic functions (``backends.clike.generic``), the templates
        this program completes built into one program of their own (its ``ProgramHandle``)."""
        reg = self.generic
        plan = generic_kernels.assign(self.target(opts, facts), kernels, dtypes, reg)
        if not plan.todo:
            return plan
        t = self.target(opts, facts)  # its own: the templates' program has its own header and helpers
        made = generic_kernels.emit(t, kernels, dtypes, plan, reg, "tile_g")
        if not made:
            return plan
        self.check(t)
        text = "\n\n".join(["\n".join(t.header()), *helper_source(t), *(s.text for _, s in made)]) + "\n"
        options = self.options()
        cache = BinaryCache(cache_key(text, " ".join(options), settings, self.device.identity), opts.cache)
        handle = ProgramHandle(self.device, text, options, cache, {})
        handle.start(opts.async_)
        generic_kernels.record(made, handle, plan, reg)
        return plan

    def check(self, t: OpenCLTarget) -> None:
        """Refuse a program whose types the device lacks, naming the first place that needs one."""
        dev = self.device
        for dt, have, ext in (
            (DType.FLOAT64, dev.fp64, "cl_khr_fp64"),
            (DType.FLOAT16, dev.fp16, "cl_khr_fp16"),
        ):
            if dt in t.uses and not have:
                raise DeviceTypeError(
                    f"{t.uses[dt]} needs {dt}, which device {dev.id} ({dev.name}) does not support "
                    f"(its driver reports no {ext})",
                    None,
                    hint=f"run it on a device with {dt} (python -m tile devices), or convert with "
                    f"as_float(X, 32)",
                )
