"""Gradients of ``>``, ``<`` and ``*`` aggregations over a combination of several tensors.

``C[i, j: M, N] = >(A[i, k] + B[k, j])`` (a max-plus product) has, per output element, one
candidate *term* ``A[i, k] + B[k, j]`` for each ``k``. Its gradient goes through the *term tensor*
``C_terms[i, j, k] = A[i, k] + B[k, j]``, which holds every term once:

* ``>`` / ``<``: the terms equal to the output receive ``DC``:
  ``C_hits[i, j, k] = >(C_terms[i, j, k] == C[i, j] ? DC[i, j])``; every tied term receives the
  full gradient, as the tied elements of a single-tensor ``>`` do (a term read by several index
  tuples of one output is one candidate and counts once);
* ``*``: each term receives ``DC`` times the product of the others, exact with zeros as the
  single-tensor ``*`` (``contraction.py``): with no zero term ``DC * C / term``, the single zero
  term ``DC *`` (product of the non-zero terms), 0 with two or more zeros;

then the chain rule through the combination sends a term's weight ``W`` to its operands:
``+`` gives both ``W``, ``*`` gives A ``W * B`` and B ``W * A``, ``A == B ? X`` gives X
``A == B ? W`` (A and B none), ``==`` none.

The term tensor is indexed by a basis of the forward's access polynomials (output first, then the
operands), each with its tensor's size, so its indices never go negative. When the access
polynomials determine the index tuple (``injective``), terms and tuples are one to one and every
rule is written over the forward's own tuples, keeping its constraints. Otherwise several tuples
read the same term: ``*`` still sums over tuples (each is a factor of the product), while ``>``
and ``<`` sum over the terms themselves, through fresh indices ``z0, z1, ...`` over the term
tensor, so that a repeated term counts once.

The term tensor has as many elements as the forward has index tuples (``M * N * K`` for the
max-plus product): ``TileGradientMemoryWarning`` says so when that is large.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

import sympy

from tile import ast
from tile.affine import Affine
from tile.autodiff.build import Namer, add, binary, cond, div, is_num, lit, mul, neg, ref, sub
from tile.errors import TileGradientMemoryWarning
from tile.linalg import independent, inverse, rank
from tile.typed import TContraction


class GradWriter(Protocol):
    """What these rules use of ``tile.autodiff.contraction.ContractionGrad`` (which calls them)."""

    namer: Namer

    def emit(self, stmt: ast.Statement) -> None: ...
    def sizes(self, tensor: str) -> tuple[ast.Expr, ...]: ...
    def ones_like(self, tensor: str) -> str: ...
    def is_float(self, tensor: str) -> bool: ...
    def contraction(
        self,
        name: str,
        sizes: tuple[ast.Expr, ...],
        out: list[ast.Expr],
        operands: tuple[ast.TensorRef, ...],
        comb: ast.CombOp,
        constraints: tuple[ast.Constraint, ...],
        agg: ast.AggOp = ...,
    ) -> ast.Name: ...


# Warn when the term tensor has at least this many elements (64 MiB of float32) ...
WARN_ELEMENTS = 1 << 24
# ... and more than this many times the elements of the contraction's operands and output together.
WARN_RATIO = 4


@dataclass(frozen=True)
class TermSpace:
    """The term tensor's index expressions (in the forward's index variables), sizes and exact
    polynomials; ``injective`` when the polynomials determine the forward's index tuple."""

    index: tuple[ast.Expr, ...]
    sizes: tuple[ast.Expr, ...]
    polys: tuple[Affine, ...]
    injective: bool


def term_space(cg: GradWriter, s: ast.Contraction, t: TContraction) -> TermSpace:
    """A basis of the access polynomials, chosen greedily: output rows first, then each operand's."""
    names = list(t.index_names)
    rows = list(zip(s.output.indices, cg.sizes(s.name), t.output.polys))
    for op, top in zip(s.operands, t.operands):
        rows += zip(op.indices, cg.sizes(op.name), top.polys)
    chosen: list[tuple[ast.Expr, ast.Expr, Affine]] = []
    basis: list[list[Fraction]] = []
    for e, size, p in rows:
        vec = [p.coeff(v) for v in names]
        if any(vec) and independent(basis, vec):
            chosen.append((e, size, p))
            basis.append(vec)
    all_rows = [[p.coeff(v) for v in names] for _, _, p in rows]
    injective = not names or rank(all_rows) == len(names)
    return TermSpace(
        tuple(e for e, _, _ in chosen),
        tuple(z for _, z, _ in chosen),
        tuple(p for _, _, p in chosen),
        injective,
    )


