"""The Tile syntax tree, exactly as written (before any shapes or types are known).

Nodes are frozen dataclasses with tuple fields; spans never take part in equality, so
``parse(print(p)) == p``. One expression family serves elementwise code, output sizes, constraint
bounds and index polynomials: what each may contain is checked when the program is bound to
shapes (``tile.bind``), where the meaning of ``/`` (truncating for sizes, exact for indices) is
decided by context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from tile.errors import Source, Span

_NO_SPAN = Span(0, 0)


def _span() -> Span:
    return field(default=_NO_SPAN, compare=False, repr=False)


class AggOp(Enum):
    """How the values that land on one output element are combined."""

    SUM = "+"
    PROD = "*"
    MAX = ">"
    MIN = "<"
    ASSIGN = "="


class CombOp(Enum):
    """How the operands of one index tuple are combined into one value."""

    NONE = ""  # a single operand
    MUL = "*"
    ADD = "+"
    EQ = "=="  # A == B, a bool
    COND = "?"  # A == B ? C : 0


# ---------------------------------------------------------------------------- expressions


@dataclass(frozen=True, slots=True)
class IntLit:
    value: int
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class FloatLit:
    text: str  # kept verbatim so printing round-trips and exact mode reads the decimal exactly
    span: Span = _span()

    @property
    def value(self) -> float:
        return float(self.text)


@dataclass(frozen=True, slots=True)
class Name:
    """A tensor, dimension or named constant (upper-case) or an index variable (lower-case)."""

    name: str
    span: Span = _span()

    @property
    def is_index(self) -> bool:
        return self.name[0].islower()


@dataclass(frozen=True, slots=True)
class Call:
    fn: str
    args: tuple[Expr, ...]
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Unary:
    op: str  # "-" or "~"
    operand: Expr
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Binary:
    op: str  # + - * / == != < > <= >= << >> & | ^
    lhs: Expr
    rhs: Expr
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Ternary:
    cond: Expr
    then: Expr
    other: Expr
    span: Span = _span()


Expr = IntLit | FloatLit | Name | Call | Unary | Binary | Ternary


def children(e: Expr) -> tuple[Expr, ...]:
    """The direct subexpressions of ``e``, left to right (none for a literal or a name)."""
    if isinstance(e, Unary):
        return (e.operand,)
    if isinstance(e, Binary):
        return (e.lhs, e.rhs)
    if isinstance(e, Ternary):
        return (e.cond, e.then, e.other)
    if isinstance(e, Call):
        return e.args
    return ()

# Operator spelling -> builtin function name (the call forms `add(A, B)` etc. are accepted too).
BINARY_FUNCTIONS = {
    "+": "add",
    "-": "sub",
    "*": "mul",
    "/": "div",
    "==": "cmp_eq",
    "!=": "cmp_ne",
    "<": "cmp_lt",
    ">": "cmp_gt",
    "<=": "cmp_le",
    ">=": "cmp_ge",
    "<<": "bit_left",
    ">>": "bit_right",
    "&": "bit_and",
    "|": "bit_or",
    "^": "bit_xor",
}
UNARY_FUNCTIONS = {"-": "neg", "~": "bit_not"}


# ----------------------------------------------------------------------------- statements


@dataclass(frozen=True, slots=True)
class TensorRef:
    """``A[i, 2*j + k]`` inside a contraction."""

    name: str
    indices: tuple[Expr, ...]
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Constraint:
    """``poly < bound``, meaning ``0 <= poly < bound``."""

    poly: Expr
    bound: Expr
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Contraction:
    """``O[idx: sizes] = agg(operands), constraints [no_defract] [default D];``"""

    output: TensorRef
    sizes: tuple[Expr, ...] | None  # None: written without `: sizes`
    agg: AggOp
    comb: CombOp
    operands: tuple[TensorRef, ...]
    constraints: tuple[Constraint, ...] = ()
    default: str | None = None
    no_defract: bool = False
    span: Span = _span()
    default_span: Span = _span()

    @property
    def name(self) -> str:
        return self.output.name


@dataclass(frozen=True, slots=True)
class Assignment:
    """``O = expr;`` — an elementwise statement (or a named constant when ``expr`` is)."""

    name: str
    expr: Expr
    span: Span = _span()


Statement = Contraction | Assignment


@dataclass(frozen=True, slots=True)
class Input:
    """A function parameter: ``I[N, M]`` (dims bound), ``I[]`` (0-D) or ``I`` (any rank)."""

    name: str
    dims: tuple[str, ...] | None
    span: Span = _span()
    dim_spans: tuple[Span, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Output:
    name: str
    span: Span = _span()


@dataclass(frozen=True, slots=True)
class Program:
    inputs: tuple[Input, ...]
    outputs: tuple[Output, ...]
    stmts: tuple[Statement, ...]
    source: Source | None = field(default=None, compare=False, repr=False)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.outputs)

    def __str__(self) -> str:
        from tile.printer import format_program

        return format_program(self)
