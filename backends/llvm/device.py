"""The LLVM CPU device: HAL compiler, executor and kernels over an MCJIT module and a thread pool.

``build`` generates one module for all kernels (``codegen``), each kernel alike up to names built
once (``dedup``: duplicates call the first one's function with their own buffers), optimizes it at
``-O3`` for the host CPU (``-O1`` for a program of kernels too small to split over threads,
``opt_level``) and keeps the execution engine in ``Library.handle``; when the object cache has the
plan (``cache.plan_key``) it generates and optimizes nothing and loads the object. ``snapshot`` and
``restore`` let the program cache (``backends.progcache``) make a library again without planning.
``Kernel.run`` calls the kernel function on the calling thread when its dependencies are done
and the dispatcher has nothing queued (and the kernel keeps little on the stack), else returns
at once and a dispatcher thread waits for the dependencies, then calls it; either way split into
one contiguous chunk of the split index per pool thread when the kernel's ``Schedule`` allows it
and the kernel is big enough, else whole. The chunks go to native worker threads (``threads``;
a Python pool where POSIX semaphores are missing); ctypes releases the GIL during the calls.

Settings (all optional): ``cache`` (False: no disk cache), ``opt`` (0-3; default ``opt_level``'s
choice, 1 or 3), ``parallel`` (False: one thread), ``reorder`` (False: Stripe's loop order; split
only on the first index), ``threads`` (chunks per kernel, default the pool's size:
``TILE_NUM_THREADS`` or one per core), ``inline`` (False: every run on the dispatcher thread),
``microkernel`` (False: contractions as plain loops, not ``microkernel``'s register tiles;
``strict`` also turns off its fused multiply-add), ``min_parallel_points`` (smaller kernels run
whole, default 16384), ``soft_half`` (float16 conversions in integer code instead of F16C),
``panel_split``
(False: a matmul's threads divide its rows, never its panels, ``match.panel_split``),
``unroll`` (whether LLVM unrolls loops; default at ``opt`` 2 and above, ``opt_level``),
``cache_bytes`` (memory name -> bytes: the ``L1`` and ``L2`` the micro-kernel's cache blocks fit;
default the optimizer config's, which the driver passes in ``BuildFacts``, else the host's,
``host_caches``), ``cache_blocks`` (False: every tile runs its whole reduction); ``build`` parses them
once into ``backends.options.LlvmOptions``. The driver's ``BuildFacts`` also bring ``buffer_dtypes``
(buffer name -> dtype, for kernels whose refinements convert from their buffer's type; by default a
buffer holds the type of the kernel's first refinement of it).
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from time import perf_counter

import llvmlite.binding as llvm

from backends import diskcache
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
    MemoryLimit,
    check_count,
    kernel_symbol,
    wait_all,
)
from backends.llvm import generic
from backends.llvm.cache import FORMAT, ObjectCache, code_identity, pack_entry, plan_key, unpack_entry
from backends.llvm.codegen import buffer_dtypes, generate
from backends.llvm.dedup import alike_code, shared_kernels, unit_key
from backends.llvm.epilogue import read_fused, takes
from backends.llvm.fills import taken_fills
from backends.llvm.host import host_available_memory, host_caches, host_target, target_machine
from backends.llvm.match import VectorConfig, from_nest, host_vector_bytes, panel_split
from backends.llvm.opt_level import opt_level
from backends.llvm.raw import RawCalls, kernel_chunks
from backends.llvm.schedule import Schedule, plan
from backends.llvm.sequence import raw_sequence
from backends.llvm.workers import INLINE_STACK_BYTES, WorkerPool, env_threads, kernel_stacks
from backends.options import NO_FACTS, BuildFacts, LlvmOptions
from stripe.ir import Block
from tile.dtypes import DType
from tile.errors import TileRuntimeError
from tile.gc_pause import paused_gc

_KERNEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
# the LLVM level of a module holding only short products built specialized as plain loops (their
# generic bucket's first kernels, ``generic.SMALL_FIRST``, and their zero fills): code run at one
# length, whose full unrolling of the nest's constant trip counts took most of its build
FIRST_OPT = 1


@dataclass
class _Jit:
    """What must stay alive while the kernels may run: the engine owns the machine code."""

    engine: llvm.ExecutionEngine
    module: llvm.ModuleRef
    functions: list
    schedules: list[Schedule]
    settings: dict
    stack: list[int]  # each kernel's stack allocations, bytes
    extents: list = field(default_factory=list)  # per kernel: a generic kernel's extents array, or None
    generic: list = field(default_factory=list)  # the engines of the generic functions it calls


@dataclass
class _Plan:
    """What a build decides before generating IR: the kernels' schedules, the code each unit is
    generated from, which kernel shares which function, and the object cache's key."""

    tm: llvm.TargetMachine
    triple: str
    layout: str
    f16c: bool
    dtypes: dict
    vector: VectorConfig
    schedules: list[Schedule]
    code: list[KernelInfo]
    blocks: list
    epilogues: list
    built: list[int]
    key: str
    opt: int  # the LLVM pipeline's speed level (``opt_level``)
    unroll: bool  # whether its passes unroll loops (the ``unroll`` setting, else ``opt >= 2``)

    @property
    def only(self) -> set[int]:
        return {j for j in self.built if self.built[j] == j}


