"""A contraction whose fused epilogue reads an index of the output (a mask written as ``cond`` on
``index``: causal attention's scores) compiles and runs on the CPU at every size: at 2x2 the
micro-kernel does not take the tiled nest, and its plain loops could not read the output's index
(``load_index ... not an index here``); such a kernel now stays whole on ``llvm_cpu``."""

import numpy as np
import pytest

import tile

MASKED = """function (A[N, D], B[M, D]) -> (Y) {
  S[i, j: N, M] = +(A[i, d] * B[j, d]);
  Y = cond(index(S, 1) <= index(S, 0), S, 0.0);
}"""


@pytest.mark.parametrize("device", ["llvm_cpu.0", "opencl_cpu.0"])
@pytest.mark.parametrize("n, m, d", [(2, 2, 2), (1, 3, 1), (3, 5, 4), (70, 70, 8), (130, 65, 16)])
def test_a_masked_product_equals_the_interpreter(device, n, m, d):
    try:
        exe = tile.compile(MASKED, device=device)
    except tile.TileDeviceError as e:
        pytest.skip(f"no {device} here: {e}")
    rng = np.random.default_rng(n * 100 + m)
    inputs = {"A": rng.integers(-3, 4, (n, d)).astype(np.float32),
              "B": rng.integers(-3, 4, (m, d)).astype(np.float32)}
    want = tile.compile(MASKED, device="interp")(inputs)["Y"]
    assert np.array_equal(exe(inputs)["Y"], want)
