"""``python -m bench.compile_time [--device D] [--only NAME,...] [--sizes 500,1000,5000]``: how long a
program with many statements takes to compile and run once, against the interpreter.

Programs (generated here, small 8x8 float32 tensors with integer values so results compare exactly):

* ``chain N``: N statements alternating an elementwise add and an 8x8 matrix product, each reading
  the previous one's result;
* ``matmuls N``: N independent 8x8 matrix products of the same two inputs, each its own output;
* ``distinct N`` (not run unless ``--only`` names it): N 8x8 products each scaled by its own
  constant, so N distinct kernels (the others have a handful, built once: ``backends.llvm.dedup``),
  where LLVM and the IR generation are most of the compile.

Each program runs in a process of its own (so its peak resident set is its own): after a warm-up on a
2-statement program (imports), the interpreter's time for one call, the device's compile + first call
(in a fresh ``tile.compile``, disk cache off unless ``--cache``), their ratio, the process's CPU time
over the compile + call and over the interpreter's call, and their ratio (the machine may be shared:
CPU time is the fairer figure; ``--repeat R``: the least of R runs of each), and the process's peak
resident set (``resource``). ``--traced``: also the peak traced Python memory of one more compile +
call under ``tracemalloc``, apart from the timed ones (tracing every allocation slows Python code
about fourfold: timed under it, the compile looked 4-5x slower than it is). Every result is checked
equal to the interpreter's.
``--warm``: instead, a new process's compile + first call when an earlier process built the same
program into a fresh disk cache (the second of two processes; imports and first-use set-up paid
by another small program first), for each program alone and with its gradient program
(``tile.grad``, derived, compiled and called in that process too), and whether the program cache
(``backends.progcache``) had it. ``--torch``: a ``tile.torch`` op (a relative-bias attention, a
matmul) called at a new size ``N`` (``--sizes``), forward then backward: in a first process
(cold cache) and in a second one (warm), after the op ran at another size; gradients checked
against PyTorch's autograd.
bench/RESULTS.md ("Compile time") has figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

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


def distinct(n: int) -> str:
    """``n`` 8x8 matrix products of ``A`` and ``B``, each scaled by its own constant (``k + 2``)."""
    outs = ", ".join(f"D{k}" for k in range(n))
    lines = [f"  C{k}[i, j: 8, 8] = +(A[i, l] * B[l, j]);\n  D{k} = C{k} * {k + 2};" for k in range(n)]
    return "function (A[N, N], B[N, N]) -> (" + outs + ") {\n" + "\n".join(lines) + "\n}"


PROGRAMS = {"chain": chain, "matmuls": matmuls, "distinct": distinct}


def inputs() -> dict[str, np.ndarray]:
    """Small integers in [-1, 1]: the chain's values stay exact in float32 (B is a permutation-like
    0/1 matrix, so products do not grow)."""
    rng = np.random.default_rng(0)
    a = rng.integers(-1, 2, (8, 8)).astype(np.float32)
    b = np.eye(8, dtype=np.float32)[rng.permutation(8)]
    return {"A": a, "B": b}


def measure(src: str, device: str, settings: dict, repeat: int = 1, traced: bool = False) -> dict:
    """Interpreter time, compile + first call time and CPU time (the least of ``repeat`` runs of
    each), peak resident set; with ``traced``, the peak traced memory of one more compile + call
    (not timed: ``tracemalloc`` slows it several-fold). Results checked."""
    x = inputs()
    best: dict[str, float] = {}
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        want = tile.compile(src, "interp")(x)
        _least(best, interp=time.perf_counter() - start, interp_cpu=time.process_time() - cpu)
        start, cpu = time.perf_counter(), time.process_time()
        got = tile.compile(src, device, settings)(x)
        _least(best, first=time.perf_counter() - start, cpu=time.process_time() - cpu)
        _check(want, got, device)
    if traced:
        tracemalloc.start()
        _check(want, tile.compile(src, device, settings)(x), device)
        best["traced_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    best["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return best


def _least(best: dict[str, float], **figures: float) -> None:
    for k, v in figures.items():
        best[k] = min(v, best.get(k, v))


def _check(want: dict, got: dict, device: str) -> None:
    for name, w in want.items():
        if not np.array_equal(np.asarray(got[name]), w):
            raise AssertionError(f"{device} differs from the interpreter in output {name}")


WARM = r"""
import sys, time
t0, c0 = time.perf_counter(), time.process_time()
import numpy as np
import tile
from bench.compile_time import PROGRAMS, inputs
name, n, grad = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "grad"
tile.compile(PROGRAMS["matmuls" if name == "chain" else "chain"](2), "llvm_cpu.0")(inputs())  # imports
if grad:
    tile.compile(tile.grad(PROGRAMS["matmuls" if name == "chain" else "chain"](2)), "llvm_cpu.0")
