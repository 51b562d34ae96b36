"""``tile.jax.op``: a Tile function as a JAX function (``jax.custom_vjp`` over ``jax.pure_callback``).

Imported only on use (``import tile`` never imports jax). The forward and the backward are host
callbacks running the compiled Tile program and Tile's gradient program (``tile.grad``) on
``llvm_cpu.0`` (or ``device=``); output shapes and dtypes come from Tile's shape inference at
trace time, so the op works under ``jax.jit`` and ``jax.grad``.

The VJP runs Tile's gradient program as a ``tile.jax`` op of its own, so reverse mode nests
(``jax.grad(jax.grad(f))``); forward mode is not available for a ``custom_vjp`` function (JAX
refuses ``jax.jvp``/``jacfwd``/``hessian`` of one with a TypeError saying so). An op pickles as
its source, device, vmap method and settings.

``jax.vmap`` runs a batch loop: the callbacks are declared ``vmap_method="sequential"``, so a
batched call runs the program once per batch element (each compiled once for the element shapes
and kept). A Tile function written for a batch is faster where the batch is large: put the batch
dimension in its source.
"""

from __future__ import annotations

import jax
import numpy as np

from tile.bridge import Op
from tile.errors import TileInputError

__all__ = ["JaxOp", "op"]


def op(
    source,
    *,
    device: str = "llvm_cpu.0",
    vmap_method: str = "sequential",
    settings: dict | None = None,
    differentiable: bool = True,
) -> JaxOp:
    """A JAX-traceable function running the Tile function ``source`` (text or a ``tile.Program``)
    on ``device``: positional arrays in the function's input order, one array or a tuple back.

    ``vmap_method`` goes to ``jax.pure_callback`` (``"sequential"``: a loop over the batch);
    ``settings`` to ``tile.compile``. A source whose gradient cannot be derived is refused here,
    unless ``differentiable=False`` makes a forward-only op."""
    return JaxOp(Op(source, "tile.jax op", settings, differentiable), device, vmap_method)


def _rebuilt(source: str, device: str, vmap_method: str, settings: dict, differentiable: bool) -> JaxOp:
    """An op from what defines it: how a pickled one loads."""
    return op(
        source, device=device, vmap_method=vmap_method, settings=settings, differentiable=differentiable
    )


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
            return call(*xs), xs  # (not the callback itself: fwd must be differentiable too)

        def bwd(xs, cotangents):
            return self._backward(xs, cotangents)

        call.defvjp(fwd, bwd)
        self._call = call
        self._grad_ops: dict[str, JaxOp] = {}  # gradient program text -> its op (_backward)

    def __call__(self, *xs):
        if len(xs) != len(self.core.inputs):
            self.core.tile_types(tuple(((), np.float32) for _ in xs))  # the arity error
        for name, x in zip(self.core.inputs, xs):
            if not hasattr(x, "dtype") or not hasattr(x, "shape"):
                raise TileInputError(
                    f"{self.core.what}: input '{name}' is "
                    f"{'None' if x is None else 'a ' + type(x).__name__}, not an array",
                    self.core._span(name),
                    hint="pass an array (jax or numpy) for every input of the Tile function, in its order",
                )
        return self._call(*xs)

    def __reduce__(self):
        core = self.core
        args = (core.text, self.device, self.vmap_method, dict(core.settings), core.has_gradient)
        return (_rebuilt, args)

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
        """The VJP: Tile's gradient program for every float input, run as a ``tile.jax`` op of its
        own (one per program text), so that it is differentiable in turn: ``jax.grad`` of
        ``jax.grad`` differentiates the gradient program, and so on."""
        key = self._key(xs)
        cots = (cotangents,) if len(self.core.outputs) == 1 else tuple(cotangents)
        wrt = tuple(i for i, d in enumerate(self.core.differentiable(key)) if d)
        if not wrt:
            return tuple(None for _ in xs)
        g = self.core.gradient(key, wrt)
        text = str(g.program)
        grad_op = self._grad_ops.get(text)
        if grad_op is None:
            core = Op(g.program, "tile.jax op (gradient program)", self.core.settings)
            grad_op = self._grad_ops[text] = JaxOp(core, self.device, self.vmap_method)
        # integer outputs carry float0 cotangents and have no cotangent input: they contribute nothing
        feed = dict(zip(self.core.inputs, xs))
        for o, cot in zip(self.core.outputs, cots):
            name = g.cotangents.get(o)
            if name is not None:
                feed[name] = cot
        outs = grad_op(*(feed[name] for name in grad_op.core.inputs))
        by_name = dict(zip(grad_op.core.outputs, outs if isinstance(outs, tuple) else (outs,)))
        result = [None] * len(xs)
        for i in wrt:
            grad = by_name[g.gradients[self.core.inputs[i]]]
            result[i] = jax.numpy.broadcast_to(grad, np.shape(xs[i])).astype(xs[i].dtype)
        return tuple(result)
