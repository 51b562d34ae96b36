"""Running a built program on a device: prepare its kernels once, allocate its buffers once, run
many times (``backends.driver`` builds it)."""

from __future__ import annotations

import contextlib
import operator
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from backends.hal import (
    Bound,
    Buffer,
    Device,
    Event,
    HostBuffer,
    KernelInfo,
    Library,
    MemoryLimit,
    kernel_symbol,
    wait_all,
)
from backends.options import CommonOptions
from backends.zeroing import needs_zero, zeroed_once
from stripe.config import TargetConfig
from stripe.ir import Block, RefDir, walk
from tile.errors import Span, TileInputError, TileResourceError
from tile.gc_pause import paused_gc
from tile.inputs import bytes_text
from tile.tensor import Tensor
from tile.typed import BoundProgram


@dataclass
class Build:
    """What ``backends.driver.build`` made of one bound program for one device."""

    lowered: Block
    config: TargetConfig | None
    program: Block  # optimized
    infos: list[KernelInfo]
    library: Library
    seconds: float  # code generation's


def nbytes(shape) -> int:
    return shape.elements * shape.dtype.numpy.itemsize


def _typed(shape) -> str:
    """``float32[100000, 100000]``, as the memory messages show a buffer's type."""
    return f"{shape.dtype.value}[{', '.join(str(n) for n in shape.sizes)}]"


def _span_of(bound: BoundProgram, name: str) -> Span | None:
    """Where the program defines tensor ``name`` (its statement, or its parameter)."""
    for st in bound.stmts:
        if st.name == name:
            return st.span
    for inp in bound.program.inputs:
        if inp.name == name:
            return inp.span
    return None


def check_memory(bound: BoundProgram, buffers: Mapping, device: Device, opts: CommonOptions) -> None:
    """Refuse, before allocating anything, buffers the device cannot hold: each buffer against
    the ``max_buffer_bytes`` setting and the device's per-buffer and total limits, all of them
    together against ``max_total_bytes`` and the device's total (``memory_bytes``)."""
    mem: MemoryLimit = device.memory_bytes()
    per: list[tuple[int, str]] = [(n, mem.what) for n in (mem.per_buffer, mem.total) if n is not None]
    total: list[tuple[int, str]] = [(mem.total, mem.what)] if mem.total is not None else []
    if opts.max_buffer_bytes is not None:
        per.append((opts.max_buffer_bytes, "the max_buffer_bytes setting"))
    if opts.max_total_bytes is not None:
        total.append((opts.max_total_bytes, "the max_total_bytes setting"))
    hint = (
        "use smaller inputs or output sizes, or a device with more memory; settings "
        "max_buffer_bytes / max_total_bytes set lower limits, never higher ones"
    )
    sizes = {name: nbytes(shape) for name, shape in buffers.items()}
    if per:
        limit, what = min(per)
        for name, shape in buffers.items():
            if sizes[name] > limit:
                raise TileResourceError(
                    f"tensor '{name}' ({_typed(shape)}) needs {bytes_text(sizes[name])}, over the "
                    f"limit of {bytes_text(limit)} for one buffer ({what})",
                    _span_of(bound, name),
                    hint,
                )
    if total:
        limit, what = min(total)
        need = sum(sizes.values())
        if need > limit:
            big = max(sizes, key=lambda n: sizes[n])
            raise TileResourceError(
                f"the program's {len(sizes)} buffers need {bytes_text(need)} together, over the limit of "
                f"{bytes_text(limit)} ({what}); the largest is '{big}' ({_typed(buffers[big])}, "
                f"{bytes_text(sizes[big])})",
                _span_of(bound, big),
                hint,
            )


POISON_ENV = "TILE_POISON_BUFFERS"


def allocate(ex, size: int) -> Buffer:
    """A new buffer of ``size`` bytes for outputs and temporaries. With ``TILE_POISON_BUFFERS=1``
    (the conformance suite sets it) it starts as 0xFF bytes (NaN, -1): an element a target's
    kernels never write then shows as a wrong value instead of whatever the memory held (often the
    right answer, left by the last run of the same shapes)."""
    buf = ex.allocate(size)
    if size and os.environ.get(POISON_ENV) == "1":
        buf.write(np.full(size, 0xFF, np.uint8)).wait()
    return buf


VIEW_REUSE_BYTES = 1 << 16  # inputs read in place up to this size keep their view between calls


