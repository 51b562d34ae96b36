"""``python -m bench.compile_time [--device D] [--only NAME,...] [--sizes 500,1000,5000]``: how long a
program with many statements takes to compile and run once, against the interpreter.

Programs (generated here, small 8x8 float32 tensors with integer values so results compare exactly):

* ``chain N``: N statements alternating an elementwise add and an 8x8 matrix product, each reading
  the previous one's result;
* ``matmuls N``: N independent 8x8 matrix products of the same two inputs, each its own output.

After a warm-up on a 2-statement program (imports), per program: the interpreter's time for
one call, the device's compile + first call (in a fresh ``tile.compile``, disk cache off unless
``--cache``), their ratio, the process's CPU time over the compile + call (the machine may be
shared: CPU time is the fairer figure), and the peak traced Python memory (``tracemalloc``) and
peak resident set (``resource``) after it. Every result is checked equal to the interpreter's.
``--warm``: instead, a new process's compile + first call when an earlier process built the same
program into a fresh disk cache (the second of two processes; imports and first-use set-up paid
by another small program first).
bench/RESULTS.md ("Compile time") has figures.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
import tracemalloc

import numpy as np

import tile


def chain(n: int) -> str:
    """``n`` statements alternating ``T = T + B`` and an 8x8 matrix product of ``T`` and ``B``."""
    lines, last = [], "A"
    for k in range(n):
        out = f"T{k}"
        if k % 2 == 0:
            lines.append(f"  {out} = {last} + B;")
        else:
            lines.append(f"  {out}[i, j: 8, 8] = +({last}[i, l] * B[l, j]);")
        last = out
    return "function (A[N, N], B[N, N]) -> (" + last + ") {\n" + "\n".join(lines) + "\n}"


def matmuls(n: int) -> str:
    """``n`` independent 8x8 matrix products of ``A`` and ``B``, each an output."""
    outs = ", ".join(f"C{k}" for k in range(n))
    lines = [f"  C{k}[i, j: 8, 8] = +(A[i, l] * B[l, j]);" for k in range(n)]
    return "function (A[N, N], B[N, N]) -> (" + outs + ") {\n" + "\n".join(lines) + "\n}"


PROGRAMS = {"chain": chain, "matmuls": matmuls}


def inputs() -> dict[str, np.ndarray]:
    """Small integers in [-1, 1]: the chain's values stay exact in float32 (B is a permutation-like
    0/1 matrix, so products do not grow)."""
    rng = np.random.default_rng(0)
    a = rng.integers(-1, 2, (8, 8)).astype(np.float32)
    b = np.eye(8, dtype=np.float32)[rng.permutation(8)]
    return {"A": a, "B": b}


def measure(src: str, device: str, settings: dict) -> dict:
    """Interpreter time, compile + first call time and CPU time, peak memory; results checked."""
    x = inputs()
    start = time.perf_counter()
    want = tile.compile(src, "interp")(x)
    interp = time.perf_counter() - start
    tracemalloc.start()
    start, cpu = time.perf_counter(), time.process_time()
    got = tile.compile(src, device, settings)(x)
    first = time.perf_counter() - start
    cpu = time.process_time() - cpu
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    for name, w in want.items():
        if not np.array_equal(np.asarray(got[name]), w):
            raise AssertionError(f"{device} differs from the interpreter in output {name}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return {"interp": interp, "first": first, "cpu": cpu, "traced_mib": peak / 2**20, "rss_mib": rss}


WARM = r"""
import sys, time
t0, c0 = time.perf_counter(), time.process_time()
import numpy as np
import tile
from bench.compile_time import PROGRAMS, inputs
name, n = sys.argv[1], int(sys.argv[2])
tile.compile(PROGRAMS["matmuls" if name == "chain" else "chain"](2), "llvm_cpu.0")(inputs())  # imports
t1, c1 = time.perf_counter(), time.process_time()
got = tile.compile(PROGRAMS[name](n), "llvm_cpu.0")(inputs())
t2, c2 = time.perf_counter(), time.process_time()
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {c2 - c1:.3f}")
"""


def warm(name: str, n: int) -> tuple[float, float, float]:
    """A new process's compile + first call with a warm disk cache (a fresh cache directory
    filled by one process before), after another small program paid the imports and first-use
    set-up: (seconds to that point, compile + call seconds, its CPU seconds)."""
    import os
    import subprocess
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TILE_CACHE_DIR": cache, "PYTHONPATH": str(root)}
        for _ in range(2):
            r = subprocess.run([sys.executable, "-c", WARM, name, str(n)], env=env, cwd=root,
                               capture_output=True, text=True, check=True)
        imp, first, cpu = (float(v) for v in r.stdout.split())
    return imp, first, cpu


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compile_time", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="llvm_cpu.0")
    p.add_argument("--only", default="chain,matmuls", help="programs: chain, matmuls")
    p.add_argument("--sizes", default="500,1000,5000", help="statement counts")
    p.add_argument("--cache", action="store_true", help="use the disk cache (default: off)")
    p.add_argument("--warm", action="store_true",
                   help="instead: a new process's compile + first call with a warm disk cache")
    args = p.parse_args(argv)
    if args.warm:
        print(f"{'program':<16}{'set-up s':>10}{'warm compile+call s':>21}{'cpu s':>8}")
        for name in args.only.split(","):
            for n in (int(s) for s in args.sizes.split(",")):
                imp, first, cpu = warm(name, n)
                print(f"{name + ' ' + str(n):<16}{imp:>10.2f}{first:>21.3f}{cpu:>8.3f}", flush=True)
        return 0
    settings = {} if args.cache else {"cache": False}
    measure(chain(2), args.device, settings)  # imports and first-use set-up, paid by no figure below
    print(f"{'program':<16}{'interp s':>10}{'compile+call s':>16}{'ratio':>8}{'cpu s':>8}"
          f"{'traced MiB':>12}{'max RSS MiB':>13}")
    for name in args.only.split(","):
        for n in (int(s) for s in args.sizes.split(",")):
            r = measure(PROGRAMS[name](n), args.device, settings)
            print(f"{name + ' ' + str(n):<16}{r['interp']:>10.2f}{r['first']:>16.2f}"
                  f"{r['first'] / r['interp']:>8.1f}{r['cpu']:>8.2f}{r['traced_mib']:>12.1f}"
                  f"{r['rss_mib']:>13.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
