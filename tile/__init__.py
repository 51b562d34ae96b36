"""Tile: PlaidML's tensor language — parser, types, shapes, exact bounds and the CLI."""

from tile.api import grad_values
from tile.ast import Program
from tile.autodiff import grad, gradient
from tile.bind import bind, bind_symbolic
from tile.errors import TileError
from tile.parser import parse, parse_file

__all__ = [
    "Program",
    "TileError",
    "bind",
    "bind_symbolic",
    "grad",
    "grad_values",
    "gradient",
    "parse",
    "parse_file",
]
