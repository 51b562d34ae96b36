"""``python -m ref_interp run F.tile [--inputs IN.npz] [--shape I=2x3] [--seed S]
[--precision native|float64|exact|tf32|3xtf32] [--output OUT.npz] [--max-points N]``.

Made-up inputs are checked before any is made: none may have more elements than the index-space
limit (``--max-points``), and together they must fit this machine's memory. Output to a closed
pipe (``| head``) ends quietly, and so does Ctrl-C (exit status 130)."""

from __future__ import annotations

import argparse
import sys
import warnings

import numpy as np

from ref_interp.contraction import max_points_default
from ref_interp.numerics import PRECISIONS
from ref_interp.run import run
from tile.errors import TileError, TileInputError, TilePrecisionWarning
from tile.inputs import (
    PRECISION_HELP,
    Limits,
    add_input_arguments,
    check_writable,
    describe,
    gather_inputs,
    interrupted,
    load_npz,
    quiet_broken_pipe,
    random_array,
)
from tile.parser import parse, read_source


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ref_interp", description="The exact Tile reference interpreter."
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="evaluate a .tile program, or a .stripe program")
    r.add_argument("file", help="the .tile (or .stripe) program")
    add_input_arguments(r)
    r.add_argument("--precision", choices=PRECISIONS, default="native", help=PRECISION_HELP)
    r.add_argument("--output", help="write every output to this .npz archive")
    r.add_argument(
        "--stage",
        choices=("tile", "reduced", "defracted", "flat"),
        default="tile",
        help="evaluate the contractions after this transform (same answer by definition)",
    )
    r.add_argument(
        "--max-points",
        type=int,
        default=None,
        help="largest contraction index space to enumerate (default 1e9)",
    )
    return p


def _run_stripe(text: str, args, given: dict) -> tuple[dict, dict]:
    """A Stripe program: its inputs' sizes are in the program, so missing ones are made up."""
    from ref_interp.stripe_exec import run_stripe, stripe_input_names
    from stripe.parser import parse_stripe
    from stripe.verify import verify

    block = parse_stripe(text, args.file)
    verify(block)
    rng = np.random.default_rng(args.seed)
    inputs = dict(given)
    planned = {n: (tuple(sizes), dtype) for n, sizes, dtype in stripe_input_names(block) if n not in inputs}
    limit = _limits(args).elements
    for name, (sizes, _dtype) in planned.items():
        if limit is not None and int(np.prod(sizes, dtype=object)) > limit[0]:
            raise TileInputError(
                f"input '{name}' would have {int(np.prod(sizes, dtype=object))} elements, more than "
                f"{limit[1]} of {limit[0]}",
                None,
                "use smaller sizes in the program, or raise --max-points",
            )
    for name, (sizes, dtype) in planned.items():
        inputs[name] = random_array(sizes, dtype, rng)
    return inputs, run_stripe(block, inputs, args.precision, max_points=args.max_points)


def _limits(args) -> Limits:
    limit = args.max_points if args.max_points is not None else max_points_default()
    return Limits(elements=(limit, "the interpreter's index-space limit (--max-points)"))


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        return quiet_broken_pipe()
    except KeyboardInterrupt:
        return interrupted()


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        text = read_source(args.file)
    except OSError as e:
        print(f"error: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 2
    except TileError as e:  # not UTF-8
        print(e, file=sys.stderr)
        return 1
    try:
        check_writable(args.output)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TilePrecisionWarning)
            given = load_npz(args.inputs) if args.inputs else {}
            if args.file.endswith(".stripe"):
                inputs, outputs = _run_stripe(text, args, given)
            else:
                program = parse(text, args.file)
                inputs = gather_inputs(program, given, args.shape, args.seed, _limits(args))
                outputs = run(program, inputs, args.precision, max_points=args.max_points, stage=args.stage)
    except TileError as e:
        print(e, file=sys.stderr)
        return 1
    for w in caught:
        print(f"note: {w.message}", file=sys.stderr)
    for name, arr in inputs.items():
        if name not in given:
            print(f"input {name}: {arr.dtype}{list(arr.shape)} (made up, seed {args.seed})")
    for name, arr in outputs.items():
        kind = f"exact ({arr.dtype})" if arr.dtype == object else str(arr.dtype)
        print(f"{name}: {kind}{list(arr.shape)}")
        print("  " + describe(arr).replace("\n", "\n  "))
    if args.output:
        saved = {k: (v.astype(np.float64) if v.dtype == object else v) for k, v in outputs.items()}
        if any(v.dtype == object for v in outputs.values()):
            print("note: exact results were rounded to float64 in the npz", file=sys.stderr)
        try:
            np.savez(args.output, **saved)
        except OSError as e:
            print(TileInputError(f"cannot write '{args.output}': {e.strerror}"), file=sys.stderr)
            return 1
    return 0
