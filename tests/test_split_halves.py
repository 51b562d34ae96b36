"""A float16 (bfloat16) matrix product with few output rows, split over its K (``split_reduction``:
the GPU's small-M GEMM, issue 41's M = 16 case with "a max error 15x cuBLAS's"), is float32 from
the products to the final rounding, as docs/semantics.md 8.1.1 defines a matrix product of these
types: each product exact in float32 (the partial block's ``mul``), the partials float32, and
their combine summing in float32 and rounding once, at the store.

The data (K = 4096): four products ``(1 + 2^-10)(1 - 2^-11) = 1 + 2^-11 - 2^-21`` (float16 rounds
it to 1) at even k, four -1 at odd k, zeros elsewhere; the exact sum ``4 (2^-11 - 2^-21) = 2^-9 -
2^-19`` is a float16 value, and every partial sum of these products is exact in float32 (multiples
of 2^-21 below 8), so any order gives it. Products rounded to float16 gave 0; so did a float16
combine of the two lanes' partials (``4 + 2^-9 - 2^-19`` rounds to 4, the other lane holds -4).
bfloat16 the same at 8 bits.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import ref_interp
import tile
from ref_interp.stripe_exec import run_stripe
from stripe.ir import Block, Intrinsic, walk
from tests.pass_support import lowered, run_pass

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n: M, N] = +(A[m, k] * B[k, n]); }"
K = 4096
# the GPU config's split (stripe/targets/gpu.json), aiming at few lanes so the test stays small
SPLIT = {"reqs": ["contraction"], "interleave": True, "only_po2": True, "self_init": True,
         "min_reduction": 2048, "min_chunk": 128, "parallelism": 8,
         "partial_set": ["split_partial"], "combine_set": ["split_combine"]}


def _adversarial(dtype, m: int = 2, n: int = 2) -> dict[str, np.ndarray]:
    bits = 8 if dtype is ml_dtypes.bfloat16 else 11  # significant bits
    a, b = np.zeros(K), np.zeros(K)
    a[0:8:2], b[0:8:2] = 1 + 2.0 ** (1 - bits), 1 - 2.0**-bits  # (1 + 2u)(1 - u), u = 2^-bits: rounds to 1
    a[1:8:2], b[1:8:2] = -1.0, 1.0
    return {"A": np.tile(a, (m, 1)).astype(dtype), "B": np.tile(b[:, None], (1, n)).astype(dtype)}


def _exact(arrays: dict[str, np.ndarray]) -> np.ndarray:
    return arrays["A"].astype(np.float64) @ arrays["B"].astype(np.float64)


def _split(dtype) -> Block:
    program = lowered(MATMUL, {"A": (2, K), "B": (K, 2)}, dtype)
    return run_pass("split_reduction", SPLIT, program, target="gpu")


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_split_products_and_combine_are_float32(dtype):
    """As data: the partial block multiplies in float32, and the combine's local sum is float32."""
    out = _split(dtype)
    blocks = [b for b in walk(out) if isinstance(b, Block)]
    muls = [s for b in blocks for s in b.stmts if isinstance(s, Intrinsic) and s.name == "mul"]
    assert muls and all(s.dtype.value == "float32" for s in muls), muls
    combine = next(b for b in blocks if "split_combine" in b.tags and b.idxs)
    sums = [r for r in combine.refs if r.into.endswith("_sum")]
    assert [r.shape.dtype.value for r in sums] == ["float32"], combine.refs
    assert out.ref("C").shape.dtype.value == np.dtype(dtype).name


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_split_matmul_rounds_once(dtype):
    """The split program gives the interpreter's answer, the exact sum (a value of the type),
    where any rounding to the type before the end gave 0."""
    arrays = _adversarial(dtype)
    want = _exact(arrays)
    assert np.all(want == want[0, 0]) and want[0, 0] != 0
    assert want.astype(dtype).astype(np.float64)[0, 0] == want[0, 0]  # a value of the type
    got = np.asarray(run_stripe(_split(dtype), arrays)["C"]).astype(np.float64)
    np.testing.assert_array_equal(got, want)
    interp = ref_interp.run(tile.parse(MATMUL), arrays)["C"].astype(np.float64)
    np.testing.assert_array_equal(interp, want)


