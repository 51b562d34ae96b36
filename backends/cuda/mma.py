"""A ``gemm_tile`` nest on a matrix unit (tensor cores): the tiled kernel of ``tiled``, with the
products issued as the unit's operations.

The nest's plan names the unit and precision mode (``GemmPlan.unit``, ``tensor_core.f16``;
``stripe.passes.tensorize``); the operation (``stripe.hardware.MmaShape``: its shape, its
instruction and where each lane's fragment elements sit) comes from the config's hardware model,
which the driver hands over with the settings. ``schedule.plan`` decides the kernel (``kernel``
``mma``) and ``render_mma`` prints it; it is ``backends.clike.tiled``'s SIMT kernel, except:

* **a work-item of the nest is a warp**: ``unit.lanes`` work-items issue each operation together.
  Warp ``(wy, wx)`` owns the nest's register block of ``rm x rn`` outputs, in the nest's layout
  (block row ``r`` is tile row ``(r / 8)·(tm·8/rm) + wy·8 + r % 8``, columns likewise), as a grid
  of ``rm/m x rn/n`` operations. Every work-item loads its share of the staged tiles.
* **operand bits, not values, are staged**: 16-bit operands move as ``ushort`` (no half
  arithmetic is needed), 32-bit ones as ``uint``, in vectors of up to 16 bytes. An operand whose
  K elements are contiguous in memory is staged K-fastest (``[mn][k]``, rows padded by 16 bytes,
  so a fragment's pair of K elements is one 32-bit ``__local`` read and the eight rows a fragment
  reads fall in distinct banks), otherwise M- (N-) fastest (``[k][mn]``, padded by 8 elements).
  When every load is 4, 8 or 16 bytes they are ``cp.async`` copies straight into ``__local``
  memory (zero-filled where a guard drops them), as many K steps in flight as fit (up to four,
  ``pipelined``); otherwise they go through registers, two buffers (``staged``, as ``tiled``).
* **fragments** are read with ``ldmatrix`` (four 8x8 matrices per instruction; ``.trans`` for a
  16-bit operand staged M/N-fastest) where the unit's ``Fragment`` stencils are the layouts it
  delivers (``LDMATRIX``), else element by element per the stencils; each lane's row offsets
  are computed once outside the K loop. TF32 operands are rounded to TF32 as they
  are read (``cvt.rna.tf32.f32``); ``3xtf32`` splits each into a TF32 high part and a TF32
  residual and issues three operations (``lo·hi + hi·lo + hi·hi``), float32-level accuracy.
* **the sums** stay in float32 registers (the accumulator fragments) and are stored, or handed
  to the fused epilogue, once at the end: a float16 output is rounded once. The unit's own
  additions round toward zero (a float32 product's error grows well past the SIMT kernel's), so
  ``3xtf32`` sums each K step in a fragment of its own and adds it to the running
  sum with a float32 (round-to-nearest) addition.

The unit sums each operation's products in its own order (the kernel reorders aggregation; strict
mode never tensorizes). An A with guards on its own M indexes (a padded convolution's input) keeps
its skipped points out as ``backends.cuda.mma_skips`` says; a B with guards on N never reaches
here (``tensorize`` leaves it to the SIMT kernel).
"""

from __future__ import annotations

from stripe.hardware import MmaShape

# the fragment layouts ``ldmatrix`` delivers, per operand: (elements per register, elements)
LDMATRIX = {
    "a": {
        (2, ((0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9), (8, 8), (8, 9))),  # m16 x k16, 16-bit
        (1, ((0, 0), (8, 0), (0, 4), (8, 4))),  # m16 x k8, 32-bit
    },
    "b": {
        (2, ((0, 0), (1, 0), (8, 0), (9, 0))),  # k16 x n8, 16-bit
        (1, ((0, 0), (4, 0))),  # k8 x n8, 32-bit
    },
}

# PTX's names of the operand and accumulator types (``MmaShape.inputs``, ``accumulator``)
PTX_TYPES = {"float16": "f16", "bfloat16": "bf16", "tf32": "tf32", "float32": "f32"}


def instruction(op: MmaShape) -> str:
    """The ``mma.sync`` instruction that issues ``op``: A row-major, B column-major (its fragment
    stencils), ``D = A·B + C`` with D and C of the accumulator's type."""
    acc, ins = PTX_TYPES[op.accumulator], PTX_TYPES[op.inputs]
    return f"mma.sync.aligned.m{op.m}n{op.n}k{op.k}.row.col.{acc}.{ins}.{ins}.{acc}"


CVT_TF32 = "cvt.rna.tf32.f32 %0, %1;"  # float32 to TF32: nearest, ties away from zero
COMMIT = 'asm volatile("cp.async.commit_group;" ::: "memory");'  # closes a group of async copies


def slot(p: str, stage: str, size: int, kfast: bool, row: int) -> str:
    """Where element ``p`` of a K step goes in buffer ``stage`` of a staged tile: ``[mn][k]`` rows
    of ``row`` when K is fastest, else ``[k][mn]``."""
    return f"{stage} * {size} + " + (f"{p}_mm * {row} + {p}_kk" if kfast else f"{p}_kk * {row} + {p}_mm")
