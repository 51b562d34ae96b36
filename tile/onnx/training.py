"""Gradients of an ONNX model, from ``tile.grad`` of its imported program.

``trainable(model)`` imports the model with its float initializers as parameters (never folded
into constants, so each stays an input of the program) and derives the gradient program once::

    t = tile.onnx.trainable(model, device="llvm_cpu.0")
    y = t.forward({"x": x})["y"]
    g = t.gradients({"x": x}, {"y": dloss_dy})     # {initializer name: gradient}
    t.params["fc.weight"] -= lr * g["fc.weight"]  # the next call uses the updated values

The gradient is that of ``sum(cotangent * output)`` over the outputs given (``tile.grad``'s rule),
so a loss computed outside the model enters through its derivative with respect to the outputs.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import tile
from tile.dtypes import DType
from tile.onnx.importer import Imported, import_model, load


class Trainable:
    """A model's forward and gradient programs, compiled for one device, and its parameters."""

    def __init__(self, model, shapes: Mapping[str, tuple[int, ...]] | None = None,
                 device: str = "llvm_cpu.0"):
        from tile.autodiff import gradient

        model = load(model)
        self.imported: Imported = import_model(model, shapes, params=True)
        self.names = {onnx: t for t, onnx in self.imported.initializers.items()}  # ONNX name -> Tile name
        consts = self.imported.constants
        self.params: dict[str, np.ndarray] = {o: consts[t].copy() for o, t in self.names.items()
                                              if DType.of(consts[t].dtype).is_float}
        program = tile.parse(self.imported.source)
        types = dict(self.imported.input_types)
        types.update({k: (v.shape, DType.of(v.dtype)) for k, v in self.imported.constants.items()})
        self.grad = gradient(program, [self.names[p] for p in self.params],
                             dtypes={k: d for k, (_, d) in types.items()},
                             shapes={k: s for k, (s, _) in types.items()})
        self._forward = tile.compile(program, device)
        self._backward = tile.compile(self.grad.program, device)

    def _feeds(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = self.imported.feeds(inputs)
        for onnx, value in self.params.items():
            feeds[self.names[onnx]] = np.asarray(value)
        return feeds

    def forward(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs by ONNX name."""
        out = self._forward(self._feeds(inputs))
        return {o: np.asarray(out[t]) for o, t in self.imported.outputs}

    def gradients(self, inputs: Mapping[str, np.ndarray], cotangents: Mapping[str, np.ndarray]
                  ) -> dict[str, np.ndarray]:
        """``{parameter: d sum(cotangent * output) / d parameter}``; outputs without a cotangent
        contribute nothing."""
        feeds = self._feeds(inputs)
        tile_out = dict(self.imported.outputs)
        for out, d in self.grad.cotangents.items():
            onnx = next(o for o, t in tile_out.items() if t == out)
            feeds[d] = np.asarray(cotangents[onnx]) if onnx in cotangents else np.zeros_like(
                self.forward(inputs)[onnx])
        result = self._backward(feeds)
        return {onnx: np.asarray(result[self.grad.gradients[self.names[onnx]]]) for onnx in self.params}


def trainable(model, shapes: Mapping[str, tuple[int, ...]] | None = None, device: str = "llvm_cpu.0"
              ) -> Trainable:
    """``Trainable(model, shapes, device)``."""
    return Trainable(model, shapes, device)
