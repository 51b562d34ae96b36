"""The hardware abstraction layer: what a backend implements to run Stripe programs.

In the spirit of PlaidML's own HAL (``tile/base/hal.h`` in github.com/plaidml/plaidml, v0.x),
everything is asynchronous: ``Kernel.run`` and ``Executor.copy`` take the events they must wait
for and return an ``Event`` at once; ``Event.wait()`` blocks and ``Event.duration`` reports the time it took.

A backend provides a ``Device`` (description and capabilities), whose ``compiler`` builds a
``Library`` from the kernels of a program and whose ``executor`` allocates ``Buffer``s, copies
between them and prepares a library's kernels for running.
"""

from __future__ import annotations

import abc
import concurrent.futures as cf
import contextlib
import mmap
import re
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tile.capabilities import STAGES as STAGES  # (re-exported: backends.program, the client)
from tile.capabilities import Declared
from tile.dtypes import DType


@dataclass(frozen=True)
class Capabilities:
    """What a device can do. ``declared`` (optional) is what it promises to the conformance
    suite (``tile.capabilities.Declared``: operations, dtypes, stages, limits, tolerance class):
    examples outside it are counted as declared unsupported, and a refusal inside it fails. None
    declares nothing beyond ``dtypes``: the device claims every operation."""

    dtypes: frozenset[DType]
    fp64: bool = True
    fp16: bool = True
    atomics: bool = False
    declared: Declared | None = None

    def supports(self, dtype: DType) -> bool:
        return dtype in self.dtypes


@dataclass(frozen=True)
class MemoryLimit:
    """How much memory a device can give one run's buffers (None: it does not say). The runner
    refuses a program whose buffers exceed it before allocating anything."""

    total: int | None = None  # bytes all of a run's buffers may take together
    per_buffer: int | None = None  # bytes one buffer may take
    what: str = "the device's memory"  # where the figures come from, for messages


class Event:
    """Completion of one asynchronous operation, with its duration once done."""

    def __init__(self, future: cf.Future | None = None, duration: float = 0.0):
        self._future = future
        self._duration = duration

    @staticmethod
    def done(duration: float = 0.0) -> Event:
        return Event(None, duration)

    def wait(self) -> Event:
        if self._future is not None:
            self._duration = self._future.result()
            self._future = None
        return self

    @property
    def complete(self) -> bool:
        return self._future is None or self._future.done()

    @property
    def duration(self) -> float:
        """Seconds the operation ran (waits for it)."""
        self.wait()
        return self._duration


def wait_all(events: Sequence[Event]) -> None:
    for e in events:
        e.wait()


class Buffer:
    """Device memory holding ``size`` bytes; ``map_current`` / ``map_discard`` give a host view."""

    def __init__(self, size: int):
        self.size = size

    @abc.abstractmethod
    def map_current(self, deps: Sequence[Event] = ()) -> np.ndarray:
        """A host view of the current contents (uint8), after ``deps``."""

    @abc.abstractmethod
    def map_discard(self, deps: Sequence[Event] = ()) -> np.ndarray:
        """A host view whose old contents may be discarded (for writing inputs)."""

    def unmap(self, view: np.ndarray) -> Event:
        """Make host writes to ``view`` visible to the device."""
        return Event.done()

    def write(self, data: np.ndarray, deps: Sequence[Event] = ()) -> Event:
        """Replace the whole contents with ``data`` (``size`` bytes, uint8) once ``deps`` are done.
        The runner writes a reused input buffer this way, so a backend can copy straight from
        ``data`` instead of through a mapped view; ``data`` may change once this returns."""
        view = self.map_discard(deps)
        view[:] = data
        return self.unmap(view)

    def zero(self, deps: Sequence[Event] = ()) -> Event:
        """Fill with zero bytes once ``deps`` are done (a reused buffer the program does not
        overwrite before reading it)."""
        view = self.map_discard(deps)
        view[:] = 0
        return self.unmap(view)

    def read(self, deps: Sequence[Event] = ()) -> np.ndarray:
        """A host copy of the contents (uint8) after ``deps``: it stays valid when the buffer is
        reused."""
        return np.array(self.map_current(deps), copy=True)


@dataclass
class KernelInfo:
    """One kernel of a program, as the compiler receives it: a Stripe block and its buffers."""

    name: str
    block: object  # stripe.ir.Block
    buffers: tuple[str, ...]  # the names of the refinements it uses, in parameter order
    buffer_dtypes: tuple[DType, ...] = ()  # each buffer's element type (as allocated)
    flops: int = 0
    bytes: int = 0


