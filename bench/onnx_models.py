"""``python -m bench.onnx_models [--threads 1,2] [--rounds R] [--models mlp,cnn,transformer] [--target ID]``:
three small models exported from PyTorch with ``torch.onnx.export``, run by ``tile.onnx`` on
``llvm_cpu.0`` (or ``--target``) and by onnxruntime's CPU provider at the same thread count (by
PyTorch on CUDA, TF32 off, for a GPU target).

The models (``build``) are also what tests/test_onnx_models.py imports and checks against PyTorch
and onnxruntime: an MLP (three Linear layers, ReLU), a small CNN (Conv, BatchNorm, ReLU, MaxPool,
Conv, global average pool, Linear) and a pre-norm transformer block (LayerNorm, single-head-per-
slice attention over 4 heads with softmax, GELU feed-forward, residuals). ``size="test"`` gives
inputs small enough for the interpreter; ``size="bench"`` the sizes timed here.

Each timing is a whole call with numpy arrays in and out (what ``BackendRep.run`` and
``InferenceSession.run`` both take and give): the median and the minimum of ``--rounds`` calls
after warm-up calls, Tile's and the peer's calls alternating so that both meet the same load (the
ratio is of the minima: on a shared machine other processes only add; ``--block B`` alternates
blocks of B calls a side instead, whose later calls find their own data in the caches);
compilation (Tile) and session creation (onnxruntime) are timed apart. Every timed answer is
checked against PyTorch's before it is reported. Figures: bench/RESULTS.md ("ONNX models").
"""

from __future__ import annotations

import argparse
import io
import math
import statistics
import sys
import time
import warnings

import numpy as np

MODELS = ("mlp", "cnn", "transformer")
SIZES = {
    # name: (test shape, bench shape) of the one input
    "mlp": ((4, 32), (64, 256)),
    "cnn": ((2, 3, 12, 12), (8, 3, 32, 32)),
    "transformer": ((2, 8, 32), (4, 64, 128)),
}


def _modules():
    import torch
    from torch import nn

    class Block(nn.Module):
        """A pre-norm transformer block: x + attention(ln(x)), then + mlp(ln(x))."""

        def __init__(self, d: int, heads: int = 4):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
            self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            h = self.ln1(x)

            def split(y):
                return y.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)

            q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
            att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // self.heads), dim=-1)
            x = x + self.o((att @ v).transpose(1, 2).reshape(b, t, d))
            return x + self.down(nn.functional.gelu(self.up(self.ln2(x))))

    return {
        "mlp": lambda d: nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, 2 * d), nn.ReLU(),
                                       nn.Linear(2 * d, 10)),
        "cnn": lambda c: nn.Sequential(nn.Conv2d(c, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                       nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                                       nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)),
        "transformer": lambda d: Block(d),
    }


