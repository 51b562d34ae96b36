"""The Tile syntax tree, exactly as written (before any shapes or types are known).

Nodes are frozen dataclasses with tuple fields; spans never take part in equality, so
``parse(print(p)) == p``, the text ``format_program`` (at the end, ``tile.printer``'s names) gives
and ``str`` of a ``Program``. One expression family serves elementwise code, output sizes, constraint
bounds and index polynomials: what each may contain is checked when the program is bound to
shapes (``tile.bind``), where the meaning of ``/`` (truncating for sizes, exact for indices) is
decided by context.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
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


def expressions(stmt: Statement) -> Iterator[Expr]:
    """Every expression node of a statement, outer before inner, left to right: an assignment's
    right side; a contraction's output indices and sizes, its operands' indices, its constraints."""
    if isinstance(stmt, Assignment):
        roots: list[Expr] = [stmt.expr]
    else:
        roots = [*stmt.output.indices, *(stmt.sizes or ())]
        roots += [i for ref in stmt.operands for i in ref.indices]
        roots += [x for c in stmt.constraints for x in (c.poly, c.bound)]
    stack = list(reversed(roots))
    while stack:
        e = stack.pop()
        yield e
        stack.extend(reversed(children(e)))


def substitute(e: Expr, subst: dict[str, Expr]) -> Expr:
    """``e`` with each tensor name in ``subst`` replaced by its expression (index names stay)."""
    if isinstance(e, Name):
        return subst.get(e.name, e) if not e.is_index else e
    if isinstance(e, Binary):
        return Binary(e.op, substitute(e.lhs, subst), substitute(e.rhs, subst))
    if isinstance(e, Unary):
        return Unary(e.op, substitute(e.operand, subst))
    if isinstance(e, Ternary):
        return Ternary(substitute(e.cond, subst), substitute(e.then, subst), substitute(e.other, subst))
    if isinstance(e, Call):
        return Call(e.fn, tuple(substitute(a, subst) for a in e.args))
    return e


def _renamed(name: str, subst: dict[str, Expr]) -> str:
    new = subst.get(name)
    return new.name if isinstance(new, Name) else name


def _renamed_ref(r: TensorRef, subst: dict[str, Expr]) -> TensorRef:
    return TensorRef(_renamed(r.name, subst), tuple(substitute(i, subst) for i in r.indices))


def rename_statement(s: Statement, subst: dict[str, Expr]) -> Statement:
    """A statement with ``subst`` applied: tensors (defined, read, default) renamed where they map
    to a ``Name``, sizes (and other names in expressions) replaced by their expressions. Used to
    inline one function's statements into another (custom gradients, ``tile.onnx``)."""
    if isinstance(s, Assignment):
        return Assignment(_renamed(s.name, subst), substitute(s.expr, subst))
    return replace(
        s,
        output=_renamed_ref(s.output, subst),
        sizes=None if s.sizes is None else tuple(substitute(x, subst) for x in s.sizes),
        operands=tuple(_renamed_ref(o, subst) for o in s.operands),
        constraints=tuple(Constraint(substitute(c.poly, subst), substitute(c.bound, subst))
                          for c in s.constraints),
        default=None if s.default is None else _renamed(s.default, subst),
    )


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


@dataclass(frozen=True, slots=True, repr=False)
class Program:
    inputs: tuple[Input, ...]
    outputs: tuple[Output, ...]
    stmts: tuple[Statement, ...]
    source: Source | None = field(default=None, compare=False)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.outputs)

    def __str__(self) -> str:
        """The program as Tile text (``parse(str(p)) == p``)."""
        return format_program(self)

    def __repr__(self) -> str:
        """A short form for the REPL: the signature and the statement count (``str`` is the text)."""
        ins = ", ".join(i.name if i.dims is None else f"{i.name}[{', '.join(i.dims)}]" for i in self.inputs)
        n = len(self.stmts)
        return f"<tile.Program ({ins}) -> ({', '.join(self.output_names)}): {n} statement{'s' * (n != 1)}>"


# ------------------------------------------------------------------------------------ text
# Tile text from the tree, ``parse(format_program(p)) == p``: expressions get the fewest
# parentheses the grammar in ``tile.parser`` needs; statements are printed one per line, indented
# four spaces, in the spelling the parser accepts (``= =(`` for the assign aggregation,
# ``A[..] == B[..] ? C[..]`` for the conditional combination).

