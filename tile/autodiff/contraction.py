"""Gradients of contractions, as new contractions over the same valid index tuples.

Every rule keeps all of the forward contraction's validity conditions: the gradient of operand
``X`` is written through ``X``'s own index expressions with ``X``'s sizes, reads the adjoint
``DO`` through the output's index expressions, and keeps the constraints; an operand whose value
does not enter the derivative is replaced by a tensor of ones of its shape so that its range
conditions still count. So the gradient is exact for strides, dilations, padding and skipping.

* ``+`` / ``=`` with ``*``:   ``DA[sa: A] = +(DO[so] * B[sb])``
* ``+`` / ``=`` with ``+``:   ``DA[sa: A] = +(DO[so] * OnesB[sb])`` (multiplicity kept)
* ``A == B ? C``:            ``DC[sc: C] = +(A[sa] == B[sb] ? DO[so])``; A and B get none
* ``>`` / ``<`` (one tensor): ``DI[si: I] = +(I[si] == O[so] ? DO[so])`` — every tied element
  receives the full gradient
* ``*`` (one tensor): exact with zeros: per output, count the zero factors and multiply the
  non-zero ones; a non-zero factor gets ``DO * O / I`` when no factor is zero, a zero factor
  gets ``DO * (product of the others)`` when it is the only zero.
* ``default D``: D receives ``DO`` where no tuple writes the output, 0 elsewhere.
* ``>`` / ``<`` / ``*`` of several tensors: through a tensor of the combination's terms, in
  ``combined.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from tile import ast
from tile.autodiff.build import Namer, binary, cond, div, lit, mul, ref
from tile.autodiff.combined import combined_grads
from tile.linalg import rank
from tile.typed import TContraction

Emit = Callable[[ast.Statement], None]


class ContractionGrad:
    """Emits the gradient statements of one contraction; returns contributions per tensor."""

    def __init__(
        self,
        namer: Namer,
        emit: Emit,
        sizes: Callable[[str], tuple[ast.Expr, ...]],
        ones_like: Callable[[str], str],
        is_float: Callable[[str], bool],
    ):
        self.namer = namer
        self.emit = emit
        self.sizes = sizes
        self.ones_like = ones_like
        self.is_float = is_float

    def contraction(
        self,
        name: str,
        sizes: tuple[ast.Expr, ...],
        out: list[ast.Expr],
        operands: tuple[ast.TensorRef, ...],
        comb: ast.CombOp,
        constraints: tuple[ast.Constraint, ...],
        agg: ast.AggOp = ast.AggOp.SUM,
    ) -> ast.Name:
        self.emit(ast.Contraction(ref(name, out), sizes, agg, comb, operands, constraints))
        return ast.Name(name)

    def grads(
        self, s: ast.Contraction, t: TContraction, g: str, base: Callable[[str], str]
    ) -> list[tuple[str, ast.Expr]]:
        """``[(tensor, contribution)]`` for the contraction ``s`` whose output adjoint is ``g``."""
        out: list[tuple[str, ast.Expr]] = []
        so = list(s.output.indices)
        dout = ref(g, so)
        cons = s.constraints
        ops = s.operands
        if s.comb is ast.CombOp.EQ:
            pass  # a comparison has no gradient
        elif s.agg in (ast.AggOp.SUM, ast.AggOp.ASSIGN):
            for k, op in enumerate(ops):
                if not self.is_float(op.name):
                    continue
                if s.comb is ast.CombOp.COND:
                    if k < 2:
                        continue
                    body, comb = (ops[0], ops[1], dout), ast.CombOp.COND
                elif s.comb is ast.CombOp.MUL:
                    body, comb = (dout, ops[1 - k]), ast.CombOp.MUL
                elif s.comb is ast.CombOp.ADD and ops[1 - k].indices:
                    other = ops[1 - k]
                    body, comb = (dout, ref(self.ones_like(other.name), other.indices)), ast.CombOp.MUL
                else:
                    body, comb = (dout,), ast.CombOp.NONE
                out.append(
                    (
                        op.name,
                        self.contraction(
                            base(op.name), self.sizes(op.name), list(op.indices), body, comb, cons
                        ),
                    )
                )
        elif s.comb is not ast.CombOp.NONE:  # `>`, `<` or `*` of several tensors
            out += combined_grads(self, s, t, g, base)
        elif s.agg in (ast.AggOp.MAX, ast.AggOp.MIN):
            (op,) = ops
            if self.is_float(op.name):
                out.append((op.name, self.extreme(s, t, op, g, base(op.name))))
        else:  # PROD
            (op,) = ops
            if self.is_float(op.name):
                out.append((op.name, self.product(s, op, g)))
        if s.default is not None and self.is_float(s.default):
            out.append((s.default, self.default_grad(s, g)))
        return out

    def extreme(self, s: ast.Contraction, t: TContraction, op: ast.TensorRef, g: str, name: str) -> ast.Expr:
        """The equality mask. When one output reads one input element through several index
        tuples (``O[] = >(I[i + j])``), the element is still one candidate: the pairs (element,
        output) that tie are found first with a ``>`` of ones, then weighted by ``DO`` once each."""
        so = list(s.output.indices)
        if _injective(t):
            body = (op, ref(s.name, so), ref(g, so))
            return self.contraction(
                name, self.sizes(op.name), list(op.indices), body, ast.CombOp.COND, s.constraints
            )
        hits = self.namer.fresh(f"{s.name}_ties")
        ones = ref(self.ones_like(s.name), so)
        self.contraction(
            hits,
            self.sizes(op.name) + self.sizes(s.name),
            [*op.indices, *so],
            (op, ref(s.name, so), ones),
            ast.CombOp.COND,
            s.constraints,
            ast.AggOp.MAX,
        )
        xs = [ast.Name(f"x{k}") for k in range(len(op.indices))]
        os = [ast.Name(f"o{k}") for k in range(len(so))]
        return self.contraction(
            name, self.sizes(op.name), xs, (ref(hits, [*xs, *os]), ref(g, os)), ast.CombOp.MUL, ()
        )

    def product(self, s: ast.Contraction, op: ast.TensorRef, g: str) -> ast.Expr:
        x = ast.Name(op.name)
        so = list(s.output.indices)
        cons = s.constraints
        osizes = self.sizes(s.name)
        zero = lit(0)
        is_zero = self.namer.fresh(f"{op.name}_is0")
        self.emit(ast.Assignment(is_zero, binary("==", x, zero)))
        nonzero = self.namer.fresh(f"{op.name}_nz")
        self.emit(ast.Assignment(nonzero, cond(binary("==", x, zero), lit(1), x)))
        count = self.contraction(
            self.namer.fresh(f"{s.name}_zeros"),
            osizes,
            so,
            (ref(is_zero, op.indices),),
            ast.CombOp.NONE,
            cons,
        )
        prod = self.contraction(
            self.namer.fresh(f"{s.name}_prodnz"),
            osizes,
            so,
            (ref(nonzero, op.indices),),
            ast.CombOp.NONE,
            cons,
            ast.AggOp.PROD,
        )
        parts = []
        for zeros in (0, 1):
            scaled = self.namer.fresh(f"{g}_z{zeros}")
            self.emit(
                ast.Assignment(scaled, mul(ast.Name(g), cond(binary("==", count, lit(zeros)), prod, zero)))
            )
            parts.append(
                self.contraction(
                    self.namer.fresh(f"D{op.name}_z{zeros}"),
                    self.sizes(op.name),
                    list(op.indices),
                    (ref(scaled, so),),
                    ast.CombOp.NONE,
                    cons,
                )
            )
        return cond(binary("==", x, zero), parts[1], div(parts[0], x))

    def default_grad(self, s: ast.Contraction, g: str) -> ast.Expr:
        """``DO`` where nothing writes the output, 0 where the contraction does."""
        ones = tuple(ref(self.ones_like(op.name), op.indices) for op in s.operands)
        comb = {1: ast.CombOp.NONE, 2: ast.CombOp.MUL, 3: ast.CombOp.COND}[len(ones)]
        written = self.contraction(
            self.namer.fresh(f"{s.name}_written"),
            self.sizes(s.name),
            list(s.output.indices),
            ones,
            comb,
            s.constraints,
            ast.AggOp.MAX,
        )
        return cond(written, lit(0), ast.Name(g))


def _injective(t: TContraction) -> bool:
    """Whether each index tuple reads a different (input element, output element) pair."""
    names = list(t.index_names)
    polys = [*t.operands[0].polys, *t.output.polys]
    return rank([[p.coeff(v) for v in names] for p in polys]) == len(names) if names else True