class LlvmCompiler(Compiler):
    def __init__(self, threads: int):
        self.threads = threads

    def cache_identity(self) -> dict:
        """What, besides the program and the settings, decides what ``build`` makes: the host CPU,
        its caches, LLVM's version, the thread count and this package's sources (``backends.progcache``
        keys on it)."""
        cpu, features = host_target()
        return {"cpu": cpu, "features": features, "llvm": list(llvm.llvm_version_info),
                "caches": host_caches(), "threads": self.threads, "object_format": FORMAT,
                "code": code_identity()}

    @paused_gc()  # code generation makes many objects: no cycle hunts over them meanwhile
    def build(self, kernels: Sequence[KernelInfo], settings: dict, facts: BuildFacts = NO_FACTS) -> Library:
        start = time.perf_counter()
        settings = dict(settings or {})
        opts = LlvmOptions.parse(settings)
        p = self._plan(kernels, opts, facts, settings)
        uses, plain = generic.assign(kernels, p, settings, *host_target()) if opts.generic else ({}, set())
        if plain:  # short first products of their buckets: plain loops (``generic.assign``)
            p = self._plain(p, kernels, plain, opts)
        only = p.only - set(uses)
        taken = taken_fills(p.code, p.schedules, p.dtypes, p.vector, p.blocks, p.epilogues, only)
        taken -= {k for k in taken if k + 1 in plain}  # their fills run: no micro-kernel takes them
        if uses:  # the module holds the other kernels only
            p = replace(p, key=diskcache.digest({"generic": sorted(uses)}, p.key))
        if plain and opts.opt is None and only <= plain | {k - 1 for k in plain}:  # (and their fills)
            p = replace(p, opt=min(p.opt, FIRST_OPT), unroll=bool(opts.unroll),
                        key=diskcache.digest({"first": FIRST_OPT}, p.key))
        cache = ObjectCache(p.key, opts.cache)
        entry = cache.load() if only or not uses else None
        parts = unpack_entry(entry) if entry is not None else None
        if uses and not only:  # every kernel generic: no module of this program's own
            stack, text, engine, mod = [0] * len(kernels), "", None, None
        elif parts is not None:  # a plan built before: no IR generated, parsed or optimized
            stack, text, obj = parts
            engine, mod = _loaded(p.tm, p.triple, p.layout, obj)
        else:
            cache.hit = False
            stack, emptied = [], set()
            args = (p.f16c, p.triple, p.layout, p.dtypes, p.vector, stack, p.blocks, p.epilogues, only)
            text = generate(p.code, p.schedules, *args, emptied, plain)
            assert emptied == taken, f"fills emptied {sorted(emptied)}, foreseen {sorted(taken)}"
            stack = [stack[p.built[k]] for k in range(len(kernels))]
            mod = llvm.parse_assembly(text)
            mod.verify()
            opt = p.opt
            pto = llvm.create_pipeline_tuning_options(speed_level=opt)
            pto.loop_vectorization = opt >= 2
            pto.slp_vectorization = opt >= 2
            pto.loop_unrolling = p.unroll
            pb = llvm.create_pass_builder(p.tm, pto)
            pb.getModulePassManager().run(mod, pb)
            engine = llvm.create_mcjit_compiler(mod, p.tm)
            store = lambda _m, data: cache.store(pack_entry(stack, text, data))  # noqa: E731
            engine.set_object_cache(store, lambda _m: None)
        fused = [j for j, e in enumerate(p.epilogues) if e is not None]
        status = "off" if not cache.enabled else "hit" if cache.hit else "miss"
        schedules = list(p.schedules)
        for k in range(len(kernels)):
            if p.built[k] in uses:
                stack[k], schedules[k] = uses[p.built[k]].stack, uses[p.built[k]].schedule
        jit = _Jit(engine, mod, [], schedules, settings, stack)
        taken |= {j for j, u in uses.items() if u.skip}  # and the fills a generic product took over
        skipped = [k for k in range(len(kernels)) if p.built[k] in taken]  # empty fills: not run
        return _library(kernels, text, jit, p.built, fused, status, cache, start, p.opt, uses, skipped)

    def _plain(self, p: _Plan, kernels: Sequence[KernelInfo], plain: set[int], opts: LlvmOptions) -> _Plan:
        """``p`` with kernels ``plain`` built from their own blocks (an optimizer nest as it is, its
        fused epilogue inside) as plain loops (``generate``'s ``plain``), scheduled as such."""
        threads = self.threads if opts.threads is None else opts.threads
        code, blocks, epilogues = list(p.code), list(p.blocks), list(p.epilogues)
        schedules = list(p.schedules)
        for j in plain:
            info = kernels[j]
            code[j], blocks[j], epilogues[j] = info, None, None
            schedules[j] = plan(info.block, tuple(info.buffers), threads, opts.reorder)  # type: ignore[arg-type]
        key = diskcache.digest({"plain": sorted(plain)}, p.key)
        return replace(p, code=code, blocks=blocks, epilogues=epilogues, schedules=schedules, key=key)

    def snapshot(self, library: Library) -> dict:
        """What ``restore`` needs to make ``library`` again from the object cache without planning:
        its object's key, the kernels' schedules and sharing, the fused kernels."""
        jit: _Jit = library.handle  # type: ignore[assignment]
        x = library.extra
        snap = {"key": x["cache_key"], "schedules": jit.schedules, "built": x["built_as"],
                "fused": x["fused_epilogues"], "stack": jit.stack, "opt": x["opt"], "skipped": x["skipped"]}
        saved = x.get("generic", {}).get("saved")
        if saved:  # generic functions: their modules' object-cache keys, symbols and extents
            if any(not s[0] for s in saved.values()):
                return {"generic": True}  # (a module not in the object cache: rebuilt)
            snap.update(generic=saved, own=jit.engine is not None)
        return snap

    def restore(self, kernels: Sequence[KernelInfo], settings: dict, snap: dict) -> Library | None:
        """The library ``build(kernels, settings)`` made when ``snapshot`` gave ``snap`` (the same
        kernels and settings, on a host of the same ``cache_identity``), loaded from its object
        cache entry; None when that entry is missing or not whole (then ``build``)."""
        start = time.perf_counter()
        settings = dict(settings or {})
        try:
            key, schedules, built, fused, opt, skipped = (
                snap[k] for k in ("key", "schedules", "built", "fused", "opt", "skipped"))
        except (KeyError, TypeError):  # a snapshot of another shape: build instead
            return None
        enabled = LlvmOptions.parse(settings).cache
        cache = ObjectCache(key, enabled)
        tm = target_machine(*host_target())
        triple, layout = llvm.get_process_triple(), str(tm.target_data)
        if not len(built) == len(schedules) == len(kernels):
            return None
        if snap.get("own", True):  # the program's own module (not every kernel generic)
            entry = cache.load()
            parts = unpack_entry(entry) if entry is not None else None
            if parts is None or parts[0] != snap.get("stack"):
                return None
            stack, text, obj = parts
            engine, mod = _loaded(tm, triple, layout, obj)
        else:
            stack, text, engine, mod = list(snap["stack"]), "", None, None
        uses = {}
        for j, saved in (snap.get("generic") or {}).items():
            use = generic.restored(saved, triple, layout, *host_target(), enabled)
            if use is None:
                return None
            uses[int(j)] = use
        jit = _Jit(engine, mod, [], list(schedules), settings, stack)
        return _library(kernels, text, jit, list(built), list(fused), "hit", cache, start, opt, uses,
                        list(skipped))

    def _plan(self, kernels: Sequence[KernelInfo], opts: LlvmOptions, facts: BuildFacts,
              settings: dict) -> _Plan:
        """The build's plan from its typed options and the driver's facts (``settings``, the user's
        own, only go into the object cache's key)."""
        cpu, features = host_target()
        tm = target_machine(cpu, features)
        threads = self.threads if opts.threads is None else opts.threads
        f16c = "+f16c" in features.split(",") and not opts.soft_half
        dtypes = dict(facts.buffer_dtypes)
        given = facts.cache_bytes if opts.cache_bytes is None else dict(opts.cache_bytes)  # the user's first
        caches = {**host_caches(), **given}
        vector = VectorConfig(
            host_vector_bytes(features) if opts.microkernel else 0,
            fma=not opts.strict,
            reassoc=not opts.strict,
            sum_block=opts.sum_block,
            l1_bytes=int(caches.get("L1", 0)) if opts.cache_blocks else 0,
            l2_bytes=int(caches.get("L2", 0)),
        )
        reorder = opts.reorder
        schedules, code, blocks, epilogues = [], [], [], []
        own = [unit_key([info], [buffer_dtypes(info, dtypes)]) for info in kernels]
        planned: dict[str, int] = {}  # a kernel's key -> the first kernel planned with it
        for j, info in enumerate(kernels):
            r = planned.setdefault(own[j], j)
            alike = alike_code(code[r], kernels[r], info) if r != j else None
            if alike is not None:  # the same up to names: the same plan, this kernel's buffers
                schedules.append(schedules[r])
                code.append(alike)
                blocks.append(blocks[r])
                epilogues.append(epilogues[r])
                continue
            k, nest, epi = info, None, None
            if vector.vector_bytes:
                nest = from_nest(k.block)  # type: ignore[arg-type]
                fused = read_fused(k.block) if nest is None else None  # type: ignore[arg-type]
                nest, epi = (fused[:2], fused[2]) if fused else (nest, None)
            if nest is not None:  # the optimizer's gemm_tile nest: a flat GEMM and its tiles
                k = replace(k, block=nest[0])
            sched = plan(k.block, tuple(k.buffers), threads, reorder)
            if reorder and opts.panel_split and not (opts.generic and threads <= generic.ROWS_THREADS):
                tiles = nest[1] if nest else None
                sched = panel_split(k.block, sched, threads, vector, buffer_dtypes(k, dtypes), tiles)  # type: ignore[arg-type]
            fused = (k.block, nest[1], epi) if epi is not None else None
            if fused and not takes(fused, sched, buffer_dtypes(k, dtypes), vector):  # type: ignore[arg-type]
                k, nest, epi = info, None, None  # the nest as it is: plain loops
                sched = plan(k.block, tuple(k.buffers), threads, reorder)
            schedules.append(sched)
            code.append(k)
            blocks.append(nest[1] if nest else None)
            epilogues.append(epi)
        triple, layout = llvm.get_process_triple(), str(tm.target_data)
        built, keys = shared_kernels(kernels, code, own)  # kernel -> the kernel whose function it calls
        opt = opt_level(kernels, opts.opt)
        unroll = opt >= 2 if opts.unroll is None else opts.unroll
        meta = {"threads": threads, "vector": repr(vector), "triple": triple, "layout": layout, "f16c": f16c,
                "opt": opt, "unroll": unroll,
                # the object's symbols: the unit keys are the kernels' code up to names, and a
                # module built under other kernel names has no function of these (address 0)
                "symbols": [kernel_symbol(j, kernels[j]) for j in sorted(set(built))]}
        key = plan_key(keys, built, meta, settings, cpu, features)
        return _Plan(
            tm, triple, layout, f16c, dtypes, vector, schedules, code, blocks, epilogues, built, key, opt,
            unroll,
        )


