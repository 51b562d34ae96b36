"""Fused attention (issue 41) on a GPU against PyTorch's ``scaled_dot_product_attention``, one run.

``python -m bench.attention [DEVICE] [--seqs 1024,4096,16384] [--dims 64,128]
[--dtypes float16,bfloat16] [--json F]`` times the forward of the plain attention program
(``conformance.attention.source``: ``S = Q·K``, row max, ``exp((S - Mx) * c)``, row sum, ``E·V``,
division; causal as constraints on the max and the sums) with ``c = 1/sqrt(D)``, which the GPU
pipeline fuses into one kernel (``stripe.passes.attention``), against PyTorch's flash backend
(``torch.nn.attention.sdpa_kernel``), for fp16 and bf16, head dims 64 and 128, sequence lengths
1k-16k, causal and not. Each case has ``32768 / N`` heads (8 x 4096, 2 x 16384). Tile: best of
``--repeat`` resident calls (wall clock around the call and its ``wait()``); PyTorch: best of as
many around the op and ``torch.cuda.synchronize()``. Both results are compared with a float64
reference computed on the GPU head by head (max absolute error; Tile's float32 result, as the
program gives it, first rounded to the inputs' type as PyTorch's is). Compile time is apart.

It prints a Markdown table: TFLOP/s of each (``4 N² D`` per head, halved when causal), the ratio
PyTorch time / Tile time (issue 41's goal: at least 0.8) and the error ratio Tile / PyTorch (the
goal: at most 2).

``--passes fwd,bwd`` adds the backward: the gradient ``tile.autodiff`` derives for the program
(``conformance.attention.gradient_source``: DQ, DK, DV of ``sum(DO * O)``), which the pipeline
fuses into two kernels (``stripe.passes.attention_backward``), against PyTorch's flash backward
(``torch.autograd.grad`` of the SDPA output, the forward run once before the timing: PyTorch's
backward reads the log-sum-exp its forward saved, Tile's gradient program recomputes the rows'
statistics in its first kernel, so its time includes that pass). TFLOP/s count ``10 N² D`` per
head (2.5 forwards, halved when causal); the error is the largest of DQ, DK, DV's against float64
gradients computed on the GPU head by head, Tile's rounded to the inputs' type as PyTorch's are
(the issue's goal: the backward at least 0.6 of PyTorch's speed).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

import tile
from bench.tensor_cores import best
from conformance.attention import Spec, gradient_source, source


def _reference(q, k, v, causal: bool):
    """Float64 attention on the GPU, one head at a time (S of one head at a time in memory)."""
    import torch

    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64, device=q.device)
    scale = 1 / math.sqrt(q.shape[-1])
    for h in range(q.shape[0]):
        s = (q[h].double() @ k[h].double().T) * scale
        if causal:
            n = s.shape[0]
            s.masked_fill_(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), -math.inf)
        out[h] = torch.softmax(s, dim=-1) @ v[h].double()
    return out


def _dtypes(dtype: str) -> tuple:
    """``dtype``'s torch and numpy types (float32 runs too: PyTorch's SDPA then takes a non-flash
    backend)."""
    import ml_dtypes
    import torch

    return {"float16": (torch.float16, np.float16), "bfloat16": (torch.bfloat16, ml_dtypes.bfloat16),
            "float32": (torch.float32, np.float32)}[dtype]


DTYPES = ("float16", "bfloat16", "float32")


def _tile_inputs(named: dict, dtype: str, device: str) -> dict:
    """PyTorch tensors as Tile tensors on ``device``, in ``dtype``."""
    npdt = _dtypes(dtype)[1]
    return {name: tile.tensor(x.float().cpu().numpy().astype(npdt), device=device)
            for name, x in named.items()}


def case(device: str, n: int, d: int, dtype: str, causal: bool, repeat: int) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads = max(1, 32768 // n)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke test of the bench itself
    spec = Spec(batch=(heads,), rows=n, keys=n, depth=d, width=d, scale=1 / math.sqrt(d),
                mask="constraint" if causal else "none", dtype=dtype)
    tdt = _dtypes(dtype)[0]
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(heads, n, d, device=dev, dtype=tdt, generator=gen) for _ in range(3))
    t0 = time.perf_counter()
    f = tile.compile(source(spec), device=device)
    ins = _tile_inputs({"Q": q, "K": k, "V": v}, dtype, device)
    got = f(**ins, resident=True)["O"]
    got.wait()
    compile_s = time.perf_counter() - t0

    def run_tile():
        f(**ins, resident=True)["O"].wait()

    tile_s = best(run_tile, repeat)
    backends = [SDPBackend.FLASH_ATTENTION] if dev == "cuda" else [SDPBackend.MATH]
    q4, k4, v4 = (x.unsqueeze(0) for x in (q, k, v))  # (batch, heads, n, d): the flash kernel's layout
    with sdpa_kernel(backends):
        def run_torch():
            F.scaled_dot_product_attention(q4, k4, v4, is_causal=causal)
            if dev == "cuda":
                torch.cuda.synchronize()

        torch_s = best(run_torch, repeat)
        theirs = F.scaled_dot_product_attention(q4, k4, v4, is_causal=causal).squeeze(0)
    want = _reference(q, k, v, causal)
    # the program's O is float32 (its float literal promotes, docs/semantics.md §4.1): rounded to
    # the inputs' type, as PyTorch's result is, before it is compared
    ours = torch.from_numpy(np.asarray(got.numpy(), np.float32)).to(dev).to(tdt).double()
    return _row("fwd", dtype, n, d, heads, causal, 4, tile_s, torch_s, compile_s,
                float((ours - want).abs().max()), float((theirs.double() - want).abs().max()))


def _reference_grads(q, k, v, do, causal: bool):
    """Float64 DQ, DK, DV of ``sum(DO * O)`` on the GPU, one head at a time."""
    import torch

    outs = [torch.empty(x.shape, dtype=torch.float64, device=q.device) for x in (q, k, v)]
    scale = 1 / math.sqrt(q.shape[-1])
    for h in range(q.shape[0]):
        qh, kh, vh, doh = (x[h].double() for x in (q, k, v, do))
        s = (qh @ kh.T) * scale
        if causal:
            n = s.shape[0]
            s.masked_fill_(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), -math.inf)
        p = torch.softmax(s, dim=-1)
        del s
        delta = (doh * (p @ vh)).sum(dim=-1, keepdim=True)
        outs[2][h] = p.T @ doh
        ds = p * (doh @ vh.T - delta) * scale
        del p
        outs[0][h] = ds @ kh
        outs[1][h] = ds.T @ qh
    return outs


def backward_case(device: str, n: int, d: int, dtype: str, causal: bool, repeat: int) -> dict:
    """The backward of one case (module docstring), as ``case`` times the forward."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads = max(1, 32768 // n)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    spec = Spec(batch=(heads,), rows=n, keys=n, depth=d, width=d, scale=1 / math.sqrt(d),
                mask="constraint" if causal else "none", dtype=dtype)
    tdt = _dtypes(dtype)[0]
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v, do = (torch.randn(heads, n, d, device=dev, dtype=tdt, generator=gen) for _ in range(4))
    t0 = time.perf_counter()
    f = tile.compile(gradient_source(spec), device=device)
    ins = _tile_inputs({"Q": q, "K": k, "V": v, "DO": do}, dtype, device)
    got = f(**ins, resident=True)
    for t in got.values():
        t.wait()
    compile_s = time.perf_counter() - t0

    def run_tile():
        for t in f(**ins, resident=True).values():
            t.wait()

    tile_s = best(run_tile, repeat)
    backends = [SDPBackend.FLASH_ATTENTION] if dev == "cuda" else [SDPBackend.MATH]
    leaves = [x.unsqueeze(0).detach().requires_grad_() for x in (q, k, v)]
    with sdpa_kernel(backends):
        out = F.scaled_dot_product_attention(*leaves, is_causal=causal)

        def run_torch():
            torch.autograd.grad(out, leaves, do.unsqueeze(0), retain_graph=True)
            if dev == "cuda":
                torch.cuda.synchronize()

        torch_s = best(run_torch, repeat)
        theirs = [g.squeeze(0).double() for g in torch.autograd.grad(out, leaves, do.unsqueeze(0))]
    want = _reference_grads(q, k, v, do, causal)
    ours = [torch.from_numpy(np.asarray(got[name].numpy(), np.float32)).to(dev).to(tdt).double()
            for name in ("DQ", "DK", "DV")]
    return _row("bwd", dtype, n, d, heads, causal, 10, tile_s, torch_s, compile_s,
                max(float((a - b).abs().max()) for a, b in zip(ours, want, strict=True)),
                max(float((a - b).abs().max()) for a, b in zip(theirs, want, strict=True)))


