"""The OpenCL executor: device buffers, copies and kernel launches on the device's in-order queue.

Every operation is enqueued at once and returns a ``CLEvent`` (a ``backends.hal.Event`` over the
OpenCL event). Its ``duration`` is the device's own start-to-end profile, which only commands
enqueued inside ``OpenCLExecutor.profiled()`` have: they go to a profiling queue
(``driver.Driver.profiling``), the others to a plain one, as profiling can cost each enqueue.
Dependencies that are OpenCL events of the same device are met by the device's in-order queue
(every command starts after the ones enqueued before it have finished; a switch between the plain
and the profiling queue finishes the one left), so they need no wait list; any other event is
waited for on the host first. A ``CLBuffer`` maps by copying: ``map_current`` reads the contents into a host
array, ``map_discard`` hands out a fresh one, and ``unmap`` writes a mapped array back (an array
of zeros becomes a fill on the device).

A kernel launches ``ceil(work_items / local) * local`` work-items in groups of ``local``
(``local_size`` setting, default 64, at most what the device allows); those past ``work_items``
return at once. A kernel with no work-item enqueues a marker, so events stay ordered. A
shape-generic kernel (``backends.clike.generic``) is its form's function, from the form's program,
with the library's integers set as arguments after the buffers.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager

import numpy as np
import pyopencl as cl

from backends.hal import Bound, Buffer, Event, Executor, Kernel, Library, check_copy, check_count
from backends.opencl.compiler import ProgramHandle
from backends.opencl.driver import Driver

_enqueue_nd_range = cl._cl.enqueue_nd_range_kernel  # (queue, kernel, global, local, offset, wait_for)


class CLEvent(Event):
    """An OpenCL event; ``duration`` comes from OpenCL profiling (seconds)."""

    def __init__(self, event: cl.Event, device: Driver, queue: cl.CommandQueue):
        self._future = None  # (Event's fields, set here: one of these is made per launch)
        self._duration = 0.0
        self.cl_event = event
        self.device = device
        self.queue = queue  # the queue it was enqueued on (the plain or the profiling one)

    def wait(self) -> CLEvent:
        self.cl_event.wait()
        return self

    @property
    def complete(self) -> bool:
        return self.cl_event.command_execution_status == cl.command_execution_status.COMPLETE

    @property
    def duration(self) -> float:
        """Seconds on the device; a command enqueued outside ``OpenCLExecutor.profiled()`` has no
        profile, and asking for it is an error (not a silent zero)."""
        self.wait()
        if not profiled(self.cl_event.command_queue):
            raise ValueError(
                "this OpenCL command was not profiled: enqueue it inside executor.profiled() "
                "to read its duration"
            )
        try:
            p = self.cl_event.profile
            return max(0, p.end - p.start) * 1e-9
        except cl.Error:  # markers may carry no profile
            return 0.0


def profiled(queue: cl.CommandQueue) -> bool:
    """Whether ``queue``'s events carry the device's start and end times."""
    return bool(queue.properties & cl.command_queue_properties.PROFILING_ENABLE)


def wait_list(queue: cl.CommandQueue, deps: Sequence[Event]) -> list[cl.Event]:
    """What a command enqueued on ``queue`` must list to wait for ``deps``: nothing, as the queue
    is in order and runs those of its own events (``in_order``); the other events (another
    device's, or the device's other queue's: a thread may switch queues meanwhile, see
    ``Driver.profiling``) are waited for here."""
    for e in deps:
        if not (isinstance(e, CLEvent) and e.queue is queue):
            e.wait()
    return []


def in_order(queue: cl.CommandQueue) -> bool:
    """Whether ``queue`` runs its commands one after another (``wait_list`` relies on it)."""
    return not queue.properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE


class CLBuffer(Buffer):
    def __init__(self, device: Driver, size: int):
        super().__init__(size)
        self.device = device
        self.buf = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, max(size, 1))

    def map_current(self, deps: Sequence[Event] = ()) -> np.ndarray:
        host = np.empty(self.size, dtype=np.uint8)
        queue = self.device.queue
        waits = wait_list(queue, deps)
        if self.size:
            cl.enqueue_copy(queue, host, self.buf, wait_for=waits, is_blocking=True)
        return host

    def map_discard(self, deps: Sequence[Event] = ()) -> np.ndarray:
        for e in deps:
            e.wait()
        return np.zeros(self.size, dtype=np.uint8)

    def write(self, data: np.ndarray, deps: Sequence[Event] = ()) -> Event:
        """A blocking copy from ``data`` (so the caller may change it at once), after ``deps``."""
        data = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
        assert data.size == self.size, (data.size, self.size)
        queue = self.device.queue
        waits = wait_list(queue, deps)
        if not self.size:
            return Event.done()
        ev = cl.enqueue_copy(queue, self.buf, data, wait_for=waits or None, is_blocking=True)
        return CLEvent(ev, self.device, queue)

    def zero(self, deps: Sequence[Event] = ()) -> Event:
        """A fill on the device: nothing crosses the bus."""
        queue = self.device.queue
        waits = wait_list(queue, deps)
        if not self.size:
            return Event.done()
        ev = cl.enqueue_fill_buffer(queue, self.buf, np.uint8(0), 0, self.size, wait_for=waits or None)
        return CLEvent(ev, self.device, queue)

    def read(self, deps: Sequence[Event] = ()) -> np.ndarray:
        return self.map_current(deps)  # already a fresh host array

    def unmap(self, view: np.ndarray) -> Event:
        data = np.ascontiguousarray(view, dtype=np.uint8).reshape(-1)
        if not data.size:
            return Event.done()
        assert data.size == self.size, (data.size, self.size)
        queue = self.device.queue
        if not data.any():  # zeros (a fresh output or temporary): filled on the device, not copied
            ev = cl.enqueue_fill_buffer(queue, self.buf, np.uint8(0), 0, self.size)
        else:
            ev = cl.enqueue_copy(queue, self.buf, data, is_blocking=False)
        return CLEvent(ev, self.device, queue)


class OpenCLKernel(Kernel):
    def __init__(self, device: Driver, library: Library, index: int):
        self.device = device
        self.library = library
        self.info = library.kernels[index]
        self.index = index
        self.handle: ProgramHandle = library.handle
        self.name = self.handle.names[index]
        self.work_items = self.handle.work_items[index]
        self.values: tuple = ()  # a shape-generic kernel's run-time integers (arguments after its buffers)
        use = (library.extra.get("generic") or {}).get("uses", {}).get(index)
        if use is not None:  # its form's program (``backends.clike.generic``)
            self.handle = use.form.program
            self.values = tuple(np.int64(v) for v in use.values)
        self.local = 1
        self._kernel: cl.Kernel | None = None
        self._queue: cl.CommandQueue | None = None
        self._sizes: tuple[tuple[int], tuple[int]] = ((0,), (1,))  # global and local size
        self._enqueue: tuple = ()  # enqueue_nd_range_kernel's positional arguments (``kernel``)
        self._args: object = None  # the CLBound whose buffers are the kernel's arguments now
        self._lock = threading.Lock()

    def kernel(self) -> cl.Kernel:
        """The OpenCL kernel (waits for the program's build the first time)."""
        with self._lock:
            if self._kernel is None:
                k = cl.Kernel(self.handle.program(), self.name)
                wg = k.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, self.device.cl_device)
                want = int(self.library.extra.get("local_size", 64))
                self.local = max(1, min(want, int(wg), self.device.max_work_group))
                need = (self.library.extra.get("local_sizes") or [])[self.index:self.index + 1]
                if need and need[0]:  # a tiled kernel's reqd_work_group_size
                    self.local = int(need[0])
                self._sizes = ((-(-self.work_items // self.local) * self.local,), (self.local,))
                self._queue = self.device.plain  # (``launch`` takes the profiling one when in use)
                assert in_order(self._queue), "wait_list leaves the device's own events to the queue"
                # no wait list: ``wait_list`` leaves none (pyopencl parses positional arguments faster)
                self._enqueue = (self._queue, k, *self._sizes, None, None)
                self._kernel = k
            return self._kernel

    def check(self, params: Sequence[Buffer]) -> None:
        """One CLBuffer of this device per parameter, all distinct."""
        check_count(self.info, params)
        for p in params:
            if not isinstance(p, CLBuffer) or p.device is not self.device:
                raise TypeError(f"kernel '{self.info.name}' runs on CLBuffers of {self.device.id}")
        if len({id(p) for p in params}) != len(params):
            raise ValueError(f"kernel '{self.info.name}' needs distinct buffers (they are restrict)")

    def bind(self, params: Sequence[Buffer]) -> CLBound:
        self.check(params)
        return CLBound(self, params)

    def run(self, params: Sequence[Buffer], deps: Sequence[Event] = ()) -> Event:
        return self.bind(params).launch(params, deps)


class CLBound(Bound):
    """An OpenCL kernel bound to its buffers: checked once, and its arguments set again only when
    another binding (or a plain ``run``, which binds afresh) of the same kernel set others since."""

    __slots__ = ()

    def launch(self, params: Sequence[Buffer], deps: Sequence[Event] = ()) -> Event:
        """Enqueue a run on ``params`` after ``deps``, setting the arguments unless this binding
        set them last."""
        kernel: OpenCLKernel = self.kernel  # type: ignore[assignment]
        k = kernel._kernel if kernel._kernel is not None else kernel.kernel()
        device = kernel.device
        if device.cuda_pending is not None:  # a kernel launched through CUDA runs first
            device.settle()
        queue = device._queue  # the plain queue, or the profiling one (``Driver.profiling``)
        for e in deps:  # (``wait_list`` inline: it leaves no list, see ``OpenCLKernel._enqueue``)
            if type(e) is not CLEvent or e.queue is not queue:  # type: ignore[attr-defined]
                e.wait()
        if kernel.work_items == 0:
            return CLEvent(cl.enqueue_marker(queue), device, queue)
        with kernel._lock:
            if kernel._args is not self:
                k.set_args(*(p.buf for p in params), *kernel.values)  # type: ignore[attr-defined]
                kernel._args = self  # (held: no other binding is made at this address meanwhile)
            if queue is kernel._queue:
                ev = _enqueue_nd_range(*kernel._enqueue)
            else:
                ev = _enqueue_nd_range(queue, k, *kernel._sizes, None, None)
        return CLEvent(ev, device, queue)


class OpenCLExecutor(Executor):
    timed_by_default = False  # durations only inside ``profiled()``

    def __init__(self, device: Driver):
        self.device = device

    def profiled(self) -> AbstractContextManager:
        """Commands enqueued inside go to the device's profiling queue: their events have a
        ``duration`` (``driver.Driver.profiling``: the queues are finished at each switch)."""
        return self.device.profiling()

    def allocate(self, size: int) -> CLBuffer:
        return CLBuffer(self.device, size)

    def copy(
        self,
        src: Buffer,
        src_offset: int,
        dst: Buffer,
        dst_offset: int,
        length: int,
        deps: Sequence[Event] = (),
    ) -> Event:
        if not isinstance(src, CLBuffer) or not isinstance(dst, CLBuffer):
            raise TypeError("OpenCL copies are between CLBuffers")
        check_copy(src, src_offset, dst, dst_offset, length)
        queue = self.device.queue
        waits = wait_list(queue, deps)
        if length == 0:
            return CLEvent(cl.enqueue_marker(queue, wait_for=waits or None), self.device, queue)
        ev = cl.enqueue_copy(
            queue,
            dst.buf,
            src.buf,
            byte_count=length,
            src_offset=src_offset,
            dst_offset=dst_offset,
            wait_for=waits or None,
        )
        return CLEvent(ev, self.device, queue)

    def prepare(self, library: Library, index: int) -> OpenCLKernel:
        return OpenCLKernel(self.device, library, index)