def _loaded(tm, triple: str, layout: str, obj: bytes) -> tuple[llvm.ExecutionEngine, llvm.ModuleRef]:
    """An MCJIT engine over an empty module with the object code ``obj`` added."""
    mod = llvm.parse_assembly(f'target triple = "{triple}"\ntarget datalayout = "{layout}"\n')
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
    return engine, mod


def _library(kernels, text: str, jit: _Jit, built: list[int], fused: list[int], status: str,
             cache: ObjectCache, start: float, opt: int, uses: dict | None = None,
             skipped: Sequence[int] = ()) -> Library:
    """The library over ``jit``'s engine (finalized here), its kernel functions looked up;
    ``uses``: the kernels that run generic functions (``generic.assign``); ``skipped``: the zero
    fills built empty (``fills``), which the runner does not launch."""
    uses = uses or {}
    only = {j for j in built if built[j] == j}
    if jit.engine is not None:
        jit.engine.finalize_object()
    find = jit.engine.get_function_address if jit.engine is not None else None
    addresses = {j: uses[j].address if j in uses else find(kernel_symbol(j, kernels[j])) for j in only}
    missing = [kernel_symbol(j, kernels[j]) for j, at in addresses.items() if not at]
    if missing:  # (calling address 0 would crash the process)
        raise TileRuntimeError(f"the LLVM module defines no function {', '.join(missing)}", None,
                               hint="a stale or foreign disk-cache entry: rerun with cache=False, or "
                               "clear the cache directory (python -m tile devices names it)")
    jit.functions = [_KERNEL_FN(addresses[built[k]]) for k in range(len(kernels))]
    ext = {j: generic.extents_array(uses[j].extents) for j in uses}
    jit.extents = [ext.get(built[k]) for k in range(len(kernels))]
    jit.generic = [u.keep for u in uses.values()]  # the generic functions' engines stay alive
    return Library(
        list(kernels),
        source=text,
        handle=jit,
        build_seconds=time.perf_counter() - start,
        extra={
            "cache": status,
            "cache_key": cache.key,
            "cache_path": str(cache.path),
            "schedules": jit.schedules,
            "fused_epilogues": fused,
            "built_as": built,  # kernel k runs the function generated for kernel built[k]
            "distinct_kernels": len(only),
            "opt": opt,
            "skipped": list(skipped),  # kernels with nothing to do (``runner``: not launched)
            "generic": {"kernels": len(uses), "built": sum(u.built for u in uses.values()),
                        "which": {j: u.built for j, u in uses.items()},  # kernel -> generated now
                        "saved": {j: u.saved() for j, u in uses.items()}},  # ``snapshot``'s
        },
    )


