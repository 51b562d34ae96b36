"""Which Stripe kernels are GEMM-shaped contractions, and how their indexes group for tiling.

The analysis the optimizer (``stripe.passes.gemm_tile``) and the code generators share
(``backends.clike``; the CPU one may use it the same way). API, kept stable:

* ``match(block, buffers, buffer_dtypes, reorder) -> Gemm | None``: ``block`` is a kernel (a child
  of ``#main``), ``buffers`` the names of ``#main``'s refinements it may refine, ``buffer_dtypes``
  their element types; ``reorder`` allows ordering K by the first operand's strides (else Stripe's
  order, which keeps each element's sum in the interpreter's order).
* ``Gemm``: ``dtype``; ``a`` / ``b`` the ``Operand``s of M / N; ``out`` (None when fused);
  ``m``, ``n``, ``k``, ``batch`` the ``Group``s; ``store_guards``; ``starts`` (index -> first
  value); ``epilogue`` (fused: the kernel block and its accumulator local).
* ``Operand``: ``ref`` (the kernel-level refinement of a ``#main`` buffer), ``offset`` (the
  element offset, one affine over the kernel's index names), ``guards`` (constraints, each
  ``>= 0``, checked before loading), ``access`` (per dim of ``ref``'s parent, the access over the
  kernel's index names: for a fused kernel the outer and inner accesses added) and ``leaf`` (the
  refinement the load or store names: ``ref`` itself, or the fused contraction's inner one).
* ``Group``: ``idxs`` (flattened, the last fastest), ``total``, ``names``.
* ``element_offset(ref)`` (``stripe.roles``), ``FLOATS``, ``MIN_SIDE``.

A kernel matches when it is one flat block ``O[out] += X[a] * Y[b]`` of one float type (float32 or
float64): statements exactly ``load, load, mul, store`` with the store's refinement ``agg_op``
``add``, every refinement a view of a kernel buffer, every access affine and integral. Its indexes
then fall into four groups (the implicit-GEMM view of any contraction, convolutions included),
the output and reduction indexes of ``stripe.roles`` with the outputs split by the operands:

* **M**: output indexes only the first operand uses, **N**: output indexes only the second uses,
* **batch**: output indexes both use, **K**: the indexes the output does not use (the reduction).

N holds the output's contiguous index (the operands swap roles when M would). The output must be
written once per (batch, M, N) point (its element offset is one-to-one over their box), so one
work-item may keep an element's whole sum in a register. Constraints are sorted by the groups
they use: without K they guard the store, with K and M (N) they guard the first (second)
operand's load, with K alone both loads. A constraint using K, M and N at once does not fit and
the kernel is not matched, nor is a contraction whose M or N has fewer than ``MIN_SIDE`` points
(a matrix-vector product, or the partial sums ``split_reduction`` makes of one).

After ``fusion`` the kernel may instead be a block over the output indexes whose first statement
is the contraction (over the reduction indexes, into a scalar local) and whose other statements
(the epilogue) compute and store the final element from it; that matches too (``epilogue``).
"""

from __future__ import annotations

from dataclasses import dataclass

from stripe.ir import Block, Index, Intrinsic, Load, RefDir, Refinement, Special, Store
from stripe.roles import element_offset, offset, one_to_one, roles, stride
from tile.affine import Affine
from tile.dtypes import DType

FLOATS = (DType.FLOAT32, DType.FLOAT64)
MIN_SIDE = 2  # M and N must each have two points or more: a 32-wide tile of one column wastes 97%


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
    access: tuple[Affine, ...] = ()  # per dim of ref's parent, over the kernel's index names
    leaf: Refinement | None = None  # the refinement the statement names (None: ``ref``)


@dataclass(frozen=True)
class Gemm:
    dtype: DType
    a: Operand  # uses M (and batch, K)
    b: Operand  # uses N (and batch, K)
    out: Operand | None  # None: the fused epilogue stores
    m: Group
    n: Group
    k: Group
    batch: Group
    store_guards: tuple[Affine, ...]
    starts: dict[str, int]  # index name -> its first value
    epilogue: tuple[Block, Refinement] | None = None  # fused: the kernel block, its accumulator


