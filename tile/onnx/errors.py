"""The errors of the ONNX importer: each names the node (or graph value) it is about."""

from __future__ import annotations

from tile.errors import TileError


class TileOnnxError(TileError):
    """A model the importer cannot turn into Tile: the message names the node and what to change."""

    kind = "onnx error"


class TileOnnxUnsupported(TileOnnxError):
    """An operator, attribute value or dtype the importer has no converter for."""

    kind = "onnx unsupported"


class TileOnnxValueDependent(TileOnnxError):
    """A node whose output *shape* depends on the values of a graph input (Reshape's ``shape``,
    Slice's ``starts``, ...). ``names`` are the graph inputs whose values would make it static: the
    backend re-imports with those values as constants; ``to_tile`` refuses."""

    kind = "onnx value-dependent shape"

    def __init__(self, message: str, names: tuple[str, ...] = (), hint: str | None = None):
        super().__init__(message, None, hint)
        self.names = tuple(names)
