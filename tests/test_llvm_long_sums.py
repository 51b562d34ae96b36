"""Long float sums on ``llvm_cpu`` are summed in blocks (``backends/llvm/partials.py``, issue 24):
their error grows like the log of their length, as numpy's pairwise sum does, not like the length.

Each case has a known exact answer: ones (every partial sum is an integer, so a blocked sum of
2**24 + k ones is exact where one float32 running sum stops at 2**24), or one value repeated (the
worst case for a running sum: every rounding goes the same way), compared with ``math.fsum``
within ``C * log2(n)`` unit roundoffs relatively, plus a constant for what one block sums in
order (below). ``sum_block=0`` (one running sum per element, the code before) misses that bound
on the cases below (but one), by orders of magnitude on most; strict mode keeps the
interpreter's order.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import tile

GLOBAL = "function (A[N]) -> (O) { O[] = +(A[i]); }"
ROW = "function (A[M, N]) -> (O) { O[i: M] = +(A[i, j]); }"
COLUMN = "function (A[M, N]) -> (O) { O[j: N] = +(A[i, j]); }"
ONE_COLUMN = "function (A[M, N]) -> (O) { O[] = +(A[i, 1]); }"
OUTER = "function (A[M], B[N]) -> (O) { O[] = +(A[i] * B[j]); }"
MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
C = 4  # the bound's constant: a blocked sum is within C * log2(n) unit roundoffs


def _run(src: str, settings: dict | None = None, **inputs: np.ndarray) -> np.ndarray:
    exe = tile.compile(src, "llvm_cpu.0", {"cache": False, **(settings or {})})
    (out,) = exe(inputs).values()
    return np.asarray(out, np.float64)


def _within_log_bound(got: np.ndarray, exact: float, n: int, dtype=np.float32, extra: float = 0) -> float:
    """The largest relative error in unit roundoffs, asserted within ``C * log2(n) + extra``."""
    u = float(np.finfo(dtype).eps) / 2
    worst = float(np.max(np.abs(got - exact))) / abs(exact) / u
    bound = C * math.log2(n) + extra
    assert worst <= bound, f"{worst:.1f} u, more than {C} log2(n) + {extra} = {bound:.1f} u"
    return worst


# What a block sums in order adds a constant, whatever the length: one value repeated is off by
# up to about half as many roundoffs as it has terms in order. The plain loops' blocks of 4096 are
# vectorized in at least 16 lanes (256 terms each; hosts that prefer 256-bit vectors use fewer
# lanes than 64); the micro-kernel's lanes each sum one element, in chunks of 512.
PLAIN = 4096 / 16 / 2
MICRO = 512 / 2


@pytest.mark.parametrize("threads", [1, 2])
def test_a_sum_of_ones_past_2_to_the_24_is_exact(threads):
    n = (1 << 24) + 1000  # float32 holds the even integers up to 2**25
    ones = np.ones(n, np.float32)
    assert _run(GLOBAL, {"threads": threads}, A=ones) == n
    # one running sum per lane stalls at 2**24 once a lane's share passes it; strict sums in order
    assert _run(GLOBAL, {"strict": True}, A=ones) == 1 << 24


def test_a_row_of_ones_past_2_to_the_24_is_exact():
    n = (1 << 24) + 4
    assert _run(ROW, A=np.ones((1, n), np.float32)).tolist() == [n]


def test_a_billion_term_sum_without_memory():
    """``A[i] * B[j]`` over 31623 x 31623 points (10^9 terms, 250 KB of input). One running
    sum per thread lane (sum_block 0) is more than 1% short on the ones."""
    n = 31623
    ones = np.ones(n, np.float32)
    _within_log_bound(_run(OUTER, A=ones, B=ones), n * n, n * n)
    rng = np.random.default_rng(7)
    a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    exact = math.fsum(a.astype(np.float64)) * math.fsum(b.astype(np.float64))
    _within_log_bound(_run(OUTER, A=a, B=b), exact, n * n)  # each product rounded: within u


TENTH = float(np.float32(0.1))
CASES = {
    # name: (program, input shape, terms per element, extra roundoffs); inputs all float32 0.1
    "global 10^7": (GLOBAL, (10**7,), 10**7, PLAIN),
    "4 rows of 2^21 (split into lanes)": (ROW, (4, 1 << 21), 1 << 21, PLAIN),
    "64 rows of 2^18": (ROW, (64, 1 << 18), 1 << 18, PLAIN),
    "one column of 2^22 (strided)": (ONE_COLUMN, ((1 << 22), 3), 1 << 22, 256 / 2),
    "64 columns of 2^16 (micro-kernel)": (COLUMN, (1 << 16, 64), 1 << 16, MICRO),
}


@pytest.mark.parametrize("name", CASES)
def test_long_sums_of_a_tenth_are_within_log_n_roundoffs(name):
    src, shape, n, extra = CASES[name]
    a = np.full(shape, 0.1, np.float32)
    _within_log_bound(_run(src, A=a), n * TENTH, n, extra=extra)
    if src is ONE_COLUMN:
        return  # split over many threads, its lanes are short enough without blocks
    # the same sums in one running sum per element (sum_block 0) miss the bound
    with pytest.raises(AssertionError):
        _within_log_bound(_run(src, {"sum_block": 0}, A=a), n * TENTH, n, extra=extra)


@pytest.mark.parametrize("m, k, n", [(1, 10**7, 1), (4, 1 << 20, 4), (24, 1 << 18, 16)])
def test_long_k_matmul(m, k, n):
    """Through the split reduction (1 x K x 1), the micro-kernel's whole-K tiles (4 x K x 4) and
    its cache blocks of K (24 x K x 16, each block a fresh sum added to C)."""
    a = np.full((m, k), 0.1, np.float32)
    b = np.ones((k, n), np.float32)
    _within_log_bound(_run(MATMUL, A=a, B=b), k * TENTH, k, extra=MICRO if m > 1 else PLAIN)


def test_float64_sums_are_blocked_too():
    n = 1 << 22
    a = np.full(n, 0.1, np.float64)
    got = _run(GLOBAL, A=a)
    _within_log_bound(got, math.fsum(a), n, np.float64, PLAIN)


def test_sums_that_skip_points_and_negative_zeros():
    """A constraint that skips every point of some blocks leaves their partials at the identity,
    and a sum of negative zeros is +0, as the interpreter's (its output starts at +0)."""
    n = 50_000
    src = "function (A[N]) -> (O) { O[] = +(A[i]), i < 40000; }"
    a = np.full(n, 0.1, np.float32)
    _within_log_bound(_run(src, A=a), 40000 * TENTH, 40000, extra=PLAIN)
    zeros = _run(GLOBAL, A=np.full(n, -0.0, np.float32))
    assert zeros == 0 and not np.signbit(zeros)


def test_short_sums_compile_as_before():
    """A reduction of at most ``sum_block`` points per element (or an innermost loop of up to
    four blocks) is left alone: the same code as before."""
    from backends.llvm.partials import plan_sums
    from tests.llvm_runner import lowered

    x = np.ones((8, 4096), np.float32)
    program = lowered(ROW, {"A": x})
    k = program.stmts[0].stmts[-1]
    dts = {r.into: r.shape.dtype for r in k.refs}
    assert plan_sums(k, (0, 1), 4096, 0, dts) is None
    assert plan_sums(k, (0, 1), 1024, 0, dts) is None
    assert plan_sums(k, (0, 1), 512, 0, dts) is not None