def combined_grads(
    cg: GradWriter, s: ast.Contraction, t: TContraction, g: str, base
) -> list[tuple[str, ast.Expr]]:
    """``[(tensor, contribution)]`` for a ``>``, ``<`` or ``*`` contraction of several tensors."""
    space = term_space(cg, s, t)
    _warn_if_large(cg, s, space)
    so = list(s.output.indices)
    cons = s.constraints
    idx = list(space.index)
    # Every tuple that reaches a term writes the same value, so `>` keeps that value (and is not a
    # matrix product, which a reduced-precision mode might round differently from the forward).
    terms = cg.contraction(
        cg.namer.fresh(f"{s.name}_terms"), space.sizes, idx, s.operands, s.comb, cons, ast.AggOp.MAX
    ).name
    if s.agg is ast.AggOp.PROD:
        weight = _product_weight(cg, s, space, terms, g)
    else:
        body = (ref(terms, idx), ref(s.name, so), ref(g, so))
        weight = cg.contraction(
            cg.namer.fresh(f"{s.name}_hits"), space.sizes, idx, body, ast.CombOp.COND, cons, ast.AggOp.MAX
        ).name
    if s.agg is ast.AggOp.PROD or space.injective:
        at, w, cons_out = (lambda k: s.operands[k].indices), ref(weight, idx), cons
    else:  # sum over the terms, not the tuples: a term read by several tuples counts once
        at, w = _over_terms(s, t, space, weight)
        cons_out = ()
    out = []
    for k, op in enumerate(s.operands):
        if not cg.is_float(op.name):
            continue
        other = s.operands[1 - k] if k < 2 else None
        if s.comb is ast.CombOp.COND:
            if k < 2:
                continue
            body = (ref(s.operands[0].name, at(0)), ref(s.operands[1].name, at(1)), w)
            comb = ast.CombOp.COND
        elif s.comb is ast.CombOp.MUL:
            body, comb = (w, ref(other.name, at(1 - k))), ast.CombOp.MUL
        elif not _covered(cg, space, other):  # `+`: the other operand's range still counts
            body, comb = (w, ref(cg.ones_like(other.name), at(1 - k))), ast.CombOp.MUL
        else:
            body, comb = (w,), ast.CombOp.NONE
        grad = cg.contraction(base(op.name), cg.sizes(op.name), list(at(k)), body, comb, cons_out)
        out.append((op.name, grad))
    return out


def _product_weight(cg: GradWriter, s: ast.Contraction, space: TermSpace, terms: str, g: str) -> str:
    """``DO * (product of the other terms)`` per term, exact with zeros. A term no valid tuple
    reaches holds 0 but is not a factor: ``valid`` marks the terms that are."""
    so = list(s.output.indices)
    osizes = cg.sizes(s.name)
    cons = s.constraints
    idx = list(space.index)
    fresh = cg.namer.fresh
    term = ast.Name(terms)
    is_zero = binary("==", term, lit(0))
    zero = fresh(f"{s.name}_is0")
    if all(_covered(cg, space, op) for op in s.operands):
        cg.emit(ast.Assignment(zero, is_zero))
    else:
        ones = tuple(ref(cg.ones_like(op.name), op.indices) for op in s.operands)
        comb = ast.CombOp.MUL if len(ones) == 2 else ast.CombOp.COND
        valid = cg.contraction(fresh(f"{s.name}_valid"), space.sizes, idx, ones, comb, cons, ast.AggOp.MAX)
        cg.emit(ast.Assignment(zero, cond(is_zero, valid, lit(0))))
    nonzero = fresh(f"{s.name}_nz")
    cg.emit(ast.Assignment(nonzero, cond(is_zero, lit(1), term)))
    count = cg.contraction(fresh(f"{s.name}_zeros"), osizes, so, (ref(zero, idx),), ast.CombOp.NONE, cons)
    prod = cg.contraction(
        fresh(f"{s.name}_prodnz"), osizes, so, (ref(nonzero, idx),), ast.CombOp.NONE, cons, ast.AggOp.PROD
    )
    spread = []
    for zeros in (0, 1):
        scaled = fresh(f"{g}_z{zeros}")
        cg.emit(ast.Assignment(scaled, mul(ast.Name(g), cond(binary("==", count, lit(zeros)), prod, lit(0)))))
        spread.append(
            cg.contraction(
                fresh(f"{s.name}_z{zeros}"),
                space.sizes,
                idx,
                (ref(scaled, so),),
                ast.CombOp.NONE,
                cons,
                ast.AggOp.MAX,
            )
        )
    weight = fresh(f"{s.name}_weight")
    cg.emit(ast.Assignment(weight, cond(is_zero, spread[1], div(spread[0], term))))
    return weight


