"""GEMMs launched through CUDA (``backends.cuda.tma``, ``backends.cuda.launch``; on unless
``TILE_CUDA_LAUNCH=0``, which these tests unset) run on the test OpenCL device
(``$TILE_OPENCL_TEST_DEVICE``) when it can launch them: an H100 or H200 whose OpenCL memory CUDA
shares. Elsewhere every test skips, saying why. Operands are integer-valued,
so every answer is exact. The kernels' plans and text are checked without a GPU in
tests/test_tma.py."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import ref_interp
from tests.opencl_support import DEVICE_ID, device

MM = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"
MLP = """function (X[B, I], W[I, O], Bias[O]) -> (Y) {
  Z[b, o : B, O] = +(X[b, i] * W[i, o]);
  Y = relu(Z + Bias);
}"""
# the product is read back by a second kernel, which OpenCL launches
MIXED = """function (A[M, K], B[K, N]) -> (C, D) {
  C[m, n : M, N] = +(A[m, k] * B[k, n]);
  D[n, m : N, M] = =(C[m, n]);
}"""


def _why_not() -> str | None:
    """Why the test device cannot launch through CUDA (None: it can, once asked to)."""
    if DEVICE_ID is None:
        return "there is no OpenCL test device"
    from backends.cuda.launch import Launcher

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("TILE_CUDA_LAUNCH", raising=False)  # (the probe's answer is kept per device)
        launcher, why = Launcher.for_device(device())
    return None if launcher is not None else why


@pytest.fixture(autouse=True)
def _launching(monkeypatch):
    monkeypatch.delenv("TILE_CUDA_LAUNCH", raising=False)


WHY = _why_not()
pytestmark = pytest.mark.skipif(
    WHY is not None,
    reason=f"GEMMs launched through CUDA run only on an H100/H200 whose OpenCL memory CUDA shares "
    f"(test device {DEVICE_ID or 'none'}: {WHY}); their plans and text are tested without one",
)


def ints(rng, shape, dt=np.float16):
    return rng.integers(-2, 3, shape).astype(dt)


def launched(f, inputs) -> list[bool]:
    """Which of the compiled program's kernels launch through CUDA."""
    return [bool(x) for x in f.prepare(inputs).library.extra["launch"]]


@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("m,k,n", [(2048, 1024, 4096), (256, 1024, 128), (4096, 64, 1024)])
def test_launched_matmuls_are_exact(dt, m, k, n):
    """Tiles of 256 x 128 (or 128 x 256), K steps of 64: one tile, one K step, many of each. (A
    long K with few outputs, 256x4096x128, is split into partial sums first and takes no tiles.)"""
    import tile

    rng = np.random.default_rng(m + k + n)
    inputs = {"A": ints(rng, (m, k), dt), "B": ints(rng, (k, n), dt)}
    f = tile.compile(MM, DEVICE_ID)
    assert launched(f, inputs) == [True]
    want = (inputs["A"].astype(np.float64) @ inputs["B"].astype(np.float64)).astype(dt)
    np.testing.assert_array_equal(f(inputs)["C"], want)


@pytest.mark.parametrize("dt,precision", [
    (np.float16, None), (ml_dtypes.bfloat16, None), (np.float32, "tf32")
])
def test_whole_line_stores_give_the_bits_of_the_per_fragment_ones(dt, precision, monkeypatch):
    """Random values, rows scaled from 0.01 to 1000 (float16 sums overflow to infinity): the output
    staged through local memory (``tile_store``) is bit for bit what storing each sum where it
    sits gives (the same sums, rounded once to the output's type)."""
    import tile
    from backends.cuda import tile_store

    rng = np.random.default_rng(5)
    scale = 10.0 ** (np.arange(1024) % 6 - 2)[:, None]
    inputs = {"A": (rng.standard_normal((1024, 512)) * scale).astype(dt),
              "B": rng.standard_normal((512, 1024)).astype(dt)}
    settings = {"cache": False, **({"precision": precision} if precision else {})}
    f = tile.compile(MM, DEVICE_ID, settings=settings)
    assert "Ws_at" in f.prepare(inputs).library.source
    staged = f(inputs)["C"]
    monkeypatch.setattr(tile_store, "plan", lambda *args: None)  # per-fragment stores
    g = tile.compile(MM, DEVICE_ID, settings=settings)
    assert "Ws_at" not in g.prepare(inputs).library.source
    plain = g(inputs)["C"]
    bits = np.uint16 if dt != np.float32 else np.uint32
    assert dt != np.float16 or np.isinf(plain).any()
    np.testing.assert_array_equal(staged.view(bits), plain.view(bits))


