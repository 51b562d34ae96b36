"""``row_fusion``: kernels that share their rows (per-row reductions and the elementwise kernels
reading their results) become one kernel per row, a *row program*, tagged ``row_program`` and
planned: its ``stripe.plans.RowPlan`` (the row indexes, the row-value locals, the work-group size
suggestion) is the hand-off to the code generator (``backends.clike.rowkernel``).

A softmax after ``recompute`` is ``Mx[i] = max_j X[i, j]; S[i] = sum_j exp(X[i, j] - Mx[i]);
Y[i, j] = exp(X[i, j] - Mx[i]) / S[i]``: three kernels, each a pass over ``X`` in memory, and two
per-row temporaries written and read back. Fused, one block over ``i`` runs, for each row, the
max over ``j`` into a per-row local, the sum over ``j`` into another, then the division over
``j``: a GPU runs it as one work-group per row (``backends.clike.rowkernel``), the row's second
and third reads hit its caches, and ``X`` crosses DRAM once.

A group is a run of consecutive child kernels of a block carrying ``reqs``, each one of:

* a **fill**: a kernel that is one ``zero``/``agg_init_*`` special of a whole ``tmp`` buffer that
  a later member reduces into;
* a **reduction**: a leaf kernel (loads, stores, constants, intrinsics, ``load_index``; no
  constraints, no index affines) with one output, a ``tmp`` buffer ``V`` (a *row value*) it
  aggregates into (``add mul max min``) at an access whose dims are each ``0`` (size 1) or one
  index alone (coefficient 1, range the dim's size): its *row indexes*; the rest reduce;
* an **elementwise** kernel: a leaf kernel with one output written through ``assign`` at an access
  giving each point its own element (each dim one index alone, coefficient 1, every index in
  one dim), reading at least one row value. One with a single point per row (its other indexes
  of range 1) writing a ``tmp`` buffer at a row value's access computes a *row value* from
  earlier ones (a layernorm's mean ``Mu = S / N``, read by the variance and the normalisation):
  its output becomes a per-row local like a reduction's.

Some member reading a row value runs over an index that is not a row (a softmax's division over
``j``): otherwise each row value is read once per row, which the ordinary fusion of a
contraction with its elementwise consumer (and ``gemm_tile`` for a matrix product with a bias)
does as well. Every member reads the row values of earlier members at the writer's element (each
row index matched to one row of the group, consistently, with the group's ranges; a dim of size
1 at 0 or at an index of range 1); its row indexes cover all of the group's rows. A row value is
used by no statement outside the group, and read by no member before its writer; a buffer an
elementwise member writes is named by no other member; what members read otherwise nobody in the
group writes; ``load_index`` uses no row index. So rows never exchange data: running the members
row by row (each row its members in order) gives every element the same values as running them
kernel by kernel. Each member's points in a row run at most ``max_row``; the group runs at least
``rows_per_unit`` rows per compute unit (fewer rows leave a GPU idle: ``split_reduction`` then
splits the long reductions instead). The block's attribute ``group`` suggests the work-items per
row: the largest power of two at most ``group``, the exec units' ``threads`` (an OpenCL device's
work-group size) and the longest member row.

The fused block runs over the group's rows (the first reduction's row indexes). Each row value
becomes a local allocation of one element (a fresh one per row, as the row's ``tmp`` was
zero), the fills become specials on it, and each kernel becomes an inner block over its other
indexes whose refinements refine per-row views of the block (each access split into its row part,
in the outer view, and the rest). A layernorm (``S = sum_j X; Mu = S / N; V = sum_j (X - Mu)^2;
Y = (X - Mu) / sqrt(V / N + eps) * G + B``) is one row program: fill, sum, mean (a one-point
inner block, which ``inline`` later makes the row block's own statements), fill, sum, and the
normalisation reading ``G`` and ``B`` along the row. Guarantee: the same outputs. Registered
as reordering: a work-group tree sums a row in another order than the interpreter
(``docs/semantics.md`` §8.3), so strict mode skips it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from stripe.hardware import Hardware
from stripe.ir import (
    Block,
    Constant,
    Dim,
    Index,
    Intrinsic,
    Load,
    LoadIndex,
    RefDir,
    Refinement,
    Special,
    Statement,
    Store,
    TensorShape,
)
from stripe.passes.cleanup import drop_unused_tmps
from stripe.passes.registry import register
from stripe.passes.rewrite import Context, fresh, rewrite
from stripe.plans import ROW_TAG, RowPlan
from tile.affine import Affine
from tile.bounds import poly_interval

_LEAF = (Load, Store, Constant, Intrinsic, LoadIndex)
_AGGS = ("add", "mul", "max", "min")


@dataclass(frozen=True)
class RowFusionConfig:
    reqs: tuple[str, ...]  # the blocks (``main``) whose child kernels are grouped
    max_row: int = 16384  # at most this many points of a member per row
    rows_per_unit: int = 4  # at least this many rows per compute unit
    group: int = 512  # work-items per row, at most (and at most the device's work-group size)
    # by row length: (at most this many points per row, work-items per row), shortest first; rows
    # longer than every bound take ``group``
    groups: tuple[tuple[int, int], ...] = ()


@register("row_fusion", RowFusionConfig, reorders=True)
def row_fusion(program: Block, cfg: RowFusionConfig, hw: Hardware) -> Block:
    """Fuses every group of the module docstring into a row program."""
    tmps = {r.into for r in program.refs if "tmp" in r.tags and not {"input", "output"} & r.tags}
    units = sum(u.count for u in hw.exec_units.values()) or 1
    min_rows = cfg.rows_per_unit * units
    most = min(u.threads for u in hw.exec_units.values()) if hw.exec_units else cfg.group

    def group_for(g: _Group) -> int:
        size = next((n for bound, n in sorted(cfg.groups) if g.row_points <= bound), cfg.group)
        return min(size, most)

    def visit(block: Block, ctx: Context) -> Block | None:
        stmts, out, k, changed = block.stmts, [], 0, False
        while k < len(stmts):
            got = _group_at(stmts, k, block, tmps, cfg.max_row, min_rows)
            if got is None:
                out.append(stmts[k])
                k += 1
                continue
            end = got[1]
            out.extend(_fuse(got[0], block, group_for(got[0])))
            k, changed = end, True
        return replace(block, stmts=tuple(out)) if changed else None

    out = rewrite(program, visit, cfg.reqs)
    return drop_unused_tmps(out) if out is not program else program


@dataclass
class _Member:
    block: Block
    kind: str  # "fill", "clear", "reduce", "value" or "map"
    rows: dict[str, int] = field(default_factory=dict)  # row index -> the group's row


@dataclass
class _Group:
    ranges: tuple[int, ...] = ()
    names: tuple[str, ...] = ()
    values: dict[str, tuple[int | None, ...]] = field(default_factory=dict)  # V -> row of each dim
    filled: set[str] = field(default_factory=set)
    written: set[str] = field(default_factory=set)  # by elementwise members
    cleared: set[str] = field(default_factory=set)  # filled whole by a fill moved before the group
    read: set[str] = field(default_factory=set)  # other than row values
    members: list[_Member] = field(default_factory=list)
    row_points: int = 0  # the most points of one member in one row

    def copy(self) -> _Group:
        return _Group(self.ranges, self.names, dict(self.values), set(self.filled), set(self.written),
                      set(self.cleared), set(self.read), list(self.members), self.row_points)


def _group_at(stmts, start: int, parent: Block, tmps: set[str], max_row: int, min_rows: int):
    """``(group, end)`` for the longest valid group starting at ``start``, or None."""
    g, best = _Group(), None
    for k in range(start, len(stmts)):
        s = stmts[k]
        if not (isinstance(s, Block) and s.has_tags("kernel")) or not _add(g, s, parent, tmps, max_row):
            break
        if _valid(g, stmts, start, k + 1, min_rows):
            best = (g.copy(), k + 1)
    return best


def _valid(g: _Group, stmts, start: int, end: int, min_rows: int) -> bool:
    kinds = [m.kind for m in g.members]
    if "reduce" not in kinds or not any(_reads_values(m, g) and _beyond_rows(m) for m in g.members):
        return False  # no row value read across a row: plain fusion (and gemm_tile) does as well
    if g.filled - set(g.values):  # a fill whose reduction is not in the group
        return False
    if _rows(g) < min_rows:
        return False
    outside = [s for s in stmts[:start] + stmts[end:] if isinstance(s, Block)]
    return not any(r.source in g.values for s in outside for r in s.refs)


def _rows(g: _Group) -> int:
    n = 1
    for k in g.ranges:
        n *= k
    return n


def _beyond_rows(m: _Member) -> bool:
    """Whether ``m`` runs over an index that is not a row (it reads a row value at many points)."""
    return any(ix.name not in m.rows for ix in m.block.idxs)


def _reads_values(m: _Member, g: _Group) -> bool:
    return any(r.dir is RefDir.IN and r.source in g.values for r in m.block.refs)


def _add(g: _Group, b: Block, parent: Block, tmps: set[str], max_row: int) -> bool:
    """Adds ``b`` to the group when it may follow the members so far (the module docstring's
    rules); False leaves ``g`` unchanged."""
    fill = _fill_of(b, parent)
    if fill is not None:
        if fill in g.filled | g.values.keys() | g.read | g.written | g.cleared:
            return False
        (g.filled if fill in tmps else g.cleared).add(fill)
        g.members.append(_Member(b, "fill" if fill in tmps else "clear"))
        return True
    if b.constraints or any(ix.affine is not None for ix in b.idxs):
        return False
    if not all(isinstance(s, _LEAF) for s in b.stmts):
        return False
    outs = [r for r in b.refs if r.dir is not RefDir.IN]
    if len(outs) != 1 or outs[0].dir is not RefDir.OUT:
        return False
    out = outs[0]
    if any(isinstance(s, Store) and s.into != out.into for s in b.stmts):
        return False
    if any(isinstance(s, Load) and s.from_ == out.into for s in b.stmts):
        return False
    ranges = {ix.name: ix.range for ix in b.idxs}
    rows = _rows_read(g, b, ranges)
    if rows is None:
        return False
    reads = {r.source for r in b.refs if r.dir is RefDir.IN and r.source not in g.values}
    if reads & (g.written | g.filled | g.cleared):
        return False
    if not all(_plain_view(r, parent) for r in b.refs if r is not out):
        return False
    if out.agg_op in _AGGS:
        pattern = _reduction(g, b, out, parent, tmps, rows, ranges)
        if pattern is None:
            return False
        kind = "reduce"
    elif out.agg_op in ("", "assign"):
        if not g.ranges or len(rows) != len(g.ranges) or not _injective(out, ranges):
            return False
        if out.source in g.values.keys() | g.filled | g.read | g.written or out.source in reads:
            return False
        if not _plain_view(out, parent):
            return False
        kind, pattern = "map", None
        if _points_per_row(ranges, rows) == 1 and out.source in tmps:  # one point per row: a row value
            pattern = _reduction(g, b, out, parent, tmps, dict(rows), ranges)
            kind = "map" if pattern is None else "value"
    else:
        return False
    if _points_per_row(ranges, rows) > max_row or any(s.affine.vars and set(s.affine.vars) & set(rows)
                             for s in b.stmts if isinstance(s, LoadIndex)):
        return False
    g.row_points = max(g.row_points, _points_per_row(ranges, rows))
    if kind == "reduce" and not g.ranges:
        g.ranges = tuple(ranges[v] for v in sorted(rows, key=rows.get))
        g.names = tuple(sorted(rows, key=rows.get))
    if kind in ("reduce", "value"):
        g.values[out.source] = pattern
    else:
        g.written.add(out.source)
    g.read |= reads
    g.members.append(_Member(b, kind, rows))
    return True


def _points_per_row(ranges: dict[str, int], rows: dict[str, int]) -> int:
    n = 1
    for name, k in ranges.items():
        n *= 1 if name in rows else k
    return n


def _zero(a: Affine, ranges: dict[str, int]) -> bool:
    """Whether the access ``a`` is 0 at every point: a constant 0, or indexes of range 1."""
    return a.const == 0 and all(ranges.get(v) == 1 for v in a.vars)


def _fill_of(b: Block, parent: Block) -> str | None:
    """The buffer of a kernel that is one fill special of a whole buffer, or None."""
    if b.idxs or b.constraints or len(b.stmts) != 1 or len(b.refs) != 1:
        return None
    s, r = b.stmts[0], b.refs[0]
    if not isinstance(s, Special) or s.inputs or s.outputs != (r.into,):
        return None
    if s.name != "zero" and s.name not in (f"agg_init_{op}" for op in _AGGS):
        return None
    if any(not (a.is_constant and a.const == 0) for a in r.access):
        return None
    whole = parent.ref(r.source)
    return r.source if r.shape == whole.shape and r.dir is RefDir.OUT else None


def _rows_read(g: _Group, b: Block, ranges: dict[str, int]) -> dict[str, int] | None:
    """``b``'s row indexes -> the group's rows, as its reads of row values fix them (each dim the
    writer's row, by one index alone, or 0 where the writer had 0); None when inconsistent."""
    rows: dict[str, int] = {}
    for r in b.refs:
        if r.dir is not RefDir.IN or r.source not in g.values:
            continue
        for a, row in zip(r.access, g.values[r.source], strict=True):
            if row is None:
                if not _zero(a, ranges):
                    return None
                continue
            names = a.vars
            if len(names) != 1 or a.coeff(names[0]) != 1 or a.const != 0:
                return None
            v = names[0]
            if rows.get(v, row) != row or ranges[v] != g.ranges[row]:
                return None
            rows[v] = row
    if len(set(rows.values())) != len(rows):
        return None
    return rows


def _reduction(g: _Group, b: Block, out: Refinement, parent: Block, tmps: set[str], rows, ranges):
    """The row of each dim of a reduction's output ``V`` (None: a dim of size 1 at 0), ``rows``
    completed with its row indexes; None when the output is not a row value of the group."""
    v = out.source
    if v not in tmps or v in g.values.keys() | g.read | g.written | g.cleared:
        return None
    whole = parent.ref(v)
    if any(not (a.is_constant and a.const == 0) for a in whole.access):
        return None
    if len(out.access) != len(whole.shape.dims):
        return None
    dims: list[str | None] = []
    complete = bool(g.ranges) and len(rows) == len(g.ranges)  # reads fixed every row index
    for a, d in zip(out.access, whole.shape.dims, strict=True):
        if a.is_constant or (complete and _zero(a, ranges) and not set(a.vars) & set(rows)):
            if not _zero(a, ranges) or d.size != 1:
                return None
            dims.append(None)  # 0, or an index of range 1 (a row value's size-1 dim)
            continue
        names = a.vars
        if len(names) != 1 or a.coeff(names[0]) != 1 or a.const != 0 or ranges[names[0]] != d.size:
            return None
        if names[0] in dims:
            return None
        dims.append(names[0])
    mine = [n for n in dims if n is not None]
    if not mine or (set(rows) - set(mine)):
        return None
    if g.ranges and len(mine) != len(g.ranges):
        return None
    free = [k for k in range(len(mine)) if k not in rows.values()]
    for n in mine:  # row indexes no read fixed take the free rows in order
        if n not in rows:
            rows[n] = free.pop(0)
    if g.ranges and any(ranges[n] != g.ranges[rows[n]] for n in mine):
        return None
    return tuple(None if n is None else rows[n] for n in dims)


def _injective(out: Refinement, ranges: dict[str, int]) -> bool:
    """Each point writes its own element: every dim one index alone (coefficient 1), each index
    in one dim."""
    seen = []
    for a in out.access:
        if len(a.vars) != 1 or a.coeff(a.vars[0]) != 1:
            return False
        seen.append(a.vars[0])
    return sorted(seen) == sorted(ranges)


def _plain_view(r: Refinement, parent: Block) -> bool:
    """A view of the parent's refinement with its rank and strides (so an access splits into a
    row part and the rest)."""
    try:
        p = parent.ref(r.source)
    except KeyError:
        return False
    return [d.stride for d in r.shape.dims] == [d.stride for d in p.shape.dims]


# ------------------------------------------------------------------------------ building


def _fuse(g: _Group, parent: Block, group: int) -> list[Block]:
    """The fills of other buffers than row values (they read nothing, and no member named their
    buffers before them), then the row program of a valid group."""
    taken = {r.into for r in parent.refs}
    outer: dict[tuple[str, tuple[Affine, ...]], list] = {}  # (source, access) -> [name, dir, sizes, r]
    local: dict[str, Refinement] = {}
    for v in g.values:
        whole = parent.ref(v)
        name = fresh(f"{v}_row", taken)
        taken.add(name)
        ones = TensorShape(whole.shape.dtype, tuple(Dim(1, 1) for _ in whole.shape.dims))
        zeros = tuple(Affine.constant(0) for _ in whole.shape.dims)
        local[v] = Refinement(RefDir.NONE, name, zeros, ones, None, "assign")
    own = {loc.into for loc in local.values()}  # the row block's names
    stmts: list[Statement] = []
    for m in g.members:
        if m.kind == "clear":
            continue
        if m.kind == "fill":
            (r,) = m.block.refs
            (s,) = m.block.stmts
            stmts.append(replace(s, outputs=(local[r.source].into,)))
            continue
        stmts.append(_inner(m, g, local, outer, own))
    refs = []
    for (source, access), (name, d, sizes, r) in outer.items():
        p = parent.ref(source)
        dims = tuple(Dim(n, pd.stride) for n, pd in zip(sizes, p.shape.dims, strict=True))
        agg = r.agg_op if d is not RefDir.IN else ""
        refs.append(Refinement(d, name, access, TensorShape(p.shape.dtype, dims),
                               None if name == source else source, agg, location=r.location))
    first = next(m.block for m in g.members if m.kind not in ("fill", "clear"))
    clears = [m.block for m in g.members if m.kind == "clear"]
    longest = max(m.block.index_space // _rows(g) for m in g.members if m.kind in ("reduce", "map", "value"))
    work = 1 << (max(1, min(group, longest)).bit_length() - 1)  # a power of two: a tree's halves
    return clears + [Block(
        name=f"{first.name}_rows",
        idxs=tuple(Index(n, k) for n, k in zip(g.names, g.ranges, strict=True)),
        refs=(*refs, *local.values()),
        stmts=tuple(stmts),
        tags=frozenset({"kernel", ROW_TAG}),
        attrs=(("group", work),),
        plan=RowPlan(tuple(g.names), tuple(loc.into for loc in local.values()), work),
        comments=tuple(c for m in g.members for c in m.block.comments if m.kind != "clear"),
    )]


def _inner(m: _Member, g: _Group, local: dict[str, Refinement], outer: dict, own: set[str]) -> Block:
    """A member kernel as the row block's inner block over its other indexes."""
    b = m.block
    env = {v: Affine.var(g.names[row]) for v, row in m.rows.items()}
    cols = tuple(ix for ix in b.idxs if ix.name not in m.rows)
    box = {ix.name: (0, ix.range - 1) for ix in cols}
    refs = []
    for r in b.refs:
        if r.source in local:
            loc = local[r.source]
            shape = TensorShape(r.shape.dtype, loc.shape.dims)
            refs.append(replace(r, access=loc.access, shape=shape, from_=_from(r.into, loc.into)))
            continue
        row_part, col_part, sizes = [], [], []
        for a, d in zip(r.access, r.shape.dims, strict=True):
            rows = Affine.build({env[v].vars[0]: c for v, c in a.terms if v in env}, a.const)
            rest = Affine.build({v: c for v, c in a.terms if v not in env})
            lo, hi = poly_interval(rest, box)
            row_part.append(rows + lo)
            col_part.append(rest - lo)
            sizes.append(int(hi - lo) + d.size)
        key = (r.source, tuple(row_part))
        got = outer.get(key)
        if got is None:
            name = fresh(r.source, own)
            own.add(name)
            outer[key] = [name, r.dir, sizes, r]
        else:
            got[2] = [max(x, y) for x, y in zip(got[2], sizes, strict=True)]
            if got[1] is not r.dir:
                got[1] = RefDir.INOUT
        name = outer[key][0]
        refs.append(replace(r, access=tuple(col_part), from_=_from(r.into, name)))
    return Block(name=b.name, idxs=cols, refs=tuple(refs), stmts=b.stmts, comments=b.comments)


def _from(into: str, source: str) -> str | None:
    return None if into == source else source
