"""A parallel-for in native code: chunks handed to worker threads without Python in between.

A Python pool costs every chunk a queue hand-off and every worker two GIL acquisitions (wake up,
report back); with 16 threads that was about 0.3 ms per kernel, longer than small kernels run.
Here each worker thread makes one ctypes call, ``tile_worker(slot)``, that never returns (daemon
threads, as the Python pool's) (ctypes released the GIL): it waits on its slot's POSIX semaphore, runs its
chunks, posts the shared ``done`` semaphore and waits again. ``tile_parallel`` (one ctypes call
from the dispatcher) fills each slot, posts it, runs its own share of the chunks and waits for
the workers (a kernel function cannot raise: no error comes back). Chunk ``k`` runs on runner
``k % runners``: runner 0 is the calling thread, runner ``w`` worker ``w``, the same every call.

Slot layout (bytes): ``[0, 64)`` the worker's semaphore, then 8-byte fields: done semaphore,
kernel function (null: the worker returns), buffer table, ranges (``lo, hi`` pairs of i64),
first chunk, chunk count, step. Needs ``sem_init``/``sem_wait``/``sem_post`` in the process
(glibc, musl); ``available()`` says whether they are there, else the device keeps its Python pool.
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from collections.abc import Callable

import llvmlite.binding as llvm
from llvmlite import ir

from backends.llvm.loops import counted_loop

SEM_BYTES = 64  # sem_t is 32 bytes on 64-bit glibc, 16 on musl
SLOT_BYTES = SEM_BYTES + 7 * 8
_F_DONE, _F_FN, _F_TABLE, _F_RANGES, _F_FIRST, _F_COUNT, _F_STEP = (SEM_BYTES + 8 * k for k in range(7))

_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
_PTR = ir.PointerType()
_KERNEL = ir.FunctionType(ir.VoidType(), [_PTR, _I64, _I64])

_lock = threading.Lock()
_runtime: tuple | None = None  # (engine, worker address, parallel address), built once


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        for name in ("sem_init", "sem_wait", "sem_post", "sem_destroy"):
            getattr(libc, name)
        return libc
    except (OSError, AttributeError):
        return None


def available() -> bool:
    return _libc() is not None


def _field(b: ir.IRBuilder, slot: ir.Value, offset: int) -> ir.Value:
    return b.gep(slot, [ir.Constant(_I64, offset)], source_etype=_I8)


def _module() -> str:
    m = ir.Module(name="tile_threads")
    m.triple = llvm.get_process_triple()
    sem_wait = ir.Function(m, ir.FunctionType(_I32, [_PTR]), "sem_wait")
    sem_post = ir.Function(m, ir.FunctionType(_I32, [_PTR]), "sem_post")

    def wait(b: ir.IRBuilder, sem: ir.Value) -> None:
        """``while (sem_wait(sem) != 0) {}``: a signal interrupts the wait with EINTR."""
        fn = b.block.function
        again, done = fn.append_basic_block(), fn.append_basic_block()
        b.branch(again)
        b.position_at_end(again)
        r = b.call(sem_wait, [sem])
        b.cbranch(b.icmp_signed("!=", r, ir.Constant(_I32, 0)), again, done)
        b.position_at_end(done)

    def chunks(b, kernel, table, ranges, first, count, step) -> None:
        def one(k):
            lo = b.load(b.gep(ranges, [b.mul(k, ir.Constant(_I64, 2))], source_etype=_I64), typ=_I64)
            hi_at = b.add(b.mul(k, ir.Constant(_I64, 2)), ir.Constant(_I64, 1))
            hi = b.load(b.gep(ranges, [hi_at], source_etype=_I64), typ=_I64)
            b.call(kernel, [table, lo, hi])

        counted_loop(b, first, count, one, step)

    def load(b, slot, offset, typ=_PTR):
        return b.load(_field(b, slot, offset), typ=typ)

    # void tile_worker(ptr slot)
    worker = ir.Function(m, ir.FunctionType(ir.VoidType(), [_PTR]), "tile_worker")
    (slot,) = worker.args
    b = ir.IRBuilder(worker.append_basic_block("entry"))
    top = worker.append_basic_block("top")
    b.branch(top)
    b.position_at_end(top)
    wait(b, slot)
    kernel = load(b, slot, _F_FN)
    run, stop = worker.append_basic_block("run"), worker.append_basic_block("stop")
    b.cbranch(b.icmp_unsigned("==", b.ptrtoint(kernel, _I64), ir.Constant(_I64, 0)), stop, run)
    b.position_at_end(stop)
    b.ret_void()
    b.position_at_end(run)
    args = [load(b, slot, f, t) for f, t in ((_F_TABLE, _PTR), (_F_RANGES, _PTR))]
    nums = [load(b, slot, f, _I64) for f in (_F_FIRST, _F_COUNT, _F_STEP)]
    chunks(b, _Callee(kernel), *args, *nums)
    b.call(sem_post, [load(b, slot, _F_DONE)])
    b.branch(top)

    # void tile_parallel(ptr slots, i64 workers, ptr done, ptr kernel, ptr table, ptr ranges, i64 count)
    par_ty = ir.FunctionType(ir.VoidType(), [_PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64])
    par = ir.Function(m, par_ty, "tile_parallel")
    slots, workers, done, kernel, table, ranges, count = par.args
    b = ir.IRBuilder(par.append_basic_block("entry"))
    one = ir.Constant(_I64, 1)
    step = b.add(workers, one)
    busy = b.select(b.icmp_signed("<", b.sub(count, one), workers), b.sub(count, one), workers)

    def post(w):
        s = b.gep(slots, [b.mul(w, ir.Constant(_I64, SLOT_BYTES))], source_etype=_I8)
        for f, v in ((_F_DONE, done), (_F_FN, kernel), (_F_TABLE, table), (_F_RANGES, ranges)):
            b.store(v, _field(b, s, f))
        for f, v in ((_F_FIRST, b.add(w, one)), (_F_COUNT, count), (_F_STEP, step)):
            b.store(v, _field(b, s, f))
        b.call(sem_post, [s])

    counted_loop(b, ir.Constant(_I64, 0), busy, post, one)
    chunks(b, _Callee(kernel), table, ranges, ir.Constant(_I64, 0), count, step)
    counted_loop(b, ir.Constant(_I64, 0), busy, lambda _w: wait(b, done), one)
    b.ret_void()
    return str(m)


class _Callee:
    """An indirect call target with the kernel's signature, for ``IRBuilder.call``."""

    function_type = _KERNEL

    def __init__(self, ptr: ir.Value):
        self.ptr = ptr

    def get_reference(self) -> str:
        return self.ptr.get_reference()


