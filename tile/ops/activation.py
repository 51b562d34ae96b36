"""Activations, elementwise on an ``X`` of any rank (declared without dims): relu, gelu (erf and
tanh forms), silu, sigmoid, tanh, elu, leaky relu, hardswish; and erf.

Output ``Y``. Each is written as PyTorch computes it (the same operations in the same order), so
the values agree to the rounding of the transcendental functions. Tile has no ``erf`` builtin:
:func:`erf_lines` builds it from polynomials (see there).
"""

from __future__ import annotations

import functools

from tile.ops._build import function, lit

# The PyTorch function each op computes, as data for the op reference (python -m tile.ops.doc);
# tests/test_ops_doc.py checks that every name exists in torch (``{nd}``: 1, 2 and 3).
TORCH: dict[str, str] = {
    "relu": "torch.relu",
    "gelu": "torch.nn.functional.gelu",
    "silu": "torch.nn.functional.silu",
    "sigmoid": "torch.sigmoid",
    "tanh": "torch.tanh",
    "elu": "torch.nn.functional.elu",
    "leaky_relu": "torch.nn.functional.leaky_relu",
    "hardswish": "torch.nn.functional.hardswish",
    "erf": "torch.erf",
}

SQRT1_2 = 0.7071067811865476  # M_SQRT1_2
SQRT_2_OVER_PI = 0.7978845608028654  # M_SQRT2 * M_2_SQRTPI * 0.5, PyTorch's kBeta
GELU_KAPPA = 0.044715


def relu() -> str:
    """``torch.relu``; the gradient at 0 is 0, as PyTorch's."""
    return function(["X"], ["Y"], ["Y = relu(X)"])


def sigmoid() -> str:
    return function(["X"], ["Y"], ["Y = sigmoid(X)"])


def tanh() -> str:
    return function(["X"], ["Y"], ["Y = tanh(X)"])


def silu() -> str:
    """``x * sigmoid(x)``."""
    return function(["X"], ["Y"], ["Y = X * sigmoid(X)"])


def elu(alpha: float = 1.0) -> str:
    """``x > 0 ? x : alpha * (exp(x) - 1)``. PyTorch uses ``expm1``, which Tile lacks: near 0 the
    result differs by about one float epsilon (absolute). The exponential's argument is capped at
    0, so a large x cannot make the unused branch infinite (and its gradient NaN)."""
    return function(["X"], ["Y"], [f"Y = X > 0.0 ? X : {lit(alpha)} * (exp(min(X, 0.0)) - 1.0)"])


def leaky_relu(negative_slope: float = 0.01) -> str:
    """``x > 0 ? x : x * negative_slope`` (at 0 the gradient is the slope, as PyTorch's)."""
    return function(["X"], ["Y"], [f"Y = X > 0.0 ? X : X * {lit(negative_slope)}"])


def hardswish() -> str:
    """``x * min(max(x + 3, 0), 6) / 6``. The constants come first in ``min``/``max``, which send
    a tie's gradient to their first operand (§11), so at x = -3 and x = 3 the gradient is PyTorch's
    (0 and 1)."""
    return function(["X"], ["Y"], ["Y = X * min(6.0, max(0.0, X + 3.0)) / 6.0"])


def gelu(approximate: str = "none") -> str:
    """``torch.nn.functional.gelu``: ``x * 0.5 * (1 + erf(x / sqrt(2)))``, or with
    ``approximate='tanh'`` ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))``."""
    if approximate == "tanh":
        inner = f"{lit(SQRT_2_OVER_PI)} * (X + {lit(GELU_KAPPA)} * Cube)"
        return function(["X"], ["Y"], ["Cube = X * X * X", f"Y = 0.5 * X * (1.0 + tanh({inner}))"])
    if approximate != "none":
        raise ValueError(f"approximate must be 'none' or 'tanh', not {approximate!r}")
    body = [f"Scaled = X * {lit(SQRT1_2)}", *erf_lines("Scaled", "Erf"), "Y = X * 0.5 * (1.0 + Erf)"]
    return function(["X"], ["Y"], body)


def erf() -> str:
    """The error function (see :func:`erf_lines`)."""
    return function(["X"], ["Y"], erf_lines("X", "Y"))


# erf on |x| < 1 is x * P(2x^2 - 1); on [1, 3] and [3, 7], P((|x| - c) / h); past 7 it is ±1 in
# float64. Chebyshev fits, each within 1e-17 of erf (float64 evaluation gives 1 ulp).
_PIECES = ((1.0, 3.0, 24), (3.0, 7.0, 28))
_SMALL_TERMS = 14
# ``narrow`` (float32 and narrower): fits within 3e-11 (small), 4e-8 and 8e-8, ±1 past 4 (erf(4) is
# 1 in float32). Float32 evaluation of these is within 1.91 ulp of erf on 35.6 million float32
# inputs in [-6, 6], as with fits a term longer each (float32 rounding dominates), in 26 Horner
# steps instead of 66 (28 with those longer fits, a sixth slower: bench/RESULTS.md, "ONNX speed,
# fifth session").
_PIECES_NARROW = ((1.0, 2.5, 10), (2.5, 4.0, 8))
_SMALL_TERMS_NARROW = 8
_CHUNK = 8  # Horner steps per statement, well inside the nesting limit (§9)


