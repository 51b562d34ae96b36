"""``python -m bench.wgmma_loop [DEVICE]``: the warp-group GEMM kernel (``backends.cuda.wgmma``)
checked where two work-groups share an SM, and timed.

An integer float16 product 1024x4096x1024 (256 work-groups of 128 x 128: two to an SM on an
H100/H200) is compared exactly with numpy five times; then the kernel time (``profile()``, best
of three) of float16 matmuls 4096 and 8192. A K loop that leaves a step's products running
across a buffer's refill got this product wrong on an H100 (bench/RESULTS.md, 2026-11-28)."""

from __future__ import annotations

import sys

import numpy as np

import tile

MM = "function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else "opencl_gpu.0"
    rng = np.random.default_rng(0)
    f = tile.compile(MM, device=device)
    a = rng.integers(-3, 4, (1024, 1024)).astype(np.float16)
    b = rng.integers(-3, 4, (1024, 4096)).astype(np.float16)
    exact = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16)
    wrong = [int((f(A=a, B=b)["C"] != exact).sum()) for _ in range(5)]
    print(f"integer 1024x4096x1024: wrong elements per run {wrong}")
    for n in (4096, 8192):
        x = rng.standard_normal((n, n)).astype(np.float16)
        A, B = tile.tensor(x, device=device), tile.tensor(x.copy(), device=device)
        times = []
        for _ in range(3):
            f(A=A, B=B, resident=True)["C"].wait()
            times.append(max(s for _, s in f.prepare(A=A, B=B).profile()))
        best = min(times)
        print(f"fp16 matmul {n}: kernel {best * 1e3:.3f} ms, {2 * n**3 / best / 1e12:.0f} TFLOP/s")


if __name__ == "__main__":
    main()