class LlvmKernel(Kernel):
    def __init__(self, library: Library, index: int, pool: WorkerPool, executor: LlvmExecutor):
        jit: _Jit = library.handle
        self.library = library  # keeps the engine alive
        self.info = library.kernels[index]
        self.fn = jit.functions[index]
        self.extents = jit.extents[index] if jit.extents else None  # a generic kernel's integers
        self.address = ctypes.cast(self.fn, ctypes.c_void_p).value
        self.schedule: Schedule = jit.schedules[index]
        self.pool = pool
        self.executor = executor
        o = LlvmOptions.parse(jit.settings)
        # may run on the caller's thread (whose stack may be small: a kernel with scratch never does)
        self.inline = o.inline and jit.stack[index] <= INLINE_STACK_BYTES
        self.parallel = o.parallel and self.schedule.split
        self.chunks = max(1, o.threads if o.threads is not None else pool.size)
        self.min_points = o.min_parallel_points
        self.last_threads: list[int] = []  # thread ids that ran the chunks of the last run
        self._chunks: list[tuple[int, int]] | None = None

    def ranges(self) -> list[tuple[int, int]]:
        """The ``[lo, hi)`` chunks of the split index one run calls the kernel function with."""
        n = self.schedule.split_range
        points = total_points(self.info.block)  # type: ignore[arg-type]
        if not self.parallel or n < 2 or points < self.min_points:
            return [(0, n)]
        return chunk_ranges(n, self.chunks, self.schedule.grain)

    def addresses(self, params: Sequence[Buffer]) -> list[int]:
        """The data addresses of ``params``, checked: one HostBuffer per parameter, all distinct."""
        check_count(self.info, params)
        for p in params:
            if not isinstance(p, HostBuffer):
                raise TypeError(f"the LLVM CPU device runs on HostBuffers, not {type(p).__name__}")
        # the data pointer without building ``ndarray.ctypes`` (3 us a buffer, a call has dozens)
        addresses = [p.data.__array_interface__["data"][0] for p in params]
        if len(set(addresses)) != len(addresses):
            raise ValueError(f"kernel '{self.info.name}' needs distinct buffers (they are noalias)")
        return addresses

    def bind(self, params: Sequence[Buffer]) -> LlvmBound:
        return LlvmBound(self, params)

    def run(self, params: Sequence[Buffer], deps: Sequence[Event] = ()) -> Event:
        return LlvmBound(self, params).launch(params, deps)