def _covered(cg: GradWriter, space: TermSpace, op: ast.TensorRef) -> bool:
    """Whether every index expression of ``op`` is one of the term tensor's, with the same size:
    then reading the term tensor checks ``op``'s range conditions already."""
    rows = set(zip(space.index, space.sizes))
    return all((e, z) in rows for e, z in zip(op.indices, cg.sizes(op.name)))


# ----------------------------------------------------------------------- summing over the terms
def _over_terms(s: ast.Contraction, t: TContraction, space: TermSpace, weight: str):
    """Index expressions over fresh term indices: ``(operand k -> its indices, weight ref)``.

    Each operand polynomial is a rational combination of the basis polynomials (plus a constant),
    so with ``z_r`` standing for basis row ``r`` it is ``sum(m_r * z_r) + c``, where the constant
    ``c`` is computed on the syntax (every index variable set to 0), so dimensions stay symbolic."""
    names = list(t.index_names)
    taken = set(names)
    zs = []
    for e, p in zip(space.index, space.polys):
        bare = isinstance(e, ast.Name) and p.terms == ((e.name, Fraction(1)),) and p.const == 0
        if bare and e.name not in zs:
            zs.append(e.name)
            continue
        k = 0
        while f"z{k}" in taken or f"z{k}" in zs:
            k += 1
        zs.append(f"z{k}")
    basis = [[p.coeff(v) for v in names] for p in space.polys]
    solve = _solver(basis)

    def rewrite(e: ast.Expr, p: Affine) -> ast.Expr:
        m = solve([p.coeff(v) for v in names])
        const = _symbolic(_at_zero(e)) - sum(c * _symbolic(_at_zero(x)) for c, x in zip(m, space.index) if c)
        out: ast.Expr = lit(0)
        for coeff, z in zip(m, zs):
            if coeff:
                out = _plus(out, coeff, ast.Name(z))
        return _render(sympy.expand(const), out)

    def at(k: int) -> tuple[ast.Expr, ...]:
        return tuple(rewrite(e, p) for e, p in zip(s.operands[k].indices, t.operands[k].polys))

    return at, ref(weight, [ast.Name(z) for z in zs])


def _solver(basis: list[list[Fraction]]):
    """``vec -> m`` with ``sum(m_r * basis[r]) == vec``, for ``vec`` in the span of the rows."""
    cols: list[int] = []
    for c in range(len(basis[0]) if basis else 0):
        if rank([[row[j] for j in (*cols, c)] for row in basis]) > len(cols):
            cols.append(c)
    square = [[row[c] for c in cols] for row in basis]
    inv = inverse(square) if square else []

    def solve(vec: list[Fraction]) -> list[Fraction]:
        m = [sum((vec[c] * inv[j][r] for j, c in enumerate(cols)), Fraction(0)) for r in range(len(basis))]
        assert all(
            sum((m[r] * basis[r][c] for r in range(len(basis))), Fraction(0)) == vec[c]
            for c in range(len(vec))
        ), "operand polynomial outside the term basis"
        return m

    return solve