class CompiledProgram:
    """A program built for one device and one set of input shapes and dtypes (by
    ``backends.driver.build``: lowered, optimized, its kernels generated), ready to run: its kernels
    prepared, its buffers allocated at the first run (after ``check_memory``, with the settings'
    ``max_buffer_bytes`` / ``max_total_bytes``) and reused by every later one (``run``)."""

    def __init__(self, bound: BoundProgram, device: Device, build: Build, settings: Mapping | None = None):
        self.bound = bound
        self.device = device
        self.settings = dict(settings or {})
        self.options = CommonOptions.parse(self.settings)
        self.lowered = build.lowered
        self.config = build.config
        self.program = build.program
        self.infos = build.infos
        self.library = build.library
        self.build_seconds = build.seconds
        self.buffers = {r.into: r.shape for r in self.program.refs}
        self.kernels = [device.executor.prepare(self.library, i) for i in range(len(self.infos))]
        self.inputs = [r.into for r in self.program.refs if "input" in r.tags]
        self.outputs = list(bound.outputs)
        named_in = frozenset(self.inputs)
        self.zeroed = needs_zero(self.program, named_in)
        self._zero_once = zeroed_once(self.program)  # zeroed when allocated: kernels keep them zero
        # what each call walks, worked out once: the buffers besides the inputs (outputs and
        # temporaries, in ``buffers``'s order) and each kernel's parameters
        self._rest = [n for n in self.buffers if n not in named_in]
        self._params = [info.buffers for info in self.infos]
        self._getters = [picker(names) for names in self._params]  # bufs -> a kernel's params
        # the kernels a call launches, in order: all but those the backend built with nothing to
        # do (``Library.extra["skipped"]``: a zero fill the next kernel took over)
        skipped = set(self.library.extra.get("skipped", ()))
        self._order = [k for k in range(len(self.kernels)) if k not in skipped]
        self._launch = [(k, self._getters[k]) for k in self._order]
        self._owned: dict[str, Buffer | None] = {}
        self._views: dict[str, HostBuffer] = {}  # small numpy inputs read in place, by name (_over)
        self._checked = False  # check_memory ran
        self._last: list[Event] = []
        self._launched: list[Event] = []  # the last run's kernel events, for profile()
        self._timed = False  # ``_launched`` report durations (the call ran under ``profiled()``)
        self._launched_once = False  # a first call ran (TILE_DEBUG labels the first)
        # each kernel bound to the buffers of the last run that used it: rebound only when a call
        # passes other buffers (another tensor, a numpy input read in place, a handed-out output);
        # and the binding before, for a loop that keeps the last result while the call runs (its
        # outputs alternate between two buffers, ``_handed_out``): it swaps the two, binding none
        self._bound: list[Bound | None] = [None] * len(self.kernels)
        self._spare: list[Bound | None] = [None] * len(self.kernels)
        self._out_types = {n: (tuple(self.buffers[n].sizes), self.buffers[n].dtype) for n in self.outputs}
        self._lock = threading.Lock()
        self._host_memory = bool(getattr(device.executor, "host_memory", False))
        # host-memory outputs of a numpy-out call: written where the caller gets them (no copy out);
        # not an output that is also an input (the caller's array must stay as it was)
        self._direct = frozenset(self.outputs) - frozenset(self.inputs)
        # the last buffers handed out per output (the newest last), for reuse, by (name, resident):
        # numpy arrays over such a buffer's memory, or resident tensors; two, so that a loop
        # ``out = exe(x)``, whose ``out`` holds the last result during the call, reuses too
        self._handed: dict[tuple[str, bool], list[Buffer]] = {}
        # inputs some kernel writes (none in programs the front end makes): never read in place
        self._written_inputs = frozenset(self.inputs) & _written(self.program)
        self._resident_lane: object = None  # ``backends.lane.resident_call``'s (False: none)
        if os.environ.get("TILE_DEBUG", "0") >= "3":
            print(self.library.source)

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """numpy in, numpy out (the buffers stay with the program for the next call)."""
        return self.run(inputs)  # type: ignore[return-value]

    def run(
        self,
        inputs: Mapping[str, np.ndarray | Tensor],
        out: Mapping[str, Tensor] | None = None,
        resident: bool = False,
    ) -> dict[str, np.ndarray | Tensor]:
        """Run once. ``inputs`` are numpy arrays (copied into the program's own buffers) or
        ``Tensor``s of this device (used in place); the outputs named in ``out`` are written into
        those tensors, the others come back as numpy arrays, or as ``Tensor``s when ``resident``
        (over a buffer of their own: of a tensor an earlier call returned only once the caller
        dropped it, so a loop that keeps the last result alternates between two). Calls are
        serialized; the program's own buffers are reused, zeroed only where
        ``backends.zeroing`` cannot prove the program overwrites them first.

        On a host-memory device (``Executor.host_memory``), a call with numpy inputs and outputs
        (no ``out``, not ``resident``) copies nothing it need not: C-contiguous, aligned inputs of
        the right dtype are read in place (the call waits for its kernels, so the caller cannot
        change them meanwhile; an input given twice, or one a kernel writes, is copied), and the
        kernels write each output into the array the call returns. That array's memory is reused
        by a later call once the caller holds no array over it (its reference count says so), so
        a loop that drops each result, or keeps only the last, neither allocates nor touches
        fresh pages."""
        debug = (_ENVIRON is None or _DEBUG_KEY in _ENVIRON) and debug_on()  # (debug_on, inline)
        if self._checked and not debug:  # a later call: no context managers to make and enter
            with self._lock:
                return self._run(inputs, out or {}, resident, False)
        # the first call allocates every buffer and prepares every kernel: no cycle hunts over the
        # program's IR meanwhile (a 5,000-statement chain's first call: 2.9 s, 0.13 s paused)
        first = paused_gc() if not self._checked else contextlib.nullcontext()
        with self._lock, first:
            if not debug:
                return self._run(inputs, out or {}, resident, False)
            with self.device.executor.profiled():  # TILE_DEBUG prints each kernel's time
                return self._run(inputs, out or {}, resident, True)

    def _run(self, inputs: Mapping, out: Mapping, resident: bool, debug: bool) -> dict:
        check_tensors(self, inputs, out)
        if not self._checked:  # before the first allocation (later calls reuse the buffers)
            check_memory(self.bound, self.buffers, self.device, self.options)
            self._checked = True
        ex = self.device.executor
        prior = self._last  # the last call's work: reused buffers are rewritten after it
        bufs: dict[str, Buffer] = {}
        deps: list[Event] = list(prior)
        # Host-memory kernels read numpy inputs where they are when the call waits for its kernels
        # (every output comes back as numpy): the caller cannot change them meanwhile.
        in_place = self._host_memory and not out and not resident
        written, write_s = 0, 0.0
        if out:
            for name, t in out.items():
                bufs[name] = t._buffer
                deps.extend(t._events)
        for name in self.inputs:
            value = inputs[name]
            if isinstance(value, Tensor) and value._buffer not in bufs.values():  # (by identity)
                bufs[name] = value._buffer  # in place: no copy
                if value._events != prior:  # (a tensor the last call read or wrote holds its events)
                    deps.extend(value._events)
                continue
            shape = self.buffers[name]
            if in_place and not isinstance(value, Tensor) and name not in self._written_inputs:
                arr = np.ascontiguousarray(np.asarray(value).astype(shape.dtype.numpy, copy=False))
                at = arr.__array_interface__["data"][0]
                if arr.size and arr.flags.aligned and all(
                    not isinstance(b, HostBuffer) or b.address != at for b in bufs.values()
                ):
                    bufs[name] = self._over(name, arr, at)
                    continue
            buf = bufs[name] = self._buffer(name)
            if isinstance(value, Tensor):  # bound already (out=, another input): buffers are distinct
                deps.append(ex.copy(value._buffer, 0, buf, 0, nbytes(shape), [*value._events, *prior]))
            else:
                arr = np.ascontiguousarray(np.asarray(value).astype(shape.dtype.numpy, copy=False))
                start = time.perf_counter()
                deps.append(buf.write(arr.reshape(-1).view(np.uint8), prior))
                written += arr.nbytes
                write_s += time.perf_counter() - start  # the host's part: a blocking copy for OpenCL
        handed: dict[str, Buffer] = {}  # resident outputs, the caller's from now on
        for name in self._rest:
            if name in bufs:  # out=: zeroed where the program starts from zeros (backends.zeroing),
                if name in self.zeroed:  # after an input copied from the same tensor
                    deps.append(bufs[name].zero(list(deps)))
                continue
            if resident and name in self._out_types:
                buf = bufs[name] = handed[name] = self._handed_out(name, True)
            elif in_place and name in self._direct:
                buf = bufs[name] = self._handed_out(name, False)
            else:
                fresh = name in self._zero_once and name not in self._owned
                buf = bufs[name] = self._buffer(name)
                if fresh:
                    deps.append(buf.zero(prior))
            if name in self.zeroed:
                deps.append(buf.zero(prior))
        done = self._kernels(bufs, pending(deps), debug)
        self._last = done
        result: dict[str, np.ndarray | Tensor] = {}
        start, read = time.perf_counter() if debug else 0.0, 0
        for name in self.outputs:
            if name in out:
                out[name]._events = list(done)
                result[name] = out[name]
                continue
            if name in handed:
                sizes, dtype = self._out_types[name]
                result[name] = Tensor.made(self.device, handed[name], sizes, dtype, list(done))
                continue
            shape = self.buffers[name]
            if in_place and name in self._direct:
                wait_all(done)  # written in place: the caller's from now on
                raw = bufs[name].data[: bufs[name].size]  # type: ignore[attr-defined]
                result[name] = raw.view(shape.dtype.numpy).reshape(shape.sizes)
            else:
                raw = bufs[name].read(done)
                read += raw.nbytes
                result[name] = raw.view(shape.dtype.numpy)[: shape.elements].reshape(shape.sizes)
        for value in inputs.values():
            if isinstance(value, Tensor):
                value._events = list(done)  # read by this call: a host write must wait for it
        if debug:
            out_s = time.perf_counter() - start
            print(f"tile: copied in {_transfer(written, write_s)}, out {_transfer(read, out_s)}",
                  file=sys.stderr)
        return result

    def profile(self) -> list[tuple[str, float]]:
        """(kernel symbol, seconds) of each kernel of the last run, as the device timed it (OpenCL
        profiling events; wall time per kernel on the LLVM CPU): kernel time without the launch
        and host overhead a call adds. Waits for the run.

        A device that times only profiled work (``Executor.timed_by_default`` False: OpenCL, whose
        calls go to a plain queue) did not time the last run unless ``TILE_DEBUG`` was on: its
        kernels are then run again, profiled, in the same order on buffers of their own (the
        inputs copied from the buffers the last call read them from, as they are now, the rest
        zeroed; freed after), so nothing the caller holds changes: twice, and the second run's
        times are reported (and again until the next call), as the first pays for fresh memory.
        (The inputs' values, not zeros: a GEMM can run faster on zeros than on random values,
        bench/RESULTS.md.)"""
        with self._lock:
            ex = self.device.executor
            if self._launched and not self._timed and not ex.timed_by_default:
                self._launched = self._replay()
                self._timed = True
            launched = self._launched
        return [(self.symbol(k), e.duration) for k, e in zip(self._order, launched)]

    def _replay(self) -> list[Event]:
        """The last call's kernels run again under ``Executor.profiled()`` on fresh buffers of the
        program's shapes (``profile``: the inputs' values, zeros elsewhere; the caller's tensors and
        the program's own buffers untouched), once to warm up and once timed: the timed run's
        events."""
        ex = self.device.executor
        wait_all(self._last)
        scratch = {name: ex.allocate(nbytes(shape)) for name, shape in self.buffers.items()}
        read: dict[str, Buffer] = {}  # each input's buffer in the last call, where it still exists
        for bound, names in zip(self._bound, self._params):
            for name, buf in zip(names, bound.buffers() if bound is not None else ()):
                if name in self.inputs and buf is not None:
                    read.setdefault(name, buf)
        with ex.profiled():
            events = [
                ex.copy(read[name], 0, buf, 0, nbytes(self.buffers[name])) if name in read else buf.zero()
                for name, buf in scratch.items()
            ]
            for _ in range(2):  # the first run warms up (fresh memory, arguments set): not reported
                launched = []
                for k in self._order:
                    events = [self.kernels[k].run([scratch[b] for b in self._params[k]], events)]
                    launched.append(events[0])
            wait_all(events)
        return launched

    def symbol(self, k: int) -> str:
        """Kernel ``k``'s name in the generated code: ``kernel_symbol``'s, or the one the backend
        reports (``Library.extra["names"]``: OpenCL's tiled contractions add their tiles)."""
        names = self.library.extra.get("names")
        return names[k] if names else kernel_symbol(k, self.infos[k])

    def _handed_out(self, name: str, resident: bool) -> Buffer:
        """The buffer output ``name`` is written into and handed out over, as a resident tensor
        or (a numpy-out call on host memory) as a numpy array over its memory: one of the last two
        calls' when nothing but the runner refers to it any more (the caller dropped the tensor,
        or the array and every view of it: each holds the memory's owner; the last call's first,
        so a loop that drops each result keeps writing one buffer and its kernels stay bound),
        else a new one, which replaces the older of the two. A loop over resident calls that drops
        each result, or keeps only the last, neither allocates nor touches fresh pages either."""
        kept = self._handed.setdefault((name, resident), [])
        if kept and resident:  # the last call's free again (a loop dropping each result): it stays
            last = kept[-1]  # the newest, as below
            if sys.getrefcount(last) == 3:
                return last
        for buf in reversed(kept):  # the last call's first: the kernels are bound to it
            # getrefcount counts its argument, and: the list and ``buf`` (a tensor's buffer);
            # ``buf.data`` alone (an array's memory)
            if sys.getrefcount(buf) == 3 if resident else sys.getrefcount(buf.data) == 2:  # type: ignore[attr-defined]
                kept.remove(buf)
                break
        else:
            buf = allocate(self.device.executor, nbytes(self.buffers[name]))
            assert resident or isinstance(buf, HostBuffer), "a host-memory executor allocates HostBuffers"
            del kept[:-1]
        kept.append(buf)
        return buf

    def _over(self, name: str, arr: np.ndarray, at: int) -> HostBuffer:
        """A buffer over input ``name``'s array ``arr`` (at address ``at``), read in place: the last
        call's for this input when it was over the same memory (a small input: the kernels stay
        bound to it, ``_kernels``; the view it holds keeps that memory alive, so memory at the same
        address is the same memory), else a new one."""
        last = self._views.get(name)
        if last is not None and last.address == at and last.size == arr.nbytes:
            return last
        buf = HostBuffer.over(arr)
        if arr.nbytes <= VIEW_REUSE_BYTES:  # a large input is not held past the call
            self._views[name] = buf
        else:
            self._views.pop(name, None)
        return buf

    def _buffer(self, name: str) -> Buffer:
        """The program's own buffer for ``name``, allocated on first use and kept."""
        buf = self._owned.get(name)
        if buf is None:
            buf = self._owned[name] = allocate(self.device.executor, nbytes(self.buffers[name]))
        return buf

    def _kernels(self, bufs: Mapping[str, Buffer], deps: list[Event], debug: bool) -> list[Event]:
        """Launch every kernel in order, each bound to its buffers (``Kernel.bind``) again only
        when they are neither the ones it was bound to last nor the ones before (``_spare``);
        ``TILE_DEBUG=1`` waits for each and prints its time (``_report``)."""
        first = not self._launched_once  # TILE_DEBUG says so: its times include one-time start-up
        self._launched_once = True
        launched = self._launched = []
        self._timed = debug
        bound, spare = self._bound, self._spare
        event = None
        for k, get in self._launch:
            params = get(bufs)
            b = bound[k]
            if b is None or not b.matches(params):
                other, spare[k] = spare[k], b
                if other is None or not other.matches(params):
                    other = self.kernels[k].bind(params)
                b = bound[k] = other
            event = b.launch(params, deps if event is None else (event,))
            launched.append(event)
            if debug:
                self._report(k, event, first)
        if debug:
            self._report(None, None, first)
        return deps if event is None else [event]

    def _report(self, k: int | None, event: Event | None, first: bool) -> None:
        """``TILE_DEBUG``'s line for kernel ``k`` (waits for ``event``), or (``k`` None) the
        call's total."""
        if k is not None:
            print(debug_line(k, self.infos[k], event.duration, self.symbol(k), first), file=sys.stderr)  # type: ignore[union-attr]
            return
        total = sum(e.duration for e in self._launched)
        call = " (first call: one-time start-up included, not a steady-state time)" if first else ""
        n = len(self._order)
        print(f"tile: {n} kernel{'s' if n != 1 else ''}, {total * 1e3:.3f} ms{call}", file=sys.stderr)


