"""Exact affine polynomials over index variables: ``sum(c_v * v) + c0`` with rational ``c``.

Index expressions in Tile are affine with integer or rational coefficients (``i/2`` is exactly a
half, not a floor), so coefficients are ``Fraction``s, never floats.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

Number = int | Fraction
_ZERO, _ONE = Fraction(0), Fraction(1)  # Fractions are immutable: shared, not rebuilt per call


def _frac(v: Number) -> Fraction:
    """``v`` as a Fraction (one already is: no new object; ``Fraction(f)`` costs a microsecond and
    long programs make hundreds of thousands)."""
    return v if type(v) is Fraction else Fraction(v)


@dataclass(frozen=True, slots=True)
class Affine:
    terms: tuple[tuple[str, Fraction], ...] = ()  # sorted by variable name, no zero coefficients
    const: Fraction = _ZERO

    @staticmethod
    def var(name: str) -> Affine:
        return Affine(((name, _ONE),))

    @staticmethod
    def constant(value: Number) -> Affine:
        return Affine((), _frac(value))

    @staticmethod
    def build(coeffs: Mapping[str, Number], const: Number = 0) -> Affine:
        terms = tuple(sorted((k, _frac(v)) for k, v in coeffs.items() if v != 0))
        return Affine(terms, _frac(const))

    # ------------------------------------------------------------------ queries
    @property
    def coeffs(self) -> dict[str, Fraction]:
        return dict(self.terms)

    @property
    def vars(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.terms)

    def coeff(self, name: str) -> Fraction:
        for k, v in self.terms:
            if k == name:
                return v
        return Fraction(0)

    @property
    def is_constant(self) -> bool:
        return not self.terms

    @property
    def denominator(self) -> int:
        """The least common denominator of all coefficients and the constant."""
        d = self.const.denominator
        for _, v in self.terms:
            d = d * v.denominator // math.gcd(d, v.denominator)
        return d

    @property
    def is_integral(self) -> bool:
        return self.denominator == 1

    def evaluate(self, env: Mapping[str, Number]) -> Fraction:
        return self.const + sum((v * env[k] for k, v in self.terms), Fraction(0))

    def substitute(self, env: Mapping[str, Affine]) -> Affine:
        """Replace variables by affines (those not in ``env`` stay)."""
        if not any(k in env for k, _ in self.terms):
            return self  # immutable, so sharing is safe; long programs substitute mostly nothing
        out = Affine.constant(self.const)
        for k, v in self.terms:
            out = out + (env[k] * v if k in env else Affine(((k, v),)))
        return out

    # --------------------------------------------------------------- arithmetic
    def __add__(self, other: Affine | Number) -> Affine:
        if not isinstance(other, Affine):
            return Affine(self.terms, self.const + other)
        const = self.const + other.const if other.const else self.const
        if not other.terms or not self.terms:  # a constant added: the other's terms as they are
            return Affine(self.terms or other.terms, const)
        coeffs = dict(self.terms)
        for k, v in other.terms:
            coeffs[k] = coeffs[k] + v if k in coeffs else v
        return Affine(tuple(sorted((k, v) for k, v in coeffs.items() if v)), const)

    __radd__ = __add__

    def __neg__(self) -> Affine:
        return Affine(tuple((k, -v) for k, v in self.terms), -self.const)

    def __sub__(self, other: Affine | Number) -> Affine:
        return self + (-other)

    def __rsub__(self, other: Number) -> Affine:
        return (-self) + other

    def __mul__(self, scalar: Number) -> Affine:
        scalar = _frac(scalar)
        if scalar == 1:
            return self  # immutable, so sharing is safe
        if scalar == 0:
            return Affine()
        return Affine(tuple((k, v * scalar) for k, v in self.terms), self.const * scalar)

    __rmul__ = __mul__

    def __truediv__(self, scalar: Number) -> Affine:
        return self * (1 / Fraction(scalar))

    # ------------------------------------------------------------------ printing
    def __str__(self) -> str:
        """Tile syntax: ``1/3*v1 - 2/3*v4 + 2``; re-parses to the same polynomial."""
        parts: list[str] = []
        for k, v in self.terms:
            mag = abs(v)
            term = k if mag == 1 else f"{mag}*{k}"
            parts.append(("-" if v < 0 else "+") + term)
        if self.const != 0 or not parts:
            parts.append(("-" if self.const < 0 else "+") + str(abs(self.const)))
        text = " ".join(f"{p[0]} {p[1:]}" for p in parts)
        return text[2:] if text.startswith("+ ") else "-" + text[2:]
