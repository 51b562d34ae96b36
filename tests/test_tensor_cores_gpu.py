"""Tensor-core kernels run on the test OpenCL device (``$TILE_OPENCL_TEST_DEVICE``) when it has
the matrix unit (an NVIDIA GPU of compute capability 8.0 or more); elsewhere every test skips,
saying so. Integer-valued operands are exact in every mode (their products and sums are exact in
float32, and TF32 keeps small integers); random normal operands are compared with a float64
product within a bound from the mode's unit roundoff and the reduction length.

The same kernels' Stripe and generated text are checked without a GPU in tests/test_tensorize.py."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from backends.driver import config_for
from tests.opencl_support import DEVICE_ID, device, run

MM = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"
MLP = """function (X[B, I], W[I, O], Bias[O]) -> (Y) {
  Z[b, o : B, O] = +(X[b, i] * W[i, o]);
  Y = relu(Z + Bias);
}"""
VALID_CONV = """function (I[N, X, Y, CI], F[KX, KY, CI, CO]) -> (O) {
  O[n, x, y, co : N, X - 2, Y - 2, CO] = +(I[n, x + i, y + j, ci] * F[i, j, ci, co]);
}"""


def _has_unit() -> bool:
    if DEVICE_ID is None:
        return False
    cfg = config_for(device())
    return cfg is not None and bool(cfg.hardware.matrix_units)


pytestmark = pytest.mark.skipif(
    not _has_unit(),
    reason=f"the tensor-core kernels run only on an NVIDIA GPU of compute capability >= 8.0 "
    f"(test OpenCL device: {DEVICE_ID or 'none'}); their Stripe and OpenCL text are tested without one",
)

MODES = [(np.float16, None), (ml_dtypes.bfloat16, None), (np.float32, "tf32"), (np.float32, "3xtf32")]
UNIT_ROUNDOFF = {np.float16: 2.0**-11, ml_dtypes.bfloat16: 2.0**-8, "tf32": 2.0**-11, "3xtf32": 2.0**-22}


def settings(prec):
    return {"precision": prec} if prec else {}


@pytest.mark.parametrize("dt,prec", MODES)
@pytest.mark.parametrize("m,k,n", [(1024, 1024, 1024), (1000, 300, 520), (64, 16, 8), (1024, 1024, 4096)])
def test_integer_matmuls_are_exact(dt, prec, m, k, n):
    """(1024, 1024, 4096): 256 work-groups of 128 x 128, two to an SM on an H100, where products
    left running across a refill once went wrong (backends.cuda.wgmma's K loop)."""
    rng = np.random.default_rng(m + k)
    a, b = rng.integers(-3, 4, (m, k)).astype(dt), rng.integers(-3, 4, (k, n)).astype(dt)
    got = run(MM, {"A": a, "B": b}, settings=settings(prec))["C"]
    np.testing.assert_array_equal(got, (a.astype(np.float64) @ b.astype(np.float64)).astype(dt))


@pytest.mark.parametrize("dt,prec", MODES)
def test_random_matmul_error_is_within_the_modes_bound(dt, prec):
    rng = np.random.default_rng(1)
    k = 1024
    a, b = rng.standard_normal((512, k)).astype(dt), rng.standard_normal((k, 512)).astype(dt)
    got = run(MM, {"A": a, "B": b}, settings=settings(prec))["C"].astype(np.float64)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    # operand rounding (2u per product) plus float32 accumulation over k (and float16 output)
    u = UNIT_ROUNDOFF[prec or dt]
    bound = (2 * u + k * 2.0**-24) * scale
    if prec is None:
        bound = bound + np.abs(exact) * u  # the output's rounding
    assert np.all(np.abs(got - exact) <= bound)


def test_3xtf32_is_as_accurate_as_the_float32_kernel():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((1024, 1024)).astype(np.float32)
    b = rng.standard_normal((1024, 1024)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    three = run(MM, {"A": a, "B": b}, settings={"precision": "3xtf32"})["C"]
    plain = run(MM, {"A": a, "B": b})["C"]
    assert np.max(np.abs(three - exact)) <= np.max(np.abs(plain - exact))


def test_fused_bias_relu_and_convolution_on_the_unit():
    rng = np.random.default_rng(3)
    x = rng.integers(-3, 4, (512, 256)).astype(np.float16)
    w = rng.integers(-3, 4, (256, 384)).astype(np.float16)
    bias = rng.integers(-3, 4, (384,)).astype(np.float16)
    got = run(MLP, {"X": x, "W": w, "Bias": bias})["Y"]
    np.testing.assert_array_equal(got, np.maximum(x.astype(np.float64) @ w + bias, 0).astype(np.float16))
    i = rng.integers(-2, 3, (2, 12, 12, 64)).astype(np.float16)
    f = rng.integers(-2, 3, (3, 3, 64, 64)).astype(np.float16)
    i64, f64 = i.astype(np.float64), f.astype(np.float64)
    taps = [(ky, kx) for ky in range(3) for kx in range(3)]
    want = sum(np.einsum("nyxc,co->nyxo", i64[:, ky:ky + 10, kx:kx + 10], f64[ky, kx]) for ky, kx in taps)
    np.testing.assert_array_equal(run(VALID_CONV, {"I": i, "F": f})["O"], want.astype(np.float16))


PADDED_CONV = """function (I[N, X, Y, CI], F[KX, KY, CI, CO]) -> (O) {
  O[n, x, y, co : N, X, Y, CO] = +(I[n, x + i - 1, y + j - 1, ci] * F[i, j, ci, co]);
}"""


@pytest.mark.parametrize("bad", [None, np.inf, np.nan])
def test_padded_convolution_leaves_skipped_points_out(bad):
    """The input's padding is skipped, not multiplied: an infinite or NaN weight reaches only the
    outputs whose real inputs it multiplies, as in the interpreter."""
    import ref_interp

    rng = np.random.default_rng(4)
    i = rng.integers(-2, 3, (2, 20, 20, 64)).astype(np.float16)
    f = rng.integers(-2, 3, (3, 3, 64, 64)).astype(np.float16)
    if bad is not None:
        f[0, 0, 5, 7] = bad
    got = run(PADDED_CONV, {"I": i, "F": f})["O"]
    np.testing.assert_array_equal(got, ref_interp.run(PADDED_CONV, {"I": i, "F": f})["O"])


def _warpgroup() -> bool:
    """Whether the test device has warp-group products (compute capability exactly 9.0)."""
    unit = config_for(device()).hardware.matrix_units.get("tensor_core")
    return unit is not None and unit.warpgroup is not None


@pytest.mark.skipif(not _has_unit() or not _warpgroup(),
                    reason="warp-group products (wgmma) exist only on compute capability 9.0 (H100, H200)")
@pytest.mark.parametrize("src,shapes", [
    (MM, {"A": (512, 256), "B": (256, 384)}),
    (PADDED_CONV, {"I": (2, 20, 20, 64), "F": (3, 3, 64, 64)}),
])
def test_kernels_take_the_warp_group_products_on_a_hopper_gpu(src, shapes):
    """On an H100/H200 the float16 kernels above ran on ``wgmma`` (backends.cuda.wgmma), from the
    program's PTX rebuilt for sm_90a; the answers are checked by the tests above."""
    import tile

    rng = np.random.default_rng(5)
    inputs = {k: rng.integers(-2, 3, s).astype(np.float16) for k, s in shapes.items()}
    f = tile.compile(src, DEVICE_ID)
    got = f(inputs)
    import ref_interp

    want = ref_interp.run(src, inputs)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    source = f.prepare(inputs).library.source
    assert "//sm_90a " in source and "wgmma.mma_async" in source, "the kernel took no warp-group products"


AS_FLOAT = """function (A[M, K], B[K, N]) -> (C) {
  P[m, n : M, N] = +(A[m, k] * B[k, n]);
  C = as_float(P, 32) * 3.0;
}"""
CONV_BIAS = """function (I[N, X, Y, CI], F[KX, KY, CI, CO], Bias[CO]) -> (O) {
  C[n, x, y, co : N, X, Y, CO] = +(I[n, x + i - 1, y + j - 1, ci] * F[i, j, ci, co]);
  O = relu(C + Bias);
}"""


@pytest.mark.skipif(not _has_unit() or not _warpgroup(),
                    reason="warp-group products (wgmma) exist only on compute capability 9.0 (H100, H200)")
@pytest.mark.parametrize("src,shapes", [
    (AS_FLOAT, {"A": (512, 256), "B": (256, 384)}),  # float32 rows: 8-byte local stores
    (CONV_BIAS, {"I": (2, 16, 16, 64), "F": (3, 3, 64, 64), "Bias": (64,)}),  # padded, fused
])
def test_opencls_kernel_stores_whole_lines_as_the_per_fragment_stores(src, shapes, monkeypatch):
    """OpenCL's warp-group kernel (``TILE_CUDA_LAUNCH=0``) stores these outputs through its K steps'
    buffers (``backends.cuda.tile_store``): equal to the interpreter on integers, and on random
    values bit for bit what storing each sum where it sits gives."""
    import ref_interp
    import tile
    from backends.cuda import tile_store

    monkeypatch.setenv("TILE_CUDA_LAUNCH", "0")
    rng = np.random.default_rng(6)
    ints_in = {k: rng.integers(-2, 3, s).astype(np.float16) for k, s in shapes.items()}
    normal = {k: rng.standard_normal(s).astype(np.float16) for k, s in shapes.items()}
    f = tile.compile(src, DEVICE_ID, {"cache": False})
    source = f.prepare(ints_in).library.source
    assert "wgmma.mma_async" in source and "const uint Cs_at = As_at;" in source
    for k, want in ref_interp.run(src, ints_in).items():
        np.testing.assert_array_equal(f(ints_in)[k], want)
    staged = f(normal)
    monkeypatch.setattr(tile_store, "plan", lambda *args: None)  # per-fragment stores
    g = tile.compile(src, DEVICE_ID, {"cache": False})
    assert "Cs_at" not in g.prepare(normal).library.source
    for k, plain in g(normal).items():
        bits = np.uint32 if plain.dtype == np.float32 else np.uint16
        np.testing.assert_array_equal(staged[k].view(bits), plain.view(bits))