_ENVIRON = getattr(os.environ, "_data", None)  # the dict behind os.environ (CPython), keyed by
_DEBUG_KEY = os.environ.encodekey("TILE_DEBUG") if hasattr(os.environ, "encodekey") else None  # this


def debug_on() -> bool:
    """``TILE_DEBUG`` >= 1 now: read at every call (it may be set between calls), and unset in
    30 ns by a look into ``os.environ``'s own dict, where ``os.environ.get`` of an unset name
    raises and catches two KeyErrors (0.7 us of a call's 5-10)."""
    if _ENVIRON is not None and _DEBUG_KEY not in _ENVIRON:
        return False
    return os.environ.get("TILE_DEBUG", "0") >= "1"


def picker(names: tuple) -> Callable[[Mapping | Sequence], tuple]:
    """What picks a kernel's parameters (``names``: keys, or positions) out of a call's buffers (or
    addresses), as a tuple: an ``itemgetter`` (a third of a list comprehension's time)."""
    if len(names) >= 2:
        return operator.itemgetter(*names)
    if names:
        name = names[0]
        return lambda bufs: (bufs[name],)
    return lambda bufs: ()


def _written(program: Block) -> frozenset[str]:
    """The program buffers some kernel writes (refines for output)."""
    main = program.stmts[0]
    return frozenset(
        r.source
        for k in main.stmts
        if isinstance(k, Block)
        for r in k.refs
        if r.dir in (RefDir.OUT, RefDir.INOUT)
    )


