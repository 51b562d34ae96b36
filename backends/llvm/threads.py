"""A parallel-for in native code: chunks handed to worker threads without Python in between.

A Python pool costs every chunk a queue hand-off and every worker two GIL acquisitions (wake up,
report back); with 16 threads that was about 0.3 ms per kernel, longer than small kernels run.
Here each worker thread makes one ctypes call, ``tile_worker(slot)``, that never returns (daemon
threads, as the Python pool's) (ctypes released the GIL). ``tile_parallel`` (one ctypes call
from the dispatcher) fills each busy worker's slot, publishes it by bumping the slot's sequence
number, runs its own share of the chunks and waits until the shared ``remaining`` count of busy
workers is zero (a kernel function cannot raise: no error comes back). Chunk ``k`` runs on runner
``k % runners``: runner 0 is the calling thread, runner ``w`` worker ``w``, the same every call,
unless the worker was late (below).

**A late worker's chunks.** A worker the operating system has not scheduled (its core busy with
another process's thread, or PyTorch's OpenMP threads spinning between the operations around a
``tile.torch`` call) would hold the call up for a whole time slice, milliseconds, for chunks that
take microseconds: through ``tile.torch`` with PyTorch's two threads on two cores, the attention's
forward + backward at S = 304 took 11.8 ms a call against 2.9 ms with PyTorch on one thread. So a
post is *taken*: a worker runs its chunks only after it moves its slot's sequence number from odd
(posted) to even by a compare-and-swap; the dispatcher, once its own chunks are done and
``STEAL_NS`` have passed with workers still out, makes the same swap on every slot still posted
and runs those chunks itself (marking the slot ``stolen`` for ``run``'s report). Whoever swaps
first runs them, exactly once; a worker that wakes to an even number goes back to watching. The
dispatcher writes a slot only while no run is in flight, so a worker that won the swap reads the
fields of its own run.

**Waking.** A worker that finished watches its sequence number for ``SPIN_NS`` (yielding the
CPU between looks) before it sleeps on its POSIX semaphore: the kernels of one call, and the
calls of a loop, follow each other closely, and a sleeping thread takes tens of microseconds to
wake (a semaphore post is a system call, more under a hypervisor) where a 2-thread max pool runs
40. Sleeping is a handshake that loses no wake-up and leaves no stray post: the worker sets its
``sleeping`` flag, then reads the sequence number; the dispatcher bumps the number, then swaps
the flag to 0 and posts only if it was 1 (sequentially consistent atomics: one of the two sees
the other). A worker that finds new work after setting the flag swaps it back; if the dispatcher
got there first, a post is coming, and the worker takes it. The dispatcher itself waits for
``remaining`` by the same yielding look.

Slot layout (bytes): ``[0, 64)`` the worker's semaphore, then 8-byte fields: the ``remaining``
counter's address, kernel function (null: the worker returns), buffer table, ranges (``lo, hi``
pairs of i64), first chunk, chunk count, step, sequence number (odd: posted, not yet taken),
sleeping flag, stolen flag (the dispatcher's, for ``run``). Needs
``sem_init``/``sem_wait``/``sem_post``, ``sched_yield`` and ``clock_gettime`` in the process
(glibc, musl); ``available()`` says whether they are there, else the device keeps its Python
pool.
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from collections.abc import Callable

import llvmlite.binding as llvm
from llvmlite import ir

from backends.hal import LINE
from backends.llvm.cache import ObjectCache, runtime_key
from backends.llvm.host import host_target, target_machine
from backends.llvm.loops import counted_loop
from backends.llvm.scalars import declare_function

SEM_BYTES = 64  # sem_t is 32 bytes on 64-bit glibc, 16 on musl
# slots and the counter start on cache lines (``LINE``) of their own: a worker watching its slot
SLOT_BYTES = 3 * LINE  # is not disturbed by the dispatcher writing the next one
_F_DONE, _F_FN, _F_TABLE, _F_RANGES, _F_FIRST, _F_COUNT, _F_STEP, _F_SEQ, _F_SLEEPING, _F_STOLEN = (
    SEM_BYTES + 8 * k for k in range(10)
)
SPIN_NS = 250_000  # how long a finished worker watches for more work before it sleeps
# how long the dispatcher, its own chunks done, waits for workers that have not taken their post
# before it runs their chunks itself: above a sleeping worker's wake-up (tens of microseconds),
# far below a time slice
STEAL_NS = 100_000
_CLOCK_MONOTONIC = 1  # Linux's clockid_t

_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
_PTR = ir.PointerType()
_KERNEL = ir.FunctionType(ir.VoidType(), [_PTR, _I64, _I64])

_lock = threading.Lock()
_runtimes: dict[tuple, tuple] = {}  # by watch and steal times: (engine, module, worker, parallel), built once


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        for name in ("sem_init", "sem_wait", "sem_post", "sem_destroy", "sched_yield", "clock_gettime"):
            getattr(libc, name)
        return libc
    except (OSError, AttributeError):
        return None


def available() -> bool:
    return _libc() is not None


def _field(b: ir.IRBuilder, slot: ir.Value, offset: int) -> ir.Value:
    return b.gep(slot, [ir.Constant(_I64, offset)], source_etype=_I8)


def _module(spin_ns: int, steal_ns: int) -> str:
    m = ir.Module(name="tile_threads")
    m.triple = llvm.get_process_triple()
    sem_wait = declare_function(m, "sem_wait", _I32, [_PTR])
    sem_post = declare_function(m, "sem_post", _I32, [_PTR])
    sched_yield = declare_function(m, "sched_yield", _I32, [])
    clock_gettime = declare_function(m, "clock_gettime", _I32, [_I32, _PTR])
    zero, one = ir.Constant(_I64, 0), ir.Constant(_I64, 1)

    def wait(b: ir.IRBuilder, sem: ir.Value) -> None:
        """``while (sem_wait(sem) != 0) {}``: a signal interrupts the wait with EINTR."""
        fn = b.block.function
        again, done = fn.append_basic_block(), fn.append_basic_block()
        b.branch(again)
        b.position_at_end(again)
        r = b.call(sem_wait, [sem])
        b.cbranch(b.icmp_signed("!=", r, ir.Constant(_I32, 0)), again, done)
        b.position_at_end(done)

    def now_ns(b: ir.IRBuilder, ts: ir.Value) -> ir.Value:
        b.call(clock_gettime, [ir.Constant(_I32, _CLOCK_MONOTONIC), ts])
        sec = b.load(ts, typ=_I64)
        nsec = b.load(b.gep(ts, [one], source_etype=_I64), typ=_I64)
        return b.add(b.mul(sec, ir.Constant(_I64, 1_000_000_000)), nsec)

    def chunks(b, kernel, table, ranges, first, count, step) -> None:
        def one_chunk(k):
            lo = b.load(b.gep(ranges, [b.mul(k, ir.Constant(_I64, 2))], source_etype=_I64), typ=_I64)
            hi_at = b.add(b.mul(k, ir.Constant(_I64, 2)), one)
            hi = b.load(b.gep(ranges, [hi_at], source_etype=_I64), typ=_I64)
            b.call(kernel, [table, lo, hi])

        counted_loop(b, first, count, one_chunk, step)

    def claim(b: ir.IRBuilder, seq_at: ir.Value, taken: ir.Block, missed: ir.Block) -> None:
        """Take a post (its sequence number odd -> even, by compare-and-swap) and branch to
        ``taken``; to ``missed`` when there is none or another runner took it first."""
        seen = b.load_atomic(seq_at, "acquire", 8, typ=_I64)
        swap = b.block.function.append_basic_block("swap")
        b.cbranch(b.icmp_unsigned("==", b.and_(seen, one), one), swap, missed)
        b.position_at_end(swap)
        pair = b.cmpxchg(seq_at, seen, b.add(seen, one), "seq_cst", "seq_cst")
        b.cbranch(b.extract_value(pair, 1), taken, missed)

    def load(b, slot, offset, typ=_PTR):
        return b.load(_field(b, slot, offset), typ=typ)

    # void tile_worker(ptr slot)
    worker = ir.Function(m, ir.FunctionType(ir.VoidType(), [_PTR]), "tile_worker")
    (slot,) = worker.args
    b = ir.IRBuilder(worker.append_basic_block("entry"))
    names = ("top", "spin", "look", "sleep", "cancel", "asleep", "got", "run", "stop")
    top, spin, look, sleep, cancel, asleep, got, run, stop = (worker.append_basic_block(n) for n in names)
    ts = b.alloca(_I64, 2)  # struct timespec
    seq_at, sleeping_at = _field(b, slot, _F_SEQ), _field(b, slot, _F_SLEEPING)

    def posted(b: ir.IRBuilder, order: str) -> ir.Value:  # an odd sequence number: work not yet taken
        return b.icmp_unsigned("==", b.and_(b.load_atomic(seq_at, order, 8, typ=_I64), one), one)

    b.branch(top)
    b.position_at_end(top)
    start = now_ns(b, ts)
    b.branch(look)
    b.position_at_end(look)  # new work? else yield, and look again until spin_ns passed
    b.cbranch(posted(b, "acquire"), got, spin)
    b.position_at_end(spin)
    b.call(sched_yield, [])
    b.cbranch(b.icmp_signed("<", b.sub(now_ns(b, ts), start), ir.Constant(_I64, spin_ns)), look, sleep)
    b.position_at_end(sleep)  # the handshake of the module docstring
    b.atomic_rmw("xchg", sleeping_at, one, "seq_cst")  # a seq_cst store (x86 makes one an xchg)
    b.cbranch(posted(b, "seq_cst"), cancel, asleep)
    b.position_at_end(cancel)
    was = b.atomic_rmw("xchg", sleeping_at, zero, "seq_cst")
    b.cbranch(b.icmp_unsigned("==", was, one), got, asleep)  # 0: the dispatcher is posting
    b.position_at_end(asleep)
    wait(b, slot)
    b.branch(got)
    b.position_at_end(got)  # take the post, unless it is not there or was stolen
    mine = worker.append_basic_block("mine")
    claim(b, seq_at, mine, top)
    b.position_at_end(mine)
    kernel = load(b, slot, _F_FN)
    b.cbranch(b.icmp_unsigned("==", b.ptrtoint(kernel, _I64), zero), stop, run)
    b.position_at_end(stop)
    b.ret_void()
    b.position_at_end(run)
    args = [load(b, slot, f, t) for f, t in ((_F_TABLE, _PTR), (_F_RANGES, _PTR))]
    nums = [load(b, slot, f, _I64) for f in (_F_FIRST, _F_COUNT, _F_STEP)]
    chunks(b, _Callee(kernel), *args, *nums)
    b.atomic_rmw("sub", load(b, slot, _F_DONE), one, "release")
    b.branch(top)

    # void tile_parallel(ptr slots, i64 workers, ptr remaining, ptr kernel, ptr table, ptr ranges, i64 count)
    par_ty = ir.FunctionType(ir.VoidType(), [_PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64])
    par = ir.Function(m, par_ty, "tile_parallel")
    slots, workers, remaining, kernel, table, ranges, count = par.args
    b = ir.IRBuilder(par.append_basic_block("entry"))
    step = b.add(workers, one)
    busy = b.select(b.icmp_signed("<", b.sub(count, one), workers), b.sub(count, one), workers)
    b.store(busy, remaining)  # published by each worker's sequence number (seq_cst)

    def slot_of(w):
        return b.gep(slots, [b.mul(w, ir.Constant(_I64, SLOT_BYTES))], source_etype=_I8)

    def post(w):
        s = slot_of(w)
        b.store(zero, _field(b, s, _F_STOLEN))
        for f, v in ((_F_DONE, remaining), (_F_FN, kernel), (_F_TABLE, table), (_F_RANGES, ranges)):
            b.store(v, _field(b, s, f))
        for f, v in ((_F_FIRST, b.add(w, one)), (_F_COUNT, count), (_F_STEP, step)):
            b.store(v, _field(b, s, f))
        seq_at = _field(b, s, _F_SEQ)
        b.atomic_rmw("add", seq_at, one, "seq_cst")
        was = b.atomic_rmw("xchg", _field(b, s, _F_SLEEPING), zero, "seq_cst")
        fn = b.block.function
        wake, on = fn.append_basic_block("wake"), fn.append_basic_block("on")
        b.cbranch(b.icmp_unsigned("==", was, one), wake, on)
        b.position_at_end(wake)
        b.call(sem_post, [s])
        b.branch(on)
        b.position_at_end(on)

    counted_loop(b, zero, busy, post, one)
    chunks(b, _Callee(kernel), table, ranges, zero, count, step)
    ts = b.alloca(_I64, 2)
    start = now_ns(b, ts)
    names = ("look", "pause", "steal", "done")
    look, pause, steal, done = (par.append_basic_block(n) for n in names)
    stole = b.alloca(_I8)  # the late workers' posts were taken over (once a call)
    b.store(ir.Constant(_I8, 0), stole)
    b.branch(look)
    b.position_at_end(look)
    b.cbranch(b.icmp_unsigned("==", b.load_atomic(remaining, "acquire", 8, typ=_I64), zero), done, pause)
    b.position_at_end(pause)
    b.call(sched_yield, [])
    late = b.and_(b.icmp_unsigned("==", b.load(stole, typ=_I8), ir.Constant(_I8, 0)),
                  b.icmp_signed(">=", b.sub(now_ns(b, ts), start), ir.Constant(_I64, steal_ns)))
    b.cbranch(late, steal, look)
    b.position_at_end(steal)
    b.store(ir.Constant(_I8, 1), stole)

    def take_over(w):
        s = slot_of(w)
        run, on = (b.block.function.append_basic_block(n) for n in ("run", "on"))
        claim(b, _field(b, s, _F_SEQ), run, on)
        b.position_at_end(run)
        b.store(one, _field(b, s, _F_STOLEN))
        chunks(b, _Callee(kernel), table, ranges, b.add(w, one), count, step)
        b.atomic_rmw("sub", remaining, one, "release")
        b.branch(on)
        b.position_at_end(on)

    counted_loop(b, zero, busy, take_over, one)
    b.branch(look)
    b.position_at_end(done)
    b.ret_void()
    return str(m)


class _Callee:
    """An indirect call target with the kernel's signature, for ``IRBuilder.call``."""

    function_type = _KERNEL

    def __init__(self, ptr: ir.Value):
        self.ptr = ptr

    def get_reference(self) -> str:
        return self.ptr.get_reference()


