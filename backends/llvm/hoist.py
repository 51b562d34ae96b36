"""Packed panels shared by a product's batches: the micro-kernel's outer loops that the packed
operands do not depend on run inside the pack, not around it.

A batched product whose second operand is the same for every batch (an exported model's
``[4, 64, 128] x [128, N]`` projection: ``Y[b, i, j] = +(A[b, i, k] * W[k, j])``) has the batch
index ``b`` as an *outer* index of the micro-kernel (``microkernel``: owned, neither the vector nor
the row index). The micro-kernel loops over the outer indexes first, and under each it packs every
panel of ``W`` again: four times here, for the same values. ``hoisted`` names the outer indexes no
packed operand reads (coefficient 0) and no constraint uses; the micro-kernel then leaves them out
of its outer loops and ``over`` runs them around each set of row tiles instead, after the panels
(or the cache block) are packed: one pack serves every batch. Each output element still receives
its reduction points in the same order (the K blocks stay outermost for every element), so the
results are the same bits; only the loop order of independent elements changes.
"""

from __future__ import annotations

from collections.abc import Callable

from backends.llvm.loops import for_range


def hoisted(mk) -> tuple[int, ...]:
    """The outer index positions of micro-kernel ``mk`` to run inside the packing: those no
    ``pack_refs`` operand reads and no constraint uses (none without packed operands or a row
    index)."""
    s = mk.s
    if not mk.pack_refs or s.r is None:
        return ()
    used = {v for c in mk.block.constraints for v in c.vars}
    return tuple(
        k for k in s.outer
        if all(s.coefs[ref][k] == 0 for ref in mk.pack_refs) and mk.block.idxs[k].name not in used
    )


def over(mk, counters: dict, rows: Callable[[], None]) -> None:
    """``rows()`` (the row tiles against the packed panels) once for every point of ``mk``'s
    hoisted outer indexes, their counters set in ``counters`` meanwhile (the tiles read them
    from there)."""
    ks = getattr(mk, "hoisted", ())

    def level(j: int) -> None:
        if j == len(ks):
            rows()
            return
        k = ks[j]
        lo, hi = mk.bounds[k]

        def body(c) -> None:
            counters[k] = c
            level(j + 1)

        for_range(mk.em, lo, hi, body)
        counters.pop(k, None)  # (the loop's counter is defined only inside it)

    level(0)


__all__ = ["hoisted", "over"]
