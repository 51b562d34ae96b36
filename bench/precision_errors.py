"""The measured error of each precision mode on random normal matmuls (docs/semantics.md §8.1).

    python -m bench.precision_errors [--size 1024] [--seed 0]

A and B are standard normal float32 matrices; the reference is their product in float64 (numpy).
Each mode is the interpreter's emulation (``ref_interp.run``), so the numbers say what the mode
computes, not what a given kernel does:

* ``fp32``: native float32 (``precision="native"``);
* ``tf32`` / ``3xtf32``: float32 operands rounded as a matrix unit does (``precision=...``);
* ``fp16`` / ``bf16``: A and B converted to the narrow type, products accumulated in float32 and
  rounded to the narrow type once (native semantics of a float16/bfloat16 ``+(A * B)``): the
  error includes rounding the float32 inputs to the narrow type.

Columns: ``max |C - C64| / max |C64|`` (normwise) and ``max |C - C64| / (|A| |B|)`` elementwise,
the quantity the γ_K error bound and conformance's tolerances (``conformance/precision.py``) are
stated in. Not a pytest benchmark: it measures accuracy, not speed (about a minute a mode at 1024).
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np

import ref_interp

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"


def measure(size: int, seed: int) -> list[tuple[str, float, float, float]]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((size, size)).astype(np.float32)
    b = rng.standard_normal((size, size)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    bf16, fp16 = ml_dtypes.bfloat16, np.float16
    runs = [
        ("fp32", MATMUL, a, b, "native"),  # one program: the dtype comes from the inputs
        ("tf32", MATMUL, a, b, "tf32"),
        ("3xtf32", MATMUL, a, b, "3xtf32"),
        ("fp16", MATMUL, a.astype(fp16), b.astype(fp16), "native"),
        ("bf16", MATMUL, a.astype(bf16), b.astype(bf16), "native"),
    ]
    points = size**3 + 1
    out = []
    for name, src, x, y, mode in runs:
        start = time.perf_counter()
        c = ref_interp.run(src, {"A": x, "B": y}, mode, max_points=points)["C"].astype(np.float64)
        err = np.abs(c - exact)
        norm, elem = float(err.max() / np.abs(exact).max()), float((err / scale).max())
        out.append((name, norm, elem, time.perf_counter() - start))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rows = measure(args.size, args.seed)
    print(f"random normal {args.size}x{args.size} matmul, seed {args.seed}, vs float64")
    print("| mode | max \\|C - C64\\| / max \\|C64\\| | max \\|C - C64\\| / (\\|A\\| \\|B\\|) | seconds |")
    print("|---|---|---|---|")
    for name, norm, elem, secs in rows:
        cells = [f"{v:.2e} (2^{np.log2(v):.1f})" for v in (norm, elem)]
        print(f"| {name} | {cells[0]} | {cells[1]} | {secs:.0f} |")


if __name__ == "__main__":
    main()
