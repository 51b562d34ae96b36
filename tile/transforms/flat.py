"""flatten: the canonical form backends consume.

A ``FlatContraction`` has named indices each ranging over ``[0, range)``, one integer offset and
one stride per index for every tensor (row-major element offsets), and the linear constraints
``lo <= Σ coeff·index <= hi`` that the ranges do not already imply — including the tensor bounds
that padding and dilation leave unguarded. Indices whose range is a single value are folded into
the offsets.

**Ownership.** After ``reduce``/``defract`` (or when the output indices were single variables to
begin with), each output location is written by exactly one value of the *output indices* (those
with a non-zero output stride); the remaining indices are accumulated over. Backends can give
each output location to one thread without atomics. ``owns_outputs`` checks this by enumeration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from tile.affine import Affine
from tile.ast import AggOp, CombOp
from tile.bounds import index_box, merge_parallel, ranges, remove_implied
from tile.errors import Span, TileIndexError
from tile.shapes import row_major_strides
from tile.typed import TAccess, TConstraint, TContraction, TensorType


@dataclass(frozen=True, slots=True)
class FlatAccess:
    tensor: str
    offset: int
    strides: tuple[int, ...]  # one per index of the flat contraction
    type: TensorType


@dataclass(frozen=True, slots=True)
class FlatConstraint:
    coeffs: tuple[int, ...]  # one per index
    lo: int
    hi: int
    origin: str


@dataclass(frozen=True, slots=True)
class FlatContraction:
    name: str
    type: TensorType
    agg: AggOp
    comb: CombOp
    names: tuple[str, ...]
    ranges: tuple[int, ...]
    output: FlatAccess
    operands: tuple[FlatAccess, ...]
    constraints: tuple[FlatConstraint, ...]
    default: str | None
    span: Span = field(default=Span(0, 0), compare=False, repr=False)

    @property
    def output_indices(self) -> tuple[str, ...]:
        return tuple(n for n, s in zip(self.names, self.output.strides) if s)


def flatten(c: TContraction) -> FlatContraction:
    """The flat form of ``c``, whose index expressions must have integer coefficients."""
    conds = ranges(c)
    bad = next((r for r in conds if not r.poly.is_integral), None)
    if bad is not None:
        raise TileIndexError(
            f"cannot flatten '{c.name}': {bad.origin} has fractional coefficients ({bad.poly})",
            bad.span,
            hint="run reduce and defract first (python -m tile emit F.tile --stage defracted)",
        )
    box = index_box(c)
    names = tuple(v for v in c.index_names if box[v][0] < box[v][1])
    fixed = {v: lo for v, (lo, hi) in box.items() if lo == hi}
    shift = {v: Affine.var(v) + box[v][0] for v in names}
    shift.update({v: Affine.constant(val) for v, val in fixed.items()})

    def access(acc: TAccess) -> FlatAccess:
        shape = acc.type.shape
        offset = Fraction(0)
        strides = [Fraction(0)] * len(names)
        for st, p in zip(row_major_strides(shape), acc.polys):
            q = p.substitute(shift)
            offset += st * q.const
            for k, v in enumerate(names):
                strides[k] += st * q.coeff(v)
        return FlatAccess(acc.tensor, int(offset), tuple(int(s) for s in strides), acc.type)

    kept = []
    for r in remove_implied(merge_parallel(conds), box):
        q = r.poly.substitute(shift)
        kept.append(
            FlatConstraint(
                tuple(int(q.coeff(v)) for v in names), int(r.lo - q.const), int(r.hi - q.const), r.origin
            )
        )
    return FlatContraction(
        c.name,
        c.type,
        c.agg,
        c.comb,
        names,
        tuple(box[v][1] - box[v][0] + 1 for v in names),
        access(c.output),
        tuple(access(a) for a in c.operands),
        tuple(kept),
        c.default,
        c.span,
    )


def as_contraction(f: FlatContraction) -> TContraction:
    """An equivalent contraction over the tensors viewed as 1-D buffers (for the interpreter)."""

    def acc(a: FlatAccess) -> TAccess:
        n = 1
        for d in a.type.shape:
            n *= d
        poly = Affine.build(dict(zip(f.names, a.strides)), a.offset)
        return TAccess(a.tensor, (poly,), TensorType(a.type.dtype, (n,)))

    cons = [
        TConstraint(Affine.build(dict(zip(f.names, k.coeffs)), -k.lo), k.hi - k.lo + 1) for k in f.constraints
    ]
    cons += [TConstraint(Affine.var(v), r) for v, r in zip(f.names, f.ranges)]
    out = acc(f.output)
    return TContraction(
        f.name, out.type, f.agg, f.comb, out, tuple(acc(a) for a in f.operands), tuple(cons), f.default, True,
        f.span,
    )


def format_flat(f: FlatContraction) -> str:
    """A readable table of the flat form."""
    w = max([len(n) for n in f.names] + [5])
    lines = [
        f"flat {f.name}: {f.type}  agg {f.agg.value}  comb {f.comb.value or '(none)'}"
        + (f"  default {f.default}" if f.default else "")
    ]
    lines.append("  " + "index".ljust(w) + "  range  owns-output")
    for n, r, s in zip(f.names, f.ranges, f.output.strides):
        lines.append("  " + n.ljust(w) + f"  {r:<5}  {'yes' if s else ''}".rstrip())
    tw = max(len(a.tensor) for a in (f.output, *f.operands))
    lines.append("  " + "tensor".ljust(max(tw, 6)) + "  offset  strides (" + ", ".join(f.names) + ")")
    for a in (f.output, *f.operands):
        lines.append(
            "  " + a.tensor.ljust(max(tw, 6)) + f"  {a.offset:<6}  " + ", ".join(map(str, a.strides))
        )
    for k in f.constraints:
        lhs = str(Affine.build(dict(zip(f.names, k.coeffs))))
        lines.append(f"  constraint {k.lo} <= {lhs} <= {k.hi}   ({k.origin})")
    return "\n".join(lines)
