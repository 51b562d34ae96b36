"""Compiled targets against a reference measured in the same run — numpy on the CPU, PyTorch (fp32,
TF32 off) for GPU targets: GFLOP/s (GB/s for elementwise) and the ratio (reference time / target
time; above 1 means faster than the reference). Compile time is reported apart.

Run: ``python -m pytest bench/ --benchmark-only [--target ID]`` (default: every compiled device).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import tile

MATMUL = "function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
CONV = """function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {
    O[n, x, y, co: N, H, W, CO] = +(I[n, x + kx - 1, y + ky - 1, ci] * K[kx, ky, ci, co]);
}"""
CHAIN = "function (X) -> (Y) { Y = relu(X * 2 + 1) / (1 + exp(-X)); }"


def chain_ref(x):
    """numpy's version of CHAIN."""
    return np.maximum(x * 2 + 1, 0) / (1 + np.exp(-x))


def _conv_ref(i, k):
    n, h, w, _ = i.shape
    p = np.pad(i, ((0, 0), (1, 1), (1, 1), (0, 0)))
    out = np.zeros((n, h, w, k.shape[3]), np.float32)
    for a in range(3):
        for b in range(3):
            out += np.einsum("nxyc,cd->nxyd", p[:, a : a + h, b : b + w], k[a, b], optimize=True)
    return out


def _cases():
    r = np.random.default_rng(0)
    out = {}
    for n in (256, 512, 1024):
        a, b = (r.integers(-3, 4, (n, n)).astype(np.float32) for _ in range(2))
        out[f"matmul_{n}"] = (MATMUL, {"A": a, "B": b}, lambda x: x["A"] @ x["B"], 2 * n**3, "GFLOP/s")
    i = r.integers(-3, 4, (1, 56, 56, 64)).astype(np.float32)
    k = r.integers(-3, 4, (3, 3, 64, 64)).astype(np.float32)
    out["conv3x3_56x56x64_to64"] = (
        CONV,
        {"I": i, "K": k},
        lambda x: _conv_ref(x["I"], x["K"]),
        2 * 56 * 56 * 64 * 9 * 64,
        "GFLOP/s",
    )
    x = r.integers(-3, 4, (1 << 22,)).astype(np.float32)
    out["eltwise_chain_4M"] = (
        CHAIN,
        {"X": x},
        lambda v: chain_ref(v["X"]),
        8 * (1 << 22),
        "GB/s",
    )
    return out


CASES = _cases()


def _torch_reference(case: str, inputs: dict):
    """The same computation in PyTorch on the GPU (TF32 off), or None when there is no CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = {k: torch.from_numpy(v).cuda() for k, v in inputs.items()}
    if case.startswith("matmul"):
        fn = lambda: torch.mm(dev["A"], dev["B"])  # noqa: E731
    elif case.startswith("conv"):
        x = dev["I"].permute(0, 3, 1, 2).contiguous()
        w = dev["K"].permute(3, 2, 0, 1).contiguous()
        fn = lambda: torch.nn.functional.conv2d(x, w, padding=1)  # noqa: E731
    else:
        fn = lambda: torch.relu(dev["X"] * 2 + 1) / (1 + torch.exp(-dev["X"]))  # noqa: E731

    def run():
        out = fn()
        torch.cuda.synchronize()
        return out

    run()
    return run


def _best(fn, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


@pytest.mark.parametrize("case", list(CASES))
def test_target(benchmark, target, case):
    from backends import registry

    if target not in registry.devices():
        pytest.skip(f"device {target} unavailable: {registry.unavailable()}")
    src, inputs, reference, work, unit = CASES[case]
    t0 = time.perf_counter()
    exe = tile.compile(src, target, {"cache": False})
    exe(inputs)  # the first call compiles for these shapes
    compile_s = time.perf_counter() - t0
    out = benchmark.pedantic(lambda: exe(inputs), rounds=3, warmup_rounds=1)
    want = reference(inputs)
    (got,) = out.values()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    ours = benchmark.stats.stats.min
    # A GPU target is compared with PyTorch on the GPU; everything else with numpy.
    torch_run = _torch_reference(case, inputs) if "gpu" in target else None
    ref_name = "pytorch" if torch_run else "numpy"
    ref = _best(torch_run if torch_run else lambda: reference(inputs), repeat=5 if torch_run else 3)
    scale = 1e9
    benchmark.extra_info.update(
        {
            "rate": work / ours / scale,
            "unit": unit,
            "reference": ref_name,
            "reference_rate": work / ref / scale,
            "ratio": ref / ours,
            "compile_s": compile_s,
        }
    )
    print(
        f"\n{target} {case}: {work / ours / scale:.2f} {unit} ({ref_name} {work / ref / scale:.2f}), "
        f"ratio {ref / ours:.3f}, compile {compile_s:.2f} s"
    )
