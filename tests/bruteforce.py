"""A tiny, deliberately naive evaluator of ONE Tile contraction, independent of the interpreter.

A ``Spec`` describes a contraction (output sizes and index polynomials, operands with their index
polynomials, constraints, aggregation, combination, ``default``); ``Spec.source`` renders it as Tile
text for ``ref_interp.run`` and ``evaluate`` computes its meaning straight from the language
definition: every integer assignment of the index variables inside a box is tried, index
expressions are evaluated in ``Fraction`` arithmetic (``(i + 1)/2`` must be an integer), values are
Python ints and ``Fraction``s, and results are converted to the output dtype only at the end.

It imports neither ``ref_interp`` nor ``tile``: the type rules it needs (promotion, bool counts as
int32 for ``+``/``*``, wrap-around) are restated here in a few lines.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

AGGS = ("+", "*", ">", "<", "=")
COMBS = ("", "*", "+", "==", "?")  # "" is a single operand; "?" is `A == B ? C`
OPERANDS = {"": 1, "*": 2, "+": 2, "==": 2, "?": 3}
NAMES = ("A", "B", "C")


@dataclass(frozen=True)
class Poly:
    """``(sum(c * v) + const) / den`` with integer ``c``, ``const`` and ``den >= 1``."""

    coeffs: tuple[tuple[str, int], ...]
    const: int = 0
    den: int = 1

    @property
    def vars(self) -> tuple[str, ...]:
        return tuple(v for v, c in self.coeffs if c)

    def value(self, env: dict[str, int]) -> Fraction:
        return Fraction(sum(c * env[v] for v, c in self.coeffs) + self.const, self.den)

    def text(self) -> str:
        parts = [("-" if c < 0 else "+", f"{'' if abs(c) == 1 else f'{abs(c)}*'}{v}")
                 for v, c in self.coeffs if c]
        if self.const or not parts:
            parts.append(("-" if self.const < 0 else "+", str(abs(self.const))))
        s = ("-" if parts[0][0] == "-" else "") + parts[0][1] + "".join(f" {sg} {t}" for sg, t in parts[1:])
        return f"({s})/{self.den}" if self.den != 1 else s


@dataclass(frozen=True)
class Spec:
    agg: str
    comb: str
    out_sizes: tuple[int, ...]
    out_polys: tuple[Poly, ...]
    operand_polys: tuple[tuple[Poly, ...], ...]  # one tuple per operand A, B, C
    constraints: tuple[tuple[Poly, int], ...] = ()
    default: bool = False
    names: tuple[str, ...] = field(default=NAMES)

    @property
    def operands(self) -> tuple[str, ...]:
        return self.names[:len(self.operand_polys)]

    @property
    def variables(self) -> list[str]:
        polys = [*self.out_polys, *(p for ps in self.operand_polys for p in ps),
                 *(p for p, _ in self.constraints)]
        return sorted({v for p in polys for v in p.vars})

    def source(self) -> str:
        """The Tile program ``function (A, B, .., D) -> (O) { O[...] = agg(...), ..; }``."""
        refs = [f"{n}[{', '.join(p.text() for p in ps)}]"
                for n, ps in zip(self.operands, self.operand_polys, strict=True)]
        body = refs[0] if self.comb == "" else (
            f"{refs[0]} == {refs[1]} ? {refs[2]}" if self.comb == "?" else f"{refs[0]} {self.comb} {refs[1]}")
        out = ", ".join(p.text() for p in self.out_polys)
        if self.out_polys:
            out += ": " + ", ".join(map(str, self.out_sizes))
        tail = "".join(f", {p.text()} < {b}" for p, b in self.constraints)
        tail += " default D" if self.default else ""
        inputs = ", ".join(self.operands + (("D",) if self.default else ()))
        return f"function ({inputs}) -> (O) {{\n    O[{out}] = {self.agg}({body}){tail};\n}}\n"


# ------------------------------------------------------------------------------- types
def _bits(dt: np.dtype) -> int:
    return 1 if dt == np.bool_ else dt.itemsize * 8


def promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """Original Tile: a float wins; otherwise the wider; equal widths: the left operand."""
    fa, fb = a.kind == "f", b.kind == "f"
    if fa != fb:
        return a if fa else b
    return b if _bits(b) > _bits(a) else a


def result_dtype(spec: Spec, dtypes: list[np.dtype]) -> np.dtype:
    if spec.comb == "":
        dt = dtypes[0]
    elif spec.comb == "==":
        dt = np.dtype(bool)
    elif spec.comb == "?":
        dt = dtypes[2]
    else:
        dt = promote(dtypes[0], dtypes[1])
    if spec.agg in "+*" and dt == np.bool_:
        dt = np.dtype(np.int32)  # bool sums and products count in int32
    return dt


def convert(x, dt: np.dtype):
    """A Python number converted to ``dt``'s values: bool 0/1, wrapped ints, exact floats."""
    if dt == np.bool_:
        return int(x != 0)
    if dt.kind in "iu":
        bits = _bits(dt)
        v = math.trunc(x) % (1 << bits)
        return v - (1 << bits) if dt.kind == "i" and v >= 1 << (bits - 1) else v
    return Fraction(x)


