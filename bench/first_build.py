"""``python -m bench.first_build [--device cuda.0] [--profile N]``: what a process's first matmul costs
on a GPU device (issue 40, "the GPU's first build"): one fresh process, a cold or warm disk cache
(``TILE_CACHE_DIR``), the wall time of import, of the first call of an fp16 4096 matmul through
``tile.torch`` (compile, build, load, launch) and of the second; ``--profile N`` prints the N
functions that took the most cumulative time in the first call (cProfile)."""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default=None, help="Tile device (default: tile.torch's for CUDA tensors)")
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--profile", type=int, default=0, help="print the top N functions of the first call")
    args = p.parse_args(argv)
    start = time.perf_counter()
    import torch

    import tile.torch as tt

    imported = time.perf_counter() - start
    n = args.size
    a = torch.randint(-2, 3, (n, n), device="cuda").half()
    b = torch.randint(-2, 3, (n, n), device="cuda").half()
    torch.cuda.synchronize()
    mm = tt.op("function (A[M, K], B[K, N]) -> (C) { C[m, n: M, N] = +(A[m, k] * B[k, n]); }",
               name="first_build_mm", device=args.device)
    prof = cProfile.Profile() if args.profile else None
    start = time.perf_counter()
    if prof:
        prof.enable()
    c = mm(a, b)
    torch.cuda.synchronize()
    if prof:
        prof.disable()
    first = time.perf_counter() - start
    start = time.perf_counter()
    c = mm(a, b)
    torch.cuda.synchronize()
    second = time.perf_counter() - start
    want = (a.float() @ b.float())
    ok = bool(torch.allclose(c.float(), want, rtol=2 ** -10, atol=0))
    print(json.dumps({"import_s": imported, "first_call_s": first, "second_call_s": second,
                      "size": n, "checked": ok}))
    if prof:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(args.profile)
        print(out.getvalue())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
