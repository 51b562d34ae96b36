"""K blocks that keep a micro-kernel's packed scratch small enough for the calling thread's stack.

A kernel whose stack passes ``device.INLINE_STACK_BYTES`` (64 KiB) runs on the dispatcher thread's
large stack: each call of a model then hands its work to that thread and waits (tens of
microseconds), and the raw-address lane (``backends/lane.py``) cannot run it at all. A product's
whole-K panel is often what passes it (``64 x 512 x 512``: 128 KiB). ``inline_blocks`` then cuts K
into blocks of one panel each (``MicroKernel.blocked``) whose packed scratch fits
``INLINE_SCRATCH``; the panel then also stays in L1 while the rows stream past it.
"""

from __future__ import annotations

from backends.llvm.match import Shape
from stripe.ir import Block

INLINE_SCRATCH = 40 << 10  # packed bytes; the tiles' other stack slots take the rest of 64 KiB


def inline_blocks(blocking, block: Block, shape: Shape, nr: int, refs: int):
    """``blocking`` (``cache_blocks``'s ``(KC0, NC, KC)``, or None: whole panels), or K blocks of
    one panel each whose packed scratch fits ``INLINE_SCRATCH`` when the panels would not: a
    64 x 512 x 512 product's 128 KiB panel sent every call of the model to the dispatcher thread.
    Blocks of fewer than 64 reduction points are not worth it (the given blocking stays)."""
    item = shape.dtype.numpy.itemsize
    inner = 1
    for k in shape.red[1:]:
        inner *= block.idxs[k].range
    k0 = block.idxs[shape.red[0]].range
    nc, chunk = (blocking[1], blocking[2]) if blocking else (nr, k0 * inner)
    if nc * chunk * item * refs <= INLINE_SCRATCH:
        return blocking
    step = INLINE_SCRATCH // (nr * item * refs * inner)  # points of the first reduction index
    if step * inner < 64:  # (reduction points: ``A[k0, i, k1]``'s blocks count k0 x k1 of them)
        return blocking
    count = -(-k0 // step)
    step = -(-k0 // count)  # even blocks
    return step, nr, step * inner


__all__ = ["INLINE_SCRATCH", "inline_blocks"]