t1, c1 = time.perf_counter(), time.process_time()
src = PROGRAMS[name](n)
x = inputs()
exe = tile.compile(src, "llvm_cpu.0")
got = exe(x)
if grad:  # the gradient program of the sum of the outputs, derived and compiled in this process
    feed = {**x, **{"D" + k: np.ones_like(v) for k, v in got.items()}}
    dx = tile.compile(tile.grad(src), "llvm_cpu.0")(feed)
t2, c2 = time.perf_counter(), time.process_time()
checks = [(src, x, got)] + ([(tile.grad(src), feed, dx)] if grad else [])
for prog, feed, out in checks:
    for k, w in tile.compile(prog, "interp")(feed).items():
        assert np.array_equal(out[k], w), f"{k} differs from the interpreter"
hit = exe._last.library.extra.get("program_cache", "-")
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {c2 - c1:.3f} {hit}")
"""


def warm(name: str, n: int, grad: bool = False) -> tuple[float, float, float, str]:
    """A new process's compile + first call with a warm disk cache (a fresh cache directory
    filled by one process before), after another small program paid the imports and first-use
    set-up: (seconds to that point, compile + call seconds, its CPU seconds, the program cache's
    status). ``grad``: the gradient program's (``tile.grad``) derivation, compile and call too."""
    with tempfile.TemporaryDirectory() as cache:
        for _ in range(2):
            out = _python(WARM, [name, str(n), "grad" if grad else "fwd"], cache)
        imp, first, cpu, hit = out.split()
    return float(imp), float(first), float(cpu), hit


def _python(script: str, args: list[str], cache: str) -> str:
    """``script``'s last line of output, run in a new process with ``TILE_CACHE_DIR=cache``."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "TILE_CACHE_DIR": cache, "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, "-c", script, *args], env=env, cwd=root, capture_output=True,
                       text=True, check=True)
    return r.stdout.strip().splitlines()[-1]


# A relative-bias attention (the shape of issue 40's tile.torch example) and a matmul, as tile.torch
# ops: called once at one size (imports, first-use set-up), then timed at a new size, forward then
# backward, checked against PyTorch's own autograd.
ATTENTION = """function (Q[S, D], K[S, D], R[S, S], V[S, D]) -> (O) {
  L[i, j: S, S] = +(Q[i, d] * K[j, d]);
  M = L + R;
  P = builtin_softmax(M, S, S);
  O[i, d: S, D] = +(P[i, j] * V[j, d]);
}"""
MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n: M, N] = +(A[m, k] * B[k, n]); }"
TORCH_OPS = {"attention": ATTENTION, "matmul": MATMUL}

TORCH = r"""
import sys, time
import torch
import tile.torch as tt
from bench.compile_time import TORCH_OPS, torch_args, torch_reference
name, n = sys.argv[1], int(sys.argv[2])
op = tt.op(TORCH_OPS[name])
for size, timed in ((3, False), (n, True)):
    args = torch_args(name, size)
    t0, c0 = time.perf_counter(), time.process_time()
    y = op(*args)
    t1, c1 = time.perf_counter(), time.process_time()
    y.sum().backward()
    t2, c2 = time.perf_counter(), time.process_time()
want = torch_reference(name, size)
for a, w in zip(args, want):  # softmax rounds: within a few ulps per term of the longest sum
    tol = 4 * (size + 8) * torch.finfo(torch.float32).eps * float(w.abs().max())
    torch.testing.assert_close(a.grad, w, rtol=0, atol=tol)
print(f"{t1 - t0:.4f} {t2 - t1:.4f} {c1 - c0:.4f} {c2 - c1:.4f}")
"""


def torch_args(name: str, n: int) -> list:
    """The op's inputs at size ``n`` (small integers, requiring gradients)."""
    import torch

    g = torch.Generator().manual_seed(n)
    shapes = [(n, 8), (n, 8), (n, n), (n, 8)] if name == "attention" else [(n, 8), (8, n + 1)]
    return [torch.randint(-2, 3, s, generator=g).float().requires_grad_() for s in shapes]