def _body(block: Block, halves: bool = False) -> tuple[Refinement, Refinement, Refinement, DType] | None:
    """``load X, load Y, mul, store O`` of one float type (16-bit ones too with ``halves``): the
    refinements X, Y, O and the type."""
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
    refs = {r.into: r for r in block.refs}
    first, second = (refs.get(st[0].from_), refs.get(st[1].from_))
    if st[2].inputs[0] != st[0].into:
        first, second = second, first
    out = refs.get(st[3].into)
    typed = dt in FLOATS or (halves and dt.is_narrow_float)  # 16-bit floats: only for a matrix unit
    if not typed or len(block.refs) != 3 or first is None or second is None or out is None:
        return None
    if out.agg_op != "add" or any(r.shape.dtype is not dt for r in (first, second, out)):
        return None
    if any(len(r.access) != len(r.shape.dims) for r in (first, second, out)):
        return None
    return first, second, out, dt


def match(
    block: Block,
    buffers: tuple[str, ...],
    buffer_dtypes: dict[str, DType],
    reorder: bool,
    halves: bool = False,
):
    """The ``Gemm`` view of kernel ``block``, or None when it is not a GEMM-shaped contraction:
    either the flat contraction itself or, after ``fusion``, a block over the output indexes whose
    first statement is the contraction (over the reduction indexes, into a scalar local) and whose
    other statements (the epilogue) compute and store the final element from it."""
    if any(ix.affine is not None and not ix.affine.is_constant for ix in block.idxs):
        return None
    if block.stmts and isinstance(block.stmts[0], Block):
        return _fused(block, buffers, buffer_dtypes, reorder, halves)
    body = _body(block, halves)
    if body is None:
        return None
    first, second, out, dt = body
    if out.dir not in (RefDir.OUT, RefDir.INOUT) or out.source in (first.source, second.source):
        return None
    if any(r.source not in buffers or buffer_dtypes.get(r.source) is not dt for r in (first, second, out)):
        return None
    rl = roles(block, out.into, {r.into: r.shape.dims for r in block.refs})
    if rl is None:
        return None
    fa, fb, fo = (rl.offsets[r.into] for r in (first, second, out))
    return _group(
        dt,
        rl.outputs,
        rl.reductions,
        block.constraints,
        (first, fa, first.access, first),
        (second, fb, second.access, second),
        fo,
        Operand(out, fo, (), out.access, out),
        reorder,
    )


def _fused(block: Block, buffers, buffer_dtypes, reorder: bool, halves: bool = False):
    inner = block.stmts[0]
    epilogue = block.stmts[1:]
    if any(isinstance(s, (Block, Special)) for s in epilogue):
        return None
    body = _body(inner, halves)
    if body is None:
        return None
    first, second, acc, dt = body
    outer = {r.into: r for r in block.refs}
    local = outer.get(acc.source)
    if local is None or local.dir is not RefDir.NONE or local.from_ is not None:
        return None
    if local.shape.dtype is not dt or any(d.size != 1 for d in local.shape.dims):
        return None
    if any(isinstance(s, Store) and s.into == local.into for s in epilogue):
        return None
    # inner indexes of range 1 that follow an outer one (``x_o = x``) are that outer index
    subst: dict[str, Affine] = {}
    kidx: list[Index] = []
    for ix in inner.idxs:
        if ix.affine is not None and not ix.affine.is_constant:
            if ix.range != 1 or not set(ix.affine.vars) <= {o.name for o in block.idxs}:
                return None
            subst[ix.name] = ix.affine
        else:
            kidx.append(ix)
    if {ix.name for ix in kidx} & {ix.name for ix in block.idxs}:
        return None
    ops = []
    for r in (first, second):  # (kernel-level ref, offset, access over the parent's dims, leaf)
        parent = outer.get(r.source)
        if parent is None or parent.source not in buffers or buffer_dtypes.get(parent.source) is not dt:
            return None
        po, io = element_offset(parent), offset(r.access, parent.shape.dims)
        if po is None or io is None or len(r.access) != len(parent.shape.dims):
            return None
        access = tuple(p + a.substitute(subst) for p, a in zip(parent.access, r.access))
        ops.append((parent, po + io.substitute(subst), access, r))
    writes = {s.into for s in epilogue if isinstance(s, Store)}
    if {outer[w].source for w in writes if w in outer} & {first.source, second.source}:
        return None
    stores = [element_offset(outer[w]) for w in writes if w in outer and outer[w].source in buffers]
    if not writes <= set(outer) or any(o is None or not one_to_one(o, block.idxs) for o in stores):
        return None  # each point of the block must write its own elements
    order = stores[0] if stores and stores[0] is not None else Affine.constant(0)
    cons = tuple(c.substitute(subst) for c in inner.constraints) + block.constraints
    return _group(dt, block.idxs, tuple(kidx), cons, ops[0], ops[1], order, None, reorder, (block, local))


