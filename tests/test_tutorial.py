"""Every example program of PlaidML's Tile tutorial ("Writing Tile Code": docs/docs/writing_tile_code.md
in github.com/plaidml/plaidml; ours, with other examples, is docs/tutorial.md) and a strided dilated
convolution's gradient, run through the reference interpreter.

Inputs are small and integer-valued, so sums and products are exact in every dtype and each result
is compared exactly with an expectation computed independently: numpy (``np.einsum``, slicing) or
plain loops written from the tutorial's prose.
"""

from __future__ import annotations

import numpy as np
import pytest

import ref_interp

RNG = np.random.default_rng(20240611)


def ints(shape, lo=-4, hi=5, dtype=np.float32) -> np.ndarray:
    return RNG.integers(lo, hi, size=shape).astype(dtype)


def run(src: str, **inputs: np.ndarray) -> dict[str, np.ndarray]:
    return ref_interp.run(src, inputs)


def check(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------- sums and max
SUM_AXIS = "function (I[M, N]) -> (O) { O[n: N] = +(I[m, n]); }"
SUM_AXIS_PADDED = "function (I[M, N]) -> (O) { O[n: N + 1] = +(I[m, n]); }"
SUM_AXIS_TRUNCATED = "function (I[M, N]) -> (O) { O[n: N - 1] = +(I[m, n]); }"


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float64])
def test_sum_over_axis(dtype):
    i = ints((4, 3), dtype=dtype)
    check(run(SUM_AXIS, I=i)["O"], i.sum(axis=0).astype(dtype))


def test_sum_over_axis_larger_output_is_zero_padded():
    i = ints((4, 3))
    want = np.zeros(4, np.float32)
    want[:3] = i.sum(axis=0)
    check(run(SUM_AXIS_PADDED, I=i)["O"], want)


def test_sum_over_axis_smaller_output_is_truncated():
    i = ints((4, 3))
    check(run(SUM_AXIS_TRUNCATED, I=i)["O"], i.sum(axis=0)[:2])


MATMUL = """
function (A[M, L], B[L, N]) -> (C) {
    C[i, j: M, N] = +(A[i, k] * B[k, j]);
}
"""


@pytest.mark.parametrize("m,k,n", [(2, 3, 4), (1, 1, 1), (5, 2, 3)])
def test_matmul(m, k, n):
    a, b = ints((m, k)), ints((k, n))
    check(run(MATMUL, A=a, B=b)["C"], np.einsum("ik,kj->ij", a, b))


def test_matmul_int():
    a, b = ints((3, 4), dtype=np.int32), ints((4, 2), dtype=np.int32)
    check(run(MATMUL, A=a, B=b)["C"], a @ b)


MAX_AXIS = """
function (I[M, N]) -> (O) {
    O[n: N] = >(I[m, n]);
}
"""


def test_max_over_axis():
    i = ints((5, 3), lo=-9, hi=-1)  # all negative: a 0 from a wrong identity would show
    check(run(MAX_AXIS, I=i)["O"], i.max(axis=0))


GLOBAL_MIN = """
function (I) -> (O) {
    Neg = -I;
    O_Neg[] = >(Neg[i, j, k]);
    O = -O_Neg;
}
"""


def test_global_min():
    i = ints((2, 3, 4), lo=1, hi=20)
    out = run(GLOBAL_MIN, I=i)
    check(out["O"], np.array(i.min(), dtype=np.float32))
    assert set(out) == {"O"}


# ------------------------------------------------------------------------------ averages
MEAN_AXIS = """
function (I[X, Y]) -> (O) {
    Sum[y: Y] = +(I[x, y]);
    O = Sum / X;
}
"""
MEAN_STAGED = """
function (I[X, Y]) -> (O) {
    Sum[] = +(I[x, y]);
    PartialMean = Sum / X;
    O = PartialMean / Y;
}
"""
MEAN_MERGED = """
function (I[X, Y]) -> (O) {
    Sum[] = +(I[x, y]);
    O = Sum / (X * Y);
}
"""


def test_mean_over_axis_float():
    i = ints((4, 3), dtype=np.float64)
    check(run(MEAN_AXIS, I=i)["O"], i.sum(axis=0) / 4)


def test_mean_staged_float():
    i = ints((4, 3), dtype=np.float64)
    check(run(MEAN_STAGED, I=i)["O"], np.float64(np.float64(i.sum() / 4) / 3))


def test_mean_merged_float():
    i = ints((4, 3), dtype=np.float64)
    check(run(MEAN_MERGED, I=i)["O"], np.float64(i.sum() / 12))


def test_mean_float32_divides_by_dimension_as_float():
    i = np.array([[1, 2], [2, 2]], np.float32)
    check(run(MEAN_AXIS, I=i)["O"], np.array([1.5, 2.0], np.float32))