def pending(events: list[Event]) -> list[Event]:
    """``events`` without repeats and without plain ``Event.done`` ones (finished, and they cannot
    fail): a call's dependencies name the last call's events once per tensor it touched."""
    if len(events) < 2:
        return [e for e in events if e._future is not None or type(e) is not Event]
    seen: set[int] = set()
    out = []
    for e in events:
        if (e._future is None and type(e) is Event) or id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
    return out


def check_tensors(program: CompiledProgram, inputs: Mapping, out: Mapping) -> None:
    """Tensors must live on the program's device; ``out=`` must name outputs, with their shapes
    and dtypes (an input tensor's shape and dtype chose what was compiled, so they fit)."""
    device = program.device
    for name, value in inputs.items():
        if isinstance(value, Tensor) and value._device is not device:
            raise TileInputError(
                f"input '{name}' is a tensor on {value.device}, but this program runs on {device.id}",
                None,
                hint=f"make it with tile.tensor(array, device={device.id!r}), or pass t.numpy()",
            )
    for name, t in out.items():
        want = program._out_types.get(name)
        if (
            want is None
            or not isinstance(t, Tensor)
            or t._device is not device
            or t._shape != want[0]
            or t._dtype is not want[1]
        ):
            check_out(program, name, t)
    if len(out) > 1 and len({id(t) for t in out.values()}) != len(out):
        raise TileInputError(
            "out= gives one tensor for two outputs", None, hint="pass a separate tensor for each output"
        )


