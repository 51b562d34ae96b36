"""Tile: PlaidML's tensor language — parse, bind, grad, compile for a device.

``import tile`` stays light (no sympy, no backend): ``bind``, ``bind_symbolic``, ``grad`` and
``gradient`` load their modules at first use, and ``compile`` loads only the device it is given.
"""

import sys
import types

from tile.api import Executable, compile, compile_file, empty, grad_values, tensor
from tile.ast import Program
from tile.errors import (
    TileBackendError,
    TileDeviceError,
    TileError,
    TileGradientMemoryWarning,
    TileIndexError,
    TileIndexWarning,
    TileInputError,
    TileLimitError,
    TileNameError,
    TileOnnxError,
    TileOnnxUnsupported,
    TileOnnxValueDependent,
    TilePrecisionWarning,
    TileResourceError,
    TileRuntimeError,
    TileShapeError,
    TileSyntaxError,
    TileTypeError,
    TileWarning,
)
from tile.parser import parse, parse_file
from tile.printer import format_program
from tile.settings import TileSettingsError
from tile.tensor import Tensor

# name -> the module that defines it, imported at first use (PEP 562)
_LAZY = {
    "bind": "tile.bind",
    "bind_symbolic": "tile.bind",
    "grad": "tile.autodiff",
    "gradient": "tile.autodiff",
    "TileConfigError": "stripe.config_types",  # a bad target config file (its class: ConfigError)
}


# submodules loaded at first use: the framework bridges import torch / jax (never on `import tile`)
_LAZY_MODULES = ("torch", "jax")


def __getattr__(name: str):
    if name in _LAZY_MODULES:
        import importlib

        try:
            return importlib.import_module(f"tile.{name}")
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            # an AttributeError (saying what to install), so hasattr(tile, "torch") is False
            raise AttributeError(f"tile.{name} needs {name} installed (pip install -e '.[{name}]')") from e
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tile' has no attribute '{name}'")
    import importlib

    value = getattr(importlib.import_module(module), "ConfigError" if name == "TileConfigError" else name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """``tile.bind`` is the function: importing the submodule ``tile.bind`` (which sets the
    package's attribute of that name) must not replace it."""

    def __setattr__(self, name: str, value) -> None:
        if name == "bind" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__all__ = [
    "Executable",
    "Program",
    "Tensor",
    "TileBackendError",
    "TileConfigError",
    "TileDeviceError",
    "TileError",
    "TileIndexError",
    "TileGradientMemoryWarning",
    "TileOnnxError",
    "TileOnnxUnsupported",
    "TileOnnxValueDependent",
    "TileIndexWarning",
    "TileInputError",
    "TileLimitError",
    "TileNameError",
    "TilePrecisionWarning",
    "TileResourceError",
    "TileRuntimeError",
    "TileSettingsError",
    "TileShapeError",
    "TileSyntaxError",
    "TileTypeError",
    "TileWarning",
    "bind",
    "bind_symbolic",
    "compile",
    "compile_file",
    "empty",
    "format_program",
    "grad",
    "grad_values",
    "gradient",
    "parse",
    "parse_file",
    "tensor",
]