@functools.cache
def _coefficients(small_terms: int = _SMALL_TERMS, pieces=_PIECES) -> tuple[tuple[float, ...], ...]:
    """The pieces' polynomial coefficients, highest degree first: computed once with mpmath (a
    dependency of sympy) at 40 digits, so every machine gets the same floats."""
    import mpmath

    with mpmath.workdps(40):
        def small(u):
            t = (u + 1) / 2  # x^2
            return 2 / mpmath.sqrt(mpmath.pi) if t == 0 else mpmath.erf(mpmath.sqrt(t)) / mpmath.sqrt(t)

        fits = [mpmath.chebyfit(small, [-1, 1], small_terms)]
        for lo, hi, n in pieces:
            c, h = (lo + hi) / 2, (hi - lo) / 2
            fits.append(mpmath.chebyfit(lambda u, c=c, h=h: mpmath.erf(c + h * u), [-1, 1], n))
    return tuple(tuple(float(v) for v in fit) for fit in fits)


def _horner(coefs, u: str, name: str) -> list[str]:
    lines, acc = [], lit(coefs[0])
    rest = list(coefs[1:])
    part = 0
    while rest:
        chunk, rest = rest[:_CHUNK], rest[_CHUNK:]
        for c in chunk:
            acc = f"{f'({acc})' if ' ' in acc else acc} * {u} + {lit(c)}"
        dst = name if not rest else f"{name}_{part}"
        lines.append(f"{dst} = {acc}")
        acc, part = dst, part + 1
    return lines


def erf_lines(src: str, dst: str, prefix: str = "Erf", narrow: bool = False) -> list[str]:
    """Statements computing ``dst = erf(src)`` elementwise, in src's float type.

    Tile has no ``erf`` builtin, and adding one would touch every backend; it composes instead:
    an odd polynomial ``x * P(2x^2 - 1)`` for ``|x| < 1`` (accurate relative to erf near 0),
    polynomials in ``|x|`` on [1, 3] and [3, 7] (each a Chebyshev fit within 1e-17, so float64
    results are within an ulp or two of the true erf), ±1 beyond and NaN for NaN. Each piece
    reads its argument clamped to its own interval, so the pieces not chosen stay finite and pass
    no NaN into the gradient, which is the polynomials' derivative (within ~1e-14 of
    ``2/sqrt(pi) * exp(-x^2)``). With ``narrow`` (for float32 and narrower sources only), shorter
    fits on [1, 2.5] and [2.5, 4] and ±1 beyond: the same float32 results in less than half the
    work (``_PIECES_NARROW``).
    """
    p = prefix
    spec = _PIECES_NARROW if narrow else _PIECES
    small, *pieces = _coefficients(_SMALL_TERMS_NARROW, spec) if narrow else _coefficients()
    lines = [f"{p}Small = min(max({src}, -1.0), 1.0)", f"{p}U0 = {p}Small * {p}Small * 2.0 - 1.0"]
    lines += _horner(small, f"{p}U0", f"{p}P0")
    lines += [f"{p}Near = {p}Small * {p}P0", f"{p}Abs = abs({src})"]
    for k, ((lo, hi, _), coefs) in enumerate(zip(spec, pieces), start=1):
        c, h = (lo + hi) / 2, (hi - lo) / 2
        scale = "" if h == 1 else f" * {lit(1 / h)}"
        clamped = f"min(max({p}Abs, {lit(lo)}), {lit(hi)}) - {lit(c)}"
        lines.append(f"{p}U{k} = " + (f"({clamped}){scale}" if scale else clamped))
        lines += _horner(coefs, f"{p}U{k}", f"{p}P{k}")
    inner = "".join(f"{p}Abs < {lit(hi)} ? {p}P{k} : " for k, (_, hi, _) in enumerate(spec[:-1], start=1))
    top = lit(spec[-1][1])
    lines.append(f"{p}Far = {inner}{p}Abs <= {top} ? {p}P{len(spec)} : {p}Abs > {top} ? 1.0 : {src}")
    lines.append(f"{p}Signed = {src} < 0.0 ? -{p}Far : {p}Far")
    lines.append(f"{dst} = {p}Abs < 1.0 ? {p}Near : {p}Signed")
    return lines
