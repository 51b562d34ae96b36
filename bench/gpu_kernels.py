"""Kernel time of Tile's tiled contractions on an OpenCL GPU against PyTorch (fp32, TF32 off).

``python -m bench.gpu_kernels [DEVICE] [--tiles TM,TN,RM,RN,KT]`` compiles matmul 1024/2048/4096
and 3x3 convolutions (8 and 32 x 56x56x64 -> 64, NHWC) from plain Tile source through the device's
own config, checks each answer against PyTorch (float64 for matmul), and times only the contraction
kernel: the HAL kernel run on resident buffers, its OpenCL profiling duration, median of 10.
PyTorch is timed with CUDA events around the op on resident tensors, median of 10. Exact checks at
sizes that are multiples of no tile (1, 3, primes, 1000) run first. It prints a Markdown table.
bench/test_gpu.py measures whole calls and resident calls with launch overhead; this is the
kernels alone, for the code generator's ratio to cuBLAS / cuDNN.
"""

from __future__ import annotations

import argparse

import numpy as np

import tile
from backends import registry
from backends.driver import compile_bound
from backends.runner import CompiledProgram
from tile.bind import bind
from tile.inputs import input_types

MM = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"
CONV = """function (I[N, X, Y, CI], F[KX, KY, CI, CO]) -> (O) {
  O[n, x, y, co : N, X, Y, CO] = +(I[n, x + i - 1, y + j - 1, ci] * F[i, j, ci, co]);
}"""


def compiled(device: str, src: str, inputs: dict, settings: dict) -> CompiledProgram:
    prog = tile.parse(src)
    return compile_bound(bind(prog, input_types(prog, inputs)), registry.get(device), settings)


def kernel_seconds(device: str, cp: CompiledProgram, inputs: dict, reps: int = 10) -> tuple[float, int]:
    """Median profiled time of the program's largest kernel on resident buffers, and its flops."""
    ex = registry.get(device).executor
    k = max(range(len(cp.infos)), key=lambda i: cp.infos[i].flops)
    info = cp.infos[k]
    bufs = []
    for name in info.buffers:
        shape = cp.buffers[name]
        b = ex.allocate(int(np.prod(shape.sizes)) * np.dtype(shape.dtype.numpy).itemsize)
        if name in inputs:
            b.unmap(np.ascontiguousarray(inputs[name]).view(np.uint8).reshape(-1)).wait()
        bufs.append(b)
    cp.kernels[k].run(bufs).wait()
    with ex.profiled():  # (OpenCL events report their duration only when profiled)
        times = [e.duration for e in [cp.kernels[k].run(bufs) for _ in range(reps)]]
    return float(np.median(times)), info.flops


def torch_cuda():
    """PyTorch with CUDA and TF32 off (fp32 products really in fp32), or None without them."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def torch_seconds(fn, reps: int = 10) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    event = torch.cuda.Event
    marks = [(event(enable_timing=True), event(enable_timing=True)) for _ in range(reps)]
    for start, end in marks:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return float(np.median([s.elapsed_time(e) for s, e in marks])) * 1e-3


def nchw(x, w):
    import torch

    xt = torch.from_numpy(x).cuda().permute(0, 3, 1, 2).contiguous()
    wt = torch.from_numpy(w).cuda().permute(3, 2, 0, 1).contiguous()
    return xt, wt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("device", nargs="?", default="opencl_gpu.0")
    args = ap.parse_args()
    dev = args.device
    settings: dict = {}  # the tiles are the gemm_tile pass's (its config params, or tuning's choices)
    torch = torch_cuda()
    if torch is None:
        raise SystemExit("this comparison needs PyTorch with CUDA")
    rng = np.random.default_rng(0)
    for m, k, n in [(1, 1, 1), (3, 1000, 7), (127, 129, 131), (1000, 3, 997)]:
        a, b = rng.integers(-4, 5, (m, k)).astype(np.float32), rng.integers(-4, 5, (k, n)).astype(np.float32)
        got = compiled(dev, MM, {"A": a, "B": b}, settings)({"A": a, "B": b})["C"]
        assert np.array_equal(got, a @ b), (m, k, n)
    rows = []
    for n in (1024, 2048, 4096):
        a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
        cp = compiled(dev, MM, {"A": a, "B": b}, settings)
        ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
        want = (ta.double() @ tb.double()).cpu().numpy()
        # fp32 sums of n products: error bound k*eps*n*max|x|, here with max|row . col| as the scale
        assert np.max(np.abs(cp({"A": a, "B": b})["C"] - want)) <= 4 * 2**-23 * n * np.max(np.abs(want))
        t, flops = kernel_seconds(dev, cp, {"A": a, "B": b})
        rows.append((f"matmul {n}", flops / t, flops / torch_seconds(lambda: ta @ tb)))  # noqa: B023
    for batch in (8, 32):
        x = rng.standard_normal((batch, 56, 56, 64), dtype=np.float32)
        w = rng.standard_normal((3, 3, 64, 64), dtype=np.float32)
        cp = compiled(dev, CONV, {"I": x, "F": w}, settings)
        xt, wt = nchw(x, w)
        want = torch.nn.functional.conv2d(xt.double(), wt.double(), padding=1)
        want = want.permute(0, 2, 3, 1).cpu().numpy()
        assert np.max(np.abs(cp({"I": x, "F": w})["O"] - want)) <= 4 * 2**-23 * 576 * np.max(np.abs(want))
        t, flops = kernel_seconds(dev, cp, {"I": x, "F": w})
        last = torch.channels_last
        cl_ = (xt.contiguous(memory_format=last), wt.contiguous(memory_format=last))
        ref = min(
            torch_seconds(lambda: torch.nn.functional.conv2d(xt, wt, padding=1)),  # noqa: B023
            torch_seconds(lambda: torch.nn.functional.conv2d(*cl_, padding=1)),  # noqa: B023
        )
        rows.append((f"conv3x3 {batch}x56x56x64->64", flops / t, flops / ref))
    print("| case | Tile TFLOP/s | PyTorch TFLOP/s | Tile / PyTorch |\n|---|---:|---:|---:|")
    for name, ours, theirs in rows:
        print(f"| {name} | {ours / 1e12:.1f} | {theirs / 1e12:.1f} | {ours / theirs:.0%} |")


if __name__ == "__main__":
    main()
