"""Tensor-core GEMMs on an OpenCL GPU against PyTorch (cuBLAS, cuDNN), one run, resident tensors.

``python -m bench.tensor_cores [DEVICE] [--sizes 4096,8192]`` times whole calls (``best of 7``,
wall clock around a resident call and its ``wait()``; PyTorch: best of 11 around the op and
``torch.cuda.synchronize()``, ``cudnn.benchmark`` on, channels-last convolutions) of:

* matmul, float16 inputs (float32 accumulation) against cuBLAS float16;
* matmul, float32 with ``precision="tf32"`` against cuBLAS with TF32 allowed;
* matmul, float32 with ``precision="3xtf32"`` against cuBLAS float32 (TF32 off), with the max
  error of both and of Tile's float32 SIMT kernel against a float64 product of the same data;
* float16 matmul + bias + relu (one kernel) against ``relu(x @ w + b)``;
* float16 3x3 convolutions, NHWC, batch 32, 56x56x64: valid (unpadded) and padded by one.

On an H100/H200 the float16 GEMMs that stream launch through CUDA with tiles from the tensor memory
accelerator (``backends.cuda.launch``); with ``TILE_CUDA_LAUNCH=0`` they run on OpenCL's
warp-group kernel.

It prints a Markdown table; ratio = PyTorch time / Tile time (above 1: Tile faster)."""

from __future__ import annotations

import argparse
import time

import numpy as np

import tile

MATMUL = "function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
MLP = """function (X[B, I], W[I, O], Bias[O]) -> (Y) {
  Z[b, o: B, O] = +(X[b, i] * W[i, o]);
  Y = relu(Z + Bias);
}"""
CONV = """function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {
  O[n, y, x, co: N, H, W, CO] = +(I[n, y + ky - 1, x + kx - 1, ci] * K[ky, kx, ci, co]);
}"""
CONV_VALID = """function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {
  O[n, y, x, co: N, H - 2, W - 2, CO] = +(I[n, y + ky, x + kx, ci] * K[ky, kx, ci, co]);
}"""


def best(fn, k: int = 7) -> float:
    fn()
    ts = []
    for _ in range(k):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


class Case:
    def __init__(self, device: str, src: str, arrays: dict, precision: str | None = None,
                 config: str | None = None):
        settings = ({"precision": precision} if precision else {}) | ({"config": config} if config else {})
        self.f = tile.compile(src, device=device, settings=settings)
        self.inputs = {k: tile.tensor(v, device=device) for k, v in arrays.items()}

    def result(self) -> np.ndarray:
        return next(iter(self.f(**self.inputs, resident=True).values())).numpy()

    def seconds(self, k: int = 7) -> float:
        def go():
            for v in self.f(**self.inputs, resident=True).values():
                v.wait()

        return best(go, k)


def torch_best(fn) -> float:
    import torch

    def go():
        fn()
        torch.cuda.synchronize()

    return best(go, 11)


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("device", nargs="?", default="opencl_gpu.0")
    ap.add_argument("--sizes", default="4096,8192")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    rng = np.random.default_rng(0)
    rows = []

    def row(name, t, tt, note=""):
        rows.append(f"| {name} | {t * 1e3:.3f} | {tt * 1e3:.3f} | {tt / t:.2f} | {note} |")
        print(rows[-1], flush=True)

    for n in (int(s) for s in args.sizes.split(",")):
        fl = 2.0 * n**3
        modes = ((np.float16, None, True), (np.float32, "tf32", True), (np.float32, "3xtf32", False))
        for dt, prec, tf32 in modes:
            a, b = rng.standard_normal((n, n)).astype(dt), rng.standard_normal((n, n)).astype(dt)
            case = Case(args.device, MATMUL, {"A": a, "B": b}, prec)
            t = case.seconds()
            torch.backends.cuda.matmul.allow_tf32 = tf32
            ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
            tt = torch_best(lambda ta=ta, tb=tb: ta @ tb)
            note = f"{fl / t / 1e12:.0f} vs {fl / tt / 1e12:.0f} TFLOP/s"
            if prec in ("tf32", "3xtf32"):  # the operand copies (backends.cuda.kmajor), the product
                times = case.f.profile()
                note += "; kernels " + ", ".join(f"{n.split('_')[2]} {s * 1e6:.0f} us" for n, s in times)
            if prec == "3xtf32":
                exact = a.astype(np.float64) @ b.astype(np.float64)
                simt = Case(args.device, MATMUL, {"A": a, "B": b}).result()
                outs = (case.result(), (ta @ tb).cpu().numpy(), simt)
                errs = [np.max(np.abs(x.astype(np.float64) - exact)) for x in outs]
                note += "; max err 3xtf32 {:.2e}, cuBLAS fp32 {:.2e}, Tile fp32 SIMT {:.2e}".format(*errs)
            peer = {None: "cuBLAS fp16", "tf32": "cuBLAS tf32", "3xtf32": "cuBLAS fp32"}[prec]
            row(f"matmul {n} {prec or 'fp16'} vs {peer}", t, tt, note)
    torch.backends.cuda.matmul.allow_tf32 = False
    n = 4096
    x, w = rng.standard_normal((n, n)).astype(np.float16), rng.standard_normal((n, n)).astype(np.float16)
    bias = rng.standard_normal((n,)).astype(np.float16)
    case = Case(args.device, MLP, {"X": x, "W": w, "Bias": bias})
    t = case.seconds()
    kernels = ", ".join(name for name, _ in case.f.profile())  # the last call's
    tx, tw, tb = (torch.from_numpy(v).cuda() for v in (x, w, bias))
    tt = torch_best(lambda: torch.relu(tx @ tw + tb))
    row("fp16 matmul+bias+relu 4096", t, tt, f"Tile kernels: {kernels}")
    convs = (("valid", CONV_VALID, (32, 58, 58, 64), 0), ("padded", CONV, (32, 56, 56, 64), 1))
    for name, src, shape, pad in convs:
        i = rng.standard_normal(shape).astype(np.float16)
        k = rng.standard_normal((3, 3, 64, 64)).astype(np.float16)
        case = Case(args.device, src, {"I": i, "K": k})
        ti = torch.from_numpy(i).cuda().permute(0, 3, 1, 2)
        tk = torch.from_numpy(k).cuda().permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
        row(f"fp16 conv3x3 {name} NHWC b32 56x56x64 vs cuDNN", case.seconds(),
            torch_best(lambda ti=ti, tk=tk, pad=pad: torch.nn.functional.conv2d(ti, tk, padding=pad)))
    print("\n| case | Tile ms | PyTorch ms | ratio | note |\n|---|---:|---:|---:|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
