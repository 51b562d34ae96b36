"""reduce: rewrite a contraction so that every output index is a single index variable.

A gradient like ``DI[n, 3*y + 2*j, ...] = +(...)`` writes one output element from several index
tuples through multi-variable output polynomials. ``reduce`` picks a basis of the index space —
the output polynomials first, then the other conditions' polynomials in order of increasing range
— makes each basis polynomial a new variable ``v0, v1, ...`` and rewrites everything exactly in
terms of them (``y = 1/3*v1 - 2/3*v4``). The output's indices become ``v0 .. v(r-1)``; the
fractions that appear elsewhere are removed by ``defract``.

Validity is kept exactly: the old variables had to be integers, so where no condition already
forces an old variable to be an integer, a range constraint on it is added (it carries the
integrality; its bounds are the variable's exact range, so it excludes nothing else).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

from tile.affine import Affine
from tile.bounds import index_box, ranges
from tile.errors import TileIndexError
from tile.linalg import independent, inverse
from tile.typed import TAccess, TConstraint, TContraction


def is_simple(p: Affine) -> bool:
    """A single variable with coefficient 1 plus an integer constant, or an integer constant."""
    if not p.const.denominator == 1:
        return False
    return not p.terms or (len(p.terms) == 1 and p.terms[0][1] == 1)


def needs_reduce(c: TContraction) -> bool:
    return not c.no_defract and not all(is_simple(p) for p in c.output.polys)


def reduce(c: TContraction, prefix: str = "v") -> TContraction:
    """``c`` with single-variable output indices (``c`` itself when already so or ``no_defract``).

    Raises ``TileIndexError`` ("underspecified") when the conditions do not span the index space.
    """
    if not needs_reduce(c):
        return c
    names = list(c.index_names)
    n = len(names)
    conds = ranges(c)
    n_out = len(c.output.polys)
    outputs = [r.poly for r in conds[:n_out]]
    others = sorted(conds[n_out:], key=lambda r: r.hi - r.lo)  # stable: ties keep source order
    basis: list[Affine] = []
    rows: list[list[Fraction]] = []
    for p in [*outputs, *(r.poly for r in others)]:
        vec = [p.coeff(v) for v in names]
        if any(vec) and independent(rows, vec):
            basis.append(p)
            rows.append(vec)
        if len(basis) == n:
            break
    if len(basis) < n:
        raise TileIndexError(
            f"cannot reduce '{c.name}': its conditions do not determine all {n} indices (underspecified)",
            c.span,
            hint="every index must be fixed by the output indices and the tensor and constraint "
            "conditions together; add a constraint or write the output with single indices",
        )
    new = [f"{prefix}{k}" for k in range(n)]
    inv = inverse(rows)
    # old x = inv · (v - const), with v_k standing for the basis polynomial k (constant included)
    env = {
        x: Affine.build(
            {new[k]: inv[i][k] for k in range(n)}, -sum(inv[i][k] * basis[k].const for k in range(n))
        )
        for i, x in enumerate(names)
    }

    def sub(acc: TAccess) -> TAccess:
        return dataclasses.replace(acc, polys=tuple(p.substitute(env) for p in acc.polys))

    box = index_box(c)
    constraints = [TConstraint(k.poly.substitute(env), k.bound, k.span) for k in c.constraints]
    for x in names:
        if not any(_forces_integer(r.poly, x) for r in conds):
            lo, hi = box[x]
            constraints.append(TConstraint(env[x] - lo, hi - lo + 1, c.span))
    return dataclasses.replace(
        c, output=sub(c.output), operands=tuple(sub(a) for a in c.operands), constraints=tuple(constraints)
    )


def _forces_integer(p: Affine, x: str) -> bool:
    """``p`` is ``±x`` plus an integer: an integral ``p`` makes ``x`` an integer."""
    return len(p.terms) == 1 and p.terms[0][0] == x and abs(p.terms[0][1]) == 1 and p.const.denominator == 1
