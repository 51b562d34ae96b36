"""A ``gemm_tile`` nest on a matrix unit's warp-group products (NVIDIA Hopper's ``wgmma``,
``stripe.hardware.WarpGroup``): ``mma``'s kernel with the products issued by four warps together,
both operands read from ``__local`` memory by the unit itself. ``schedule.plan`` decides it
(``kernel`` ``wgmma``, where ``schedule.wgmma_fits``) and ``render_wg`` prints it.

* **The tile.** The plan's tile is the warp-group one (``gemm_tile`` ranks it first where the unit
  has it): ``tm x tn`` with ``tm / 16`` warps along M, each work-item of the nest a warp. Warp ``w``
  owns tile rows ``16·w .. 16·w + 15`` (``block_pos``: the hardware's rows, not the nest's
  interleaved ones; any one-to-one assignment of a tile's outputs computes the same tile), warp
  group ``w / 4`` the 64 rows one ``m64 x tn x k16`` product covers. Each warp's sums sit as the
  unit's accumulator fragment per 8 columns, so ``render.Render.store_mma`` stores them (and runs
  the fused epilogue) as for ``mma``.
* **Staging.** Every load is a 16-byte ``cp.async`` (``schedule.wgmma_fits`` says when; otherwise
  the nest takes ``mma``'s kernel), into tiles laid out as the unit's swizzled canonical layouts,
  so that its reads of eight 16-byte rows hit distinct banks (``render.byte_at``):
  - an operand whose K elements are contiguous (A of a row-major matrix) is staged K-major: rows of
    ``kt`` elements (32, 64 or 128 bytes), the 16-byte chunk ``c`` of row ``r`` stored at chunk
    ``c XOR ((r·row_bytes / 128) mod (row_bytes / 16))`` (the 32-, 64- or 128-byte swizzle);
  - otherwise M- (N-) major: panels of 64 elements (128 bytes) by ``kt`` rows of K, chunk ``c`` of
    K row ``k`` at chunk ``c XOR (k mod 8)`` (the 128-byte swizzle), read transposed.
  A descriptor (start address, the strides between 8-row groups and between panels, the swizzle)
  tells the unit where each K slice of 16 starts.
* **The K loop.** ``stages`` K steps in ``__local`` memory (as many as fit, up to 4); a step waits
  for its copies and fences them for the unit's (asynchronous) reads; after the barrier (where
  every warp has finished the previous step's products) it refills that step's buffer, issues
  its own products and waits for them. One barrier a step.
  Leaving a step's products running into the next step gave wrong sums on an H100: 8,000-16,000
  wrong elements of an integer 1024x4096x1024 float16 product in each of three runs, none when
  drained (a proxy fence after the wait made it rarer, not gone). It is not buffer reuse: a loop
  that awaited only the step before last and refilled buffers two or three steps back was as
  wrong, and awaiting the products before the next step's copy wait, fence and barrier made it
  exact (bench/RESULTS.md, "2026-11-28 (third)"). ``bench/wgmma_loop.py`` and
  tests/test_tensor_cores_gpu.py check such a product exactly. The buffer is refilled before the
  products are issued rather than after them and a second barrier: faster, and exact in every run
  (figures: bench/RESULTS.md, "Figures moved from docstrings").

* **Stores.** Where ``tile_store.plan`` takes the output (a plain product, a fused epilogue, a
  convolution), the K steps' buffers hold each warp's output rows after one barrier and the
  warps store whole 128-byte lines (``tile_store``;
  (figures: bench/RESULTS.md, "Figures moved from docstrings")). Otherwise
  ``store_mma`` stores each sum where it sits.

The instructions exist only for ``sm_90a``, which OpenCL C cannot target: they are written as PTX
comments starting with ``SM90A``, and the OpenCL compiler uncomments them in the program's PTX and
builds that for ``sm_90a`` (``backends.cuda.ptx``).
"""

from __future__ import annotations

SM90A = "//sm_90a "  # marks PTX that builds only for sm_90a (backends.cuda.ptx uncomments it)
SWIZZLE = {128: 1, 64: 2, 32: 3}  # the descriptor's swizzle field, by row bytes


def descriptor(lbo: int, sbo: int, swizzle: int) -> str:
    """The constant part of a shared-memory matrix descriptor: leading and stride byte offsets
    (16-byte units, bits 16-29 and 32-45) and the swizzle mode (bits 62-63); the start address
    (16-byte units, bits 0-13) is or-ed in per K slice."""
    return f"0x{((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (swizzle << 62):x}UL"