def _group(dt, outs, reductions, constraints, a, b, order: Affine, out, reorder, epilogue=None):
    """Sort the output indexes ``outs`` into M, N and batch by the operands that use them (the
    ``reductions`` are K) and the constraints into guards (module docstring); ``order`` is the
    output's element offset (its strides order M and N)."""
    (first, fa, xa, la), (second, fb, xb, lb) = a, b
    m = [ix for ix in outs if ix.name in fa.vars and ix.name not in fb.vars]
    n = [ix for ix in outs if ix.name in fb.vars and ix.name not in fa.vars]
    bt = [ix for ix in outs if ix.name in fa.vars and ix.name in fb.vars]
    k = list(reductions)
    if len(m) + len(n) + len(bt) != len(outs):
        return None  # an output index neither operand reads (a broadcast) does not fit
    if min(Group(tuple(m)).total, Group(tuple(n)).total) < MIN_SIDE:
        return None  # a matrix-vector product: the lanes of split_reduction serve it better

    def fastest(grp: list[Index]) -> int:
        return min((stride(order, ix.name) for ix in grp), default=1 << 62)

    # N holds the output's contiguous index, so consecutive work-items store consecutive elements
    if fastest(m) < fastest(n):
        m, n, first, second, fa, fb, xa, xb, la, lb = n, m, second, first, fb, fa, xb, xa, lb, la
    for grp in (m, n, bt):
        grp.sort(key=lambda ix: -stride(order, ix.name))
    if reorder:
        k.sort(key=lambda ix: -stride(fa, ix.name))
    mn, nn, kn = ({ix.name for ix in g} for g in (m, n, k))
    ga, gb, gs = [], [], []
    for c in constraints:
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
    starts = {ix.name: int(ix.affine.const) if ix.affine is not None else 0 for ix in (*outs, *reductions)}
    return Gemm(
        dt,
        Operand(first, fa, tuple(ga), xa, la),
        Operand(second, fb, tuple(gb), xb, lb),
        out,
        Group(tuple(m)),
        Group(tuple(n)),
        Group(tuple(k)),
        Group(tuple(bt)),
        tuple(gs),
        starts,
        epilogue,
    )


def streams(
    g: Gemm, tm: int, tn: int, kt: int, size: int, b_kmajor: bool = False, whole: bool = True
) -> bool:
    """Whether the tensor memory accelerator can feed ``g``'s ``tm x tn`` tiles K steps of ``kt``
    (elements of ``size`` bytes): a plain matrix product ``A[i, k] · B[k, j]`` (one index per
    group, no batch, nothing guarded, every index from 0), A's rows contiguous along K and B's
    along N (along K with ``b_kmajor``: B stored as ``[j][k]``), rows starting at the buffers'
    starts and every 16 bytes, and whole tiles (with ``whole``; else the last tiles may overhang)."""
    if len(g.m.idxs) != 1 or len(g.n.idxs) != 1 or len(g.k.idxs) != 1 or g.batch.idxs:
        return False
    if g.a.guards or g.b.guards or g.store_guards or any(g.starts.values()):
        return False
    (i,), (j,), (k,) = g.m.idxs, g.n.idxs, g.k.idxs
    for op, row, col in ((g.a, i, k), (g.b, j, k) if b_kmajor else (g.b, k, j)):
        off = op.offset
        if off.const != 0 or set(off.vars) != {row.name, col.name} or off.coeff(col.name) != 1:
            return False
        if (int(off.coeff(row.name)) * size) % 16:
            return False
    return not whole or (i.range % tm == 0 and j.range % tn == 0 and k.range % kt == 0)
