"""The typed program: every tensor's dtype and shape known, every index polynomial exact.

``tile.bind`` produces it from the syntax tree and the input types; the interpreter, autodiff and
lowering consume it. Elementwise expressions are trees of ``TConst``/``TRef``/``TCall`` (every
operator is a call of its builtin name: ``a + b`` is ``add``); contractions carry exact
``Affine`` accesses and integer constraint bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from tile import ast
from tile.affine import Affine
from tile.dtypes import DType
from tile.errors import Span

_NO_SPAN = Span(0, 0)

# A dimension size: an int once bound to arrays, a sympy expression in a symbolic check.
Size = Any


def _span() -> Span:
    return field(default=_NO_SPAN, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class TensorType:
    dtype: DType
    shape: tuple[Size, ...] | None  # None: rank unknown (only in a symbolic check)

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def __str__(self) -> str:
        dims = "?" if self.shape is None else ", ".join(str(d) for d in self.shape)
        return f"{self.dtype}[{dims}]"


@dataclass(frozen=True, slots=True)
class TConst:
    """A scalar constant: a literal, a dimension's size, or a folded integer expression."""

    value: int | Fraction | Any  # Any: a sympy symbol in a symbolic check
    type: TensorType
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class TRef:
    name: str
    type: TensorType
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class TCall:
    fn: str
    args: tuple[TExpr, ...]
    type: TensorType
    params: tuple[int, ...] = ()  # compile-time integer arguments: bits, axis, reshape sizes
    span: Span = _span()


TExpr = TConst | TRef | TCall


def calls(e: TExpr):
    """Every builtin call in ``e``, outermost first."""
    if isinstance(e, TCall):
        yield e
        for a in e.args:
            yield from calls(a)


@dataclass(frozen=True, slots=True)
class TAccess:
    """One tensor's access in a contraction: an exact affine polynomial per dimension."""

    tensor: str
    polys: tuple[Affine, ...]
    type: TensorType
    span: Span = _span()
    poly_spans: tuple[Span, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class TConstraint:
    """``0 <= poly < bound``."""

    poly: Affine
    bound: Size
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class TContraction:
    name: str
    type: TensorType
    agg: ast.AggOp
    comb: ast.CombOp
    output: TAccess
    operands: tuple[TAccess, ...]
    constraints: tuple[TConstraint, ...]
    default: str | None
    no_defract: bool
    span: Span = _span()
    source: ast.Contraction | None = field(default=None, compare=False, repr=False)

    @property
    def is_matrix_product(self) -> bool:
        """A `+` contraction of `*` products (matmuls, convolutions, dot products): what float16
        and bfloat16 sum in float32 and a matrix unit computes (docs/semantics.md §8.1.1)."""
        return self.agg is ast.AggOp.SUM and self.comb is ast.CombOp.MUL

    @property
    def has_matrix_shape(self) -> bool:
        """A matrix product of two operands with rows, columns and a sum between them: an output
        index only the first operand reads, one only the second reads, and an index both read that
        the output does not (matmuls, convolutions): what a matrix unit can take. A depthwise
        convolution (no index of the second operand's own), a dot product or a summed elementwise
        product has none."""
        if not self.is_matrix_product or len(self.operands) != 2:
            return False
        a, b = ({v for p in acc.polys for v in p.vars} for acc in self.operands)
        out = {v for p in self.output.polys for v in p.vars}
        return bool(out & a - b) and bool(out & b - a) and bool(a & b - out)

    @property
    def index_names(self) -> tuple[str, ...]:
        """Every index variable, in order of first appearance (output first)."""
        seen: dict[str, None] = {}
        for acc in (self.output, *self.operands):
            for p in acc.polys:
                for v in p.vars:
                    seen.setdefault(v)
        for c in self.constraints:
            for v in c.poly.vars:
                seen.setdefault(v)
        return tuple(seen)


@dataclass(frozen=True, slots=True)
class TAssign:
    name: str
    expr: TExpr
    span: Span = _span()

    @property
    def type(self) -> TensorType:
        return self.expr.type


TStatement = TAssign | TContraction


@dataclass(frozen=True, slots=True)
class BoundProgram:
    program: ast.Program
    inputs: tuple[tuple[str, TensorType], ...]
    stmts: tuple[TStatement, ...]
    outputs: tuple[str, ...]
    types: dict[str, TensorType] = field(compare=False)
    constants: dict[str, Size] = field(compare=False)  # dims and integer named constants
    notes: tuple[str, ...] = ()  # assumptions a symbolic check had to make

    @property
    def symbolic(self) -> bool:
        return any(not isinstance(v, int) for v in self.constants.values())
