"""Which Stripe kernels are GEMM-shaped contractions, and how their indexes group for tiling.

A kernel matches when it is one flat block ``O[out] += X[a] * Y[b]`` of one float type (float32 or
float64): statements exactly ``load, load, mul, store`` with the store's refinement ``agg_op``
``add``, every refinement a view of a kernel buffer, every access affine and integral. Its indexes
then fall into four groups (the implicit-GEMM view of any contraction, convolutions included):

* **M**: output indexes only the first operand uses, **N**: output indexes only the second uses,
* **batch**: output indexes both use, **K**: the indexes the output does not use (the reduction).

Each group is flattened into one number (``flat``), its indexes in a fixed order, the last fastest.
The output must be written once per (batch, M, N) point (``backends.llvm.schedule.plan`` owns every
output index), so one work-item may keep an element's whole sum in a register. Constraints are
sorted by the groups they use: without K they guard the store, with K and M (N) they guard the
first (second) operand's load (a skipped point becomes a zero operand), with K alone both loads.
A constraint using K, M and N at once does not fit and the kernel takes the general path.

K's order is Stripe's (so the values reach each element in the interpreter's order: strict mode
stays bit-identical) unless ``reorder`` allows ordering it by the first operand's strides, which
makes the cooperative loads of a convolution's input contiguous.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.llvm.schedule import plan
from stripe.ir import Block, Index, Intrinsic, Load, RefDir, Refinement, Store
from tile.affine import Affine
from tile.dtypes import DType

FLOATS = (DType.FLOAT32, DType.FLOAT64)


@dataclass(frozen=True)
class Group:
    """Indexes flattened into one number, the last fastest; ``total`` is the product of ranges."""

    idxs: tuple[Index, ...]

    @property
    def total(self) -> int:
        out = 1
        for ix in self.idxs:
            out *= ix.range
        return out

    @property
    def names(self) -> frozenset[str]:
        return frozenset(ix.name for ix in self.idxs)


@dataclass(frozen=True)
class Operand:
    """One buffer read or written: its offset is ``const + Σ coeff_v * v`` over the block's indexes."""

    ref: Refinement
    offset: Affine
    guards: tuple[Affine, ...] = ()  # constraints checked before loading (each >= 0)


@dataclass(frozen=True)
class Gemm:
    dtype: DType
    a: Operand  # uses M (and batch, K)
    b: Operand  # uses N (and batch, K)
    out: Operand
    m: Group
    n: Group
    k: Group
    batch: Group
    store_guards: tuple[Affine, ...]
    starts: dict[str, int]  # index name -> its first value


def element_offset(r: Refinement) -> Affine | None:
    """The element offset of a kernel-level refinement as one affine (None: not integral)."""
    out = Affine.constant(0)
    for a, d in zip(r.access, r.shape.dims):
        if not a.is_integral:
            return None
        out = out + a * d.stride
    return out


def _stride(aff: Affine, name: str) -> int:
    return abs(int(aff.coeff(name)))


def match(block: Block, buffers: tuple[str, ...], buffer_dtypes: dict[str, DType], reorder: bool):
    """The ``Gemm`` view of ``block``, or None when it is not a GEMM-shaped contraction."""
    st = block.stmts
    if (
        len(st) != 4
        or not (isinstance(st[0], Load) and isinstance(st[1], Load))
        or not (isinstance(st[2], Intrinsic) and st[2].name == "mul" and len(st[2].outputs) == 1)
        or not isinstance(st[3], Store)
        or st[3].from_ != st[2].outputs[0]
        or sorted(st[2].inputs) != sorted((st[0].into, st[1].into))
        or st[0].into == st[1].into
    ):
        return None
    dt = st[2].dtype
    if dt not in FLOATS or len(block.refs) != 3:
        return None
    refs = {r.into: r for r in block.refs}
    first, second = (refs.get(st[0].from_), refs.get(st[1].from_))
    if st[2].inputs[0] != st[0].into:
        first, second = second, first
    out = refs.get(st[3].into)
    if first is None or second is None or out is None or out.agg_op != "add":
        return None
    if out.dir not in (RefDir.OUT, RefDir.INOUT) or out.source in (first.source, second.source):
        return None
    for r in (first, second, out):
        if r.source not in buffers or r.shape.dtype is not dt or buffer_dtypes.get(r.source) is not dt:
            return None
        if len(r.access) != len(r.shape.dims):
            return None
    offs = [element_offset(r) for r in (first, second, out)]
    if any(o is None for o in offs):
        return None
    fa, fb, fo = offs
    if any(ix.affine is not None and not ix.affine.is_constant for ix in block.idxs):
        return None
    outs = set(fo.vars)
    owned = set(plan(block, buffers, 1).owned)
    if not outs <= owned:
        return None
    m = [ix for ix in block.idxs if ix.name in outs and ix.name in fa.vars and ix.name not in fb.vars]
    n = [ix for ix in block.idxs if ix.name in outs and ix.name in fb.vars and ix.name not in fa.vars]
    bt = [ix for ix in block.idxs if ix.name in outs and ix.name in fa.vars and ix.name in fb.vars]
    k = [ix for ix in block.idxs if ix.name not in outs]
    if len(m) + len(n) + len(bt) != len(outs) or not (m or n):
        return None  # an output index neither operand reads (a broadcast) does not fit

    def fastest(grp: list[Index]) -> int:
        return min((_stride(fo, ix.name) for ix in grp), default=1 << 62)

    # N holds the output's contiguous index, so consecutive work-items store consecutive elements
    if fastest(m) < fastest(n):
        m, n, first, second, fa, fb = n, m, second, first, fb, fa
    m.sort(key=lambda ix: -_stride(fo, ix.name))
    n.sort(key=lambda ix: -_stride(fo, ix.name))
    bt.sort(key=lambda ix: -_stride(fo, ix.name))
    if reorder:
        k.sort(key=lambda ix: -_stride(fa, ix.name))
    mn, nn, kn = ({ix.name for ix in g} for g in (m, n, k))
    ga, gb, gs = [], [], []
    for c in block.constraints:
        vs = set(c.vars)
        if not vs & kn:
            gs.append(c)
        elif vs & mn and vs & nn:
            return None
        elif vs & mn:
            ga.append(c)
        elif vs & nn:
            gb.append(c)
        else:
            ga.append(c)
            gb.append(c)
    starts = {ix.name: int(ix.affine.const) if ix.affine is not None else 0 for ix in block.idxs}
    return Gemm(
        dt,
        Operand(first, fa, tuple(ga)),
        Operand(second, fb, tuple(gb)),
        Operand(out, fo),
        Group(tuple(m)),
        Group(tuple(n)),
        Group(tuple(k)),
        Group(tuple(bt)),
        tuple(gs),
        starts,
    )