def kernel_symbol(index: int, info: KernelInfo) -> str:
    """The symbol of kernel ``index`` in generated code: stable, and a valid C/LLVM identifier."""
    return f"tile_k{index}_{re.sub(r'[^A-Za-z0-9_]', '_', info.name)[:48]}"


@dataclass
class Library:
    """Compiled kernels, one per ``KernelInfo``; ``source`` is the generated code (for TILE_DEBUG=3)."""

    kernels: list[KernelInfo]
    source: str = ""
    handle: object = None
    build_seconds: float = 0.0
    extra: dict = field(default_factory=dict)


class Kernel(abc.ABC):
    info: KernelInfo

    @abc.abstractmethod
    def run(self, params: Sequence[Buffer], deps: Sequence[Event] = ()) -> Event:
        """Run on ``params`` (one buffer per ``info.buffers``) once ``deps`` completed."""

    def bind(self, params: Sequence[Buffer]) -> Bound:
        """This kernel with its arguments checked and prepared once, for the runner's calls that
        pass the same buffers again (a backend overrides it to skip per-run work)."""
        return Bound(self, params)


class Bound:
    """A kernel bound to one list of buffers: ``launch`` runs it on them (as ``Kernel.run``). It
    keeps only weak references, so it keeps no buffer alive; ``matches`` says whether a list of
    buffers is the one it was bound to (the same objects), so it may be launched on them."""

    __slots__ = ("kernel", "_refs")

    def __init__(self, kernel: Kernel, params: Sequence[Buffer]):
        self.kernel = kernel
        self._refs = tuple(weakref.ref(p) for p in params)

    def matches(self, params: Sequence[Buffer]) -> bool:
        refs = self._refs
        if len(refs) != len(params):
            return False
        i = 0
        for r in refs:  # (indexing: no zip object and tuples per call)
            if r() is not params[i]:
                return False
            i += 1
        return True

    def buffers(self) -> tuple[Buffer | None, ...]:
        """The buffers it was bound to, None for each one freed since."""
        return tuple(r() for r in self._refs)

    def launch(self, params: Sequence[Buffer], deps: Sequence[Event] = ()) -> Event:
        """Run on ``params``, which ``matches``; the caller's list keeps them alive until the run
        is over."""
        return self.kernel.run(params, deps)


def check_count(info: KernelInfo, params: Sequence[Buffer]) -> None:
    """A ``ValueError`` unless ``params`` holds one buffer per ``info.buffers``."""
    if len(params) != len(info.buffers):
        raise ValueError(f"kernel '{info.name}' takes {len(info.buffers)} buffers, got {len(params)}")


def check_copy(src: Buffer, src_offset: int, dst: Buffer, dst_offset: int, length: int) -> None:
    """A ``ValueError`` unless ``length`` bytes from ``src_offset`` of ``src`` fit at ``dst_offset``
    of ``dst``."""
    if src_offset < 0 or dst_offset < 0 or src_offset + length > src.size or dst_offset + length > dst.size:
        raise ValueError(f"copy of {length} bytes at {src_offset} -> {dst_offset} is out of bounds")


class Compiler(abc.ABC):
    @abc.abstractmethod
    def build(self, kernels: Sequence[KernelInfo], settings: dict) -> Library:
        """The library of ``kernels`` built with the user's ``settings`` (a compiler parses the ones
        it reads into its own options, ``backends.options``). One that also takes ``facts``
        (``backends.options.BuildFacts``: the matrix units, caches and storage types the driver
        knows) is given them by ``backends.options.build_library``."""


