"""defract: remove fractional coefficients by parametrizing the lattice of valid index tuples.

After ``reduce``, index expressions such as ``1/3*v1 - 2/3*v4`` are only valid where they are
integers. The integer points ``v`` at which every condition polynomial is an integer form a
lattice coset ``L``. ``defract`` writes ``L`` as the exact image of new integer variables:

1. **The lattice.** With ``M`` the rational matrix of all condition polynomials (plus one unit row
   per variable, and a homogenizing column ``w = 1`` for constant terms), ``L = {v : M v ∈ Z^m}``
   is the dual of the row lattice of ``M``. A basis ``R`` of the row lattice comes from the
   Hermite normal form of ``M`` (``sympy.matrices.normalforms.hermite_normal_form``, fraction-free
   on the integer matrix ``d·M``); ``L``'s basis is the columns of ``R^-1``.
2. **Triangular form.** A second Hermite normal form makes that basis lower triangular in the
   variable order (outputs first): ``v_i = g_i u_i + Σ_{j<i} G_ij u_j`` with ``0 <= G_ij < g_i``.
3. **Digits.** ``v_i`` only needs ``u_j`` modulo ``s = g_i / gcd(G_ij, g_i)``, so ``u_j`` is split
   into a digit ``0 <= r < s`` and a high part ``q`` (``u_j = r + s*q``), and ``s*q``'s multiple of
   ``g_i`` is absorbed into ``u_i``. Repeated splits give mixed-radix digits, so no divisibility
   chain between the splits is needed (the original required one and failed otherwise).

Each step is a bijection, so every valid tuple appears exactly once; every coefficient becomes an
integer; and the output indices, written in the digits of the output variables, are one-to-one.
For the seed's gradient this gives ``v1 = v1_0 + 3*v1_1`` and ``v4 = 2*v1_0 + 3*v4_0`` with
``0 <= v1_0 < 3``.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

from sympy import Matrix
from sympy.matrices.normalforms import hermite_normal_form

from tile.affine import Affine
from tile.bounds import ranges
from tile.errors import TileIndexError
from tile.typed import TAccess, TConstraint, TContraction


def needs_defract(c: TContraction) -> bool:
    """Whether any condition has a fractional coefficient (``no_defract`` only skips ``reduce``,
    as in the original: fractions must go before a contraction can be flattened)."""
    return not all(r.poly.is_integral for r in ranges(c))


def defract(c: TContraction) -> TContraction:
    """``c`` with integer coefficients everywhere (``c`` itself when it already has them)."""
    if not needs_defract(c):
        return c
    names = list(c.index_names)
    n = len(names)
    polys = [r.poly for r in ranges(c)]
    g = _lattice_basis(polys, names)  # (n+1)x(n+1) lower triangular; index 0 is w = 1
    if g[0][0] != 1:
        raise TileIndexError(
            f"no index tuple of '{c.name}' makes every index expression an integer",
            c.span,
            hint="check the fractional coefficients and offsets",
        )
    rows, digits = _digits(g, n)
    env = {}
    for i, x in enumerate(names):
        coeffs, const = rows[i]
        env[x] = Affine.build({_name(names, digits, var): a for var, a in coeffs.items()}, const)

    def sub(acc: TAccess) -> TAccess:
        return dataclasses.replace(acc, polys=tuple(_integral(p.substitute(env), c) for p in acc.polys))

    constraints = [TConstraint(_integral(k.poly.substitute(env), c), k.bound, k.span) for k in c.constraints]
    for var, (_, size) in digits.items():
        if size is not None:
            constraints.append(TConstraint(Affine.var(_name(names, digits, var)), size, c.span))
    return dataclasses.replace(
        c, output=sub(c.output), operands=tuple(sub(a) for a in c.operands), constraints=tuple(constraints)
    )


def _integral(p: Affine, c: TContraction) -> Affine:
    assert p.is_integral, f"defract left a fraction in {p} of {c.name}"
    return p


# ------------------------------------------------------------------------ the lattice
def _lattice_basis(polys: list[Affine], names: list[str]) -> list[list[int]]:
    """A lower-triangular integer basis (columns) of ``{(w, v) : every poly is integral}``."""
    n = len(names)
    rows = [[p.const] + [p.coeff(v) for v in names] for p in polys]
    rows += [[Fraction(int(j == k)) for j in range(n + 1)] for k in range(n + 1)]
    den = 1
    for r in rows:
        for x in r:
            den = den * x.denominator // math.gcd(den, x.denominator)
    scaled = Matrix([[int(x * den) for x in r] for r in rows])
    row_basis = hermite_normal_form(scaled.T).T / den  # rows: a basis of the row lattice of M
    dual = row_basis.inv()  # columns: a basis of L
    assert all(x.is_integer for x in dual), "the lattice must lie in Z^(n+1)"
    flip = Matrix.eye(n + 1)[::-1, :]
    lower = flip * hermite_normal_form(flip * dual) * flip
    g = [[int(lower[i, j]) for j in range(n + 1)] for i in range(n + 1)]
    assert all(g[i][j] == 0 for i in range(n + 1) for j in range(i + 1, n + 1)), "not lower triangular"
    return g


# --------------------------------------------------------------------------- digits
def _digits(g: list[list[int]], n: int):
    """Rows ``v_i = Σ coeff·var + const`` in digit variables, and ``{var: (owner row, size)}``
    (size ``None`` for each row's one unbounded variable)."""
    # rows[i]: {var: coeff}, const; variable k (1..n) starts as u_k, owned by row k-1
    rows = []
    for i in range(1, n + 1):
        coeffs = {j: g[i][j] for j in range(1, i + 1) if g[i][j]}
        rows.append((coeffs, g[i][0]))
    info: dict[int, tuple[int, int | None]] = {k: (k - 1, None) for k in range(1, n + 1)}
    pivot = {i: i + 1 for i in range(n)}
    next_var = n + 1

    def replace(var: int, parts: dict[int, int]) -> None:
        """Substitute ``var = Σ parts[p]·p`` in every row."""
        for coeffs, _ in rows:
            a = coeffs.pop(var, 0)
            if a:
                for p, m in parts.items():
                    coeffs[p] = coeffs.get(p, 0) + a * m
                    if coeffs[p] == 0:
                        del coeffs[p]

    for i in range(n):
        coeffs, _ = rows[i]
        p = pivot[i]
        for y in list(coeffs):
            if y == p or y not in coeffs:
                continue
            gi = coeffs[p]
            a = coeffs[y]
            k = a // gi
            if k:  # shift the pivot: p := p - k*y, leaving a mod gi on y
                replace(p, {p: 1, y: -k})
            a = coeffs.get(y, 0)
            if a == 0 or info[y][1] is not None:
                continue
            s = gi // math.gcd(a, gi)
            r, q = next_var, next_var + 1
            next_var += 2
            owner = info[y][0]
            info[r] = (owner, s)
            info[q] = (owner, None)
            del info[y]
            replace(y, {r: 1, q: s})
            for j in range(n):
                if pivot[j] == y:
                    pivot[j] = q
            # a*s*q is a multiple of gi in row i: absorb it into the pivot
            m = coeffs.get(q, 0) // gi
            if m:
                replace(p, {p: 1, q: -m})
    ordered = {}
    for var in sorted(info):  # creation order: less significant digits first
        ordered[var] = info[var]
    return rows, ordered


def _name(names: list[str], digits: dict, var: int) -> str:
    owner = digits[var][0]
    k = [v for v in digits if digits[v][0] == owner].index(var)
    return f"{names[owner]}_{k}"