def _row(kind: str, dtype: str, n: int, d: int, heads: int, causal: bool, per: int, tile_s: float,
         torch_s: float, compile_s: float, tile_err: float, torch_err: float) -> dict:
    """One case's record; ``per``: flops per (query, key, head dim) point (4 forward, 10 backward),
    halved under a causal mask."""
    flops = per * n * n * d * heads / (2 if causal else 1)
    return {
        "pass": kind, "dtype": dtype, "n": n, "d": d, "heads": heads, "causal": causal,
        "tile_ms": tile_s * 1e3, "torch_ms": torch_s * 1e3,
        "tile_tflops": flops / tile_s / 1e12, "torch_tflops": flops / torch_s / 1e12,
        "ratio": torch_s / tile_s, "compile_s": compile_s, "tile_err": tile_err, "torch_err": torch_err,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("device", nargs="?", default="cuda.0")
    ap.add_argument("--seqs", default="1024,4096,16384")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--dtypes", default="float16,bfloat16", help=f"comma-separated, of {', '.join(DTYPES)}")
    ap.add_argument("--causal", default="0,1", help="0: full, 1: causal (comma-separated)")
    ap.add_argument("--passes", default="fwd,bwd", help="fwd: the forward, bwd: the gradient")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--budget", type=float, default=float("inf"),
                    help="start no case after this many seconds")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    unknown = set(args.dtypes.split(",")) - set(DTYPES)
    if unknown:
        ap.error(f"--dtypes: {', '.join(sorted(unknown))} is not one of {', '.join(DTYPES)}")
    start = time.perf_counter()
    rows = []
    print("| pass | dtype | N | D | heads | causal | Tile ms | TFLOP/s | PyTorch ms | TFLOP/s | ratio | "
          "Tile err | PyTorch err | err ratio | compile s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    todo = [(ps, dtype, d, n, causal) for ps in args.passes.split(",") for dtype in args.dtypes.split(",")
            for d in map(int, args.dims.split(",")) for n in map(int, args.seqs.split(","))
            for causal in (c == "1" for c in args.causal.split(","))]
    for ps, dtype, d, n, causal in todo:
        if time.perf_counter() - start > args.budget:
            print(f"(budget of {args.budget} s spent: the remaining cases were not run)")
            break
        run = backward_case if ps == "bwd" else case
        try:
            r = run(args.device, n, d, dtype, causal, args.repeat)
        except Exception as e:  # a case that fails is reported, the others still run
            print(f"| {ps} | {dtype} | {n} | {d} | | {causal} | failed: {type(e).__name__}: {e} |")
            continue
        rows.append(r)
        print(f"| {ps} | {dtype} | {n} | {d} | {r['heads']} | {causal} | {r['tile_ms']:.3f} | "
              f"{r['tile_tflops']:.1f} | {r['torch_ms']:.3f} | {r['torch_tflops']:.1f} | "
              f"{r['ratio']:.3f} | {r['tile_err']:.2e} | {r['torch_err']:.2e} | "
              f"{r['tile_err'] / max(r['torch_err'], 1e-30):.2f} | {r['compile_s']:.1f} |",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