def _build() -> tuple:
    global _runtime
    with _lock:
        if _runtime is None:
            from backends.llvm.device import _host, _target_machine

            mod = llvm.parse_assembly(_module())
            mod.verify()
            engine = llvm.create_mcjit_compiler(mod, _target_machine(*_host()))
            engine.finalize_object()
            _runtime = (
                engine,
                mod,
                engine.get_function_address("tile_worker"),
                engine.get_function_address("tile_parallel"),
            )
        return _runtime


_WORKER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_PARALLEL = ctypes.CFUNCTYPE(
    None,
    ctypes.c_void_p,
    ctypes.c_int64,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_int64,
)


class NativePool:
    """``workers`` native worker threads plus the calling thread: ``run`` spreads a kernel's
    chunks over ``workers + 1`` runners. Threads start at the first ``run``; ``start_thread``
    makes one (the device gives them large stacks)."""

    def __init__(self, workers: int, start_thread: Callable[[Callable[[], None]], threading.Thread]):
        self.workers = max(0, workers)
        self._start_thread = start_thread
        self._fresh()
        # a forked child has none of the threads: it starts its own, on fresh semaphores
        me = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (p := me()) is not None and p._fresh())

    def _fresh(self) -> None:
        self._slots = (ctypes.c_char * (SLOT_BYTES * max(1, self.workers)))()
        self._done = (ctypes.c_char * SEM_BYTES)()
        self._started = False
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._idents: list[int] = []

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            libc = _libc()
            assert libc is not None
            _, _, worker, parallel = _build()
            self._parallel = _PARALLEL(parallel)
            base = ctypes.addressof(self._slots)
            libc.sem_init(ctypes.c_void_p(ctypes.addressof(self._done)), 0, 0)
            ready = threading.Barrier(self.workers + 1)
            idents: dict[int, int] = {}
            loop = _WORKER(worker)
            for w in range(self.workers):
                slot = base + w * SLOT_BYTES
                libc.sem_init(ctypes.c_void_p(slot), 0, 0)

                def body(w: int = w, slot: int = slot, keep=(self._slots, self._done)) -> None:
                    idents[w] = threading.get_ident()
                    ready.wait()
                    loop(slot)  # waits for work for the process's life (daemon threads); keep: the
                    # slots and semaphores it waits on outlive this pool object

                self._start_thread(body)
            ready.wait()
            self._idents = [idents[w] for w in range(self.workers)]
            self._started = True

    def run(self, fn_address: int, table: ctypes.Array, chunks: list[tuple[int, int]]) -> list[int]:
        """Run the kernel at ``fn_address`` on every ``(lo, hi)`` chunk; the thread id per chunk."""
        self._start()
        ranges = (ctypes.c_int64 * (2 * len(chunks)))(*[v for c in chunks for v in c])
        self._parallel(
            ctypes.addressof(self._slots),
            self.workers,
            ctypes.addressof(self._done),
            fn_address,
            ctypes.addressof(table),
            ctypes.addressof(ranges),
            len(chunks),
        )
        runners = [threading.get_ident(), *self._idents]
        return [runners[k % len(runners)] for k in range(len(chunks))]