# --------------------------------------------------------------------------- the box
def index_box(spec: Spec, shapes: dict[str, tuple[int, ...]]) -> dict[str, range]:
    """A box holding every valid index tuple.

    Every valid tuple satisfies every condition ``0 <= (c*v + k)/den <= n - 1``; a condition on a
    single variable ``v`` (c != 0) alone confines v to the interval between -k/c and
    (den*(n-1) - k)/c. So the product over variables of the intersection of these intervals holds
    every valid tuple, and nothing outside it needs to be tried; points inside are checked against
    all conditions. The generator guarantees each variable has such a condition (asserted).
    """
    lo: dict[str, Fraction] = {}
    hi: dict[str, Fraction] = {}
    for poly, n in _conditions(spec, shapes):
        if len(poly.vars) != 1:
            continue
        (v,) = poly.vars
        c = dict(poly.coeffs)[v]
        a, b = Fraction(-poly.const, c), Fraction(poly.den * (n - 1) - poly.const, c)
        lo[v] = max(lo.get(v, min(a, b)), min(a, b))
        hi[v] = min(hi.get(v, max(a, b)), max(a, b))
    box = {}
    for v in spec.variables:
        assert v in lo, f"index {v} is not confined by a single-variable condition"
        box[v] = range(math.ceil(lo[v]), math.floor(hi[v]) + 1)
    return box


def _conditions(spec: Spec, shapes) -> list[tuple[Poly, int]]:
    """``(poly, n)`` meaning ``poly`` must be an integer in ``[0, n)``."""
    out = list(zip(spec.out_polys, spec.out_sizes, strict=True))
    for name, polys in zip(spec.operands, spec.operand_polys, strict=True):
        out.extend(zip(polys, shapes[name], strict=True))
    out.extend(spec.constraints)
    return out


# --------------------------------------------------------------------------- evaluate
@dataclass
class Result:
    value: np.ndarray  # the output, in its dtype (unwritten elements 0 or default)
    valid: int  # number of valid index tuples
    duplicate: dict[tuple[int, ...], list[dict[str, int]]]  # for `=`: elements written more than once
    bound: int  # max over elements of sum |v| (for +) or prod max(|v|, 1) (for *): exactness check
    zero_size: bool  # the output or an operand has no elements


def _aggregate(agg: str, values: list):
    if agg == "+":
        return sum(values)
    if agg == "*":
        return math.prod(values)
    if agg == ">":
        return max(values)
    if agg == "<":
        return min(values)
    return values[0]


def storage(dt: np.dtype, precision: str) -> np.dtype:
    """How the interpreter stores ``dt`` in a precision mode: floats as float64 or as Fractions."""
    if dt.kind != "f" or precision == "native":
        return dt
    return np.dtype(np.float64) if precision == "float64" else np.dtype(object)


def evaluate(spec: Spec, inputs: dict[str, np.ndarray], precision: str = "native") -> Result:
    arrays = [np.asarray(inputs[n]) for n in spec.operands]
    shapes = {n: a.shape for n, a in zip(spec.operands, arrays, strict=True)}
    dtypes = [a.dtype for a in arrays]
    out_dt = result_dtype(spec, dtypes)
    cmp_dt = promote(dtypes[0], dtypes[1]) if spec.comb in ("==", "?") else None
    conds = _conditions(spec, shapes)
    box = index_box(spec, shapes)
    names = list(box)
    writes: dict[tuple[int, ...], list[tuple[dict[str, int], object]]] = defaultdict(list)
    for point in itertools.product(*box.values()):
        env = dict(zip(names, point, strict=True))
        idx = []
        for poly, n in conds:
            x = poly.value(env)
            if x.denominator != 1 or not 0 <= x < n:
                break
            idx.append(int(x))
        else:
            pos, reads = len(spec.out_polys), []
            for arr, polys in zip(arrays, spec.operand_polys, strict=True):
                reads.append(arr[tuple(idx[pos: pos + len(polys)])].item())
                pos += len(polys)
            value = _combine(spec, reads, cmp_dt, out_dt)
            writes[tuple(idx[:len(spec.out_polys)])].append((env, value))
    store = storage(out_dt, precision)
    value = _initial(spec, inputs, out_dt, store)
    bound = 0
    for where, ws in writes.items():
        vals = [v for _, v in ws]
        value[where] = _finish(_aggregate(spec.agg, vals), out_dt, store)
        mags = [abs(v) for v in vals]
        if spec.agg in "+*":
            bound = max(bound, sum(mags) if spec.agg == "+" else math.prod(max(m, 1) for m in mags))
    dup = {w: [e for e, _ in ws] for w, ws in writes.items() if spec.agg == "=" and len(ws) > 1}
    zero = math.prod(spec.out_sizes) == 0 or any(a.size == 0 for a in arrays)
    return Result(value, sum(len(ws) for ws in writes.values()), dup, int(bound), zero)


def _combine(spec: Spec, reads: list, cmp_dt, out_dt):
    if spec.comb == "":
        return convert(reads[0], out_dt)
    if spec.comb in ("==", "?"):
        eq = convert(reads[0], cmp_dt) == convert(reads[1], cmp_dt)
        if spec.comb == "==":
            return convert(int(eq), out_dt)
        return convert(reads[2], out_dt) if eq else convert(0, out_dt)
    a, b = convert(reads[0], out_dt), convert(reads[1], out_dt)
    return convert(a * b if spec.comb == "*" else a + b, out_dt)  # wraps like the out dtype


def _finish(x, dt: np.dtype, store: np.dtype):
    if dt.kind == "f":
        return Fraction(x) if store.kind == "O" else float(x)
    return convert(x, dt)


def _initial(spec: Spec, inputs, dt: np.dtype, store: np.dtype) -> np.ndarray:
    out = np.zeros(spec.out_sizes, dtype=store)
    if store.kind == "O":
        out[...] = Fraction(0)
    if spec.default:
        d = np.asarray(inputs["D"])
        assert d.shape == out.shape
        for where in np.ndindex(*out.shape):
            x = d[where].item()
            out[where] = _finish(convert(x, dt) if dt.kind != "f" else Fraction(x), dt, store)
    return out
