"""Typing a contraction: its output's sizes and element type, its accesses (one exact affine index
polynomial per dimension), its constraints and its default; then, when every size is known, the
exact bounds of its index space (``tile.bounds.check_bounded``)."""

from __future__ import annotations

import sympy

from tile import ast
from tile.affine import Affine
from tile.binding.scope import Scope
from tile.bounds import check_bounded
from tile.dtypes import DType, arithmetic, promote
from tile.errors import Span, TileIndexError, TileShapeError, TileTypeError
from tile.shapes import fmt_shape, is_concrete, same_size
from tile.typed import Size, TAccess, TConstraint, TContraction, TensorType


class Contractions:
    def __init__(self, scope: Scope):
        self.scope = scope
        self.placeholder_used = False  # a symbolic size stood in an index polynomial of this one

    def bind(self, c: ast.Contraction) -> TContraction:
        self.placeholder_used = False
        out = c.output
        shape = self.output_shape(c)
        operands = tuple(self.access(r) for r in c.operands)
        otype = TensorType(_dtype(c, operands), shape)
        output = TAccess(
            out.name,
            tuple(self.poly(i) for i in out.indices),
            otype,
            out.span,
            tuple(i.span for i in out.indices),
        )
        constraints = self.constraints(c, (output, *operands))
        if c.default is not None:
            self.check_default(c, shape)
        bound = TContraction(
            out.name, otype, c.agg, c.comb, output, operands, constraints, c.default, c.no_defract, c.span, c
        )
        if not self.placeholder_used:
            check_bounded(bound)
        return bound

    def output_shape(self, c: ast.Contraction) -> tuple[Size, ...]:
        out = c.output
        if c.sizes is None:
            raise TileShapeError(
                f"the size of '{out.name}' is missing",
                out.span,
                hint=f"give one size per index after a colon, e.g. `{out.name}[i, j: M, N]`",
            )
        if len(c.sizes) != len(out.indices):
            raise TileShapeError(
                f"'{out.name}' has {len(out.indices)} index(es) but {len(c.sizes)} size(s)",
                out.span,
                hint="give exactly one size per output index",
            )
        sizes = []
        for s in c.sizes:
            v = self.scope.const(s, "an output size")
            if is_concrete(v) and v < 0:
                raise TileShapeError(
                    f"output size {v} is negative",
                    s.span,
                    hint="sizes are non-negative integer expressions of dimensions",
                )
            sizes.append(v)
        return tuple(sizes)

    def access(self, ref: ast.TensorRef) -> TAccess:
        t = self.scope.lookup_tensor(ref.name, ref.span)
        if t.shape is not None and len(t.shape) != len(ref.indices):
            raise TileShapeError(
                f"'{ref.name}' has rank {len(t.shape)} but is indexed with {len(ref.indices)} index(es)",
                ref.span,
                hint=f"{ref.name} has shape {fmt_shape(t.shape)}; give one index per dimension",
            )
        if t.shape is None:  # rank learned from this use (symbolic check of an input without dims)
            t = TensorType(
                t.dtype,
                tuple(
                    sympy.Symbol(f"{ref.name}.{k}", positive=True, integer=True)
                    for k in range(len(ref.indices))
                ),
            )
            self.scope.types[ref.name] = t
        return TAccess(
            ref.name,
            tuple(self.poly(i) for i in ref.indices),
            t,
            ref.span,
            tuple(i.span for i in ref.indices),
        )

    def constraints(self, c: ast.Contraction, accesses: tuple[TAccess, ...]) -> tuple[TConstraint, ...]:
        """The constraints, each of whose indexes must appear in an access."""
        constraints = tuple(
            TConstraint(self.poly(k.poly), self.scope.const(k.bound, "a constraint bound"), k.span)
            for k in c.constraints
        )
        used = {v for a in accesses for p in a.polys for v in p.vars}
        for k, tk in zip(c.constraints, constraints):
            for v in tk.poly.vars:
                if v not in used:
                    raise TileIndexError(
                        f"index '{v}' appears only in a constraint",
                        _find_name(k.poly, v) or k.span,
                        hint=f"use '{v}' in a tensor index, or remove the constraint",
                    )
        return constraints

    def check_default(self, c: ast.Contraction, shape: tuple[Size, ...]) -> None:
        assert c.default is not None
        dt = self.scope.lookup_tensor(c.default, c.default_span)
        if dt.shape is not None and not (
            len(dt.shape) == len(shape) and all(same_size(a, b) for a, b in zip(dt.shape, shape))
        ):
            raise TileShapeError(
                f"default tensor '{c.default}' has shape {fmt_shape(dt.shape)} but "
                f"'{c.output.name}' has shape {fmt_shape(shape)}",
                c.default_span,
                hint="the default must have exactly the output's shape",
            )

    # --------------------------------------------------------- index polynomials
    def poly(self, e: ast.Expr) -> Affine:
        """An exact affine polynomial in index variables; ``/`` is exact (``i/2`` is a half)."""
        if isinstance(e, ast.IntLit):
            return Affine.constant(e.value)
        if isinstance(e, ast.Name):
            if e.is_index:
                return Affine.var(e.name)
            v = self.scope.const(e, "an index polynomial")
            if is_concrete(v):
                return Affine.constant(v)
            self.placeholder_used = True  # symbolic: only linearity can be checked
            return Affine.constant(1)
        if isinstance(e, ast.Unary) and e.op == "-":
            return -self.poly(e.operand)
        if isinstance(e, ast.Binary) and e.op in "+-":
            a, b = self.poly(e.lhs), self.poly(e.rhs)
            return a + b if e.op == "+" else a - b
        if isinstance(e, ast.Binary) and e.op == "*":
            a, b = self.poly(e.lhs), self.poly(e.rhs)
            if not a.is_constant and not b.is_constant:
                raise TileIndexError(
                    "non-linear index polynomial",
                    e.span,
                    hint="index expressions are affine: multiply an index only by a constant",
                )
            return a * b.const if b.is_constant else b * a.const
        if isinstance(e, ast.Binary) and e.op == "/":
            a, b = self.poly(e.lhs), self.poly(e.rhs)
            if not b.is_constant:
                raise TileIndexError(
                    "division by an index variable",
                    e.rhs.span,
                    hint="index expressions may only be divided by constants",
                )
            if b.const == 0:
                raise TileIndexError(
                    "division by zero in an index polynomial",
                    e.rhs.span,
                    hint="divide index expressions by non-zero constants only",
                )
            return a / b.const
        if isinstance(e, ast.FloatLit):
            raise TileTypeError(
                "float constant in an index expression",
                e.span,
                hint="index coefficients are integers or exact fractions like 1/2",
            )
        raise TileIndexError(
            "not allowed in an index polynomial",
            e.span,
            hint="index expressions use + - * / on indices, integers and dimensions",
        )


