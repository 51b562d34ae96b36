"""The roles of a leaf block's indexes: those its output is indexed by, and those it reduces over.

What every reader of a contraction-shaped block needs first, whatever it then does with it:

* ``offsets``: each refinement's element offset, one affine over the block's index names (its
  access through the strides of the dims it refines);
* ``outputs``: the indexes with a non-zero coefficient in the output's offset, and
  ``reductions``: the others (each output element sums over them);
* the output written once per point of the outputs (its offset one-to-one over their box,
  ``one_to_one``), so that one point of them owns one element and may keep its whole sum in a
  register.

``stripe.gemm`` builds the GEMM view on these (the outputs split further by the operands that use
them into M, N and batch; the reductions are K), which the passes (``gemm_tile``, ``fusion``,
``self_init``) and the OpenCL generator use; the CPU micro-kernel (``backends.llvm.match``) picks
its vector and row indexes among the outputs and loops over the reductions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from stripe.ir import Block, Dim, Index, Refinement
from tile.affine import Affine


def offset(access: tuple[Affine, ...], dims: tuple[Dim, ...]) -> Affine | None:
    """``Σ access_d * stride_d``, the element offset of an access into ``dims`` (None: an access
    with a non-integer coefficient)."""
    out = Affine.constant(0)
    for a, d in zip(access, dims):
        if not a.is_integral:
            return None
        out = out + a * d.stride
    return out


def element_offset(r: Refinement) -> Affine | None:
    """The element offset of a kernel-level refinement as one affine (None: not integral)."""
    return offset(r.access, r.shape.dims)


def stride(aff: Affine, name: str) -> int:
    """The magnitude of ``name``'s coefficient in the offset ``aff``."""
    return abs(int(aff.coeff(name)))


def one_to_one(aff: Affine, idxs: tuple[Index, ...]) -> bool:
    """Whether the offset ``aff`` takes a different value at every point of the box of ``idxs`` (those of
    range 1 aside): sorted by stride, each stride exceeds the span of the smaller ones. A
    sufficient test, which every dense output passes."""
    span = 0
    for ix in sorted((ix for ix in idxs if ix.range > 1), key=lambda ix: stride(aff, ix.name)):
        s = stride(aff, ix.name)
        if s <= span:
            return False
        span += s * (ix.range - 1)
    return True


@dataclass(frozen=True)
class Roles:
    """What ``roles`` found; ``outputs`` and ``reductions`` keep the block's index order."""

    offsets: dict[str, Affine]  # refinement -> its element offset over the block's index names
    out: str  # the output refinement
    outputs: tuple[Index, ...]
    reductions: tuple[Index, ...]

    def coefs(self, idxs: tuple[Index, ...]) -> dict[str, tuple[int, ...]]:
        """Per refinement, its offset's coefficient for each of ``idxs``."""
        return {n: tuple(int(o.coeff(ix.name)) for ix in idxs) for n, o in self.offsets.items()}


def roles(block: Block, out: str, dims: Mapping[str, tuple[Dim, ...]]) -> Roles | None:
    """The roles of the indexes of leaf ``block`` whose output is refinement ``out``; ``dims``:
    per refinement, the dims its access counts in (those of what it refines). None when a
    refinement has no dims there, an access does not match its dims or is not an integral affine
    of the block's indexes, or two points of the outputs may write one element."""
    names = {ix.name for ix in block.idxs}
    offsets: dict[str, Affine] = {}
    for r in block.refs:
        d = dims.get(r.into)
        if d is None or len(r.access) != len(d) or any(not set(a.vars) <= names for a in r.access):
            return None
        o = offset(r.access, d)
        if o is None:
            return None
        offsets[r.into] = o
    if out not in offsets:
        return None
    outputs = tuple(ix for ix in block.idxs if offsets[out].coeff(ix.name) != 0)
    if not one_to_one(offsets[out], outputs):
        return None  # two points of the outputs might write one element
    used = {ix.name for ix in outputs}
    reductions = tuple(ix for ix in block.idxs if ix.name not in used)
    return Roles(offsets, out, outputs, reductions)


__all__ = ["Roles", "element_offset", "offset", "one_to_one", "roles", "stride"]
