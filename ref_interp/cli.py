"""``python -m ref_interp run F.tile [--inputs IN.npz] [--shape I=2x3] [--seed S]
[--precision native|float64|exact] [--output OUT.npz] [--max-points N]``."""

from __future__ import annotations

import argparse
import sys
import warnings

import numpy as np

from ref_interp.numerics import PRECISIONS
from ref_interp.run import run
from tile.errors import TileError, TileInputError, TilePrecisionWarning
from tile.inputs import add_input_arguments, describe, gather_inputs, load_npz
from tile.parser import parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ref_interp", description="The exact Tile reference interpreter."
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="evaluate a .tile program")
    r.add_argument("file", help="the .tile program")
    add_input_arguments(r)
    r.add_argument("--precision", choices=PRECISIONS, default="native")
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        print(f"error: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 2
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TilePrecisionWarning)
            program = parse(text, args.file)
            given = load_npz(args.inputs) if args.inputs else {}
            inputs = gather_inputs(program, given, args.shape, args.seed)
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
