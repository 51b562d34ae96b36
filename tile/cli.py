"""``python -m tile <command>``: the language's command line.

* ``check F.tile [--shape I=2x3[:dtype] ...]`` — parse and type-check; print every tensor's
  inferred dtype and shape (symbolic in the input dimensions where no ``--shape`` is given).
* ``grad F.tile [--wrt A,B] [--emit] [--inputs IN.npz] [--shape ...] [--output GRADS.npz]`` —
  ``--emit`` prints the gradient program; otherwise the interpreter computes the gradient of the
  sum of the outputs and prints (and saves) arrays named ``grad_<Input>``.
* ``emit F.tile --stage reduced|defracted|flat [--inputs IN.npz] [--shape ...]`` — print the
  program after a transform (sizes are those of the given or made-up inputs).
"""

from __future__ import annotations

import argparse
import sys

from tile.bind import bind_symbolic
from tile.errors import TileError
from tile.inputs import parse_shape_spec
from tile.parser import parse_file


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tile", description="The Tile tensor language.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="parse and type-check a .tile program, print inferred shapes")
    c.add_argument("file")
    c.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=2x3[:dtype]",
        help="a concrete input shape and dtype (repeatable); others stay symbolic",
    )
    g = sub.add_parser("grad", help="differentiate a .tile program (Tile to Tile)")
    g.add_argument("file")
    g.add_argument(
        "--wrt", help="comma-separated inputs to differentiate with respect to (default: float inputs)"
    )
    g.add_argument("--emit", action="store_true", help="print the gradient program instead of running it")
    g.add_argument("--inputs", help="an .npz archive with one array per input")
    g.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=2x3[:dtype]",
        help="make up a random small-integer input of this shape (repeatable)",
    )
    g.add_argument("--seed", type=int, default=0, help="seed for made-up inputs (default 0)")
    g.add_argument("--precision", choices=("native", "float64", "exact"), default="native")
    g.add_argument("--output", help="write grad_<Input> arrays to this .npz archive")
    e = sub.add_parser("emit", help="print a program after a transform stage")
    e.add_argument("file")
    e.add_argument("--stage", choices=("tile", "reduced", "defracted", "flat"), required=True)
    e.add_argument("--inputs", help="an .npz archive giving the input shapes and dtypes")
    e.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=2x3[:dtype]",
        help="an input shape (repeatable); shapes fix every size the transforms need",
    )
    return p


def cmd_emit(args) -> int:
    import numpy as np

    from tile.bind import bind
    from tile.dtypes import DType
    from tile.inputs import gather_inputs, load_npz
    from tile.transforms import apply_stage
    from tile.transforms.emit import format_stage
    from tile.typed import TensorType

    program = parse_file(args.file)
    given = load_npz(args.inputs) if args.inputs else {}
    arrays = gather_inputs(program, given, args.shape)
    types = {k: TensorType(DType.of(np.asarray(v).dtype), tuple(np.shape(v))) for k, v in arrays.items()}
    print(format_stage(apply_stage(bind(program, types), args.stage)), end="")
    return 0


def cmd_grad(args) -> int:
    from tile.api import grad_values
    from tile.autodiff import gradient
    from tile.inputs import describe, gather_inputs, load_npz
    from tile.printer import format_program

    program = parse_file(args.file)
    wrt = [w.strip() for w in args.wrt.split(",")] if args.wrt else None
    if args.emit:
        dtypes = {}
        shapes = {}
        for spec in args.shape:
            name, shape, dtype = parse_shape_spec(spec)
            shapes[name], dtypes[name] = shape, dtype
        g = gradient(program, wrt, dtypes=dtypes, shapes=shapes)
        for note in g.notes:
            print(f"// note: {note}")
        print(format_program(g.program), end="")
        return 0
    given = load_npz(args.inputs) if args.inputs else {}
    inputs = gather_inputs(program, given, args.shape, args.seed)
    grads = grad_values(program, inputs, wrt, precision=args.precision)
    for name, arr in grads.items():
        print(f"grad_{name}: {arr.dtype}{list(arr.shape)}")
        print("  " + describe(arr).replace("\n", "\n  "))
    if args.output:
        import numpy as np

        np.savez(
            args.output,
            **{f"grad_{k}": (v.astype(np.float64) if v.dtype == object else v) for k, v in grads.items()},
        )
    return 0


def cmd_check(args) -> int:
    program = parse_file(args.file)
    shapes, dtypes = {}, {}
    for spec in args.shape:
        name, shape, dtype = parse_shape_spec(spec)
        shapes[name], dtypes[name] = shape, dtype
    bound = bind_symbolic(program, dtypes, shapes)
    outputs = set(bound.outputs)
    width = max((len(n) for n in bound.types), default=0)
    for name, t in bound.types.items():
        role = "input" if name in dict(bound.inputs) else "output" if name in outputs else ""
        print(f"{name:<{width}}  {t}  {role}".rstrip())
    for note in bound.notes:
        print(f"note: {note}")
    print(f"ok: {args.file}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with open(args.file, encoding="utf-8"):
            pass
    except OSError as e:
        print(f"error: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 2
    try:
        return {"check": cmd_check, "grad": cmd_grad, "emit": cmd_emit}[args.command](args)
    except TileError as e:
        print(e, file=sys.stderr)
        return 1
