"""Kernel time of Tile's reductions on an OpenCL GPU against PyTorch (fp32), as bandwidth.

``python -m bench.gpu_reductions [DEVICE] [--config NAME_OR_FILE] [--kernels] [--local-size N]``
compiles each case from plain Tile source with the device's config (or ``--config``), checks the
answer against numpy (small-integer inputs: sums are exact in any order; softmax and layernorm
within a few ulps times the row length), and times one call on resident tensors (``tile.tensor``,
``out=``) by the device's own profiling events: the sum of every kernel of the call
(initialisation of partials included), median of 30 calls. PyTorch is timed with CUDA events
around the op on resident tensors, median of 50. Bandwidth counts the bytes a perfect kernel
moves: each input read once, each output written once. ``--kernels`` prints each kernel's median
time; ``--local-size`` sets the work-group size of the kernels that leave it to the backend (the
``local_size`` setting). It prints a Markdown table.
bench/test_gpu.py times whole calls; this is the kernels alone.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import tile
from bench.gpu_kernels import torch_seconds

N = int(os.environ.get("TILE_BENCH_N", 4096))
SOFTMAX = """function (X[M, N]) -> (Y) {
  Mx[i, 0: M, 1] = >(X[i, j]);
  E = exp(X - Mx);
  S[i, 0: M, 1] = +(E[i, j]);
  Y = E / S;
}"""
LAYERNORM = """function (X[M, N], G[N], Bt[N]) -> (Y) {
  S[i, 0: M, 1] = +(X[i, j]);
  Mu = S / N;
  D = X - Mu;
  V[i, 0: M, 1] = +(D[i, j] * D[i, j]);
  Y = D / sqrt(V / N + 0.00001) * G + Bt;
}"""
CASES = (
    # name, source, input shape, numpy answer, torch op
    (f"sum {N * N} (1-D)", "function (X[N]) -> (S) { S[] = +(X[i]); }", (N * N,),
     lambda x: x.sum(dtype=np.float64), lambda t: t.sum()),
    (f"sum {N}x{N}", "function (X[M, N]) -> (S) { S[] = +(X[i, j]); }", (N, N),
     lambda x: x.sum(dtype=np.float64), lambda t: t.sum()),
    (f"max {N}x{N}", "function (X[M, N]) -> (S) { S[] = >(X[i, j]); }", (N, N),
     lambda x: x.max(), lambda t: t.max()),
    (f"min {N}x{N}", "function (X[M, N]) -> (S) { S[] = <(X[i, j]); }", (N, N),
     lambda x: x.min(), lambda t: t.min()),
    (f"row sums {N}x{N}", "function (X[M, N]) -> (S) { S[i: M] = +(X[i, j]); }", (N, N),
     lambda x: x.sum(axis=1), lambda t: t.sum(dim=1)),
    (f"column sums {N}x{N}", "function (X[M, N]) -> (S) { S[j: N] = +(X[i, j]); }", (N, N),
     lambda x: x.sum(axis=0), lambda t: t.sum(dim=0)),
    (f"row max {N}x{N}", "function (X[M, N]) -> (S) { S[i: M] = >(X[i, j]); }", (N, N),
     lambda x: x.max(axis=1), lambda t: t.amax(dim=1)),
    (f"rows over their sums {N}x{N}",
     "function (X[M, N]) -> (Y) { S[i, 0: M, 1] = +(X[i, j]); Y = X / S; }", (N, N),
     lambda x: x / x.sum(axis=1, keepdims=True), lambda t: t / t.sum(dim=1, keepdim=True)),
    (f"exp of the max {N}x{N}", "function (X[M, N]) -> (Y) { Mx[] = >(X[i, j]); Y = exp(Mx); }", (N, N),
     lambda x: np.exp(x.max()), lambda t: t.max().exp()),
    (f"softmax rows {N}x{N}", SOFTMAX, (N, N), lambda x: _softmax(x), lambda t: t.softmax(dim=1)),
    ("softmax rows 256x65536", SOFTMAX, (256, 65536), lambda x: _softmax(x), lambda t: t.softmax(dim=1)),
    # the longest rows a row program takes (row_fusion's max_row), at 8 rows per H100 unit
    ("softmax rows 1024x16384", SOFTMAX, (1024, 16384), lambda x: _softmax(x), lambda t: t.softmax(dim=1)),
    # several inputs: the shapes by name, and the answers of the inputs by name (issue 24's case)
    ("layernorm 8192x1024", LAYERNORM, {"X": (8192, 1024), "G": (1024,), "Bt": (1024,)},
     lambda d: _layernorm(d["X"], d["G"], d["Bt"]),
     lambda d: _torch_layernorm(d)),
)


def _layernorm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    d = x.astype(np.float64) - x.mean(axis=1, keepdims=True, dtype=np.float64)
    return d / np.sqrt((d * d).mean(axis=1, keepdims=True) + 1e-5) * g + b


def _torch_layernorm(d):
    import torch.nn.functional as F

    return F.layer_norm(d["X"], d["X"].shape[1:], d["G"], d["Bt"], 1e-5)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def check(name: str, got: np.ndarray, want: np.ndarray) -> None:
    if name.startswith(("softmax", "exp", "layernorm")):
        # each output: an exp (a square root), sums of n terms (relative error <= n eps), a division
        n = got.shape[-1] if got.ndim else 1
        ok = np.max(np.abs(got - want)) <= 8 * 2**-23 * n * np.max(np.abs(want))
    else:
        ok = np.array_equal(got, np.asarray(want, np.float32))
    assert ok, f"{name}: wrong answer"


def tile_seconds(exe, inputs: dict, out: dict, reps: int = 30) -> tuple[float, list[tuple[str, float]]]:
    """Median over calls of the summed kernel times, and each kernel's median time."""
    exe(inputs, out=out)
    runs = []
    for _ in range(reps):
        exe(inputs, out=out)
        runs.append(exe.profile())
    total = float(np.median([sum(s for _, s in r) for r in runs]))
    kernels = [(name, float(np.median([r[k][1] for r in runs]))) for k, (name, _) in enumerate(runs[0])]
    return total, kernels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("device", nargs="?", default="opencl_gpu.0")
    ap.add_argument("--config", help="optimize with this config (a built-in name or a JSON file)")
    ap.add_argument("--kernels", action="store_true", help="print each kernel's time")
    ap.add_argument("--only", help="run only the cases whose name contains this")
    ap.add_argument("--local-size", type=int, help="work-group size of the general kernels")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        torch = None
    settings = {"config": args.config} if args.config else {}
    if args.local_size:
        settings["local_size"] = args.local_size
    rng = np.random.default_rng(0)
    rows = []
    for name, src, shape, ref, top in CASES:
        if args.only and args.only not in name:
            continue
        shapes = shape if isinstance(shape, dict) else {"X": shape}
        if name.startswith(("softmax", "layernorm")):
            xs = {k: rng.standard_normal(v, dtype=np.float32) for k, v in shapes.items()}
        elif name.startswith("rows over"):
            xs = {k: rng.integers(1, 9, v).astype(np.float32) for k, v in shapes.items()}  # no zero divisor
        else:
            xs = {k: rng.integers(-8, 9, v).astype(np.float32) for k, v in shapes.items()}
        exe = tile.compile(src, device=args.device, settings=settings)
        want = ref(xs) if isinstance(shape, dict) else ref(xs["X"])
        got = exe(xs)
        (oname,) = got
        check(name, got[oname], want)
        ins = {k: tile.tensor(v, device=args.device) for k, v in xs.items()}
        out = {oname: tile.tensor(np.zeros(np.shape(want), np.float32), device=args.device)}
        secs, kernels = tile_seconds(exe, ins, out)
        nbytes = sum(v.nbytes for v in xs.values()) + 4 * np.size(want)
        theirs = None
        if torch is not None and torch.cuda.is_available():
            ts = {k: torch.from_numpy(v).cuda() for k, v in xs.items()}
            arg = ts if isinstance(shape, dict) else ts["X"]
            theirs = torch_seconds(lambda arg=arg, top=top: top(arg), reps=50)
        rows.append((name, nbytes / secs, nbytes / theirs if theirs else None, len(kernels)))
        if args.kernels:
            for k, s in kernels:
                print(f"  {name}: {k} {s * 1e3:.3f} ms")
            print(_row(*rows[-1]), flush=True)  # as it goes: a run cut short keeps its cases
    print("| case | kernels | Tile GB/s | PyTorch GB/s | Tile / PyTorch |\n|---|---:|---:|---:|---:|")
    for row in rows:
        print(_row(*row))


def _row(name: str, ours: float, theirs: float | None, nk: int) -> str:
    ratio = f"{ours / theirs:.2f}" if theirs else "-"
    their = f"{theirs / 1e9:.0f}" if theirs else "-"
    return f"| {name} | {nk} | {ours / 1e9:.0f} | {their} | {ratio} |"


if __name__ == "__main__":
    main()
