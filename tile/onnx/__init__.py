"""tile.onnx: ONNX models as Tile programs, and an ONNX backend that runs them on any Tile target.

* ``to_tile(model) -> str``: the model's graph as one Tile function (``import_model`` also gives
  the input/output names and the constants to feed);
* ``Backend``: ``onnx.backend.base.Backend`` over ``tile.compile`` (``"CPU"`` is ``llvm_cpu.0``;
  ``TILE_ONNX_TARGET`` or ``device="interp"`` picks any target id);
* ``trainable(model)``: gradients of the initializers through ``tile.grad`` (``training``);
* converters are registered per operator (``tile.onnx.registry``, whose docstring is the contract).

Needs the optional extra ``[onnx]`` (``pip install -e .[onnx]``).
"""

from __future__ import annotations

import importlib.util

from tile.onnx import (  # noqa: F401  (registration)
    ops_bitcast,
    ops_carried,
    ops_dft,
    ops_elementwise,
    ops_grid,
    ops_linalg,
    ops_misc,
    ops_ml,
    ops_reduce,
    ops_resize,
    ops_rnn,
    ops_shape,
    ops_training,
)
from tile.onnx.errors import TileOnnxError, TileOnnxUnsupported, TileOnnxValueDependent
from tile.onnx.importer import Imported, import_model, to_tile
from tile.onnx.registry import converter, supported

if importlib.util.find_spec("tile.onnx.ops_nn") is not None:  # Conv, pooling, normalization
    from tile.onnx import ops_nn  # noqa: F401


def __getattr__(name: str):
    if name in ("Backend", "BackendRep"):  # imports onnx.backend (and the Tile API) on first use
        from tile.onnx import backend

        return getattr(backend, name)
    if name in ("Trainable", "trainable"):
        from tile.onnx import training

        return getattr(training, name)
    raise AttributeError(f"module 'tile.onnx' has no attribute {name!r}")


__all__ = ["Backend", "BackendRep", "Imported", "TileOnnxError", "TileOnnxUnsupported",
           "TileOnnxValueDependent", "Trainable", "converter", "import_model", "supported", "to_tile",
           "trainable"]