# the reduction lengths along each model's longest path, for the tolerance (tests/test_onnx_models.py)
def reduction_length(name: str, shape: tuple[int, ...]) -> int:
    if name == "mlp":
        d = shape[-1]
        return d + 2 * d + 2 * d
    if name == "cnn":
        return 3 * 9 + 16 * 9 + (shape[2] // 2) * (shape[3] // 2) + 32
    d, t = shape[-1], shape[1]
    return d + d + d // 4 + t + t + d + d + 2 * d + 2 * d


def tolerance(name: str, x: np.ndarray, want: np.ndarray, extra: int = 0) -> float:
    """How far two float32 implementations of model ``name`` may differ on input ``x``: twice
    ``u * L * max(1, |want|)`` for the unit roundoff ``u = 2^-24`` and ``L`` the reduction lengths
    along the longest path (``extra`` more, for a gradient's own sums)."""
    length = reduction_length(name, x.shape) + extra
    return 2 * 2.0**-24 * length * max(1.0, float(np.max(np.abs(want))))


def build(name: str, size: str = "test", seed: int = 0):
    """(torch module in eval mode, its input as a float32 array)."""
    import torch

    torch.manual_seed(seed)
    shape = SIZES[name][0 if size == "test" else 1]
    module = _modules()[name](shape[-1] if name != "cnn" else shape[1]).eval()
    for m in module.modules():  # running statistics that are not the identity
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return module, x


def export(module, x: np.ndarray) -> bytes:
    """``module`` as ONNX bytes (the TorchScript exporter: it needs no onnxscript), input "x"."""
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation and tracer warnings
        torch.onnx.export(module, (torch.from_numpy(x),), buf, input_names=["x"], output_names=["y"],
                          dynamo=False, opset_version=18)
    return buf.getvalue()


def torch_output(module, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return module(torch.from_numpy(x)).numpy()


def ort_session(model: bytes, threads: int):
    """An onnxruntime CPU session with ``threads`` intra-op threads, or None without onnxruntime."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def seconds(fn, rounds: int, warmup: int = 3) -> tuple[float, float]:
    """(median, minimum) seconds of ``rounds`` calls of ``fn`` after ``warmup`` calls. On a shared
    machine the minimum is the steadier figure: other processes only ever add time."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def paired_seconds(fa, fb, rounds: int, warmup: int = 3,
                   block: int = 1) -> tuple[tuple[float, float], tuple[float, float]]:
    """``seconds`` of ``fa`` and of ``fb``, their calls alternating: on a shared machine both then
    meet the same load (timed one after the other, a burst of other work can favour either).
    ``block``: calls a side takes in a row before the other's (1: one by one, each call after the
    other side has evicted some of its data; more: the later calls of a block find their own data
    in the caches), each timed; ``rounds`` calls a side in all."""
    for _ in range(warmup):
        fa(), fb()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(-(-rounds // block)):
        for fn, out in ((fa, times[0]), (fb, times[1])):
            for _ in range(block):
                start = time.perf_counter()
                fn()
                out.append(time.perf_counter() - start)
    return tuple((statistics.median(t), min(t)) for t in times)  # type: ignore[return-value]


def torch_cuda_call(module, x: np.ndarray):
    """A whole PyTorch CUDA call as Tile's is timed: numpy in, the model, numpy out (TF32 off),
    or None without a CUDA device."""
    import torch

    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    gpu = module.to("cuda")

    def call():
        with torch.no_grad():
            return gpu(torch.from_numpy(x).to("cuda")).cpu().numpy()

    return call


def measure(name: str, threads: int, rounds: int, target: str = "llvm_cpu.0", block: int = 1) -> dict:
    """One model at one thread count: compile/session seconds, call seconds (median, min), max
    errors; the peer is onnxruntime's CPU provider at ``threads`` for a CPU target, PyTorch CUDA
    for a GPU one; ``block``: calls a side in a row (``paired_seconds``)."""
    import tile.onnx

    module, x = build(name, "bench")
    model, want = export(module, x), torch_output(module, x)
    cpu = target.startswith(("llvm", "opencl_cpu", "interp"))
    start = time.perf_counter()
    rep = tile.onnx.Backend.prepare(model, target, settings={"threads": threads} if cpu else None)
    got = rep.run([x])[0]
    compile_s = time.perf_counter() - start
    row = {"model": name, "input": list(x.shape), "threads": threads, "target": target,
           "tile_compile_s": round(compile_s, 2), "tile_max_err": float(np.max(np.abs(got - want)))}
    if row["tile_max_err"] > tolerance(name, x, want):
        raise AssertionError(f"{name}: Tile's answer is off by {row['tile_max_err']:.3g}")
    if cpu:
        sess = ort_session(model, threads)
        call = None if sess is None else (lambda: sess.run(None, {"x": x})[0])
        row["peer"] = "onnxruntime CPU"
    else:
        call = torch_cuda_call(module, x)
        row["peer"] = "PyTorch CUDA"
    if call is None:
        row["tile_ms"] = [1e3 * t for t in seconds(lambda: rep.run([x]), rounds)]
        return row
    row["peer_max_err"] = float(np.max(np.abs(call() - want)))
    mine, peer = paired_seconds(lambda: rep.run([x]), call, rounds, block=block)
    row["tile_ms"], row["peer_ms"] = [1e3 * t for t in mine], [1e3 * t for t in peer]
    row["ratio"] = row["peer_ms"][1] / row["tile_ms"][1]  # of the minima; > 1: Tile is faster
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--target", default="llvm_cpu.0")
    ap.add_argument("--block", type=int, default=1,
                    help="calls a side takes in a row before the other's (default 1: one by one)")
    args = ap.parse_args(argv)
    print(f"target {args.target}" + (f", blocks of {args.block} calls a side" if args.block > 1 else ""))
    print("| model | input | threads | Tile compile s | Tile ms (median, min) | peer | peer ms (median, min) "
          "| peer / Tile (min) | max err Tile, peer |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            r = measure(name, threads, args.rounds, args.target, args.block)
            peer = f"{r['peer']} | - | -"
            if "peer_ms" in r:
                peer = f"{r['peer']} | {r['peer_ms'][0]:.3f}, {r['peer_ms'][1]:.3f} | {r['ratio']:.2f}"
            errs = f"{r['tile_max_err']:.1e}, {r.get('peer_max_err', float('nan')):.1e}"
            head = f"| {name} | {r['input']} | {threads} | {r['tile_compile_s']} | {r['tile_ms'][0]:.3f}, " \
                   f"{r['tile_ms'][1]:.3f}"
            print(f"{head} | {peer} | {errs} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