def _build(spin_ns: int, steal_ns: int) -> tuple:
    with _lock:
        if (spin_ns, steal_ns) not in _runtimes:
            engine, mod = _jit(_module(spin_ns, steal_ns))
            _runtimes[spin_ns, steal_ns] = (
                engine,
                mod,
                engine.get_function_address("tile_worker"),
                engine.get_function_address("tile_parallel"),
            )
        return _runtimes[spin_ns, steal_ns]


def _jit(text: str) -> tuple[llvm.ExecutionEngine, llvm.ModuleRef]:
    """An engine over the runtime's IR ``text``: its object code from the disk cache where an
    earlier process built it (about 20 ms of LLVM saved at a process's first split kernel), else
    built and stored there (``backends.llvm.cache``: a bad entry is a miss)."""
    cpu, features = host_target()
    tm = target_machine(cpu, features)
    cache = ObjectCache(runtime_key(text, cpu, features))
    obj = cache.load()
    if obj is not None:
        mod = llvm.parse_assembly(f'target triple = "{llvm.get_process_triple()}"\n'
                                  f'target datalayout = "{tm.target_data}"\n')
        engine = llvm.create_mcjit_compiler(mod, tm)
        engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
    else:
        mod = llvm.parse_assembly(text)
        mod.verify()
        engine = llvm.create_mcjit_compiler(mod, tm)
        engine.set_object_cache(lambda _m, data: cache.store(data), lambda _m: None)
    engine.finalize_object()
    return engine, mod


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

    def __init__(
        self,
        workers: int,
        start_thread: Callable[[Callable[[], None]], threading.Thread],
        spin_ns: int = SPIN_NS,
        steal_ns: int = STEAL_NS,
    ):
        self.workers = max(0, workers)
        self.spin_ns = spin_ns  # how long a finished worker watches for more work
        self.steal_ns = steal_ns  # how long the dispatcher waits for a late worker (module docstring)
        self._start_thread = start_thread
        self._fresh()
        # a forked child has none of the threads: it starts its own, on fresh semaphores
        me = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (p := me()) is not None and p._fresh())

    def _fresh(self) -> None:
        self._memory = (ctypes.c_char * (SLOT_BYTES * max(1, self.workers) + 3 * LINE))()
        start = ctypes.addressof(self._memory)
        self._base = start + (-start) % LINE  # the slots, then the ``remaining`` counter's line
        self._remaining = self._base + SLOT_BYTES * max(1, self.workers)
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
            _, _, worker, parallel = _build(self.spin_ns, self.steal_ns)
            self._parallel = _PARALLEL(parallel)
            base = self._base
            ready = threading.Barrier(self.workers + 1)
            idents: dict[int, int] = {}
            loop = _WORKER(worker)
            for w in range(self.workers):
                slot = base + w * SLOT_BYTES
                libc.sem_init(ctypes.c_void_p(slot), 0, 0)

                def body(w: int = w, slot: int = slot, keep=self._memory) -> None:
                    idents[w] = threading.get_ident()
                    ready.wait()
                    loop(slot)  # waits for work for the process's life (daemon threads); keep: the
                    # slots and semaphores it waits on outlive this pool object

                self._start_thread(body)
            ready.wait()
            self._idents = [idents[w] for w in range(self.workers)]
            self._started = True

    def run(self, fn_address: int, table: ctypes.Array, chunks: list[tuple[int, int]]) -> list[int]:
        """Run the kernel at ``fn_address`` on every ``(lo, hi)`` chunk; the thread id per chunk
        (the caller's for a late worker's, which it ran)."""
        self._start()
        ranges = (ctypes.c_int64 * (2 * len(chunks)))(*[v for c in chunks for v in c])
        with self._run_lock:  # one kernel at a time: callers on two threads share the slots
            self._parallel(
                self._base,
                self.workers,
                self._remaining,
                fn_address,
                ctypes.addressof(table),
                ctypes.addressof(ranges),
                len(chunks),
            )
            me, busy = threading.get_ident(), min(len(chunks) - 1, self.workers)
            runners = [me] + [me if w < busy and self._stolen(w) else t for w, t in enumerate(self._idents)]
        return [runners[k % len(runners)] for k in range(len(chunks))]

    def _stolen(self, w: int) -> bool:
        return bool(ctypes.c_int64.from_address(self._base + w * SLOT_BYTES + _F_STOLEN).value)