def _scaled(coeff: Fraction, e: ast.Expr) -> ast.Expr:
    """``coeff * e`` with an exact division (index polynomials divide exactly)."""
    if coeff < 0:
        return neg(_scaled(-coeff, e))
    out = lit(coeff.numerator) if is_num(e, 1) else mul(lit(coeff.numerator), e)
    return div(out, lit(coeff.denominator)) if coeff.denominator != 1 else out


def _at_zero(e: ast.Expr) -> ast.Expr:
    """``e`` with every index variable set to 0: the constant part of an index polynomial."""
    if isinstance(e, ast.Name):
        return lit(0) if e.is_index else e
    if isinstance(e, ast.Binary):
        return ast.Binary(e.op, _at_zero(e.lhs), _at_zero(e.rhs))
    if isinstance(e, ast.Unary):
        return ast.Unary(e.op, _at_zero(e.operand))
    return e


def _symbolic(e: ast.Expr) -> sympy.Expr:
    """A constant index expression as sympy, dividing exactly as index polynomials do."""
    if isinstance(e, ast.IntLit):
        return sympy.Integer(e.value)
    if isinstance(e, ast.Name):
        return sympy.Symbol(e.name)
    if isinstance(e, ast.Unary) and e.op == "-":
        return -_symbolic(e.operand)
    assert isinstance(e, ast.Binary) and e.op in "+-*/", e
    a, b = _symbolic(e.lhs), _symbolic(e.rhs)
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b != 0 else sympy.Integer(0)}[e.op]


def _render(e: sympy.Expr, out: ast.Expr) -> ast.Expr:
    """``out`` plus an expanded sympy polynomial of dimension names, as Tile syntax."""
    terms = e.as_coefficients_dict().items()
    for monomial, coeff in sorted(terms, key=lambda kv: (kv[0] == 1, sympy.default_sort_key(kv[0]))):
        term: ast.Expr = lit(1)
        for base, power in sorted(monomial.as_powers_dict().items(), key=lambda kv: str(kv[0])):
            if base != 1:
                for _ in range(int(power)):
                    term = mul(term, ast.Name(str(base)))
        out = _plus(out, Fraction(int(coeff.p), int(coeff.q)), term)
    return out


def _plus(out: ast.Expr, coeff: Fraction, term: ast.Expr) -> ast.Expr:
    """``out + coeff * term``, written with ``-`` for a negative coefficient."""
    if coeff < 0:
        return sub(out, _scaled(-coeff, term))
    return add(out, _scaled(coeff, term))


# -------------------------------------------------------------------------------- the warning
def _warn_if_large(cg: GradWriter, s: ast.Contraction, space: TermSpace) -> None:
    """Warn when the sizes are known, the term tensor has ``WARN_ELEMENTS`` or more elements and
    more than ``WARN_RATIO`` times the elements of the operands and output together."""
    size = _elements(space.sizes)
    tensors = {s.name, *(op.name for op in s.operands)}
    counts = [_elements(cg.sizes(n)) for n in tensors]
    if size is None or any(c is None for c in counts):
        return
    if size < WARN_ELEMENTS or size <= WARN_RATIO * sum(counts):
        return
    shape = ", ".join(str(z.value) for z in space.sizes)
    warnings.warn(
        TileGradientMemoryWarning(
            f"the gradient of '{s.name}' (a '{s.agg.value}' aggregation over a combination) holds its "
            f"{size} terms in temporaries of shape ({shape}), about {size * 4 / 2**20:.0f} MiB each at "
            f"float32, against {sum(counts)} elements in '{s.name}' and its operands",
            s.span,
            hint="split the reduction into smaller blocks, or silence this with warnings.filterwarnings("
            "'ignore', category=tile.autodiff.TileGradientMemoryWarning)",
        ),
        stacklevel=2,
    )


def _elements(sizes: tuple[ast.Expr, ...]) -> int | None:
    if not all(isinstance(z, ast.IntLit) for z in sizes):
        return None
    return math.prod(z.value for z in sizes)
