"""``python -m bench.cpu_gemm [--threads 1] [--sizes 248,256,257,264,512,1000]``: square float32
matmuls on ``llvm_cpu.0`` (specialized, and shape-generic: its bucket built at two other sizes
first) against numpy's BLAS, at the same thread count (Tile's ``threads`` setting; numpy's through
``OPENBLAS_NUM_THREADS`` and ``OMP_NUM_THREADS``, set here before numpy loads). Best of
interleaved calls; every output checked within the §8.3 bound of a sum of ``n`` products first.
Figures in bench/RESULTS.md ("CPU GEMMs on 16 registers")."""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cpu_gemm", description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sizes", default="248,256,257,264,512,1000")
    p.add_argument("--seconds", type=float, default=1.0, help="per size, about")
    args = p.parse_args(argv)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import numpy as np

    import tile
    from bench.compile_time import MATMUL

    print(f"threads {args.threads} (Tile and numpy); load average {os.getloadavg()[0]:.2f}")
    print(f"{'n':>6}{'numpy us':>10}{'tile us':>10}{'GF/s':>7}{'/numpy':>8}{'generic us':>12}{'/numpy':>8}")
    for n in (int(x) for x in args.sizes.split(",")):
        rng = np.random.default_rng(n)
        a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
        settings = {"cache": False, "threads": args.threads}
        spec = tile.compile(MATMUL, "llvm_cpu.0", settings)
        gen = tile.compile(MATMUL, "llvm_cpu.0", {**settings, "generic": True})
        for m in (n + 3, n + 5):
            gen(*(rng.standard_normal((m, m)).astype(np.float32) for _ in range(2)))
        bound = 2 * n * np.finfo(np.float32).eps * (np.abs(a) @ np.abs(b))
        want = a.astype(np.float64) @ b.astype(np.float64)
        for f in (spec, gen):
            assert np.all(np.abs(f(a, b)["C"] - want) <= bound), f"matmul {n}: past the bound"
        calls = {"numpy": (np.matmul, (a, b)), "tile": (spec, (a, b)), "generic": (gen, (a, b))}
        best = dict.fromkeys(calls, float("inf"))
        stop = time.perf_counter() + args.seconds
        while time.perf_counter() < stop or min(best.values()) == float("inf"):
            for k, (f, ins) in calls.items():
                t = time.perf_counter()
                f(*ins)
                best[k] = min(best[k], time.perf_counter() - t)
        us = {k: v * 1e6 for k, v in best.items()}
        ratio = {k: best["numpy"] / best[k] for k in ("tile", "generic")}
        print(f"{n:>6}{us['numpy']:>10.0f}{us['tile']:>10.0f}{2 * n**3 / best['tile'] / 1e9:>7.0f}"
              f"{ratio['tile']:>8.2f}{us['generic']:>12.0f}{ratio['generic']:>8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
