"""The errors of the ONNX importer: each names the node (or graph value) it is about. They are
defined in ``tile.errors`` beside the others (``tile`` exports them without importing onnx)."""

from __future__ import annotations

from tile.errors import TileOnnxError, TileOnnxUnsupported, TileOnnxValueDependent

__all__ = ["TileOnnxError", "TileOnnxUnsupported", "TileOnnxValueDependent"]
