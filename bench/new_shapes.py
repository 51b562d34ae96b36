"""``python -m bench.new_shapes [--lengths 8:512:8] [--profile]``: what a ``tile.torch`` op pays for
each new shape (issue 40's two bridge goals), on ``llvm_cpu.0``.

* **Cold**: one op (``bench.compile_time.ATTENTION``: softmax(Q K^T + R) V, R a relative bias, head
  size 8) called at every sequence length of ``--lengths`` (64 of them by default) in a new process
  with an empty ``TILE_CACHE_DIR``: forward only, and forward then backward (a process each). The
  op runs once at length 3 first (imports, the thread pool's runtime: one-time, not per shape).
  Goal: the 64 lengths in <= 5 s in all. Every length's result (and gradients) are checked against
  PyTorch's, outside the timed part.
* **Warm**: the op at a new length whose program an earlier process built into the disk cache
  (``bench.compile_time.torch_case``: the second of two processes), forward + backward. Goal <= 50 ms.
* ``--profile``: the cold forward + backward over the first ``--profile-lengths`` lengths under
  cProfile, the cumulative seconds of each stage (``STAGES``) and the top functions.
* ``--generic``: the cold runs again with the op made ``dynamic=True`` (shape-generic kernels,
  ``backends.llvm.generic``, products as generic micro-kernels, ``generic_tiles``), and with
  ``generic_products`` and ``tiled=False`` besides ("products": contractions as plain loops).
* ``--only generations``: code generations per kernel of the attention over ``--gen-lengths`` (one
  process, each length checked against float64 numpy), specialized and generic.
* ``--only steady``: the op's forward + backward at a known length against PyTorch's, with the
  thread pool's default wait for a late worker and with none (``steady``).
* ``--only speed``: generic kernels' run time against the specialized ones' (best of ``--repeat``
  calls, interleaved) for square matmuls, an elementwise chain, a row reduction and a softmax, and
  the attention with every kernel generic (``dynamic=True``'s setting).

The machine may be shared: the load average is printed, and the process's CPU time besides wall
time. bench/RESULTS.md ("Compile time: new shapes") has figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.compile_time import torch_case

COLD = r"""
import json, sys, time
import torch
import tile.torch as tt
from bench.compile_time import ATTENTION, torch_args, torch_reference
lengths, backward, profile = json.loads(sys.argv[1]), sys.argv[2] == "bwd", sys.argv[3] == "profile"
mode = sys.argv[5]  # -, generic, or products (generic_products with tiled=False)
op = tt.op(ATTENTION, dynamic=mode != "-",
           settings={"generic_products": True, "tiled": False} if mode == "products" else None)

def call(n):
    args = torch_args("attention", n)
    y = op(*args)
    if backward:
        y.sum().backward()
    return args, y

call(3)  # imports, first-use set-up
if profile:
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
per, cpu0, wall0 = [], time.process_time(), time.perf_counter()
results = []
for n in lengths:
    t = time.perf_counter()
    results.append(call(n))
    per.append(time.perf_counter() - t)
wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
if profile:
    prof.disable()
    prof.dump_stats(sys.argv[4])
for n, (args, y) in zip(lengths, results):  # checked after the clock stopped
    q, k, r, v = (a.detach() for a in args)
    want = torch.softmax(q @ k.T + r, dim=1) @ v
    tol = 4 * (n + 8) * torch.finfo(torch.float32).eps * float(want.abs().max())
    torch.testing.assert_close(y.detach(), want, rtol=0, atol=tol)
    if backward:
        for a, w in zip(args, torch_reference("attention", n)):
            tol = 4 * (n + 8) * torch.finfo(torch.float32).eps * float(w.abs().max())
            torch.testing.assert_close(a.grad, w, rtol=0, atol=tol)
