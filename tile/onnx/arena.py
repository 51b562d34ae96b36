"""A model's constants in one block of huge pages, for the lane (``tile.onnx.lane``).

An exported model's weights are numpy arrays in 4 KiB pages placed anywhere in physical memory. A
core's L2 picks a line's set by physical address bits that a 4 KiB page does not fix, so a
working set near L2's size (the benchmark MLP's 1.5 MiB of weights in a 2 MiB L2) meets a
different number of conflict misses in every process: its lane ran 240-258 us (warm) from one
process to the next, 238-239 us every time with the weights in a 2 MiB page. ``arena`` copies the
constants, each at a 64-byte boundary, into one buffer aligned to 2 MiB and asks Linux for
transparent huge pages there (``madvise``; where the kernel says no, or elsewhere than Linux,
the copies are ordinary memory: the same values, only the placement is not helped).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import numpy as np

HUGE = 2 << 20  # x86-64's (and most arm64 kernels') transparent huge page
MADV_HUGEPAGE = 14  # Linux's advice number
ALIGN = 64  # each constant starts a cache line
MOST = 256 << 20  # larger sets of constants stay where they are (no second copy of them at once)
LEAST = 256 << 10  # smaller ones too: a huge page each would cost a lane 2 MiB for a few sets of L2


def _madvise_huge(address: int, size: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        return libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(size), MADV_HUGEPAGE) == 0
    except (OSError, AttributeError):
        return False


def arena(arrays: list[np.ndarray]) -> list[np.ndarray] | None:
    """Copies of ``arrays`` (C-contiguous) in one 2 MiB-aligned buffer advised as huge pages, in
    order, each the same dtype, shape and values as its original; None when there are fewer than
    ``LEAST`` bytes to place (a small model's lane would hold a 2 MiB page for them) or more than
    ``MOST``."""
    sizes = [(a.nbytes + ALIGN - 1) // ALIGN * ALIGN for a in arrays]
    total = sum(sizes)
    if not arrays or total < LEAST or total > MOST:
        return None
    span = (total + HUGE - 1) // HUGE * HUGE
    raw = np.empty(span + HUGE, np.uint8)
    start = (-raw.ctypes.data) % HUGE
    block = raw[start: start + span]
    _madvise_huge(block.ctypes.data, span)  # before the first touch: the copies fault huge pages in
    out, at = [], 0
    for a, size in zip(arrays, sizes):
        copy = block[at: at + a.nbytes].view(a.dtype).reshape(a.shape)
        copy[...] = a
        out.append(copy)
        at += size
    return out


__all__ = ["arena"]
