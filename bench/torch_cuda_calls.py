"""``python -m bench.torch_cuda_calls [--device cuda.0] [--cpu-only] [--threads T] [--json F]``:
``tile.torch`` ops against PyTorch's own, in one run (issue 39's table).

CPU rows (always; ``--threads``, default 1, for both Tile and torch): a 1-element add per call
without and with its backward, and ``llvm_cpu.0``'s resident 64x64 float32 matmul against
``torch.mm``; wall time and the process's CPU time (``tile_cpu_us``, ``torch_cpu_us``), the
second steadier on a loaded machine. CUDA rows (unless ``--cpu-only`` or without CUDA):

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
    p.add_argument("--cpu-only", action="store_true", help="only the CPU rows")
    p.add_argument("--threads", type=int, default=1, help="threads for Tile and torch on the CPU")
    args = p.parse_args(argv)
    import torch

    import tile.torch as tt

    rows = cpu_rows(torch, tt, args.threads)
    if args.cpu_only or not torch.cuda.is_available():
        return report(rows, args.json, "cpu")

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    mm = tt.op(MATMUL, name="bench_mm", device=args.device)
    add = tt.op(ADD, name="bench_add", device=args.device)

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
    return report(rows, args.json, torch.cuda.get_device_name())


def per_call_host(tile_fn, torch_fn, calls: int = 2000, rounds: int = 9) -> tuple[float, ...]:
    """Medians over rounds of the time per call on the host (s), of Tile's and torch's, their
    rounds alternating (a load that comes and goes on a shared machine touches both alike): wall
    time, then this process's CPU time (what a loaded machine's waits do not inflate)."""
    for _ in range(200):
        tile_fn()
        torch_fn()
    got: tuple[list, ...] = ([], [], [], [])
    for _ in range(rounds):
        for j, fn in enumerate((tile_fn, torch_fn)):
            start, cpu = time.perf_counter(), time.process_time()
            for _ in range(calls):
                fn()
            got[j].append((time.perf_counter() - start) / calls)
            got[2 + j].append((time.process_time() - cpu) / calls)
    return tuple(statistics.median(g) for g in got)


def cpu_rows(torch, tt, threads: int) -> list[dict]:
    """The CPU rows (module docstring), each checked first."""
    import numpy as np

    import tile

    torch.set_num_threads(threads)
    settings = {"threads": threads}
    add = tt.op(ADD, name="bench_cpu_add", device="llvm_cpu.0", settings=settings)
    x, y = torch.ones(1), torch.full((1,), 2.0)
    xg, yg = torch.ones(1, requires_grad=True), torch.full((1,), 2.0, requires_grad=True)
    assert torch.equal(add(x, y), x + y)

    def tile_fb():
        add(xg, yg).sum().backward()

    def torch_fb():
        (xg + yg).sum().backward()

    for _ in range(10):  # (past the general path's first calls: the lanes' answers checked)
        xg.grad = yg.grad = None
        tile_fb()
        assert torch.equal(xg.grad, torch.ones(1)) and torch.equal(yg.grad, torch.ones(1))
        assert torch.equal(add(x, y), x + y)

    f = tile.compile(MATMUL, device="llvm_cpu.0", settings=settings)
    a = np.random.default_rng(0).integers(-2, 3, (64, 64)).astype(np.float32)
    ta, tb, out = tile.tensor(a), tile.tensor(a), tile.empty((64, 64), np.float32)
    f(A=ta, B=tb, out={"C": out})["C"].wait()
    assert np.array_equal(out.numpy(), a @ a)
    at = torch.from_numpy(a)
    rows = []
    for case, tile_s, torch_s, tile_cpu, torch_cpu, goal in (
        (f"cpu add, 1 element ({threads} thread)", *per_call_host(lambda: add(x, y), lambda: x + y),
         "<= 2x torch's time"),
        (f"cpu add, 1 element, + backward ({threads} thread)", *per_call_host(tile_fb, torch_fb, 500),
         "<= 2x torch's time"),
        (f"llvm_cpu.0 matmul 64, resident ({threads} thread)",
         *per_call_host(lambda: f(A=ta, B=tb, out={"C": out})["C"].wait(), lambda: torch.mm(at, at)),
         "<= 2x torch's time"),
    ):
        r = {"case": case, "tile_us": tile_s * 1e6, "torch_us": torch_s * 1e6, "ratio": torch_s / tile_s,
             "tile_cpu_us": tile_cpu * 1e6, "torch_cpu_us": torch_cpu * 1e6,
             "cpu_ratio": torch_cpu / tile_cpu, "goal": goal}
        rows.append(r)
        print(json.dumps(r), flush=True)
    return rows


def report(rows: list[dict], path: str | None, device: str) -> int:
    print(f"\n{'case':48} {'Tile us':>10} {'torch us':>10} {'ratio':>7}  {'CPU: Tile, torch, ratio':25} goal")
    for r in rows:
        cpu = (f"{r['tile_cpu_us']:.1f}, {r['torch_cpu_us']:.1f}, {r['cpu_ratio']:.2f}"
               if "cpu_ratio" in r else "")
        wall = f"{r['tile_us']:10.1f} {r['torch_us']:10.1f} {r['ratio']:7.2f}"
        print(f"{r['case']:48} {wall}  {cpu:25} {r['goal']}")
    if path:
        with open(path, "w") as f:
            json.dump({"device": device, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
