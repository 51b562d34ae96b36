"""A lane's whole kernel sequence as one native call on ``llvm_cpu`` (``raw_sequence``).

A lane (``backends.lane``) launches a program's kernels one by one from Python: each kernel's
address table filled (``raw.RawCalls.raw_launcher``), then a ctypes call of the kernel function,
about a microsecond a kernel; an exported transformer block runs 33 kernels a call. When every
kernel runs as one chunk on the calling thread (the lane's case at one thread, and for small
kernels at any count), ``raw_sequence`` JIT-compiles, once per lane, a function that copies the
call's addresses into every kernel's table and calls the kernel functions in program order: one
foreign call a run. The kernels, their tables' layout (buffers, then a generic kernel's extents)
and their ``(lo, hi)`` chunk are those the lane would launch, so the results are the same bits.

It must stay a launcher: no arithmetic, no reordering, nothing the kernels do not do themselves.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llvmlite.binding as llvm

from backends.llvm.host import host_target, target_machine
from backends.llvm.raw import address_table, kernel_chunks

_SEQUENCE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
NAME = "tile_lane_sequence"


class NativeSequence:
    """``go(addresses, stream)``, the lane's launcher shape for its whole plan: ``addresses`` (the
    lane's call addresses, ``count`` of them) into one array, then one call of the compiled
    sequence. Calls are serialized by the lane (the program's lock): the array is shared."""

    __slots__ = ("fn", "engine", "args", "tables", "source")

    def __init__(self, fn, engine, args, tables: list, source: str):
        self.fn, self.engine, self.args, self.tables, self.source = fn, engine, args, tables, source

    def __call__(self, addresses: Sequence[int], _stream=None) -> None:
        self.args[:] = addresses
        self.fn(self.args)


def raw_sequence(kernels: Sequence, slots: Sequence[tuple[int, ...]], count: int) -> NativeSequence | None:
    """The launcher of ``kernels`` (``LlvmKernel``s, in launch order) as one native call, where
    kernel ``j`` reads its buffers at positions ``slots[j]`` of a call's ``count`` addresses; None
    where some kernel would not run as one chunk on the calling thread (its stack needs the
    dispatcher's, or the schedule splits it over threads) or is not an ``llvm_cpu`` kernel."""
    plan = []
    for kernel, where in zip(kernels, slots, strict=True):
        if not getattr(kernel, "inline", False) or not hasattr(kernel, "ranges"):
            return None
        if len(kernel_chunks(kernel)) != 1 or len(where) != len(kernel.info.buffers):
            return None
        if any(not 0 <= s < count for s in where):
            return None
        plan.append((kernel, where))
    if not plan:
        return None
    tables = []
    lines = [f"define void @{NAME}(ptr noalias %a) {{", "entry:"]
    for j, (kernel, where) in enumerate(plan):
        n = len(where)
        table = address_table(kernel, n)
        tables.append((table, kernel.extents, kernel))  # (the kernel keeps its module's code alive)
        base = ctypes.addressof(table)
        for i, s in enumerate(where):
            lines += [f"  %p{j}_{i} = getelementptr inbounds i64, ptr %a, i64 {s}",
                      f"  %v{j}_{i} = load i64, ptr %p{j}_{i}",
                      f"  store i64 %v{j}_{i}, ptr inttoptr (i64 {base + 8 * i} to ptr)"]
        (lo, hi), = kernel_chunks(kernel)
        lines.append(f"  call void inttoptr (i64 {kernel.address} to ptr)"
                     f"(ptr inttoptr (i64 {base} to ptr), i64 {lo}, i64 {hi})")
    lines += ["  ret void", "}"]
    source = f'target triple = "{llvm.get_process_triple()}"\n' + "\n".join(lines) + "\n"
    mod = llvm.parse_assembly(source)
    mod.verify()
    engine = llvm.create_mcjit_compiler(mod, target_machine(*host_target()))
    engine.finalize_object()
    fn = _SEQUENCE_FN(engine.get_function_address(NAME))
    return NativeSequence(fn, engine, (ctypes.c_uint64 * max(1, count))(), tables, source)


__all__ = ["NativeSequence", "raw_sequence"]
