"""``python -m tile <command>``: the language's command line.

* ``check F.tile [--shape I=2x3[:dtype] ...]`` — parse and type-check; print every tensor's
  inferred dtype and shape (symbolic in the input dimensions where no ``--shape`` is given).
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
    c.add_argument("--shape", action="append", default=[], metavar="NAME=2x3[:dtype]",
                   help="a concrete input shape and dtype (repeatable); others stay symbolic")
    return p


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
        return {"check": cmd_check}[args.command](args)
    except OSError as e:
        print(f"error: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 2
    except TileError as e:
        print(e, file=sys.stderr)
        return 1
