"""The elementwise math accuracy family's reference and bounds: each float function of
``tile.builtins`` against its correctly rounded value, in ulps.

**The correctly rounded reference.** For a function f, a format F (float16, bfloat16 or float32)
and an input x of F, ``correctly_rounded`` gives f(x) rounded once, to nearest with ties to even,
from the exact real value. mpmath at 65536 x 18 functions x 3 formats would take minutes, so the
exact value is first bracketed in double precision and mpmath is asked only where the bracket
cannot decide:

* ``double_value`` is the C library's double routine (``ref_interp.libm``), or a double
  composition of routines (``sigmoid``), at most ``DOUBLE_ULPS[f]`` double ulps from the exact
  value. glibc lists at most 2 ulp for each routine used here (its ``libm-test-ulps``: exp, log,
  sin, cos, tan, asin, acos, atan, pow 1; sinh, cosh, tanh, asinh, acosh, atanh 2); ``sqrt`` and
  ``1/x`` are IEEE operations, within half an ulp; the table takes 8 (4 more for ``sigmoid``'s two
  further roundings), four times the listed maxima. ``test_math_accuracy.py`` checks the whole
  reference against mpmath alone on a sample, so a libm outside these bounds is caught.
* Rounding is monotonic, so when both ends of ``d ± k·ulp(d)`` round to the same value of F, the
  exact value (between them) rounds to it too: that is f(x) correctly rounded, and it is taken. F
  has at most 24 significant bits, double 53, so the bracket is 2^-26 of an ulp of F or narrower,
  and it straddles a rounding boundary (a midpoint between two values of F) for about one input
  in 10^7: never among the 65536 float16 or bfloat16 patterns, a few times in 10^7 float32 ones.
* Only there ``_ziv`` evaluates f with mpmath at 96 bits, then 192, ... (Ziv's strategy: each
  evaluation is trusted to 2^-(P-8) relatively, far more than mpmath's own error), until both ends
  of that bracket round alike. A bracket still straddling a midpoint at 6144 bits means f(x) is
  that midpoint exactly (a transcendental function of a rational argument cannot come so close to
  one without being it; ``pow(169, 1.5) = 2197`` is a float16 midpoint), and it rounds to even.
* An overflow, a nan and an infinity are decided by the double routine itself: C99's Annex F fixes
  them (``exp(1000)`` is inf, ``log(-1)`` nan, ``atanh(1)`` inf), and a double that overflows
  means an exact value far beyond every narrow format's range.

**Error in ulps.** ``ulp_errors`` measures ``|got - f(x)| / ulp(f(x))`` with ``ulp(y)`` the
spacing of F in y's binade (the smallest subnormal's below the normal range), f(x) taken from the
double bracket (a 2^-26 ulp uncertainty at most). A non-finite correctly rounded result must be
matched exactly (any nan for nan, the same infinity), and a non-finite result where the correctly
rounded one is finite is an infinite error: that is the special-value rule (NaN in gives NaN out,
``exp(-inf) = 0``, ``log(0) = -inf``, overflow to inf and not to the largest finite value).

**Bounds** (``BOUNDS``, docs/semantics.md §8.6, checked equal by tests/test_docs_sync.py): strict
mode is the C library's double rounded once, so within ``STRICT_ULPS`` = 0.5 + 2^-20 (correctly
rounded, except where the double lands on the other side of a midpoint than the exact value,
never measured); ``sigmoid`` composes three roundings in F there. Default-mode bounds are those a
compiled target promises (the float routines, vectorized code), measured on ``llvm_cpu.0`` and
``opencl_cpu.0`` (PoCL).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import mpmath
import numpy as np

from ref_interp import libm
from tile.precision import to_bfloat16

# ---------------------------------------------------------------------------------- formats


@dataclass(frozen=True)
class Format:
    """A binary floating-point format: ``p`` significant bits, normal exponents ``emin..emax``."""

    name: str
    p: int
    emin: int
    emax: int
    dtype: np.dtype
    bits: type

    def round(self, d: np.ndarray) -> np.ndarray:
        """float64 values rounded once to this format (to nearest, ties to even)."""
        with np.errstate(over="ignore", invalid="ignore"):
            if self.name == "bfloat16":
                return to_bfloat16(d)
            return np.asarray(d, np.float64).astype(self.dtype)

    def ulp(self, y: np.ndarray) -> np.ndarray:
        """The spacing of the format in the binade of each |y| (float64, finite y)."""
        _, e = np.frexp(np.abs(y))
        return np.ldexp(1.0, np.maximum(e - 1, self.emin) - (self.p - 1))


FORMATS = {
    "float16": Format("float16", 11, -14, 15, np.dtype(np.float16), np.uint16),
    "bfloat16": Format("bfloat16", 8, -126, 127, np.dtype(ml_dtypes.bfloat16), np.uint16),
    "float32": Format("float32", 24, -126, 127, np.dtype(np.float32), np.uint32),
}

# ------------------------------------------------------------------------------- functions

UNARY = ("exp", "log", "sqrt", "sin", "cos", "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan")
UNARY += ("asinh", "acosh", "atanh", "sigmoid", "recip")
FUNCTIONS = UNARY + ("pow",)  # tile.builtins' float functions (floor, ceil, round are exact)

_MP = {
    "exp": mpmath.exp,
    "log": mpmath.log,
    "sqrt": mpmath.sqrt,
    "sin": mpmath.sin,
    "cos": mpmath.cos,
    "tan": mpmath.tan,
    "sinh": mpmath.sinh,
    "cosh": mpmath.cosh,
    "tanh": mpmath.tanh,
    "asin": mpmath.asin,
    "acos": mpmath.acos,
    "atan": mpmath.atan,
    "asinh": mpmath.asinh,
    "acosh": mpmath.acosh,
    "atanh": mpmath.atanh,
    "sigmoid": lambda x: 1 / (1 + mpmath.exp(-x)),
    "recip": lambda x: 1 / x,
    "pow": mpmath.power,
}

# How many double ulps ``double_value`` may be from the exact value (see the module docstring).
DOUBLE_ULPS = {f: 8.0 for f in FUNCTIONS} | {"sqrt": 1.0, "recip": 1.0, "sigmoid": 12.0}


def _f64(a) -> np.ndarray:
    """``a`` as float64 (exact; bfloat16's nan casts quietly)."""
    with np.errstate(invalid="ignore"):
        return np.asarray(a).astype(np.float64)


def double_value(fn: str, x: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
    """f(x) (``pow``: f(x, y)) in double precision, within ``DOUBLE_ULPS[fn]`` of the exact value."""
    x64 = _f64(x)
    with np.errstate(all="ignore"):
        if fn == "sqrt":
            return np.sqrt(x64)
        if fn == "recip":
            return 1.0 / x64
        if fn == "sigmoid":
            return 1.0 / (1.0 + libm.evaluate("exp", -x64))
        if fn == "pow":
            return libm.evaluate("pow", np.asarray(x), np.asarray(y))  # (a float64 signaling nan stays one)
        return libm.evaluate(fn, x64)


# ---------------------------------------------------------------------------------- rounding


def round_exact(sign: int, man: int, exp: int, fmt: Format) -> float:
    """(-1)^sign · man · 2^exp (integers, exact) rounded once to ``fmt``: to nearest, ties to even,
    with gradual underflow and overflow to infinity, as a Python float (exact in double)."""
    if man == 0:
        return -0.0 if sign else 0.0
    top = exp + man.bit_length() - 1  # the exponent of the leading bit
    q = max(top, fmt.emin) - (fmt.p - 1)  # the quantum of that binade
    if exp < q:
        shift = q - exp
        m, rem, half = man >> shift, man & ((1 << shift) - 1), 1 << (shift - 1)
        if rem > half or (rem == half and m & 1):
            m += 1
    else:
        m, q = man << (exp - q), q
    if m.bit_length() + q > fmt.emax + 1:  # m·2^q >= 2^(emax+1)
        value = math.inf
    else:
        value = math.ldexp(m, q)
    return -value if sign else value


def _to_format(v: mpmath.mpf, fmt: Format) -> float:
    sign, man, exp, _ = v._mpf_
    return round_exact(sign, int(man), int(exp), fmt)


_CAP = 6144


def _ziv(fn: str, fmt: Format, x: float, y: float | None) -> float:
    """f(x) correctly rounded to ``fmt`` by mpmath at increasing precision (see the docstring)."""
    prec = 96
    while True:
        with mpmath.workprec(prec):
            args = [mpmath.mpf(x)] + ([] if y is None else [mpmath.mpf(y)])
            v = _MP[fn](*args)
            v = mpmath.re(v)
            err = abs(v) * mpmath.ldexp(1, 8 - prec)
            lo, hi = v - err, v + err  # (rounded at prec: both move by far less than err)
        a, b = _to_format(lo, fmt), _to_format(hi, fmt)
        if a == b:
            return math.copysign(a, float(v)) if a == 0 else a
        if prec >= _CAP:  # f(x) is a midpoint: snap to the (p+1)-bit grid, then ties to even
            wider = Format("mid", fmt.p + 1, fmt.emin, fmt.emax + 1, fmt.dtype, fmt.bits)
            return _to_format(mpmath.mpf(_to_format(v, wider)), fmt)
        prec *= 2


def correctly_rounded(fn: str, fmt: Format, x: np.ndarray, y: np.ndarray | None = None):
    """(f(x) correctly rounded, as ``fmt``'s dtype; f(x) in double, for measuring ulps; how many
    inputs needed mpmath)."""
    d = double_value(fn, x, y)
    k = DOUBLE_ULPS[fn]
    with np.errstate(all="ignore"):
        step = k * np.spacing(np.abs(d))
        lo, hi = fmt.round(d - step).astype(np.float64), fmt.round(d + step).astype(np.float64)
    out = _f64(fmt.round(d))  # infinities and nans as the double gives them
    undecided = np.isfinite(d) & (lo != hi)
    zero = np.isfinite(d) & (lo == hi) & (lo == 0)
    out[zero] = np.copysign(0.0, d[zero])  # a zero keeps the sign of the exact value
    idx = np.flatnonzero(undecided)
    xs = _f64(x)
    ys = None if y is None else np.broadcast_to(_f64(y), xs.shape)
    for i in idx:
        out.flat[i] = _ziv(fn, fmt, float(xs.flat[i]), None if ys is None else float(ys.flat[i]))
    return fmt.round(out), d, len(idx)


def ulp_errors(
    fmt: Format, got: np.ndarray, exact: np.ndarray, cr: np.ndarray, flush: bool = False
) -> np.ndarray:
    """Each result's distance from the exact value in ulps of ``fmt`` (float64); ``exact`` is the
    double bracket's centre, ``cr`` the correctly rounded result. Where ``cr`` is not finite the
    result must be the same infinity or a nan: 0 if so, else inf; a non-finite result where ``cr``
    is finite is inf. ``flush``: a zero result where the exact value is below the normal range
    (a flushed subnormal) counts as no error."""
    g, c = _f64(got), _f64(cr)
    out = np.zeros(g.shape, np.float64)
    finite = np.isfinite(c)
    both = finite & np.isfinite(g)
    with np.errstate(all="ignore"):
        out[both] = np.abs(g[both] - exact[both]) / fmt.ulp(exact[both])
    if flush:  # a zero where the exact value is below the normal range: flushed, not wrong
        out[both & (g == 0) & (np.abs(exact) < 2.0**fmt.emin)] = 0.0
    out[finite & ~np.isfinite(g)] = np.inf
    special = ~finite
    same = (g == c) | (np.isnan(g) & np.isnan(c))
    out[special & ~same] = np.inf
    return out


# ------------------------------------------------------------------------------------ inputs


def all_patterns(fmt: Format) -> np.ndarray:
    """Every bit pattern of a 16-bit format: nan, ±inf, ±0 and the subnormals included."""
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(fmt.dtype)


# Values where a function changes behaviour: domain ends, overflow and underflow thresholds, poles
BOUNDARIES = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 2.0, 1e-8, -1e-8, 1e-30]
BOUNDARIES += [88.72283, 88.72284, 89.41599, 89.416, -87.33655, -103.97207, -103.97208, -104.0]
BOUNDARIES += [np.pi / 2, -np.pi / 2, np.pi, 3 * np.pi / 2, 1e4, 1e10, 1e30, -1e30, 0.99999994]
BOUNDARIES += [1.0000001, 9.0, 20.0, 11.0898, 11.0899, -17.33, 709.8, -745.2]


def float32_sample(n: int, seed: int) -> np.ndarray:
    """``n`` float32 inputs: the special and boundary values (every format's extremes too), a
    quarter random bit patterns (every exponent), a half log-uniform magnitudes in [2^-12, 2^8]
    and the rest uniform in [-1.2, 1.2]."""
    rng = np.random.default_rng(seed)
    fin = np.finfo(np.float32)
    extremes = [fin.max, fin.tiny, fin.smallest_subnormal, fin.tiny - fin.smallest_subnormal]
    extremes += [65504.0, 6.1035156e-05, 5.9604645e-08]  # float16's
    special = np.array(BOUNDARIES + extremes + [-v for v in extremes], np.float32)
    raw = rng.integers(0, 2**32, n // 4, dtype=np.uint64).astype(np.uint32).view(np.float32)
    mags = np.exp2(rng.uniform(-12, 8, n // 2)) * rng.choice([-1.0, 1.0], n // 2)
    unit = rng.uniform(-1.2, 1.2, n)
    return np.concatenate([special, raw, mags.astype(np.float32), unit.astype(np.float32)])[:n]


def exponents(x: np.ndarray, seed: int) -> np.ndarray:
    """pow's second argument beside each x: small integers, halves, thirds, ±inf, nan and uniform
    values in [-6, 6], in x's dtype."""
    rng = np.random.default_rng(seed)
    choices = np.concatenate([np.arange(-4, 5), [0.5, -0.5, 1.5, 1 / 3, np.inf, -np.inf, np.nan]])
    pick = rng.choice(choices, x.size)
    free = rng.uniform(-6, 6, x.size)
    return np.where(rng.random(x.size) < 0.5, pick, free).astype(x.dtype)


def inputs(fmt: Format, float32_count: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The family's inputs ``A`` (and ``B``, pow's exponents) in ``fmt``: all 65536 patterns of a
    16-bit format, ``float32_count`` samples of float32."""
    a = all_patterns(fmt) if fmt.bits is np.uint16 else float32_sample(float32_count, seed)
    return {"A": a, "B": exponents(a, seed + 1)}


def program(functions=FUNCTIONS) -> str:
    """One program computing every function, one output each (``O_exp``, ...)."""
    body = " ".join(f"O_{f} = {'pow(A, B)' if f == 'pow' else f + '(A)'};" for f in functions)
    return f"function (A[N], B[N]) -> ({', '.join(f'O_{f}' for f in functions)}) {{ {body} }}"


# ------------------------------------------------------------------------------------ bounds

STRICT_ULPS = 0.5 + 2.0**-20  # the C library's double rounded once (module docstring)


@dataclass(frozen=True)
class Bound:
    """The largest error allowed, in ulps of the format; ``flush``: a result whose exact value is
    below the normal range may also be 0 (sigmoid's ``1 + exp(-x)`` overflows in the type first)."""

    ulps: float
    flush: bool = False


# default-mode float32 bounds: the OpenCL 1.2 full profile's for its built-ins (exp and log 3 ulp,
# tan and atan 5, pow 16, the rest 4), but sqrt and 1/x correctly rounded (§5.2 promises it)
_DEFAULT32 = {"exp": 3.0, "log": 3.0, "tan": 5.0, "atan": 5.0, "pow": 16.0}
_ROUNDED = Bound(STRICT_ULPS)

# mode -> format -> function -> Bound (docs/semantics.md §8.6 shows this table)
BOUNDS: dict[str, dict[str, dict[str, Bound]]] = {
    "strict": {
        name: {f: _ROUNDED for f in FUNCTIONS} | {"sigmoid": Bound(2.5, True)} for name in FORMATS
    },
    "default": {
        name: {f: Bound(_DEFAULT32.get(f, 4.0) if name == "float32" else 1.0) for f in FUNCTIONS}
        | {"sqrt": _ROUNDED, "recip": _ROUNDED, "sigmoid": Bound(4.0 if name == "float32" else 2.5, True)}
        for name in FORMATS
    },
}
MODES = {"default": {}, "strict": {"strict": True}}  # mode -> compile settings
# Outside strict mode a signaling nan argument may give nan where a quiet one gives a number
# (IEEE 754 §9.2.1: ``pow(sNaN, 0)``; the float routine sees bfloat16's sNaN unquieted)
SIGNALING_NAN_MAY_PROPAGATE = {"default"}


def signaling_nan(fmt: Format, a: np.ndarray) -> np.ndarray:
    """Where ``a`` (of ``fmt``) holds a signaling nan: exponent all ones, quiet bit clear, not inf."""
    bits = np.asarray(a).view(fmt.bits).astype(np.uint64)
    width = 8 * fmt.dtype.itemsize
    mant_bits = fmt.p - 1
    exp_mask = ((1 << (width - 1 - mant_bits)) - 1) << mant_bits
    quiet = 1 << (mant_bits - 1)
    mant = (1 << mant_bits) - 1
    return ((bits & exp_mask) == exp_mask) & ((bits & quiet) == 0) & ((bits & mant) != 0)


@dataclass
class Measured:
    """One function's accuracy in one format and mode: the largest error and where it occurs."""

    function: str
    dtype: str
    mode: str
    max_ulp: float
    worst_input: str
    bound: float
    over: int  # inputs beyond the bound
    not_rounded: int  # results other than the correctly rounded one (a zero's sign counts)
    count: int

    def merged(self, other: Measured) -> Measured:
        """Two chunks of the same inputs' measurements as one."""
        worst = self if self.max_ulp >= other.max_ulp else other
        return Measured(
            self.function, self.dtype, self.mode, worst.max_ulp, worst.worst_input, self.bound,
            self.over + other.over, self.not_rounded + other.not_rounded, self.count + other.count,
        )

    def row(self, target: str) -> dict:
        """The summary's row (``--conformance-json``; the terminal shows the same columns)."""
        return {
            "target": target,
            "function": self.function,
            "dtype": self.dtype,
            "mode": self.mode,
            "max_ulp": round(self.max_ulp, 4),
            "bound": round(self.bound, 6),
            "worst_input": self.worst_input,
            "over_bound": self.over,
            "not_correctly_rounded": self.not_rounded,
            "inputs": self.count,
        }

    def problem(self) -> str:
        return (
            f"{self.function} on {self.dtype} in {self.mode} mode: {self.over} of {self.count} inputs beyond "
            f"{self.bound:g} ulp, the worst {self.max_ulp:.4g} ulp at x = {self.worst_input}"
        )


def measure(
    fn: str, fmt: Format, mode: str, got: np.ndarray, ins: dict[str, np.ndarray], ref: tuple
) -> tuple[Measured, np.ndarray]:
    """``got`` (the results for ``ins``) against ``ref`` = (correctly rounded, double value), under
    ``BOUNDS[mode][fmt][fn]``: the summary, and each input's error in ulps."""
    cr, exact = ref
    bound = BOUNDS[mode][fmt.name][fn]
    g = np.asarray(got)
    err = ulp_errors(fmt, g, exact, cr, bound.flush)
    nan = np.isnan(_f64(g))
    if mode in SIGNALING_NAN_MAY_PROPAGATE:
        snan = signaling_nan(fmt, ins["A"]) | (signaling_nan(fmt, ins["B"]) if fn == "pow" else False)
        err[snan & nan] = 0.0
    i = int(np.argmax(err))
    worst = _show(ins["A"].flat[i]) + (f", y = {_show(ins['B'].flat[i])}" if fn == "pow" else "")
    c = np.asarray(cr)
    same = (g.view(fmt.bits) == c.view(fmt.bits)) | (nan & np.isnan(_f64(c)))
    over, wrong = int((err > bound.ulps).sum()), int((~same).sum())
    return Measured(fn, fmt.name, mode, float(err.flat[i]), worst, bound.ulps, over, wrong, err.size), err


def _show(v) -> str:
    return repr(float(v))