class LlvmBound(Bound):
    """An LLVM kernel bound to its buffers: their address table and the chunks are built once (a
    HostBuffer's memory never moves)."""

    __slots__ = ("table", "chunks", "whole")

    def __init__(self, kernel: LlvmKernel, params: Sequence[Buffer]):
        super().__init__(kernel, params)
        addresses = kernel.addresses(params)
        if kernel.extents is not None:  # a generic kernel reads its extents after the buffers
            addresses.append(ctypes.addressof(kernel.extents))
        self.table = (ctypes.c_void_p * max(1, len(addresses)))(*addresses)
        self.chunks = kernel_chunks(kernel)  # fixed by the schedule and the settings
        self.whole = self.chunks[0] if len(self.chunks) == 1 else None  # one call on this thread

    def launch(self, params: Sequence[Buffer], deps: Sequence[Event] = ()) -> Event:
        k: LlvmKernel = self.kernel  # type: ignore[assignment]
        return k.executor.submit(deps, self.work, k.inline, params)

    def work(self) -> None:
        k: LlvmKernel = self.kernel  # type: ignore[assignment]
        if self.whole is not None:
            k.fn(self.table, *self.whole)
            k.last_threads = [threading.get_ident()]
        else:
            k.last_threads = k.pool.run_kernel(k.fn, k.address, self.table, self.chunks)