# Binding strength of each operator (higher binds tighter); mirrors tile.parser._LEVELS.
_LEVEL = {
    "|": 1,
    "^": 2,
    "&": 3,
    "==": 4,
    "!=": 4,
    "<": 5,
    ">": 5,
    "<=": 5,
    ">=": 5,
    "<<": 6,
    ">>": 6,
    "+": 7,
    "-": 7,
    "*": 8,
    "/": 8,
}
_NONASSOC = {4, 5}
_UNARY, _PRIMARY = 9, 10


def _level(e: Expr) -> int:
    if isinstance(e, Ternary):
        return 0
    if isinstance(e, Binary):
        return _LEVEL[e.op]
    if isinstance(e, Unary):
        return _UNARY
    if isinstance(e, (IntLit, FloatLit)) and _text(e).startswith("-"):
        return _UNARY
    return _PRIMARY


def _text(e: IntLit | FloatLit) -> str:
    return str(e.value) if isinstance(e, IntLit) else e.text


def _wrap(e: Expr, need: bool) -> str:
    s = format_expr(e)
    return f"({s})" if need else s


def format_expr(e: Expr) -> str:
    """One expression in Tile syntax."""
    if isinstance(e, (IntLit, FloatLit)):
        return _text(e)
    if isinstance(e, Name):
        return e.name
    if isinstance(e, Call):
        return f"{e.fn}({', '.join(format_expr(a) for a in e.args)})"
    if isinstance(e, Unary):
        inner = _wrap(e.operand, _level(e.operand) < _UNARY)
        # `- -x` must not print as `--x`; `-(-3)` keeps its parentheses to stay a Unary.
        if inner.startswith("-") or (isinstance(e.operand, (IntLit, FloatLit))):
            inner = f"({inner})"  # `inner` is unwrapped here; reuse it (formatting twice was exponential)
        return f"{e.op}{inner}"
    if isinstance(e, Binary):
        lvl = _LEVEL[e.op]
        strict = lvl in _NONASSOC
        lhs = _wrap(e.lhs, _level(e.lhs) < lvl or (strict and _level(e.lhs) == lvl))
        rhs = _wrap(e.rhs, _level(e.rhs) <= lvl)
        return f"{lhs} {e.op} {rhs}"
    if isinstance(e, Ternary):
        cond = _wrap(e.cond, _level(e.cond) == 0)
        return f"{cond} ? {format_expr(e.then)} : {format_expr(e.other)}"
    raise AssertionError(f"unknown expression node {e!r}")


def format_ref(r: TensorRef) -> str:
    return f"{r.name}[{', '.join(format_expr(i) for i in r.indices)}]"


def format_combination(comb: CombOp, operands: list[str]) -> str:
    """The inside of ``agg(...)``: ``A[..]``, ``A[..] * B[..]`` or ``A[..] == B[..] ? C[..]``."""
    if comb is CombOp.NONE:
        return operands[0]
    if comb is CombOp.COND:
        return f"{operands[0]} == {operands[1]} ? {operands[2]}"
    return f" {comb.value} ".join(operands)


def format_statement(s: Statement) -> str:
    """One statement, with its semicolon."""
    if isinstance(s, Assignment):
        return f"{s.name} = {format_expr(s.expr)};"
    out = ", ".join(format_expr(i) for i in s.output.indices)
    if s.sizes:
        out = f"{out}: {', '.join(format_expr(x) for x in s.sizes)}"
    elif s.sizes is not None and s.output.indices:
        out = f"{out}:"
    body = format_combination(s.comb, [format_ref(o) for o in s.operands])
    text = f"{s.output.name}[{out}] = {s.agg.value}({body})"
    for c in s.constraints:
        text += f", {format_expr(c.poly)} < {format_expr(c.bound)}"
    if s.no_defract:
        text += " no_defract"
    if s.default is not None:
        text += f" default {s.default}"
    return text + ";"


def format_program(p: Program) -> str:
    """A whole function, one statement per line."""

    def inp(i: Input) -> str:
        return i.name if i.dims is None else f"{i.name}[{', '.join(i.dims)}]"

    head = f"function ({', '.join(inp(i) for i in p.inputs)}) -> ({', '.join(p.output_names)}) {{"
    body = [f"    {format_statement(s)}" for s in p.stmts]
    return "\n".join([head, *body, "}"]) + "\n"