def _dtype(c: ast.Contraction, operands: tuple[TAccess, ...]) -> DType:
    """The output's element type: its combination's, widened for ``+`` and ``*`` aggregations."""
    dtypes = [a.type.dtype for a in operands]
    if c.comb is ast.CombOp.NONE:
        dtype = dtypes[0]
    elif c.comb is ast.CombOp.EQ:
        dtype = DType.BOOL
    elif c.comb is ast.CombOp.COND:
        dtype = dtypes[2]
    else:
        dtype = promote(dtypes[0], dtypes[1])
    if c.agg in (ast.AggOp.SUM, ast.AggOp.PROD):
        dtype = arithmetic(dtype)
    return dtype


def _find_name(e: ast.Expr, name: str) -> Span | None:
    """The span of the first use of ``name`` inside ``e``."""
    if isinstance(e, ast.Name):
        return e.span if e.name == name else None
    children: tuple = ()
    if isinstance(e, ast.Binary):
        children = (e.lhs, e.rhs)
    elif isinstance(e, ast.Unary):
        children = (e.operand,)
    elif isinstance(e, ast.Call):
        children = e.args
    elif isinstance(e, ast.Ternary):
        children = (e.cond, e.then, e.other)
    for c in children:
        s = _find_name(c, name)
        if s is not None:
            return s
    return None