def check_out(program: CompiledProgram, name: str, t) -> None:
    """The error for ``out=``'s tensor ``t`` for ``name`` (``check_tensors`` calls it only when
    the quick test fails)."""
    dev = program.device.id
    if name not in program.outputs:
        raise TileInputError(
            f"out= names '{name}', which is not an output of this program",
            None,
            hint=f"the outputs are: {', '.join(program.outputs)}",
        )
    shape = program.buffers[name]
    want = f"{shape.dtype.value}{list(shape.sizes)} on {dev}"
    if not isinstance(t, Tensor):
        raise TileInputError(
            f"out= for '{name}' must be a tile.Tensor, not {type(t).__name__}",
            None,
            hint=f"pass tile.empty({tuple(shape.sizes)}, {shape.dtype.value!r}, device={dev!r})",
        )
    got = f"{t.tile_dtype.value}{list(t.shape)} on {t.device}"
    if got != want:
        raise TileInputError(
            f"out= for '{name}' is a {got} tensor, but the output is {want}",
            None,
            hint=f"pass tile.empty({tuple(shape.sizes)}, {shape.dtype.value!r}, device={dev!r})",
        )


def _transfer(nbytes: int, secs: float) -> str:
    return f"{nbytes / 1e6:.3g} MB ({secs * 1e3:.3f} ms)" if nbytes else "nothing"


def debug_line(k: int, info: KernelInfo, secs: float, symbol: str | None = None, first: bool = False) -> str:
    """``TILE_DEBUG=1``'s line for one kernel: its symbol, Stripe name, time and rate (GFLOP/s for
    contractions, GB/s of the buffers it names for the rest); ``first`` marks a program's first
    call, whose times include one-time start-up (threads, page faults, lazy code)."""
    s = max(secs, 1e-12)
    rate = (
        f"{info.flops / s / 1e9:.2f} GFLOP/s"
        if info.block.has_tags("contraction")  # type: ignore[attr-defined]
        else f"{info.bytes / s / 1e9:.2f} GB/s"
    )
    symbol = symbol or kernel_symbol(k, info)
    call = " [first call]" if first else ""
    return f"tile: kernel {symbol} ({info.block.name}): {secs * 1e3:.3f} ms, {rate}{call}"  # type: ignore[attr-defined]


def kernels_of(program: Block) -> list[Block]:
    return [b for b in walk(program) if b.has_tags("kernel")]
