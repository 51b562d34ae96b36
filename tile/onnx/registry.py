"""The converter registry: one function per ONNX operator (or family), found by ``op_type``.

The contract
============

A converter is registered with ``@converter("Relu", "LeakyRelu")`` and called once per node of
those types, in graph order, as ``fn(ctx, node) -> list[Value | None]``:

* ``node`` is the ``onnx.NodeProto``; ``ctx`` (``tile.onnx.context.Context``) is the node's view
  of the graph being built.
* **Inputs.** ``ctx.input(i)`` is input ``i`` as a ``Value`` (``None`` for an absent optional
  input); a ``Value`` has a Tile tensor ``name`` (``str(v)`` is the name, so f-strings write it),
  a static ``shape`` (tuple of ints), a Tile ``dtype`` (``tile.dtypes.DType``) and, for
  initializers, ``Constant`` outputs and folded values, ``const`` (a numpy array).
  ``ctx.const(i)`` is input ``i``'s value as a numpy array: use it for inputs that decide a *shape*
  (Reshape's shape, Slice's starts). It raises ``TileOnnxValueDependent`` naming the node when the
  value is only known at run time, which ``to_tile`` reports and the backend answers by importing
  again with that input's value fixed.
* **Attributes.** ``ctx.attr("alpha", 0.01)`` is the attribute with its ONNX default (ints,
  floats, strings as ``str``, lists as tuples, tensors as numpy arrays); ``ctx.attr("perm")``
  without a default raises a ``TileOnnxError`` when the model omits it. ``ctx.opset`` is the
  model's default-domain opset version, for converters whose operator changed between versions.
* **Writing Tile.** Converters build statements, each typed at once by ``tile.bind``, so every
  returned ``Value`` carries its true Tile shape and dtype:

  - ``ctx.let("exp({x})".format(x=x))`` or ``ctx.let(f"exp({x})")`` -> a new elementwise value;
  - ``ctx.emit(f"$[i: {n}] = +({x}[i, j])")`` -> a contraction, ``$`` standing for the new name;
  - ``ctx.call(tile.ops.softmax(rank=2, axis=1), x)`` -> the outputs of a ``tile.ops`` function,
    inlined with its inputs bound to the given values (dims become the static sizes);
  - ``ctx.lit(0.5, dtype)`` writes a literal of exactly ``dtype`` (so ``float16 * lit`` stays
    float16, where a bare ``0.5`` would make the product float32), ``ctx.cast(v, dtype)`` converts,
    ``ctx.constant(array)`` adds a constant tensor (a program input fed by the backend).
* **Outputs.** Return one entry per node output, in order (``None`` for an optional output nobody
  reads). Each must have the dtype ONNX defines for it; the importer checks the graph's outputs
  against the model's declared types.
* **Refusing.** Raise ``ctx.unsupported("why")`` (a ``TileOnnxUnsupported`` naming the node) for
  attribute values or dtypes the converter does not handle. Never let a raw exception escape.

An operator of another domain registers as ``"domain:OpType"`` (``"ai.onnx.preview.training:Adam"``).

Converters for Conv/ConvTranspose/pooling/normalization live in ``ops_nn.py``; the rest in the
``ops_*`` modules beside this one. ``tile.onnx`` imports all of them, which registers them.
"""

from __future__ import annotations

from collections.abc import Callable

Converter = Callable[..., list]

# op_type -> converter: the default ONNX domain (and "ai.onnx") by name, others as "domain:op_type"
CONVERTERS: dict[str, Converter] = {}


def converter(*op_types: str) -> Callable[[Converter], Converter]:
    """Register the decorated function as the converter of each of ``op_types``."""

    def register(fn: Converter) -> Converter:
        for op in op_types:
            assert op not in CONVERTERS, f"two converters for {op}"
            CONVERTERS[op] = fn
        return fn

    return register


def supported() -> list[str]:
    """The operators that have a converter, sorted."""
    return sorted(CONVERTERS)
