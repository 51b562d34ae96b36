"""The launched TMA kernel (``backends.cuda.tma``) on 16-bit GEMMs whose last tiles overhang M, N or
K (issue 41: "unaligned M, N and K: predicated edges, or TMA's out-of-bounds fill, instead of
falling to a slower kernel"): the copies read rows every 16 bytes, so any multiple of 8 elements
per row streams; what a box reaches beyond the tensor the accelerator fills with zeros (adding
nothing), and the stores are guarded. Only where the tiles fill every compute unit
(``launched.tiles``); 32-bit operands keep whole tiles (``kmajor``'s copies).

As data here (the schedule an H100 profile plans, ``tests/gemm_corpus.py``) and in the rendered
text; on a GPU, bit-exact on data whose float32 sums are exact (``tests/test_cuda_small_m.py``).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tile
from backends import registry
from tests.gemm_corpus import MM, nest_of
from tests.test_cuda_small_m import MATMUL, exact_data

RAGGED = [((4097, 4096), (4096, 4096)), ((4096, 4104), (4104, 4096)), ((1000, 3000), (3000, 4104)),
          ((3000, 3000), (3000, 3000))]


def _shapes(a, b):
    return {"A": a, "B": b}


@pytest.mark.parametrize("a,b", RAGGED, ids=lambda s: "x".join(map(str, s)))
def test_overhanging_16_bit_gemms_stream_on_the_launched_kernel(a, b):
    nest = nest_of(MM, _shapes(a, b), np.float16, prof="launch_cu")
    s = nest.plan()
    (m, k), (_, n) = a, b
    (i,), (j,), (kk,) = nest.g.m.idxs, nest.g.n.idxs, nest.g.k.idxs
    assert s.kernel == "tma" and (s.tiles.tm, s.tiles.tn, s.tiles.kt) == (256, 128, 64)
    rows, cols = -(-m // 256), -(-n // 128)
    assert (s.order.rows, s.order.cols) == (rows, cols) and rows * cols >= 132 == s.order.launched
    assert s.k_steps == -(-k // 64) and s.groups == rows * cols
    assert set(s.edges) == {ix.name for ix, t in ((i, 256), (j, 128), (kk, 64)) if ix.range % t}
    assert (i.range, j.range, kk.range) == (m, n, k)
    amap, bmap = s.maps
    assert amap.dims == (k, m) and bmap.dims == (n, k)  # the tensors' own sizes: the rest reads 0
    if m % 256 or n % 128:
        assert s.lines is None  # stored in place, guarded


def test_the_overhanging_rows_are_guarded_in_the_text():
    nest = nest_of(MM, _shapes((4097, 4096), (4096, 4096)), np.float16, prof="launch_cu")
    text = nest.render(nest.plan())
    stores = [ln for ln in text.splitlines() if "vstore_half_rte" in ln or "< 4097" in ln]
    assert any("< 4097) {" in ln for ln in stores) and "cp.async.bulk.tensor" in text


@pytest.mark.parametrize("shapes,dtype,prec", [
    (((1000, 1000), (1000, 1000)), np.float16, None),  # 32 launched tiles for 132 units
    (((3000, 3000), (3000, 3000)), np.float32, "tf32"),  # 32-bit: whole tiles only
    (((4097, 4097), (4097, 4097)), np.float16, None),  # rows every 8194 bytes: no 16-byte copies
])
def test_what_stays_off_the_launched_kernel(shapes, dtype, prec):
    s = nest_of(MM, _shapes(*shapes), dtype, prec, prof="launch_cu").plan()
    assert s.kernel != "tma", s.kernel


# ---------------------------------------------------------------------------------- GPU
@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
@pytest.mark.parametrize("a,b", RAGGED, ids=lambda s: "x".join(map(str, s)))
def test_overhanging_tiles_are_exact_on_the_gpu(a, b, dt):
    if "cuda.0" not in registry.devices():
        pytest.skip("no cuda.0 here (needs an NVIDIA GPU, its driver, cuda-bindings and NVRTC)")
    if dt == "bfloat16" and a != RAGGED[0][0]:
        pytest.skip("bfloat16: one shape is enough")
    npdt = ml_dtypes.bfloat16 if dt == "bfloat16" else np.float16
    (m, k), (_, n) = a, b
    arrays = exact_data(m, n, k, npdt)
    a64, b64 = (arrays[x].astype(np.float64) for x in "AB")
    assert (np.abs(a64) @ np.abs(b64)).max() < 2.0**16  # every partial sum exact in float32
    got = np.asarray(tile.compile(MATMUL, device="cuda.0")(**arrays)["C"]).astype(np.float64)
    np.testing.assert_array_equal(got, (a64 @ b64).astype(npdt).astype(np.float64))
