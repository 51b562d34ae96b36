"""The reference interpreter's speed, as a ratio to numpy measured in the same run.

The interpreter is an oracle, not a fast path; these numbers say how large a problem it answers in
reasonable time. Run: ``python -m pytest bench/ --benchmark-only``.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import ref_interp
from bench.test_backends import chain_ref
from ref_interp.run import input_types
from tile.bind import bind
from tile.parser import parse

CONV = """function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {
    O[n, x, y, co: N, H - KH + 1, W - KW + 1, CO] = +(I[n, x + kx, y + ky, ci] * K[kx, ky, ci, co]);
}"""
MATMUL = "function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
CHAIN = "function (X) -> (Y) { Y = relu(X * 2 + 1) / (1 + exp(-X)); }"


def _best(fn, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _conv_ref(i, k):
    kh, kw = k.shape[:2]
    oh, ow = i.shape[1] - kh + 1, i.shape[2] - kw + 1
    out = np.zeros((i.shape[0], oh, ow, k.shape[3]), np.float32)
    for a in range(kh):
        for b in range(kw):
            out += np.einsum("nxyc,cd->nxyd", i[:, a : a + oh, b : b + ow], k[a, b])
    return out


CASES = {
    "conv3x3_1x32x32x16_to16": (
        CONV,
        lambda r: {
            "I": r.integers(-3, 4, (1, 32, 32, 16)).astype(np.float32),
            "K": r.integers(-3, 4, (3, 3, 16, 16)).astype(np.float32),
        },
        lambda x: _conv_ref(x["I"], x["K"]),
        lambda x: 2 * 30 * 30 * 16 * 9 * 16,
    ),
    "matmul_128": (
        MATMUL,
        lambda r: {
            "A": r.integers(-3, 4, (128, 128)).astype(np.float32),
            "B": r.integers(-3, 4, (128, 128)).astype(np.float32),
        },
        lambda x: x["A"] @ x["B"],
        lambda x: 2 * 128**3,
    ),
    "eltwise_chain_1M": (
        CHAIN,
        lambda r: {"X": r.integers(-3, 4, (1 << 20,)).astype(np.float32)},
        lambda x: chain_ref(x["X"]),
        lambda x: 6 * (1 << 20),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_interpreter(benchmark, case):
    src, make, reference, flops = CASES[case]
    inputs = make(np.random.default_rng(0))
    program = parse(src)
    bound = bind(program, input_types(program, inputs))
    out = benchmark.pedantic(lambda: ref_interp.run(bound, inputs), rounds=5, warmup_rounds=1)
    want = reference(inputs)
    (got,) = out.values()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    ref_time = _best(lambda: reference(inputs))
    ours = benchmark.stats.stats.min
    benchmark.extra_info["gflops"] = flops(inputs) / ours / 1e9
    benchmark.extra_info["numpy_gflops"] = flops(inputs) / ref_time / 1e9
    benchmark.extra_info["ratio_to_numpy"] = ref_time / ours
    print(
        f"\n{case}: interpreter {ours * 1e3:.1f} ms ({flops(inputs) / ours / 1e9:.3f} GFLOP/s), "
        f"numpy {ref_time * 1e3:.2f} ms, ratio {ref_time / ours:.3f}"
    )