class Executor(abc.ABC):
    # allocate() gives HostBuffers that kernels read where they are: the runner may then hand a
    # numpy input to them in place (HostBuffer.over) instead of copying it
    host_memory: bool = False
    # the events of every operation report their ``duration``; an executor whose device times
    # only what runs inside ``profiled()`` (OpenCL: profiling may cost each enqueue) says False
    timed_by_default: bool = True

    def profiled(self) -> contextlib.AbstractContextManager:
        """A context inside which the operations enqueued have events that report their
        ``duration`` (the runner's ``profile()`` and ``TILE_DEBUG`` enter it)."""
        return contextlib.nullcontext()

    @abc.abstractmethod
    def allocate(self, size: int) -> Buffer: ...

    @abc.abstractmethod
    def copy(
        self,
        src: Buffer,
        src_offset: int,
        dst: Buffer,
        dst_offset: int,
        length: int,
        deps: Sequence[Event] = (),
    ) -> Event: ...

    @abc.abstractmethod
    def prepare(self, library: Library, index: int) -> Kernel: ...

    # -- raw calls (``backends.lane``): kernels on addresses a framework owns ---------------------
    # whether raw launches run on the calling thread (no stream; ``raw_point`` is always empty)
    raw_host = False

    def raw_launcher(self, kernel: Kernel) -> Callable[[tuple[int, ...], object], None] | None:
        """A function ``go(addresses, stream)`` running ``kernel`` on raw addresses (one per
        ``kernel.info.buffers``) on ``stream`` (``raw_stream``'s), or None where this executor
        cannot (the default)."""
        return None

    def raw_address(self, buffer: Buffer) -> int:
        """The address of one of this executor's buffers, for ``raw_launcher``'s functions."""
        raise NotImplementedError(f"{type(self).__name__} runs no kernels on raw addresses")

    def raw_stream(self) -> object:
        """Where the next raw launches go (CUDA: the caller's current stream); None on a host."""
        return None

    def raw_ready(self) -> bool:
        """Whether raw launches may run now (a host device: no general work still queued)."""
        return True

    def raw_after(self, events: Sequence[Event], stream: object) -> None:
        """Order what is launched next on ``stream`` after ``events`` (a general call's)."""
        wait_all(events)

    def raw_zero(self, address: int, nbytes: int, stream: object) -> None:
        """Zero ``nbytes`` at ``address``, ordered on ``stream``."""
        raise NotImplementedError(f"{type(self).__name__} runs no kernels on raw addresses")

    def raw_point(self, stream: object) -> list[Event]:
        """Events a general call waits for after raw launches on ``stream`` (none on a host: the
        launches ran)."""
        return []

    def raw_unmarked(self, point: list[Event]) -> bool:
        """Whether ``raw_point``'s ``point`` still stands for whatever is launched on its stream
        later too (so a lane may hand it out again instead of a new one)."""
        return True


class Device(abc.ABC):
    id: str  # e.g. "llvm_cpu.0", "opencl_gpu.0"
    description: str
    capabilities: Capabilities
    compiler: Compiler
    executor: Executor
    # The Stripe optimizer config this device compiles with: a built-in config's name
    # (stripe/targets/<optimizer>.json) or a config file's path (a plugin ships its own); empty:
    # none, the lowered program is compiled as it is (a new backend starts so).
    optimizer: str = ""

    @property
    def tiled_optimizer(self) -> str:
        """The built-in Stripe-tiled pipeline for this device (conformance runs it besides the
        default one): ``<optimizer>_tiled`` unless the backend names another."""
        return f"{self.optimizer}_tiled" if self.optimizer else ""

    def memory_bytes(self) -> MemoryLimit:
        """What memory this device has for buffers now (queried at each run: it may change);
        a backend that cannot tell says nothing, and only the settings' limits apply."""
        return MemoryLimit()

    def hardware(self, hw):
        """The config's hardware model (``stripe.hardware.Hardware``) with the sizes this device
        reports filled in; the config's defaults where it reports nothing."""
        return hw

    def tuning_space(self, library: Library) -> list[dict]:
        """Build settings worth timing for the program ``library`` holds (each merged into the
        settings of one trial build by ``backends.tune``); a backend without knobs has none."""
        return []


# STAGES (tile.capabilities): what a ProgramDevice may take (backends.program)


class ProgramDevice(abc.ABC):
    """A target that runs whole programs: it is handed the program as text at its ``stage``
    (Tile source, lowered Stripe text, or Stripe text optimized by its ``config``) and the input
    arrays, and returns the output arrays. ``tile.compile`` runs it through
    ``backends.program.ProgramRun``, which renders the program and checks what comes back. The
    shape of a backend in another process or language (``backends.external``), or of another
    Tile implementation (``backends.plaidml``)."""

    id: str
    description: str
    capabilities: Capabilities
    stage: str = "tile"
    config: str = ""  # for stage "optimized": the config the program is optimized by

    @abc.abstractmethod
    def execute(
        self,
        program: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, tuple[DType, tuple[int, ...]]],
    ) -> dict[str, np.ndarray]:
        """Run ``program`` (text at ``stage``) on ``inputs`` and return every output by name.
        ``outputs`` says what the program produces (dtype and shape of each), for a backend that
        wants to allocate them first. A failure of the target raises ``TileBackendError``; a
        program the target refuses as the interpreter would raises that ``TileError``."""

    def known_difference(self, source: str, problem: str) -> str | None:
        """Why this target is expected to differ from the interpreter on ``source`` (a documented
        semantic difference), or None. The conformance suite reports such a difference as an
        expected failure that names the reason instead of a failure."""
        return None

    def close(self) -> None:  # noqa: B027 - most devices hold nothing to release
        """Release what the device holds (a child process, say)."""


