"""The elementary functions as the interpreter defines them: the C library's double routines.

``evaluate(name, *arrays)`` applies the process's C library routine (``exp``, ``sin``, ``pow``, ...
of ``libm``, the ones Python's ``math`` module calls) to each element converted exactly to double,
and returns float64; the caller rounds that once to the result type. Compiled targets in strict
mode call the same routine (``llvm_cpu``: the same symbol of the same process) or their platform's
double routine (OpenCL), so float16, bfloat16 and float32 results are rounded from a double
evaluation exactly as here (docs/semantics.md §8.3). numpy's own loops are not used: on AVX-512
hosts its float32 functions differ from a correctly rounded result by an ulp for a third of the
inputs and its float64 ``exp``, ``sinh``, ``tanh``, ... from the C library's by an ulp, which no
compiled target reproduces.

Python's ``math`` raises where C returns a special value (``exp(1000)``: OverflowError where C
gives inf; ``log(0)``: ValueError where C gives -inf; ``sin(inf)``: nan). Those elements take
numpy's float64 value instead, which is that same special value (an overflow's inf with numpy's
sign, a pole's ±inf, a domain error's nan): C99's Annex F fixes them, whoever computes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

# name -> (the C library's routine through ``math``, numpy's float64 ufunc for the special values)
ROUTINES: dict[str, tuple[Callable[..., float], np.ufunc]] = {
    "exp": (math.exp, np.exp),
    "log": (math.log, np.log),
    "sin": (math.sin, np.sin),
    "cos": (math.cos, np.cos),
    "tan": (math.tan, np.tan),
    "sinh": (math.sinh, np.sinh),
    "cosh": (math.cosh, np.cosh),
    "tanh": (math.tanh, np.tanh),
    "asin": (math.asin, np.arcsin),
    "acos": (math.acos, np.arccos),
    "atan": (math.atan, np.arctan),
    "asinh": (math.asinh, np.arcsinh),
    "acosh": (math.acosh, np.arccosh),
    "atanh": (math.atanh, np.arctanh),
    "pow": (math.pow, np.power),
}


def _guarded(fn: Callable[..., float]) -> Callable[..., float]:
    """``fn`` of all but the last argument, with C's special values where ``math`` raises instead
    of returning them: the last argument is numpy's value there (an overflow keeps only its sign)."""

    def call(*xs: float) -> float:
        try:
            return fn(*xs[:-1])
        except OverflowError:
            return math.copysign(math.inf, xs[-1])
        except ValueError:
            return xs[-1]

    return call


def _mapped(fn: Callable[..., float], columns: list[list[float]]) -> np.ndarray:
    return np.fromiter(map(fn, *columns), np.float64, count=len(columns[0]))


def _signaling_nan(a: np.ndarray) -> np.ndarray:
    """Where the float64 array ``a`` holds a signaling nan (exponent all ones, quiet bit clear)."""
    bits = a.view(np.uint64)
    exp, quiet, mant = np.uint64(0x7FF << 52), np.uint64(1 << 51), np.uint64((1 << 52) - 1)
    return ((bits & exp) == exp) & ((bits & quiet) == 0) & ((bits & mant) != 0)


def evaluate(name: str, *arrays: np.ndarray) -> np.ndarray:
    """The C library's double routine ``name`` elementwise over ``arrays`` (broadcast together),
    each argument converted exactly to float64; a float64 array."""
    fn, special = ROUTINES[name]
    arrays = tuple(np.asarray(a) for a in arrays)
    with np.errstate(all="ignore"):
        args = np.broadcast_arrays(*(a.astype(np.float64) for a in arrays))
        approx = special(*args)  # numpy's: the special values, and where math would raise
    shape = args[0].shape
    # math raises only where C's result is inf or nan (or an argument is not finite): everything
    # else goes through map at C speed; a nan of numbers is a domain error, nan in C too; the rest
    # (infinities, nan arguments: few) through the guarded call
    finite = np.ones(approx.shape, bool)
    for a in args:
        finite &= np.isfinite(a)
    plain = finite & np.isfinite(approx)
    domain = finite & np.isnan(approx)
    out = approx.ravel().copy()
    plain, rest = np.flatnonzero(plain.ravel()), np.flatnonzero(~(plain | domain).ravel())
    cols = [a.ravel() for a in args]
    try:
        out[plain] = _mapped(fn, [c[plain].tolist() for c in cols])
    except (OverflowError, ValueError):  # numpy finite where C overflows: at the edge of the range
        rest = np.arange(out.size)
    out[rest] = _mapped(_guarded(fn), [c[rest].tolist() for c in cols] + [approx.ravel()[rest].tolist()])
    out = out.reshape(shape)
    if name == "pow":
        # C's pow(nan, 0) and pow(1, nan) are 1, but for a signaling nan (IEEE 754) nan, which
        # Python's math.pow does not follow. Only a float64 argument can still be signaling: a
        # narrower one is quieted by its conversion to double (numpy's float16 one keeps it).
        for a, wide in zip(arrays, args, strict=True):
            if a.dtype == np.float64:
                out[_signaling_nan(wide)] = np.nan
    return out