def chunk_ranges(n: int, chunks: int, grain: int = 1) -> list[tuple[int, int]]:
    """``[0, n)`` cut into at most ``chunks`` contiguous ranges as even as whole ``grain``s allow,
    each starting at a multiple of ``grain``."""
    units = -(-n // grain)
    k = max(1, min(chunks, units))
    cuts = [min(n, grain * (units * j // k)) for j in range(k + 1)]
    return [(lo, hi) for lo, hi in zip(cuts, cuts[1:]) if hi > lo]


def total_points(block: Block) -> int:
    """Points a kernel runs, nested blocks included: a cache-tiled kernel has few outer points
    (its tiles) but as much work as the untiled one, and must be split as readily."""
    inner = sum(total_points(s) for s in block.stmts if isinstance(s, Block))
    return block.index_space * max(1, inner)


class LlvmExecutor(RawCalls, Executor):
    host_memory = True  # HostBuffers: numpy inputs are read in place
    raw_sequence = staticmethod(raw_sequence)  # a lane's kernels as one native call (``sequence``)

    def __init__(self, pool: WorkerPool):
        self.pool = pool
        # one dispatcher thread: runs and copies start in submission order (so never deadlock
        # on dependencies, which are always earlier events)
        self.dispatcher = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tile-llvm-dispatch")
        self._lock = threading.Lock()
        self._queued = 0  # submitted to the dispatcher and not finished
        with kernel_stacks():  # the executor starts its thread at the first submit
            self.dispatcher.submit(lambda: None).result()

    def allocate(self, size: int) -> HostBuffer:
        return HostBuffer(size)

    def copy(
        self,
        src: Buffer,
        src_offset: int,
        dst: Buffer,
        dst_offset: int,
        length: int,
        deps: Sequence[Event] = (),
    ) -> Event:
        def work() -> None:
            s = src.map_current()
            d = dst.map_discard()
            d[dst_offset : dst_offset + length] = s[src_offset : src_offset + length]

        return self.submit(deps, work, False)

    def submit(self, deps: Sequence[Event], work, inline: bool, keep: object = None) -> Event:
        """``work`` after ``deps``: on the dispatcher thread, or at once on the calling thread when
        ``inline`` and nothing is waiting for the dispatcher (its deps done, no earlier work
        queued), which saves two thread hand-offs per kernel and keeps the order of submission.
        ``keep`` (the buffers ``work`` uses) stays referenced until ``work`` is over."""
        with self._lock:  # (no generator for no deps: a resident call's kernels usually have none)
            now = inline and not self._queued and (not deps or all(e.complete for e in deps))
            if not now:
                self._queued += 1
        if now:
            if deps:
                wait_all(deps)  # done: raises a failed dependency's error here
            start = perf_counter()
            work()
            return Event(None, perf_counter() - start)  # (as Event.done)

        def task(_keep: object = keep) -> float:  # the default holds ``keep`` until the work ran
            try:
                wait_all(deps)
                start = time.perf_counter()
                work()
                return time.perf_counter() - start
            finally:  # a failed dependency too: the count must not stay up
                with self._lock:
                    self._queued -= 1

        return Event(self.dispatcher.submit(task))

    def prepare(self, library: Library, index: int) -> LlvmKernel:
        return LlvmKernel(library, index, self.pool, self)


class LlvmCpuDevice(Device):
    """The host CPU through LLVM's JIT: every Tile dtype, fp16 and fp64."""

    id = "llvm_cpu.0"
    optimizer = "llvm_cpu"

    def __init__(self, threads: int | None = None):
        n = threads or env_threads() or os.cpu_count() or 1
        cpu, features = host_target()
        major, minor, _ = llvm.llvm_version_info
        width = host_vector_bytes(features)
        where = " (TILE_NUM_THREADS)" if not threads and env_threads() else ""
        self.description = (
            f"LLVM {major}.{minor} JIT for the host CPU ({cpu}), {n} threads{where}, "
            f"{width * 8}-bit vectors"
        )
        self.capabilities = Capabilities(frozenset(DType), fp64=True, fp16=True, atomics=False)
        self.pool = WorkerPool(n)
        self.compiler = LlvmCompiler(n)
        self.executor = LlvmExecutor(self.pool)

    def memory_bytes(self) -> MemoryLimit:
        """Buffers live in host memory: what the host has available now (no per-buffer limit)."""
        avail, what = host_available_memory()
        return MemoryLimit(total=avail, what=what) if avail is not None else MemoryLimit()

    def hardware(self, hw):
        """Cores: one execution unit per worker thread; the config's ``L1`` and ``L2`` memories
        get the host's cache sizes where Linux reports them (``host_caches``)."""
        units = {k: replace(u, count=self.pool.size) for k, u in hw.exec_units.items()}
        caches = host_caches()
        mems = {
            k: replace(m, size_KiB=caches[k] / 1024) if k in ("L1", "L2") and k in caches else m
            for k, m in hw.mem_units.items()
        }
        return replace(hw, exec_units=units, mem_units=mems)


__all__ = ["LlvmCpuDevice", "LlvmKernel", "WorkerPool"]
