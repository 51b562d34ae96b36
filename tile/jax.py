"""``tile.jax.op``: a Tile function as a JAX function (``jax.custom_vjp`` over ``jax.pure_callback``).

Imported only on use (``import tile`` never imports jax). The forward and the backward are host
callbacks running the compiled Tile program and Tile's gradient program (``tile.grad``) on
``llvm_cpu.0`` (or ``device=``); output shapes and dtypes come from Tile's shape inference at
trace time, so the op works under ``jax.jit`` and ``jax.grad``.

``jax.vmap`` runs a batch loop: the callbacks are declared ``vmap_method="sequential"``, so a
batched call runs the program once per batch element (each compiled once for the element shapes
and kept). A Tile function written for a batch is faster where the batch is large: put the batch
dimension in its source.
"""

from __future__ import annotations

import jax
import numpy as np

from tile.bridge import Op
from tile.dtypes import DType

__all__ = ["JaxOp", "op"]


def op(
    source, *, device: str = "llvm_cpu.0", vmap_method: str = "sequential", settings: dict | None = None
) -> JaxOp:
    """A JAX-traceable function running the Tile function ``source`` (text or a ``tile.Program``)
    on ``device``: positional arrays in the function's input order, one array or a tuple back.

    ``vmap_method`` goes to ``jax.pure_callback`` (``"sequential"``: a loop over the batch);
    ``settings`` to ``tile.compile``."""
    return JaxOp(Op(source, "tile.jax op", settings), device, vmap_method)


class JaxOp:
    """The callable ``tile.jax.op`` returns (``.core`` is the shared ``tile.bridge.Op``)."""

    def __init__(self, core: Op, device: str, vmap_method: str):
        self.core = core
        self.device = device
        self.vmap_method = vmap_method

        @jax.custom_vjp
        def call(*xs):
            return self._forward(xs)

        def fwd(*xs):
            return self._forward(xs), xs

        def bwd(xs, cotangents):
            return self._backward(xs, cotangents)

        call.defvjp(fwd, bwd)
        self._call = call

    def __call__(self, *xs):
        if len(xs) != len(self.core.inputs):
            self.core.tile_types(tuple(((), np.float32) for _ in xs))  # the arity error
        return self._call(*xs)

    def __repr__(self) -> str:
        return f"tile.jax.op(({', '.join(self.core.inputs)}) -> ({', '.join(self.core.outputs)}))"

    def _key(self, xs) -> tuple:
        shapes = [tuple(int(d) for d in np.shape(x)) for x in xs]
        return self.core.key(shapes, [np.dtype(x.dtype) for x in xs])

    def _forward(self, xs):
        key = self._key(xs)
        types = self.core.out_types(key)
        shapes = tuple(jax.ShapeDtypeStruct(s, d) for s, d in types)

        def host(*arrays):
            outs = self.core.forward(self.device, [np.asarray(a) for a in arrays], key)
            return tuple(np.asarray(o) for o in outs)

        outs = jax.pure_callback(host, shapes, *xs, vmap_method=self.vmap_method)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _backward(self, xs, cotangents):
        key = self._key(xs)
        cots = (cotangents,) if len(self.core.outputs) == 1 else tuple(cotangents)
        types = self.core.out_types(key)
        # integer outputs carry float0 cotangents: they contribute nothing
        given = [i for i, (_, d) in enumerate(types) if DType.of(d).is_float]
        wrt = [i for i, d in enumerate(self.core.differentiable(key)) if d]
        if not wrt:
            return tuple(None for _ in xs)
        shapes = tuple(jax.ShapeDtypeStruct(key[i][0], key[i][1]) for i in wrt)

        def host(*arrays):
            ins = [np.asarray(a) for a in arrays[: len(xs)]]
            it = iter(arrays[len(xs):])
            cot = [np.asarray(next(it)) if i in given else None for i in range(len(types))]
            grads = self.core.backward(self.device, ins, cot, wrt, key)
            return tuple(np.asarray(g) for g in grads)

        grads = jax.pure_callback(host, shapes, *xs, *(cots[i] for i in given), vmap_method=self.vmap_method)
        result = [None] * len(xs)
        for i, g in zip(wrt, grads):
            result[i] = g
        return tuple(result)
