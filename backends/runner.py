"""Running a bound Tile program on a device: lower to Stripe, build once, run many times."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from backends.hal import Device, Event, KernelInfo, MemoryLimit
from stripe.config import TargetConfig, builtin_names, load_config, target_config
from stripe.ir import Block, walk
from stripe.lower import lower
from stripe.passes import optimize
from tile.errors import Span, TileResourceError
from tile.typed import BoundProgram


def _buffer_names(kernel: Block, buffers: Mapping) -> tuple[str, ...]:
    """The program buffers a kernel uses, in first-use order (its own scratch buffers excluded)."""
    names: dict[str, None] = {}
    for r in kernel.refs:
        if (r.from_ or r.into) in buffers:
            names.setdefault(r.from_ or r.into)
    return tuple(names)


def _flops(kernel: Block) -> int:
    return kernel.index_space * (2 if kernel.has_tags("contraction") else 1)


def device_config(device: Device, settings: Mapping | None = None) -> TargetConfig | None:
    """The optimizer config a device compiles with: ``settings["config"]`` (a path or a built-in
    config's name, such as ``opencl_gpu_tiled``) or the device's built-in one (``Device.optimizer``;
    none for a backend that names none), with the sizes the device reports filled into its
    hardware model."""
    settings = settings or {}
    config = settings_config(settings.get("config"))
    if config is None:
        if not device.optimizer:
            return None  # a backend with no optimizer config compiles the lowered program as it is
        config = target_config(device.optimizer)
    return replace(config, hardware=device.hardware(config.hardware))


def settings_config(given) -> TargetConfig | None:
    """``settings["config"]``: a config file's path, or the name of a built-in config."""
    if not given:
        return None
    if isinstance(given, str) and given in builtin_names():
        return target_config(given)
    return load_config(given)


def _nbytes(shape) -> int:
    return shape.elements * shape.dtype.numpy.itemsize


def _typed(shape) -> str:
    """``float32[100000, 100000]``, as the memory messages show a buffer's type."""
    return f"{shape.dtype.value}[{', '.join(str(n) for n in shape.sizes)}]"


def _gib(n: int) -> str:
    return f"{n} bytes ({n / 2**30:.1f} GiB)" if n >= 2**30 else f"{n} bytes"


def _span_of(bound: BoundProgram, name: str) -> Span | None:
    """Where the program defines tensor ``name`` (its statement, or its parameter)."""
    for st in bound.stmts:
        if st.name == name:
            return st.span
    for inp in bound.program.inputs:
        if inp.name == name:
            return inp.span
    return None


def check_memory(bound: BoundProgram, buffers: Mapping, device: Device, settings: Mapping) -> None:
    """Refuse, before allocating anything, buffers the device cannot hold: each buffer against
    ``settings["max_buffer_bytes"]`` and the device's per-buffer and total limits, all of them
    together against ``settings["max_total_bytes"]`` and the device's total (``memory_bytes``)."""
    mem: MemoryLimit = device.memory_bytes()
    per: list[tuple[int, str]] = [(n, mem.what) for n in (mem.per_buffer, mem.total) if n is not None]
    total: list[tuple[int, str]] = [(mem.total, mem.what)] if mem.total is not None else []
    if "max_buffer_bytes" in settings:
        per.append((int(settings["max_buffer_bytes"]), "the max_buffer_bytes setting"))
    if "max_total_bytes" in settings:
        total.append((int(settings["max_total_bytes"]), "the max_total_bytes setting"))
    hint = (
        "use smaller inputs or output sizes, or a device with more memory; settings "
        "max_buffer_bytes / max_total_bytes set lower limits, never higher ones"
    )
    sizes = {name: _nbytes(shape) for name, shape in buffers.items()}
    if per:
        limit, what = min(per)
        for name, shape in buffers.items():
            if sizes[name] > limit:
                raise TileResourceError(
                    f"tensor '{name}' ({_typed(shape)}) needs {_gib(sizes[name])}, over the "
                    f"limit of {_gib(limit)} for one buffer ({what})",
                    _span_of(bound, name),
                    hint,
                )
    if total:
        limit, what = min(total)
        need = sum(sizes.values())
        if need > limit:
            big = max(sizes, key=lambda n: sizes[n])
            raise TileResourceError(
                f"the program's {len(sizes)} buffers need {_gib(need)} together, over the limit of "
                f"{_gib(limit)} ({what}); the largest is '{big}' ({_typed(buffers[big])}, "
                f"{_gib(sizes[big])})",
                _span_of(bound, big),
                hint,
            )


class CompiledProgram:
    """A program built for one device and one set of input shapes and dtypes: lowered to Stripe,
    optimized by the device's config (``settings``: ``config`` a config file, ``strict`` to keep
    every aggregation in the interpreter's order, ``optimize=False`` to skip the passes;
    ``max_buffer_bytes`` / ``max_total_bytes`` to lower the memory limits ``check_memory`` applies
    before every run's allocations)."""

    def __init__(self, bound: BoundProgram, device: Device, settings: Mapping | None = None):
        self.bound = bound
        self.device = device
        settings = dict(settings or {})
        self.settings = settings
        self.lowered = lower(bound)
        self.config = device_config(device, settings)
        self.program = self.lowered
        if settings.get("optimize", True) and self.config is not None:
            self.program = optimize(self.lowered, self.config, strict=bool(settings.get("strict", False)))
        main = self.program.stmts[0]
        self.buffers = {r.into: r.shape for r in self.program.refs}
        self.infos = []
        for k in main.stmts:
            names = _buffer_names(k, self.buffers)
            dtypes = tuple(self.buffers[n].dtype for n in names)
            self.infos.append(KernelInfo(k.name, k, names, dtypes, _flops(k)))
        start = time.perf_counter()
        self.library = device.compiler.build(self.infos, dict(settings or {}))
        self.build_seconds = time.perf_counter() - start
        self.kernels = [device.executor.prepare(self.library, i) for i in range(len(self.infos))]
        self.inputs = [r.into for r in self.program.refs if "input" in r.tags]
        self.outputs = list(bound.outputs)
        if os.environ.get("TILE_DEBUG", "0") >= "3":
            print(self.library.source)

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        ex = self.device.executor
        check_memory(self.bound, self.buffers, self.device, self.settings)
        bufs = {}
        for name, shape in self.buffers.items():
            nbytes = _nbytes(shape)
            buf = ex.allocate(nbytes)
            view = buf.map_discard()
            if name in inputs:
                arr = np.ascontiguousarray(np.asarray(inputs[name]).astype(shape.dtype.numpy, copy=False))
                view[:] = arr.reshape(-1).view(np.uint8)
            else:
                view[:] = 0
            buf.unmap(view)
            bufs[name] = buf
        event: list[Event] = []
        debug = os.environ.get("TILE_DEBUG", "0") >= "1"
        for info, kernel in zip(self.infos, self.kernels):
            done = kernel.run([bufs[b] for b in info.buffers], event)
            event = [done]
            if debug:
                secs = done.duration
                rate = info.flops / max(secs, 1e-12) / 1e9
                print(f"kernel {info.name}: {secs * 1e3:.3f} ms, {rate:.2f} GFLOP/s")
        for e in event:
            e.wait()
        out = {}
        for name in self.outputs:
            shape = self.buffers[name]
            raw = bufs[name].map_current()
            out[name] = raw.view(shape.dtype.numpy)[: shape.elements].reshape(shape.sizes).copy()
        return out


def kernels_of(program: Block) -> list[Block]:
    return [b for b in walk(program) if b.has_tags("kernel")]