def torch_reference(name: str, n: int) -> list:
    """PyTorch's gradients of the sum of the op's output, on the same inputs."""
    args = torch_args(name, n)
    if name == "attention":
        q, k, r, v = args
        out = torch_softmax(q @ k.T + r) @ v
    else:
        out = args[0] @ args[1]
    out.sum().backward()
    return [a.grad for a in args]


def torch_softmax(x):
    import torch

    return torch.softmax(x, dim=1)


def torch_case(name: str, n: int) -> list[tuple[float, float, float, float]]:
    """(forward s, backward s, their CPU s) of a first process (cold cache) and a second one (warm)
    at the new size ``n``."""
    with tempfile.TemporaryDirectory() as cache:
        return [tuple(float(v) for v in _python(TORCH, [name, str(n)], cache).split()) for _ in range(2)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compile_time", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="llvm_cpu.0")
    p.add_argument("--only", default="chain,matmuls", help="programs: chain, matmuls, distinct")
    p.add_argument("--sizes", default="500,1000,5000", help="statement counts")
    p.add_argument("--cache", action="store_true", help="use the disk cache (default: off)")
    p.add_argument("--repeat", type=int, default=1, help="the least time of this many runs")
    p.add_argument("--traced", action="store_true",
                   help="also the peak traced memory of one more (untimed) compile + call")
    p.add_argument("--one", help=argparse.SUPPRESS)  # NAME,N: that program in this process, as JSON
    p.add_argument("--warm", action="store_true",
                   help="instead: a new process's compile + first call with a warm disk cache")
    p.add_argument("--torch", action="store_true",
                   help="instead: tile.torch ops' forward + backward at a new size, cold and warm cache")
    args = p.parse_args(argv)
    if args.torch:
        print(f"{'tile.torch op':<16}{'cold fwd+bwd ms':>17}{'warm fwd ms':>13}{'warm bwd ms':>13}"
              f"{'warm cpu ms':>13}")
        for name in TORCH_OPS:
            for n in (int(s) for s in args.sizes.split(",")):
                (cf, cb, _, _), (wf, wb, cpf, cpb) = torch_case(name, n)
                print(f"{name + ' ' + str(n):<16}{(cf + cb) * 1e3:>17.1f}{wf * 1e3:>13.1f}{wb * 1e3:>13.1f}"
                      f"{(cpf + cpb) * 1e3:>13.1f}", flush=True)
        return 0
    if args.warm:
        print(f"{'program':<16}{'set-up s':>10}{'warm compile+call s':>21}{'cpu s':>8}  program cache")
        for name in args.only.split(","):
            for n in (int(s) for s in args.sizes.split(",")):
                for grad in (False, True):
                    imp, first, cpu, hit = warm(name, n, grad)
                    label = f"{name} {n}{' +grad' if grad else ''}"
                    print(f"{label:<16}{imp:>10.2f}{first:>21.3f}{cpu:>8.3f}  {hit}", flush=True)
        return 0
    settings = {} if args.cache else {"cache": False}
    if args.one:
        name, n = args.one.split(",")
        measure(chain(2), args.device, settings)  # imports and first-use set-up, paid by no figure
        print(json.dumps(measure(PROGRAMS[name](int(n)), args.device, settings, args.repeat, args.traced)))
        return 0
    print(f"{'program':<16}{'interp s':>10}{'compile+call s':>16}{'ratio':>8}{'cpu s':>8}"
          f"{'interp cpu s':>14}{'cpu ratio':>11}{'traced MiB':>12}{'max RSS MiB':>13}")
    for name in args.only.split(","):
        for n in (int(s) for s in args.sizes.split(",")):
            r = _own_process(name, n, args)
            traced = f"{r['traced_mib']:>12.1f}" if "traced_mib" in r else f"{'-':>12}"
            print(f"{name + ' ' + str(n):<16}{r['interp']:>10.2f}{r['first']:>16.2f}"
                  f"{r['first'] / r['interp']:>8.1f}{r['cpu']:>8.2f}{r['interp_cpu']:>14.2f}"
                  f"{r['cpu'] / r['interp_cpu']:>11.1f}{traced}{r['rss_mib']:>13.0f}", flush=True)
    return 0


def _own_process(name: str, n: int, args: argparse.Namespace) -> dict:
    """``measure`` of one program in a new process (its peak resident set its own)."""
    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "bench.compile_time", "--one", f"{name},{n}", "--device", args.device,
           "--repeat", str(args.repeat)] + ["--cache"] * args.cache + ["--traced"] * args.traced
    env = {**os.environ, "PYTHONPATH": str(root)}
    r = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{name} {n} failed:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())
