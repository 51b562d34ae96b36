"""Tile: PlaidML's tensor language — parse, bind, grad, compile for a device."""

from tile.api import Executable, compile, empty, grad_values, tensor
from tile.ast import Program
from tile.autodiff import grad, gradient
from tile.bind import bind, bind_symbolic
from tile.errors import (
    TileBackendError,
    TileDeviceError,
    TileError,
    TileInputError,
    TileSyntaxError,
    TileTypeError,
)
from tile.parser import parse, parse_file
from tile.tensor import Tensor

__all__ = [
    "Executable",
    "Program",
    "Tensor",
    "TileBackendError",
    "TileDeviceError",
    "TileError",
    "TileInputError",
    "TileSyntaxError",
    "TileTypeError",
    "bind",
    "bind_symbolic",
    "compile",
    "empty",
    "grad",
    "grad_values",
    "gradient",
    "parse",
    "parse_file",
    "tensor",
]
