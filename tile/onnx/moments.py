"""Statements for a normalization's mean and (biased) variance over some axes, in as few kernels
and temporaries as their values allow: LayerNormalization, MeanVarianceNormalization and
RMSNormalization build on them.

``tile.ops.reduce.variance_lines`` writes the textbook chain: ``Sum``, ``Mean = Sum / n``,
``Dev = X - Mean``, ``Sq = Dev * Dev``, ``SqSum = +(Sq)``, ``Var = SqSum / n``. On a compiled target
each line over the reduced shape is a kernel of its own (a few microseconds each for a layer norm of
[4, 64, 128]), and ``Sq`` is a whole tensor written and read back. Here:

* the squares are the sum's own product, ``SqSum = +(Dev * Dev)`` (each square rounded, then
  summed, as before): no ``Sq`` tensor;
* where ``n`` is a power of two, dividing by it is multiplying by ``1 / n`` exactly, so ``Dev`` reads
  ``X - Sum * (1/n)`` elementwise (the same bits as ``X - Mean``) and needs no ``Mean`` kernel.

Every value is the one the textbook chain computes, bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

from tile.ops.reduce import contraction


def scaled(total: str, count: int, lit) -> str:
    """``total / count`` as Tile text: a multiplication by the exact ``1 / count`` where ``count``
    is a power of two (``lit(value)``: a literal of the tensor's type)."""
    if count > 0 and count & (count - 1) == 0:
        return f"{total} * {lit(1.0 / count)}"
    return f"{total} / {lit(count)}"


def squares_sum(dst: str, src: str, rank: int, red: Sequence[int], names: Sequence[str]) -> str:
    """``dst = +(src * src)`` over ``red`` (kept as size-1 axes): the squares without a tensor."""
    line = contraction(dst, "+", src, rank, red, True, names)
    head, _, read = line.partition("= +(")
    read = read[:-1]
    return f"{head}= +({read} * {read})"


def moment_lines(src: str, rank: int, red: Sequence[int], count: int, names: Sequence[str], lit) -> list[str]:
    """``Sum``, ``Mean``, ``Dev`` and ``Var`` (the biased variance) of ``src`` over the axes ``red``
    (``count`` elements each), kept as size-1 axes; unread ones are left out by Tile's dead-code
    elimination."""
    return [
        contraction("Sum", "+", src, rank, red, True, names),
        f"Mean = {scaled('Sum', count, lit)}",
        f"Dev = {src} - {scaled('Sum', count, lit) if count & (count - 1) == 0 else 'Mean'}",
        squares_sum("SqSum", "Dev", rank, red, names),
        f"Var = {scaled('SqSum', count, lit)}",
    ]


__all__ = ["moment_lines", "scaled", "squares_sum"]
