"""Reductions before and after the ``split_reduction`` pass on one device: a row sum, a column sum
and a row max of a 4096x4096 matrix, a global sum and a global max over 16M elements, each against numpy in
the same run (numpy's reductions run on one thread whatever the BLAS thread count).

Run: ``python -m bench.split_reduction [--target llvm_cpu.0] [--config F.json] [--rounds 5]``.
"Before" compiles with the same config less its ``split_reduction`` steps (so the code
generators' settings are the same: not strict), "after" with the device's config (or
``--config``). Times are whole calls on an input already on the device (``tile.tensor``;
"after+copy": a numpy input, copied in), outputs returned as numpy, the best of ``--rounds``
after one warm-up call; the answer
is checked against numpy (inputs in [0, 1), so K·eps relative for a K-long sum).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

import tile
from bench.cases import best_of

N = 4096
ROW = "function (A[M, N]) -> (O) { O[i: M] = +(A[i, j]); }"
COLUMN = "function (A[M, N]) -> (O) { O[j: N] = +(A[i, j]); }"
CASES = {
    "row sum 4096x4096": (ROW, (N, N), lambda a: a.sum(1)),
    "column sum 4096x4096": (COLUMN, (N, N), lambda a: a.sum(0)),
    "row max 4096x4096": (ROW.replace("+(", ">("), (N, N), lambda a: a.max(1)),
    "global sum 16M": ("function (A[N]) -> (O) { O[] = +(A[i]); }", (N * N,), lambda a: a.sum()),
    "global max 16M": ("function (A[N]) -> (O) { O[] = >(A[i]); }", (N * N,), lambda a: a.max()),
}


def best(fn, rounds: int) -> float:
    """The fastest of ``rounds`` runs of ``fn``, after one warm-up run."""
    fn()
    return best_of(fn, budget_s=0.0, least=rounds, most=rounds)


def _without_split(config: str | None, target: str) -> str:
    """A temporary copy of the config (a file, or the target's built-in one) with no split steps."""
    from backends import registry
    from stripe.config import TARGETS, format_config, load_config

    path = Path(config) if config else TARGETS / f"{registry.get(target).optimizer}.json"
    if not path.exists():  # a built-in name such as llvm_cpu_tiled
        path = TARGETS / f"{config}.json"
    data = json.loads(format_config(load_config(path)))  # resolved: a delta's steps written out too
    data["passes"] = [p for p in data["passes"] if p["pass"] != "split_reduction"]
    out = Path(tempfile.mkdtemp()) / "without_split.json"
    out.write_text(json.dumps(data))
    return str(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="llvm_cpu.0")
    ap.add_argument("--config", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    after = {"cache": False, **({"config": args.config} if args.config else {})}
    before = {"cache": False, "config": _without_split(args.config, args.target)}
    print(f"{args.target}; times in ms, the best of {args.rounds}; input resident unless 'copy in'")
    head = ["case", "numpy", "before", "after", "after+copy", "numpy/after", "before/after"]
    print(f"{head[0]:22}" + "".join(f"{h:>13}" for h in head[1:]))
    for name, (src, shape, ref) in CASES.items():
        a = rng.random(shape, dtype=np.float32)
        resident = tile.tensor(a, device=args.target)
        want = ref(a)
        t_np = best(lambda a=a, ref=ref: ref(a), args.rounds)
        times = []
        for settings in (before, after):
            exe = tile.compile(src, args.target, settings)
            got = exe({"A": a})["O"]
            # Positive inputs: a sum of K values in any order is within K·eps of the exact, relatively.
            np.testing.assert_allclose(got, want, rtol=np.finfo(np.float32).eps * (a.size // want.size))
            times.append(best(lambda exe=exe, t=resident: exe({"A": t}), args.rounds))
        t_copy = best(lambda exe=exe, a=a: exe({"A": a}), args.rounds)
        t_before, t_after = times
        cells = [t_np * 1e3, t_before * 1e3, t_after * 1e3, t_copy * 1e3, t_np / t_after, t_before / t_after]
        print(f"{name:22}" + "".join(f"{c:13.2f}" for c in cells))


if __name__ == "__main__":
    main()
