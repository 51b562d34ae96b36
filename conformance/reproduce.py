"""``python -m conformance.reproduce DIR [--target ID]``: rerun a failing conformance example.

DIR is a folder the conformance suite wrote (``case.tile``, ``inputs.npz``, ``expected.npz``,
``case.json``). The program runs on the target (default: the one that failed) and its outputs are
compared with ``expected.npz`` under the suite's tolerance. Exit status 0: the target now matches;
1: it still differs (the difference is printed); 2: the folder is unusable or the target unknown.
``--save got.npz`` keeps what the target produced; ``--config F.json`` compiles with that config
(by default the one a ``--config`` run recorded in ``case.json``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from conformance.report import NotAFailure, compare, read_failure, refusal_text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m conformance.reproduce", description=__doc__.split("\n")[0])
    p.add_argument("dir", help="a folder under conformance/failures/")
    p.add_argument(
        "--target",
        help="device id (default: the target that failed; 'interp' allowed; 'stripe:CONFIG@STEP' runs the "
        "program optimized up to that pass step in the Stripe interpreter)",
    )
    p.add_argument(
        "--config",
        metavar="F.json",
        help="compile with this config (default: the config the failure was recorded with, if any)",
    )
    p.add_argument("--save", metavar="OUT.npz", help="write the target's outputs here")
    args = p.parse_args(argv)

    import tile

    folder = Path(args.dir)
    try:
        failure = read_failure(folder)
    except NotAFailure as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    meta, source, inputs, want, tol = failure.meta, failure.source, failure.inputs, failure.want, failure.tol
    target = args.target or meta["target"]
    config = args.config or meta.get("config")
    try:
        if target.startswith("stripe:"):
            from conformance.optimized import StripeTarget

            exe = StripeTarget(source, target, config)
        else:
            exe = tile.compile(source, target, {"config": config} if config else None)
    except (KeyError, tile.TileError) as e:
        print(f"error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    print(
        f"{folder}: family {meta['family']}, recorded on {meta['target']}: {meta['problem'].splitlines()[0]}"
    )
    refusal = meta.get("refusal")  # the interpreter refuses this program: the target must too
    try:
        got = exe(inputs)
    except tile.TileError as e:
        if refusal is not None and refusal == refusal_text(e):
            print(f"{target} refuses it with the interpreter's error")
            return 0
        print(f"{target} raised {type(e).__name__}: {e}")
        return 1
    except Exception as e:  # the target crashing is what the folder may be about
        print(f"{target} raised {type(e).__name__}: {e}")
        return 1
    if refusal is not None:
        print(f"{target} answered where the interpreter refuses it ({refusal.splitlines()[0]})")
        return 1
    if args.save:
        np.savez(args.save, **got)
    problem = compare(want, got, tol)
    if problem is None:
        print(f"{target} matches expected.npz")
        return 0
    print(f"{target} differs from expected.npz: {problem}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
