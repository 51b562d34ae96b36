"""How hard LLVM optimizes a program's module: ``-O1`` for programs that run in microseconds,
``-O3`` for the rest (``opt_level``), unless the ``opt`` setting says."""

from __future__ import annotations

from collections.abc import Sequence

from backends.hal import KernelInfo
from backends.llvm.intrinsics import TRANSCENDENTAL
from stripe.ir import Block

SMALL_FLOPS, SMALL_BYTES = 1 << 16, 1 << 17  # a kernel under both runs in microseconds


def opt_level(kernels: Sequence[KernelInfo], opt: int | None = None) -> int:
    """The LLVM pipeline's speed level: the ``opt`` setting where given; else 1 when every kernel
    does fewer than ``SMALL_FLOPS`` operations and moves fewer than ``SMALL_BYTES`` (microseconds
    a run, where ``-O3``'s passes take about twice ``-O1``'s time to build), else 3. ``-O1`` runs neither
    loop nor SLP vectorizer: a float sum may associate differently only where docs/semantics.md
    §8.3 lets it (never under ``strict``, whose IR carries no reassociation flags). Below 2 loops
    are not unrolled either (neither fully nor partly), unless the ``unroll`` setting says so: the
    micro-kernel's register tiles are unrolled in the IR already, and unrolling a small program's
    counted loops (constant trip counts, every extent baked in) and optimizing the copies was about
    half of LLVM's passes and of its machine code generation for a relative-bias attention's
    forward + backward at a new sequence length (``bench.new_shapes``). Without vectorizers this
    copies no arithmetic differently: results were bit-identical to the unrolled build's in every
    case compared (``tests/test_new_shape_pipeline.py``; at 3 they were not always, so 3 unrolls).
    A transcendental function counts ``MATH_OPS`` operations a point (``math_ops``): ``-O1`` leaves
    its loop scalar, and an ``exp`` of 5,661 floats ran 20-40 us a call slower than at ``-O3``, for
    8-10 ms more build (bench/RESULTS.md, fifth session)."""
    if opt is not None:
        return opt
    small = all(k.flops * (1 + MATH_OPS * math_ops(k.block)) < SMALL_FLOPS and k.bytes < SMALL_BYTES
                for k in kernels)
    return 1 if small and kernels else 3


MATH_OPS = 32  # what ``opt_level`` counts a transcendental function for (an exp: about 20-40 operations)


def math_ops(block) -> int:
    """How many transcendental functions (``intrinsics.TRANSCENDENTAL``) a point of ``block`` computes."""
    if not isinstance(block, Block):
        return 0
    return sum(math_ops(s) if isinstance(s, Block) else getattr(s, "name", None) in TRANSCENDENTAL
               for s in block.stmts)


__all__ = ["MATH_OPS", "SMALL_BYTES", "SMALL_FLOPS", "math_ops", "opt_level"]