print(json.dumps({"wall": wall, "cpu": cpu, "per": per}))
"""

# (label, file name ending, function name): cumulative seconds of each under cProfile
STAGES = [
    ("tile.compile + prepare (all)", "tile/api.py", "_compiled_for"),
    ("  bind", "backends/driver.py", "bind_inputs"),
    ("  lower", "stripe/lower.py", "lower"),
    ("  optimize (Stripe passes)", "backends/driver.py", "optimized"),
    ("    gemm_tile", "stripe/passes/gemm_tile.py", "gemm_tile"),
    ("  name kernels", "backends/driver.py", "kernels"),
    ("  LLVM: plan", "backends/llvm/device.py", "_plan"),
    ("  LLVM: IR generation", "backends/llvm/codegen.py", "generate"),
    ("  LLVM: parse IR", "llvmlite/binding/module.py", "parse_assembly"),
    ("  LLVM: passes", "llvmlite/binding/newpassmanagers.py", "run"),
    ("  LLVM: machine code", "llvmlite/binding/executionengine.py", "finalize_object"),
    ("  program cache store", "backends/progcache.py", "store"),
    ("autodiff (gradient derivation)", "tile/bridge.py", "_derive"),
    ("output types (bind)", "tile/bridge.py", "out_types"),
]


def lengths_of(spec: str) -> list[int]:
    """``a:b:s`` (``range(a, b + 1, s)``) or a comma list."""
    if ":" in spec:
        a, b, s = (int(x) for x in spec.split(":"))
        return list(range(a, b + 1, s))
    return [int(x) for x in spec.split(",")]


def cold(lengths: list[int], backward: bool, profile: str | None = None, generic: str = "-") -> dict:
    """The cold run in a new process with an empty disk cache: wall and CPU seconds over all
    ``lengths``, and each length's wall seconds."""
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TILE_CACHE_DIR": cache, "PYTHONPATH": str(root)}
        args = [json.dumps(lengths), "bwd" if backward else "fwd", "profile" if profile else "-",
                profile or "-", generic]
        r = subprocess.run([sys.executable, "-c", COLD, *args], env=env, cwd=root, capture_output=True,
                           text=True)
    if r.returncode:
        raise RuntimeError(f"the cold run failed:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def stage_table(stats_path: str, n: int) -> str:
    """Per-stage cumulative seconds (per length) from a cProfile dump of ``n`` lengths."""
    import pstats

    st = pstats.Stats(stats_path)
    total = sum(v[2] for v in st.stats.values())  # tottime over all functions
    lines = [f"{'stage':<34}{'s':>8}{'ms/length':>11}"]
    for label, path, fn in STAGES:
        cum = sum(v[3] for (f, _, name), v in st.stats.items()
                  if name == fn and f.replace(os.sep, "/").endswith(path))
        lines.append(f"{label:<34}{cum:>8.2f}{cum / n * 1e3:>11.1f}")
    lines.append(f"{'(profiled total)':<34}{total:>8.2f}{total / n * 1e3:>11.1f}")
    return "\n".join(lines)


STEADY = r"""
import json, os, statistics, sys, time
import torch
import tile.torch as tt
from bench.compile_time import ATTENTION, torch_args
lengths, reps = json.loads(sys.argv[1]), int(sys.argv[2])
op = tt.op(ATTENTION, dynamic=True)

def tile_call(args):
    op(*args).sum().backward()

def torch_call(args):
    q, k, r, v = args
    (torch.softmax(q @ k.T + r, dim=1) @ v).sum().backward()

out = {}
for n in lengths:
    args = torch_args("attention", n)
    times = {"tile": [], "torch": []}
    for f in (tile_call, torch_call):
        f(args)
    for _ in range(reps):  # interleaved
        for name, f in (("tile", tile_call), ("torch", torch_call)):
            t = time.perf_counter()
            f(args)
            times[name].append(time.perf_counter() - t)
    out[n] = {k: statistics.median(v) for k, v in times.items()}
print(json.dumps(out))
"""


def steady(lengths: list[int], reps: int) -> str:
    """The op's forward + backward at a known length (no compile), against PyTorch's eager ops on
    the same tensors, median of ``reps`` interleaved calls: with the pool's default wait for late
    workers and with none (``TILE_THREAD_STEAL_US`` huge: a worker's chunks wait for it), each in a
    new process, PyTorch on its default threads (one per core, as Tile's pool)."""
    root = Path(__file__).resolve().parent.parent
    lines = [f"{'length':<8}{'late workers':<22}{'tile ms':>9}{'torch ms':>10}{'ratio':>7}"]
    for label, env in (("run by the caller", {}), ("waited for", {"TILE_THREAD_STEAL_US": str(10**9)})):
        with tempfile.TemporaryDirectory() as cache:
            full = {**os.environ, "TILE_CACHE_DIR": cache, "PYTHONPATH": str(root), **env}
            if not env:
                full.pop("TILE_THREAD_STEAL_US", None)
            r = subprocess.run([sys.executable, "-c", STEADY, json.dumps(lengths), str(max(5, reps))],
                               env=full, cwd=root, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"the steady run failed:\n{r.stderr[-4000:]}")
        for n, t in json.loads(r.stdout.strip().splitlines()[-1]).items():
            lines.append(f"{n:<8}{label:<22}{t['tile'] * 1e3:>9.2f}{t['torch'] * 1e3:>10.2f}"
                         f"{t['tile'] / t['torch']:>7.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.new_shapes", description=__doc__.split("\n")[0])
    p.add_argument("--lengths", default="8:512:8", help="a:b:step or a comma list (default: 64 lengths)")
    p.add_argument("--warm-sizes", default="7,64", help="the warm case's new lengths")
    p.add_argument("--only", default="cold,warm", help="cold, warm, generations, speed, steady")
    p.add_argument("--profile", action="store_true", help="profile a cold forward + backward instead")
    p.add_argument("--profile-lengths", type=int, default=8, help="how many of --lengths to profile")
    p.add_argument("--profile-kind", default="-", help="the profiled mode: - (specialized) or generic")
    p.add_argument("--generic", action="store_true", help="cold runs with dynamic=True as well")
    p.add_argument("--kinds", default="-,generic,products",
                   help="with --generic: which cold modes (-: specialized, generic, products: plain loops)")
    p.add_argument("--modes", default="fwd,fwd+bwd", help="cold: fwd, fwd+bwd or both")
    p.add_argument("--gen-lengths", default="1:64:1,96:4096:*1.25", help="generations: lengths")
    p.add_argument("--steady-lengths", default="96,304,512", help="steady: lengths")
    p.add_argument("--repeat", type=int, default=200, help="speed: calls timed per kernel and mode")
    args = p.parse_args(argv)
    lengths = lengths_of(args.lengths)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    if args.profile:
        part = lengths[: args.profile_lengths]
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "cold.prof")
            r = cold(part, True, path, generic=args.profile_kind)
            print(f"{len(part)} lengths {part[0]}..{part[-1]}, forward + backward: {r['wall']:.2f} s wall "
                  f"(profiled), {r['cpu']:.2f} s CPU")
            print(stage_table(path, len(part)))
        return 0
    if "cold" in args.only:
        print(f"cold: {len(lengths)} lengths {lengths[0]}..{lengths[-1]}, one process, empty cache")
        print(f"{'mode':<16}{'total s':>9}{'cpu s':>8}{'ms/length':>11}{'median ms':>11}{'max ms':>9}"
              "  goal 5 s")
        kinds = tuple(args.kinds.split(",")) if args.generic else ("-",)
        directions = [b for b in (False, True) if ("fwd+bwd" if b else "fwd") in args.modes.split(",")]
        for backward, gen in [(b, g) for g in kinds for b in directions]:
            r = cold(lengths, backward, generic=gen)
            per = sorted(r["per"])
            mode = ("fwd+bwd" if backward else "fwd") + ("" if gen == "-" else f" {gen}")
            print(f"{mode:<16}{r['wall']:>9.2f}{r['cpu']:>8.2f}{r['wall'] / len(per) * 1e3:>11.1f}"
                  f"{per[len(per) // 2] * 1e3:>11.1f}{per[-1] * 1e3:>9.1f}  "
                  f"{'met' if r['wall'] <= 5 else 'not met'}", flush=True)
    if "generations" in args.only:
        from bench.generic_shapes import gen_lengths, generations

        print(generations(gen_lengths(args.gen_lengths)), flush=True)
    if "speed" in args.only:
        from bench.generic_shapes import attention_speed, product_speed, speed

        print(product_speed(args.repeat), flush=True)
        print(speed(args.repeat), flush=True)
        print(attention_speed(max(10, args.repeat // 4)), flush=True)
    if "steady" in args.only:
        print(steady(lengths_of(args.steady_lengths), args.repeat // 10), flush=True)
    if "warm" in args.only:
        print("warm: a new process, the disk cache filled by an earlier one; goal 50 ms fwd+bwd")
        print(f"{'length':<10}{'fwd ms':>9}{'bwd ms':>9}{'fwd+bwd ms':>12}{'cpu ms':>9}")
        for n in lengths_of(args.warm_sizes):
            _, (wf, wb, cf, cb) = torch_case("attention", n)
            print(f"{n:<10}{wf * 1e3:>9.1f}{wb * 1e3:>9.1f}{(wf + wb) * 1e3:>12.1f}{(cf + cb) * 1e3:>9.1f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
