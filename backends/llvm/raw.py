"""Raw calls on ``llvm_cpu.0`` (``backends.lane``): a kernel function on an address table of the
caller's memory, on the calling thread, as an inline run of the general path does."""

from __future__ import annotations

import ctypes


class RawCalls:
    """``LlvmExecutor``'s part of ``backends.hal.Executor``'s raw-call methods."""

    _queued: int
    raw_host = True

    def raw_launcher(self, kernel):
        if not kernel.inline:  # (its stack needs the dispatcher thread's)
            return None
        chunks, fn, n = kernel_chunks(kernel), kernel.fn, len(kernel.info.buffers)
        table = address_table(kernel, n)  # (calls hold a lock)
        if len(chunks) == 1:
            (lo, hi), = chunks

            def go(addresses, _stream) -> None:
                table[:n] = addresses
                fn(table, lo, hi)
        else:
            pool, address = kernel.pool, kernel.address

            def go(addresses, _stream) -> None:
                table[:n] = addresses
                pool.run_kernel(fn, address, table, chunks)
        return go

    def raw_address(self, buffer) -> int:
        return buffer.address

    def raw_ready(self) -> bool:
        return self._queued == 0

    def raw_zero(self, address: int, nbytes: int, stream) -> None:
        ctypes.memset(address, 0, nbytes)

    @staticmethod
    def raw_entry(sequence, given: int, fixed):
        """A lane's native call (``sequence``) as a Python builtin (``pyentry.raw_entry``)."""
        from backends.llvm.pyentry import raw_entry  # (llvmlite's binding: only a lane needs it)

        return raw_entry(sequence, given, fixed)


def kernel_chunks(kernel) -> list[tuple[int, int]]:
    """``kernel``'s ``(lo, hi)`` chunks, worked out at its first raw launch (fixed by its schedule
    and settings)."""
    if kernel._chunks is None:
        kernel._chunks = kernel.ranges()
    return kernel._chunks


def address_table(kernel, n: int):
    """The table a call of ``kernel`` (``n`` buffers) passes: the buffers' addresses, filled per
    call, then a generic kernel's extents array."""
    extents = getattr(kernel, "extents", None)  # a generic kernel's integers, read after the buffers
    table = (ctypes.c_void_p * max(1, n + (extents is not None)))()
    if extents is not None:
        table[n] = ctypes.addressof(extents)
    return table


__all__ = ["RawCalls", "address_table", "kernel_chunks"]