@pytest.mark.parametrize("m,k,n", [(2048, 1024, 4096), (256, 32, 128), (1024, 4096, 1024)])
def test_launched_tf32_matmuls_are_exact_on_integers(m, k, n):
    """float32 with ``precision="tf32"``: B copied K-major (``backends.cuda.kmajor``), both tiles
    from the tensor memory accelerator; small integers are exact in TF32."""
    import tile

    rng = np.random.default_rng(m + k + n)
    inputs = {"A": ints(rng, (m, k), np.float32), "B": ints(rng, (k, n), np.float32)}
    f = tile.compile(MM, DEVICE_ID, settings={"precision": "tf32"})
    assert launched(f, inputs) == [False, True]  # the copy, then the product
    want = (inputs["A"].astype(np.float64) @ inputs["B"].astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(f(inputs)["C"], want)


def test_a_launched_tf32_matmul_is_within_the_modes_bound():
    """Random normal operands: each product within ``4u`` of exact (each operand's low bits
    dropped, ``u = 2^-11``, docs/semantics.md), plus float32's sum over K."""
    import tile

    rng = np.random.default_rng(11)
    k = 1024
    a, b = rng.standard_normal((512, k)).astype(np.float32), rng.standard_normal((k, 512)).astype(np.float32)
    f = tile.compile(MM, DEVICE_ID, settings={"precision": "tf32"})
    assert launched(f, {"A": a, "B": b}) == [False, True]
    got = f(A=a, B=b)["C"].astype(np.float64)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    assert np.all(np.abs(got - exact) <= (4 * 2.0**-11 + k * 2.0**-23) * scale)


@pytest.mark.parametrize("m,k,n", [(1024, 1024, 2048), (128, 32, 128)])
def test_launched_3xtf32_matmuls_are_exact_on_integers(m, k, n):
    """float32 with ``precision="3xtf32"``: both operands split into TF32 parts along 3K
    (``backends.cuda.kmajor``, two kernels), then the launched product folding each K step."""
    import tile

    rng = np.random.default_rng(m + k + n)
    inputs = {"A": ints(rng, (m, k), np.float32), "B": ints(rng, (k, n), np.float32)}
    f = tile.compile(MM, DEVICE_ID, settings={"precision": "3xtf32"})
    assert launched(f, inputs) == [False, False, True]
    want = (inputs["A"].astype(np.float64) @ inputs["B"].astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(f(inputs)["C"], want)


def test_a_launched_3xtf32_matmul_is_as_accurate_as_float32():
    """Random normals with low bits (the low parts matter): within the mode's bound, and no
    further from the exact product than Tile's float32 kernel (the issue's accuracy goal)."""
    import tile

    rng = np.random.default_rng(12)
    k = 2048
    a = rng.standard_normal((1024, k)).astype(np.float32)
    b = rng.standard_normal((k, 1024)).astype(np.float32)
    f = tile.compile(MM, DEVICE_ID, settings={"precision": "3xtf32"})
    assert launched(f, {"A": a, "B": b}) == [False, False, True]
    got = f(A=a, B=b)["C"].astype(np.float64)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    assert np.all(np.abs(got - exact) <= (3 * 2.0**-22 + k * 2.0**-24) * scale)
    plain = tile.compile(MM, DEVICE_ID)(A=a, B=b)["C"].astype(np.float64)
    assert np.max(np.abs(got - exact)) <= np.max(np.abs(plain - exact))


def test_resident_calls_on_new_inputs_and_the_fused_epilogue():
    """Resident tensors (their addresses repeat: tensor maps reused) and a bias vector smaller than
    a shared block (a piece of one), three calls with fresh values each."""
    import tile

    f = tile.compile(MLP, DEVICE_ID)
    rng = np.random.default_rng(3)
    for _ in range(3):
        inputs = {"X": ints(rng, (1024, 512)), "W": ints(rng, (512, 1024)), "Bias": ints(rng, (1024,))}
        tensors = {k: tile.tensor(v, device=DEVICE_ID) for k, v in inputs.items()}
        assert launched(f, tensors) == [True]
        got = f(tensors, resident=True)["Y"].numpy()
        np.testing.assert_array_equal(got, ref_interp.run(MLP, inputs)["Y"])


def test_a_kernel_opencl_launches_reads_the_launched_product():
    """CUDA's launch and OpenCL's kernel after it are ordered (``Driver.cuda_pending``), and the
    next call's launch waits for OpenCL's kernel."""
    import tile

    f = tile.compile(MIXED, DEVICE_ID)
    rng = np.random.default_rng(4)
    for _ in range(3):
        inputs = {"A": ints(rng, (1024, 1024)), "B": ints(rng, (1024, 1024))}
        flags = launched(f, inputs)
        assert any(flags) and not all(flags), flags
        got = f(inputs)
        # (numpy's product, exact on these integers: 1024³ points are past the interpreter's limit)
        c = (inputs["A"].astype(np.float64) @ inputs["B"].astype(np.float64)).astype(np.float16)
        np.testing.assert_array_equal(got["C"], c)
        np.testing.assert_array_equal(got["D"], c.T)


def test_a_profile_times_the_launched_kernel():
    import tile

    rng = np.random.default_rng(6)
    inputs = {"A": ints(rng, (1024, 1024)), "B": ints(rng, (1024, 1024))}
    f = tile.compile(MM, DEVICE_ID)
    f(inputs)
    ((name, seconds),) = f.profile()
    assert "t256x128" in name or "t128x256" in name
    assert 0 < seconds < 1.0


def test_with_tile_cuda_launch_0_every_kernel_stays_on_opencl(monkeypatch):
    import tile

    monkeypatch.setenv("TILE_CUDA_LAUNCH", "0")
    rng = np.random.default_rng(7)
    inputs = {"A": ints(rng, (512, 768)), "B": ints(rng, (768, 2048))}  # (a shape no test compiled)
    f = tile.compile(MM, DEVICE_ID)
    assert launched(f, inputs) == [False]
    np.testing.assert_array_equal(f(inputs)["C"], ref_interp.run(MM, inputs)["C"])