class Found(list):
    """What a ``tile.devices`` entry point may return: its devices, plus ``unavailable``, the
    devices it knows of but cannot offer and why (``{id or kind: reason}``), which
    ``python -m tile devices`` lists. A plain list or any iterable of devices does as well."""

    def __init__(self, devices=(), unavailable: dict[str, str] | None = None):
        super().__init__(devices)
        self.unavailable = dict(unavailable or {})


MAPPED_BYTES = 1 << 20  # host buffers from this size on are mappings of their own
LINE = 64  # bytes
HUGE_PAGE = 2 << 20


def host_zeros(nbytes: int) -> np.ndarray:
    """``nbytes`` of zeroed host memory for a buffer, starting on a cache line (``LINE``: vector
    loads and stores of a row never straddle two lines where the row does not). From
    ``MAPPED_BYTES`` on, a fresh anonymous mapping (huge pages asked for, used where the OS grants
    them), not malloc's memory: once a process has freed a large array, malloc serves the next
    ones from its heap, pages that other arrays used before, and on the 16-core VM host of
    bench/RESULTS.md an elementwise kernel reading and writing two such heap arrays ran 4x slower
    (26 ms against 7) than with its output in a mapping. The array is over a buffer object, not a
    view of another array: views of it keep it (and so its memory) alive, as ``np.zeros``'s do."""
    if nbytes < MAPPED_BYTES:
        return _aligned(bytearray(nbytes + LINE), nbytes, LINE)
    m = mmap.mmap(-1, nbytes + HUGE_PAGE)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without transparent huge pages: small pages then
            pass
    return _aligned(m, nbytes, HUGE_PAGE)  # (pages never touched cost nothing)


def _aligned(raw, nbytes: int, align: int) -> np.ndarray:
    start = -np.frombuffer(raw, dtype=np.uint8, count=1).ctypes.data % align
    return np.frombuffer(raw, dtype=np.uint8, count=nbytes, offset=start)


class HostBuffer(Buffer):
    """A buffer in host memory (for CPU devices): mapping is free."""

    def __init__(self, size: int):
        super().__init__(size)
        self.data = host_zeros(max(size, 1))

    @classmethod
    def over(cls, array: np.ndarray) -> HostBuffer:
        """A buffer over ``array``'s own memory (C-contiguous, aligned, not empty), not a copy: the
        runner hands a numpy input to host-memory kernels this way, and keeps ``array`` alive and
        unread by the caller until they finish."""
        assert array.flags.c_contiguous and array.flags.aligned and array.size, "a copy is needed"
        buf = cls.__new__(cls)
        Buffer.__init__(buf, array.nbytes)
        buf.data = array.reshape(-1).view(np.uint8)
        return buf

    def map_current(self, deps: Sequence[Event] = ()) -> np.ndarray:
        wait_all(deps)
        return self.data[: self.size]

    def map_discard(self, deps: Sequence[Event] = ()) -> np.ndarray:
        wait_all(deps)
        return self.data[: self.size]

    _at: int | None = None  # ``address``, once read (``data`` is set once, by the constructors)

    @property
    def address(self) -> int:
        at = self._at
        if at is None:  # (``__array_interface__`` builds a dict: 1 us; ``ctypes.data`` an object: 2 us)
            at = self._at = self.data.__array_interface__["data"][0]
        return at


def timed(pool: cf.Executor, deps: Sequence[Event], work: Callable[[], None]) -> Event:
    """Run ``work`` on ``pool`` after ``deps``; the event's duration is the work's own time."""

    def task() -> float:
        wait_all(deps)
        t = time.perf_counter()
        work()
        return time.perf_counter() - t

    return Event(pool.submit(task))
