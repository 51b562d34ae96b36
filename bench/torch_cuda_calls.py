"""``python -m bench.torch_cuda_calls [--device cuda.0] [--json F]``: ``tile.torch`` ops on CUDA
tensors against PyTorch's own, in one run (issue 39's table).

Rows: fp16 matmul 64 and a 1-element add, per call (each call synchronized, the median of
rounds); fp16 matmul 4096 and fp32 matmul 256 forward + backward, per call timed on the GPU with
CUDA events over a burst of calls (the device time, warm). TF32 off for torch, ``cudnn.benchmark``
on. Every Tile result is checked against torch's first (integer-valued data, exact; float16
within the sum's rounding). Prints a table and one JSON row per case.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n: M, N] = +(A[m, k] * B[k, n]); }"
ADD = "function (A[N], B[N]) -> (C) { C = A + B; }"


def per_call_synced(fn, torch, calls: int = 200, rounds: int = 5) -> float:
    """Median over rounds of the wall time per call, each call followed by a synchronize (s)."""
    fn()
    torch.cuda.synchronize()
    got = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
            torch.cuda.synchronize()
        got.append((time.perf_counter() - start) / calls)
    return statistics.median(got)


def per_call_device(fn, torch, calls: int = 20, rounds: int = 5) -> float:
    """Median over rounds of the time per call of a burst, CUDA events around it (s)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    got = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        got.append(start.elapsed_time(end) * 1e-3 / calls)
    return statistics.median(got)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default=None, help="Tile device (default: tile.torch's choice, cuda.0)")
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args(argv)
    import torch

    import tile.torch as tt

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    mm = tt.op(MATMUL, name="bench_mm", device=args.device)
    add = tt.op(ADD, name="bench_add", device=args.device)
    rows = []

    def row(case, tile_s, torch_s, goal):
        r = {"case": case, "tile_us": tile_s * 1e6, "torch_us": torch_s * 1e6,
             "ratio": torch_s / tile_s, "goal": goal}
        rows.append(r)
        print(json.dumps(r), flush=True)

    def ints(*shape, dtype):
        return torch.randint(-2, 3, shape, device="cuda").to(dtype)

    a, b = ints(64, 64, dtype=torch.float16), ints(64, 64, dtype=torch.float16)
    assert torch.equal(mm(a, b), a @ b)
    row("fp16 matmul 64, per call", per_call_synced(lambda: mm(a, b), torch),
        per_call_synced(lambda: a @ b, torch), "<= 1.5x torch's time")
    x, y = ints(1, dtype=torch.float32), ints(1, dtype=torch.float32)
    assert torch.equal(add(x, y), x + y)
    row("add, 1 element, per call", per_call_synced(lambda: add(x, y), torch),
        per_call_synced(lambda: x + y, torch), "<= 1.5x torch's time")
    a, b = ints(4096, 4096, dtype=torch.float16), ints(4096, 4096, dtype=torch.float16)
    got, want = mm(a, b).float(), (a.float() @ b.float())
    assert torch.allclose(got, want, rtol=2 ** -10, atol=0), (got - want).abs().max()
    row("fp16 matmul 4096", per_call_device(lambda: mm(a, b), torch),
        per_call_device(lambda: a @ b, torch), ">= 0.9 of cuBLAS")
    a = ints(256, 256, dtype=torch.float32).requires_grad_()
    b = ints(256, 256, dtype=torch.float32).requires_grad_()
    g = ints(256, 256, dtype=torch.float32)

    def tile_fb():
        a.grad = b.grad = None
        mm(a, b).backward(g)

    def torch_fb():
        a.grad = b.grad = None
        (a @ b).backward(g)

    tile_fb()
    ga, gb = a.grad.clone(), b.grad.clone()
    torch_fb()
    assert torch.equal(ga, a.grad) and torch.equal(gb, b.grad)
    row("fp32 matmul 256 forward + backward", per_call_device(tile_fb, torch),
        per_call_device(torch_fb, torch), ">= 0.7")
    print(f"\n{'case':40} {'Tile us':>10} {'torch us':>10} {'ratio':>7}  goal")
    for r in rows:
        print(f"{r['case']:40} {r['tile_us']:10.1f} {r['torch_us']:10.1f} {r['ratio']:7.2f}  {r['goal']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
