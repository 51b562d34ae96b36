"""The compile spine: the one place where a Tile program becomes something that runs.

::

    text ─ parse ─► ast.Program ─ bind (input shapes) ─► BoundProgram ─ lower ─► Stripe
         ─ optimize (a target config) ─► Stripe ─ code generation (Device.compiler) ─► Library
         ─► backends.runner.CompiledProgram (allocates, copies, runs)

``tile.compile`` (``tile.api``), every command of ``python -m tile`` (``emit`` at each stage,
``run``, ``tune``) and the conformance suite go through here; the runner only runs what this
built, and the autotuner (``backends.tune``) builds its trial programs here. A whole-program
device (``backends.hal.ProgramDevice``) takes the program as text at its stage instead
(``backends.program.ProgramRun``).

Which config a device compiles with (``config_for``) is decided here too: the settings' config
or the device's own, its hardware model filled in from the device, and with ``tiled=False`` the
steps of passes that tile kernels for the code generator (``PassInfo.kernel_tiling``) left out.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from backends import progcache
from backends.hal import Device, KernelInfo, ProgramDevice
from backends.naming import label, work
from backends.options import BuildFacts, CommonOptions, build_library
from backends.program import ProgramRun, stage_config
from backends.runner import Build, CompiledProgram
from stripe.config import TargetConfig, builtin_names, format_config, resolve_config, target_config
from stripe.cost import estimate
from stripe.ir import Block
from stripe.lower import check_index_space, lower
from stripe.passes import PASSES, optimize
from stripe.passes.gemm_tile import GENERIC_FLAT_K, GENERIC_FLAT_POINTS
from stripe.printer import format_block
from tile import ast, tuples
from tile.bind import bind
from tile.errors import Span, TileRuntimeError
from tile.gc_pause import paused_gc
from tile.inputs import input_types
from tile.transforms import apply_stage
from tile.transforms.emit import format_flat_program, format_stage
from tile.typed import BoundProgram, TContraction

FLOAT32_ON_UNITS = ("tf32", "3xtf32")  # ``precision`` settings that fill tensorize's ``float32``


def bind_inputs(program: ast.Program, host: Mapping[str, np.ndarray], check: bool = True) -> BoundProgram:
    """``program`` typed for these arrays' shapes and dtypes (0-D size inputs by value); with
    ``check``, the single-writer rule of ``=`` checked from the shapes, as the interpreter checks
    it (what runs must be refused alike; what is only printed need not)."""
    bound = bind(program, input_types(program, host), host)
    if check:
        try:
            tuples.check_assignments(bound)
        except TileRuntimeError as e:
            first_error_before(bound, e.span)  # the interpreter reports errors in statement order
            raise
    return bound


def first_error_before(bound: BoundProgram, span: Span | None) -> None:
    """Raise the error lowering finds in a contraction before the statement at ``span`` (the
    double write ``check_assignments`` found), if there is one: the interpreter runs statements
    in order, so it reports that one first, dead code or not; compiled targets report the same."""
    for stmt in bound.stmts:
        if stmt.span == span:
            return
        if isinstance(stmt, TContraction):
            check_index_space(stmt)


def config_for(device: Device, settings: Mapping | None = None) -> TargetConfig | None:
    """The optimizer config ``device`` compiles with: ``settings["config"]`` (a path or a built-in
    config's name, such as ``opencl_gpu_tiled``) or the device's own (``Device.optimizer``; none
    for a backend that names none), with the sizes the device reports filled into its hardware
    model. ``tiled=False`` leaves out the steps that tile kernels for the code generator (GEMM
    kernels then run one work-item per output element). Kept per process for a config given by
    name (a file's by its path, size and modification time): parsing one takes milliseconds, and
    every ``tile.compile`` and first call of a shape asks."""
    opts = CommonOptions.parse(settings)
    given = opts.config
    generic = bool((settings or {}).get("generic"))  # shape-generic kernels (only LLVM's change the config)
    memo = _config_memo_key(device, opts)
    memo = None if memo is None else (*memo, generic)
    kept = _kept_configs(device) if memo is not None else None
    if kept is not None and memo in kept:
        return kept[memo]
    config = resolve_config(given)
    if config is None:
        if not device.optimizer:
            return None  # a backend with no optimizer config compiles the lowered program as it is
        config = resolve_config(device.optimizer)
    if not opts.tiled:
        config = replace(config, passes=tuple(s for s in config.passes if not PASSES[s.pass_].kernel_tiling))
    if opts.precision in FLOAT32_ON_UNITS:  # what float32 contractions may run on a matrix unit
        mode = opts.precision
        config = replace(config, passes=tuple(
            replace(s, params=replace(s.params, float32=mode)) if hasattr(s.params, "float32") else s
            for s in config.passes
        ))
    if generic:  # shape-generic kernels: short GEMMs stay flat (``gemm_tile.GENERIC_FLAT_POINTS``, ``_K``)
        config = replace(config, passes=tuple(
            replace(s, params=replace(s.params, flat_points=GENERIC_FLAT_POINTS, flat_unfused=True,
                                      flat_k=GENERIC_FLAT_K))
            if getattr(s.params, "model", "") == "cpu" and getattr(s.params, "flat_points", None) == 0 else s
            for s in config.passes
        ))
    config = replace(config, hardware=device.hardware(config.hardware))
    if kept is not None:
        kept[memo] = config
    return config


def widened(config: TargetConfig | None, strict: bool) -> bool | str:
    """Which half-type matrix products a build with ``config`` lowers widened (into float32,
    rounded once: ``stripe.lower``'s ``widen``): all in strict mode and wherever the config has no
    matrix units; where it has some, whose passes (``tensorize``) take the narrow form, those
    without a matrix shape (``"unshaped"``: a depthwise convolution, which no unit takes). A
    kernel that sums in float16 or bfloat16 itself errs by a growing multiple of PyTorch's
    (50x at K = 4096; a depthwise convolution on cuda.0 3.4x cuDNN's). A backend with no config
    gets the program strict mode lowers."""
    if strict or (config is not None and not config.hardware.matrix_units):
        return True
    return "unshaped" if config is not None else False


_configs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # device -> {memo key: config}


def _kept_configs(device: Device) -> dict | None:
    """``config_for``'s results kept for ``device`` (None where a device cannot be weakly held)."""
    try:
        return _configs.setdefault(device, {})
    except TypeError:
        return None


def _config_memo_key(device: Device, opts: CommonOptions) -> tuple | None:
    """What ``config_for``'s result depends on besides the device, for configs named by strings
    (a file's with its modification time and size); None (not kept) for a loaded ``TargetConfig``
    or a file that cannot be read."""
    given = opts.config
    if given is not None and not isinstance(given, str):
        return None
    stamps = []
    for name in (given, device.optimizer):
        if name and name not in builtin_names():
            try:
                st = os.stat(name)
            except OSError:
                return None  # the error is resolve_config's to give
            stamps.append((st.st_mtime_ns, st.st_size))
    return (given, device.optimizer, tuple(stamps), not opts.tiled, opts.precision)


def optimized(
    lowered: Block, config: TargetConfig | None, settings: Mapping | None = None, after: str | None = None
) -> Block:
    """``lowered`` after ``config``'s passes (up to the step ``after``); ``settings``: ``strict``
    skips the passes that reorder aggregation, ``optimize=False`` skips them all."""
    opts = CommonOptions.parse(settings)
    if config is None or not opts.optimize:
        return lowered
    return optimize(lowered, config, after=after, strict=opts.strict)


def kernels(program: Block) -> list[KernelInfo]:
    """The kernels of an optimized program, in order: each top-level block of ``main``, with the
    program buffers it uses, their dtypes, and its work (for names and ``TILE_DEBUG``)."""
    buffers = {r.into: r.shape for r in program.refs}
    infos = []
    for k in program.stmts[0].stmts:
        names = _buffer_names(k, buffers)
        flops, nbytes = work(k, buffers, names)
        infos.append(KernelInfo(label(k), k, names, tuple(buffers[n].dtype for n in names), flops, nbytes))
    return infos


def _buffer_names(kernel: Block, buffers: Mapping) -> tuple[str, ...]:
    """The program buffers a kernel uses, in first-use order (its own scratch buffers excluded)."""
    names: dict[str, None] = {}
    for r in kernel.refs:
        if (r.from_ or r.into) in buffers:
            names.setdefault(r.from_ or r.into)
    return tuple(names)


@paused_gc()  # as compile_bound (the autotuner builds here directly)
def build(bound: BoundProgram, device: Device, settings: Mapping | None = None) -> Build:
    """Lower, optimize with ``config_for(device, settings)``, and generate code for ``device``;
    or, where the program cache (``backends.progcache``) has this program, shapes, device and
    settings, the device's library restored from it with nothing lowered or optimized (the
    ``Build`` then has no ``lowered`` program)."""
    settings = dict(settings or {})
    opts = CommonOptions.parse(settings)
    key = None
    # TILE_DEBUG=2 prints every pass as it runs (stripe.passes.pipeline): the user is watching the
    # optimizer, so the program cache is neither read nor written (a cached build shows nothing)
    watching = os.environ.get("TILE_DEBUG", "0") >= "2"
    if opts.cache and progcache.takes_part(device) and not watching:
        start = time.perf_counter()
        key = progcache.program_key(bound, device, settings)
        found = _restored(key, device, start)
        if found is not None:
            return found
    config = config_for(device, settings)
    lowered = lower(bound, strict=opts.strict, widen=widened(config, opts.strict))
    program = optimized(lowered, config, settings)
    infos = kernels(program)
    # what the config says that no user set (matrix units, caches) goes as facts, not settings
    facts = BuildFacts.of(config)
    start = time.perf_counter()
    library = build_library(device.compiler, infos, settings, facts)
    if key is not None:
        progcache.store(key, program, infos, config, settings, device.compiler.snapshot(library))
    if progcache.takes_part(device):
        library.extra["program_cache"] = "miss" if key is not None else "off"
    return Build(lowered, config, program, infos, library, time.perf_counter() - start)


def _restored(key: str, device: Device, start: float) -> Build | None:
    """The build the program cache holds under ``key``: the library restored by the device's
    compiler, else built again from the cached kernels (and the entry rewritten); None on a miss."""
    entry = progcache.load(key)
    if entry is None:
        return None
    program, infos, config, settings = entry["program"], entry["infos"], entry["config"], entry["settings"]
    library = device.compiler.restore(infos, settings, entry["snapshot"])
    if library is None:  # the device's own entry is gone or bad: build the kernels again
        library = build_library(device.compiler, infos, settings, BuildFacts.of(config))
        progcache.store(key, program, infos, config, settings, device.compiler.snapshot(library))
    library.extra["program_cache"] = "hit"
    return Build(None, config, program, infos, library, time.perf_counter() - start)  # type: ignore[arg-type]


@paused_gc()  # every step makes and keeps many IR objects: no cycle hunts over them meanwhile
def compile_bound(
    bound: BoundProgram, device: Device | ProgramDevice, settings: Mapping | None = None
) -> CompiledProgram | ProgramRun:
    """``bound`` ready to run on ``device``: built and handed to the runner, or, for a
    whole-program device, rendered at its stage. The cyclic collector is paused throughout
    (``tile.gc_pause``), not only in the steps that pause it themselves: between them, naming the
    kernels and the runner's analyses of a 5,000-statement program's kernels paid a full
    collection over every live IR object every few hundred allocations (naming its kernels:
    3.3 s, 0.8 s paused)."""
    if isinstance(device, ProgramDevice):
        return ProgramRun(bound, device, settings)
    return CompiledProgram(bound, device, build(bound, device, settings), settings)


def check_config(device: Device | ProgramDevice, settings: Mapping | None) -> None:
    """Load the config ``settings`` names for ``device`` (a bad file fails here, located)."""
    if isinstance(device, ProgramDevice):
        stage_config(device, settings)
    else:
        config_for(device, settings)


def emitted_config(target: str, device: Device | None = None, config: str | None = None) -> TargetConfig:
    """The config ``emit`` optimizes with: ``config`` (a file or a built-in name), else the built-in
    config of ``target``'s kind with the sizes ``device`` (when present) reports."""
    if config:
        return resolve_config(config)
    cfg = target_config(target)
    return replace(cfg, hardware=device.hardware(cfg.hardware)) if device is not None else cfg


def config_text(target: str, device: Device | None = None, config: str | None = None) -> str:
    """The config ``emit`` optimizes with (``emitted_config``), fully resolved, as a config file:
    ``python -m tile emit --stage config``, which needs no program."""
    return format_config(emitted_config(target, device, config))


def emit(
    bound: BoundProgram,
    stage: str,
    *,
    target: str = "llvm_cpu.0",
    device: Device | None = None,
    config: str | None = None,
    after: str | None = None,
    strict: bool = False,
    report: bool = False,
) -> str:
    """The program at ``stage`` (those of ``python -m tile emit --stage``) as text. ``optimized``
    and ``config`` use ``config`` (a file or a built-in name) or ``target``'s built-in config,
    with the sizes that ``device`` (the device ``target`` names, when present) reports;
    ``report`` adds the cost model's estimate per kernel of the optimized program; ``strict``
    lowers (``stripe`` and ``optimized``) and optimizes as strict mode compiles."""
    if stage == "flat-tile":
        return format_flat_program(apply_stage(bound, "flat"))
    if stage not in ("stripe", "optimized", "config"):
        return format_stage(apply_stage(bound, stage))
    if stage == "stripe":
        return format_block(lower(bound, strict=strict)) + "\n"
    if stage == "config":
        return config_text(target, device, config)
    cfg = emitted_config(target, device, config)
    lowered = lower(bound, strict=strict, widen=widened(cfg, strict))
    program = optimized(lowered, cfg, {"strict": strict}, after)
    text = format_block(program) + "\n"
    return text + estimate(program, cfg.hardware).format() + "\n" if report else text