# ---------------------------------------------------------------------------------- stand-in sm_90
SMALL_M = [(1, 4096, 4096), (8, 4096, 11008), (16, 4096, 4096), (64, 4096, 4096)]


@pytest.mark.parametrize("m,n,k", SMALL_M)
def test_cuda_small_m_kernels_round_only_at_the_store(m, n, k):
    """The CUDA text cuda.0 builds for float16 GEMMs of few rows (a stand-in sm_90 device, no GPU):
    its only float16 roundings (``tile_rh``, ``vstore_half_rte``) are the output's stores; a split
    one (M = 1 here: a GEMM with rows on both sides goes to the tensor cores unsplit,
    ``split_reductions.min_free``) writes float32 partials."""
    from backends import driver
    from backends.cuda import nvrtc
    from tests.test_cuda_device import _stand_in

    if nvrtc.compiler() is None:
        pytest.skip("no CUDA compiler here (neither NVRTC nor nvcc)")
    arrays = {"A": np.ones((m, k), np.float16), "B": np.ones((k, n), np.float16)}
    bound = driver.bind_inputs(tile.parse(MATMUL), arrays)
    source = driver.build(bound, _stand_in(), {"cache": False}).library.source
    kernels = source.split('extern "C"')[1:]
    assert kernels
    for text in kernels:
        rounded = [ln.strip() for ln in text.splitlines() if "tile_rh" in ln or "vstore_half" in ln]
        stores = [ln.startswith("vstore_half_rte(") and ", b" in ln and "_C);" in ln for ln in rounded]
        assert all(stores), rounded
    if len(kernels) == 2:  # split over K: the partials, their combine
        assert "__global float* restrict b2_C_part" in kernels[0], kernels[0].split("{")[0]


@pytest.mark.parametrize("m", [1])
def test_the_optimized_cuda_program_is_the_product_rounded_once(m):
    """cuda.0's whole optimized program (a stand-in sm_90 device) run by the Stripe interpreter on
    data whose float32 sums are exact (``tests/test_cuda_small_m.py``): the float64 product
    rounded once, bit for bit."""
    from backends import driver
    from backends.cuda import nvrtc
    from tests.test_cuda_device import _stand_in
    from tests.test_cuda_small_m import exact_data

    if nvrtc.compiler() is None:
        pytest.skip("no CUDA compiler here (neither NVRTC nor nvcc)")
    arrays = exact_data(m, 32, K, np.float16)
    build = driver.build(driver.bind_inputs(tile.parse(MATMUL), arrays), _stand_in(), {"cache": False})
    assert len(build.library.extra["names"]) == 2  # split over K: the partials, their combine
    got = np.asarray(run_stripe(build.program, arrays)["C"]).astype(np.float64)
    want = (arrays["A"].astype(np.float64) @ arrays["B"].astype(np.float64)).astype(np.float16)
    np.testing.assert_array_equal(got, want.astype(np.float64))


@pytest.mark.parametrize("m, dtype, split", [(1, np.float16, True), (2, np.float16, False),
                                             (16, np.float16, False), (16, np.float32, True)])
def test_cuda_splits_a_half_gemm_only_without_rows_on_both_sides(m, dtype, split):
    """On cuda.0 (the stand-in sm_90 device) a float16 product of M >= 2 rows is one tensor-core
    GEMM (``split_reductions.min_free``: it took 0.047 ms at 16 x 4096 x 4096 where the split took
    0.162 on an H100); M = 1 (no rows of A's own) and float32 (no unit) are still split over K."""
    from backends import driver
    from tests.test_cuda_device import _stand_in

    arrays = {"A": np.ones((m, K), dtype), "B": np.ones((K, 64), dtype)}
    build = driver.build(driver.bind_inputs(tile.parse(MATMUL), arrays), _stand_in(), {"cache": False})
    names = build.library.extra["names"]
    assert (len(names) == 2) == split, names
