"""What the autotuner (``backends.tune``) may vary in OpenCL code: the tiles of GEMM kernels.

``backends.clike.tiled.choose_tiles`` picks a work-group tile, register block and K step from the
output's sizes by a rule measured once on an H100; other shapes and other GPUs may prefer another.
When a program has GEMM-tiled kernels (a work-group size of their own in ``local_sizes``), these
``gemm_tiles`` settings are the candidates, each valid for the kernel template (powers of two,
register blocks of multiples of 4, work-items dividing both tile loads). The setting applies to
every GEMM kernel of the program.
"""

from __future__ import annotations

from backends.hal import Library

# [tm, tn, rm, rn, kt]: large tiles for large outputs first, then smaller ones
GEMM_TILES = (
    (128, 128, 8, 8, 8),
    (128, 128, 8, 8, 16),
    (128, 64, 8, 4, 8),
    (64, 128, 4, 8, 8),
    (64, 64, 4, 4, 16),
    (64, 64, 8, 8, 8),
    (32, 32, 4, 4, 8),
)


def gemm_space(library: Library) -> list[dict]:
    """``gemm_tiles`` candidates when ``library`` has a GEMM-tiled kernel, else none."""
    if not any(library.extra.get("local_sizes") or ()):
        return []
    return [{"gemm_tiles": list(t)} for t in GEMM_TILES]