def test_mean_of_integers_truncates_toward_zero():
    # int32 / int32 truncates: column sums 7 and -7 over X = 2 give 3 and -3 (not -4).
    i = np.array([[3, -3], [4, -4]], np.int32)
    check(run(MEAN_AXIS, I=i)["O"], np.array([3, -3], np.int32))
    check(run(MEAN_MERGED, I=i)["O"], np.array(0, np.int32))


# ----------------------------------------------------------------------------- max pools
POOL_WRONG = "function (I[N]) -> (O) { O[i: N / 2] = >(I[2 * i + j]); }"
POOL = "function (I[N]) -> (O) { O[i: N / 2] = >(I[2 * i + j]), j < 2; }"
POOL_UP = "function (I[N]) -> (O) { O[i: (N + 1) / 2] = >(I[2 * i + j]), j < 2; }"


@pytest.mark.parametrize("n", [4, 5, 8])
def test_max_pool_without_constraint_gives_global_max(n):
    i = ints(n, lo=-20, hi=20)
    check(run(POOL_WRONG, I=i)["O"], np.full(n // 2, i.max(), np.float32))


@pytest.mark.parametrize("n", [4, 5, 7, 8])
def test_max_pool_rounds_down(n):
    i = ints(n, lo=-20, hi=20)
    want = np.array([max(i[2 * k], i[2 * k + 1]) for k in range(n // 2)], np.float32)
    check(run(POOL, I=i)["O"], want)


@pytest.mark.parametrize("n", [4, 5, 7, 1])
def test_max_pool_rounds_up_with_smaller_edge_pool(n):
    i = ints(n, lo=-20, hi=-1)  # negative: a 0 for the half-empty last pool would show
    want = np.array([i[2 * k: 2 * k + 2].max() for k in range((n + 1) // 2)], np.float32)
    if n % 2:
        assert want[-1] == i[-1]
    check(run(POOL_UP, I=i)["O"], want)


def test_valid_indices_example_n5():
    # The tutorial's "Valid Indices" example: with N = 5, (i=1, j=1) is valid, (i=2, j=1) is not,
    # so O[2] is I[4] alone.
    i = np.array([1, 2, 3, 4, -5], np.float32)
    check(run(POOL_UP, I=i)["O"], np.array([2, 4, -5], np.float32))


# ------------------------------------------------------------------------------ skipping
SKIP = """
function (I[N, M]) -> (O) {
    O[2 * i: N] = +(I[2 * i, j]);
}
"""


@pytest.mark.parametrize("n", [4, 5, 1])
def test_skipping_writes_even_entries_only(n):
    i = ints((n, 3), lo=1, hi=9)  # positive rows: an odd entry that was written would be non-zero
    want = np.zeros(n, np.float32)
    want[0::2] = i[0::2].sum(axis=1)
    check(run(SKIP, I=i)["O"], want)


# ------------------------------------------------------------------------ cumulative sums
CUMSUM_CONSTRAINT = "function (I[N]) -> (O) { O[i: N] = +(I[k]), i - k < N; }"
CUMSUM_SHIFT = "function (I[N]) -> (O) { O[i: N] = +(I[i - j]), j < N; }"


@pytest.mark.parametrize("src", [CUMSUM_CONSTRAINT, CUMSUM_SHIFT], ids=["constraint", "shift"])
@pytest.mark.parametrize("n", [1, 2, 6])
def test_cumulative_sum(src, n):
    i = ints(n, dtype=np.int32)
    want = np.array([sum(int(i[k]) for k in range(m + 1)) for m in range(n)], np.int32)
    check(run(src, I=i)["O"], want)
    check(run(src, I=i)["O"], np.cumsum(i).astype(np.int32))


# --------------------------------------------------------------------------- convolutions
CONV1D = """
function (I[N, L, CI], K[LK, CI, CO]) -> (O) {
    O[n, x, co: N, L - LK + 1, CO] = +(I[n, x + k, ci] * K[k, ci, co]);
}
"""


@pytest.mark.parametrize("n,length,ci,lk,co", [(2, 7, 3, 3, 2), (1, 4, 1, 4, 1), (1, 5, 2, 1, 3)])
def test_conv1d_valid(n, length, ci, lk, co):
    i, k = ints((n, length, ci)), ints((lk, ci, co))
    want = np.zeros((n, length - lk + 1, co), np.float32)
    for x in range(length - lk + 1):
        want[:, x, :] = np.einsum("nkc,kcd->nd", i[:, x:x + lk, :], k)
    check(run(CONV1D, I=i, K=k)["O"], want)


CONV2D_DILATED = """
function (I[N, Lx, Ly, CI], K[LKx, LKy, CI, CO]) -> (O) {
    O[n, x, y, co: N, Lx - 2 * (LKx - 1), Ly - 3 * (LKy - 1), CO] =
            +(I[n, x + 2 * kx, y + 3 * ky, ci] * K[kx, ky, ci, co]);
}
"""


def test_conv2d_dilated():
    n, lx, ly, ci, co, kx, ky = 2, 7, 8, 2, 3, 3, 2
    i, k = ints((n, lx, ly, ci)), ints((kx, ky, ci, co))
    ox, oy = lx - 2 * (kx - 1), ly - 3 * (ky - 1)
    want = np.zeros((n, ox, oy, co), np.float32)
    for a in range(kx):
        for b in range(ky):
            patch = i[:, 2 * a: 2 * a + ox, 3 * b: 3 * b + oy, :]  # dilation (2, 3)
            want += np.einsum("nxyc,cd->nxyd", patch, k[a, b])
    check(run(CONV2D_DILATED, I=i, K=k)["O"], want)


# ------------------------------------------- a strided dilated conv and its gradient by hand
CONV_STRIDED = """
function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {
    O[n, y, x, co: N, H/3, W/3, CO] = +(I[n, 3*y + 2*j, 3*x + 2*i, ci] * K[j, i, ci, co]);
}
"""
CONV_STRIDED_DI = """
function (DO[N, OH, OW, CO], K[KH, KW, CI, CO]) -> (DI) {
    DI[n, 3*y + 2*j, 3*x + 2*i, ci: N, 3*OH, 3*OW, CI] = +(DO[n, y, x, co] * K[j, i, ci, co]);
}
"""


def conv_strided_loops(i: np.ndarray, k: np.ndarray) -> np.ndarray:
    n, h, w, ci = i.shape
    kh, kw, _, co = k.shape
    out = np.zeros((n, h // 3, w // 3, co), i.dtype)
    for y in range(h // 3):
        for x in range(w // 3):
            for j in range(kh):
                for ii in range(kw):
                    if 3 * y + 2 * j < h and 3 * x + 2 * ii < w:  # out-of-range terms are skipped
                        out[:, y, x, :] += i[:, 3 * y + 2 * j, 3 * x + 2 * ii, :] @ k[j, ii]
    return out


def conv_strided_di_scatter(do: np.ndarray, k: np.ndarray) -> np.ndarray:
    n, oh, ow, co = do.shape
    kh, kw, ci, _ = k.shape
    di = np.zeros((n, 3 * oh, 3 * ow, ci), do.dtype)
    for y in range(oh):
        for x in range(ow):
            for j in range(kh):
                for ii in range(kw):
                    r, c = 3 * y + 2 * j, 3 * x + 2 * ii
                    if r < 3 * oh and c < 3 * ow:
                        di[:, r, c, :] += do[:, y, x, :] @ k[j, ii].T
    return di


@pytest.mark.parametrize("h,w,kh,kw", [(9, 9, 2, 2), (10, 8, 2, 3), (7, 11, 3, 1)])
def test_strided_dilated_conv(h, w, kh, kw):
    i, k = ints((2, h, w, 3)), ints((kh, kw, 3, 2))
    want = conv_strided_loops(i, k)
    assert want.shape == (2, h // 3, w // 3, 2)
    check(run(CONV_STRIDED, I=i, K=k)["O"], want)


@pytest.mark.parametrize("oh,ow,kh,kw", [(3, 3, 2, 2), (2, 4, 3, 2), (1, 2, 1, 3)])
def test_strided_conv_derivative_program(oh, ow, kh, kw):
    do, k = ints((2, oh, ow, 2)), ints((kh, kw, 3, 2))
    want = conv_strided_di_scatter(do, k)
    got = run(CONV_STRIDED_DI, DO=do, K=k)["DI"]
    check(got, want)
    # Positions no (y, j) pair reaches (e.g. row 1: 3y + 2j = 1 has no solution) stay 0.
    assert not got[:, 1, :, :].any()


def test_strided_conv_derivative_is_the_adjoint():
    # <DO, conv(I)> == <DI(DO), I> whenever H = 3 * OH, W = 3 * OW: DI is the exact transpose.
    oh, ow, kh, kw = 3, 2, 2, 2
    i, k, do = ints((1, 3 * oh, 3 * ow, 2), dtype=np.float64), ints((kh, kw, 2, 3), dtype=np.float64), \
        ints((1, oh, ow, 3), dtype=np.float64)
    o = run(CONV_STRIDED, I=i, K=k)["O"]
    di = run(CONV_STRIDED_DI, DO=do, K=k)["DI"]
    assert di.shape == i.shape
    assert float(np.sum(do * o)) == float(np.sum(di * i))
