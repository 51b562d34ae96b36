"""How a ``tile.torch`` op is differentiated: one ``torch.autograd.Function`` for every mode.

``TileFunction`` has PyTorch's ``setup_context`` form, so the ``torch.func`` transforms take it
(``grad``, ``jacrev``, ``jvp``, ``jacfwd``, ``hessian``, ``vmap`` of any of them), with

* ``backward``: Tile's gradient program for exactly the inputs that need a gradient (the
  ``<name>_backward`` operator where nothing differentiates it further; otherwise the gradient
  program as a ``tile.torch`` op of its own, whose own backward and JVP are Tile's in turn);
* ``jvp``: Tile's JVP program (``tile.autodiff.jvp``: the gradient program differentiated with
  respect to its cotangents), run as a ``tile.torch`` op of its own, for forward-mode AD
  (``torch.autograd.forward_ad`` dual tensors, ``torch.func.jvp``/``jacfwd``);
* a generated vmap rule, which runs the op's own (a loop over the batch).

The operator's ``Autograd`` kernel (``autograd_kernel``, registered over ``custom_op``'s own,
whose ``Function`` has neither a ``setup_context`` nor a ``jvp``) applies it whenever an input
requires grad or carries a forward-mode tangent, so ``torch.ops.tile.<name>`` and a saved
``torch.export`` program differentiate the same way as the eager call.
"""

from __future__ import annotations

import inspect
import warnings

import torch
import torch.autograd.forward_ad as fwAD

from tile.errors import TileInputError

__all__ = [
    "TileEagerFunction", "TileFunction", "as_inputs", "autograd_kernel", "backward_of", "c_apply",
    "eager_apply", "has_tangent",
]


def has_tangent(tensors) -> bool:
    """Whether forward-mode AD is on and one of ``tensors`` carries a tangent at its level."""
    if fwAD._current_level < 0 or not torch._C._is_fwd_grad_enabled():
        return False
    return any(isinstance(t, torch.Tensor) and fwAD.unpack_dual(t).tangent is not None for t in tensors)


def _differentiated() -> bool:
    """Whether what a backward or JVP computes may itself be differentiated."""
    return (
        torch.is_grad_enabled() or fwAD._current_level >= 0 or torch._C._are_functorch_transforms_active()
    )


class TileFunction(torch.autograd.Function):
    """``op(*tensors)`` with Tile's backward and JVP (``apply(op, *tensors)``)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(op, *tensors):
        return op._run(tensors)

    @staticmethod
    def setup_context(ctx, inputs, output):
        op, *tensors = inputs
        _saved(ctx, op, tensors, output)
        ctx.save_for_forward(*tensors)

    @staticmethod
    def backward(ctx, *grads):
        return backward_of(ctx, grads, ctx.op, None)

    @staticmethod
    def jvp(ctx, _op, *tangents):
        op = ctx.op
        inputs = ctx.saved_tensors
        wrt = [
            i for i, (x, t) in enumerate(zip(inputs, tangents)) if t is not None and x.dtype.is_floating_point
        ]
        result = forward(op, inputs, tangents, wrt)
        return result[0] if len(result) == 1 else tuple(result)


class TileEagerFunction(torch.autograd.Function):
    """``TileFunction`` for an eager call with a gradient (``tile.torch._eager_kind``'s
    ``AUTOGRAD``: no transform, no forward-mode AD), in the form whose ``apply`` does not bind the
    forward's signature on every call (``inspect.signature``: ~25 us of a call)."""

    @staticmethod
    def forward(ctx, op, *tensors):
        # (``apply`` comes only from an eager call that found nothing to dispatch for: no second
        # look, and the signature kept for the backward's lane)
        ctx.sig = sig = op._signature(tensors)
        output = op._forward_at(sig, tensors)
        _saved(ctx, op, tensors, output)
        return output

    @staticmethod
    def backward(ctx, *grads):
        return backward_of(ctx, grads, ctx.op, ctx.sig)


def c_apply(function: type):
    """``function.apply``'s C part (``torch._C._FunctionBase.apply`` bound to it: what
    ``Function.apply`` calls when no functorch transform is active), or None where this torch has
    no such thing."""
    try:
        return torch._C._FunctionBase.__dict__["apply"].__get__(None, function)
    except (AttributeError, KeyError):
        return None


_EAGER_APPLY = c_apply(TileEagerFunction)
_UNWRAP_IF_DEAD = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)


def eager_apply(op, tensors):
    """``TileEagerFunction.apply(op, *tensors)`` for ``tile.torch._eager_kind``'s ``AUTOGRAD``
    (so no functorch transform is active): what ``Function.apply`` does then (a tensor left over
    from an exited transform unwrapped, the C ``apply``) without its Python part (~2 us: the
    setup-context test, a generator over the arguments)."""
    if _EAGER_APPLY is None or _UNWRAP_IF_DEAD is None:
        return TileEagerFunction.apply(op, *tensors)
    return _EAGER_APPLY(op, *map(_UNWRAP_IF_DEAD, tensors))


def _saved(ctx, op, tensors, output) -> None:
    """What the backward needs: the op and the inputs; the integer outputs marked."""
    ctx.op = op
    ctx.save_for_backward(*tensors)
    outs = output if isinstance(output, tuple) else (output,)
    ints = [o for o in outs if not o.dtype.is_floating_point]
    if ints:
        ctx.mark_non_differentiable(*ints)


def backward_of(ctx, grads, op, sig: tuple | None):
    """Every function's backward: Tile's gradient program for the inputs that need a gradient
    (``ctx``'s, whose forward applied ``op`` to its saved inputs; ``sig``: their signature where
    they were plain tensors of ``op``'s device at the forward, else None)."""
    inputs = ctx.saved_tensors
    needs = ctx.needs_input_grad
    wrt = [i for i, t in enumerate(inputs) if needs[i + 1] and t.dtype.is_floating_point]
    result: list[torch.Tensor | None] = [None] * len(inputs)
    if wrt:
        op.core.refuse_backward()
        # inputs that were plain tensors of the op's device at the forward (their signature kept):
        # only the cotangents and the modes now may send this to the dispatcher
        if _differentiated():
            found = reverse(op, inputs, list(grads), wrt)
        elif op._dispatching(grads if sig is not None else (*inputs, *grads)):
            found = op.backward_op(*inputs, list(grads), wrt)  # one node in a traced graph
        else:
            found = op._backward_at(op._signature(inputs) if sig is None else sig, inputs, list(grads), wrt)
        for i, g in zip(wrt, found):
            result[i] = g
    return (None, *result)


def autograd_kernel(op):
    """The ``Autograd`` dispatch kernel of ``op``'s operator: ``TileFunction`` where a gradient or
    a tangent is wanted, else straight to the kernels below autograd."""
    after = torch._C._after_autograd_keyset

    def kernel(keyset, *tensors):
        if (torch.is_grad_enabled() and torch._C._any_requires_grad(*tensors)) or has_tangent(tensors):
            if torch._C._are_functorch_transforms_active():
                raise TileInputError(
                    f"{op.core.what}: torch.ops.tile.{op.name} was called directly under a torch.func "
                    "transform, which takes Tile's derivatives only from the op itself",
                    None,
                    hint=f"call the tile.torch op (tile.torch.op(...)(x), or {op.name}.op's TorchOp) "
                    "inside torch.func.grad / jacrev / jvp / jacfwd / hessian",
                )
            return TileFunction.apply(op, *tensors)
        with torch._C._AutoDispatchBelowAutograd():
            return op._call.redispatch(keyset & after, *tensors)

    return kernel


def register_autograd(op) -> None:
    """``autograd_kernel`` as ``op``'s ``Autograd`` kernel, over the one ``custom_op`` made."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel")
        warnings.filterwarnings("ignore", message="Warning only once for all operators")
        impl = op.op._lib.impl
        # custom_op registered an Autograd kernel of its own: replacing it must be allowed, which
        # PyTorch 2.13 does by default and earlier releases (2.11) only when asked
        override = {"allow_override": True} if "allow_override" in inspect.signature(impl).parameters else {}
        impl(op.name, autograd_kernel(op), "Autograd", with_keyset=True, **override)


def as_inputs(grads, tensors, wrt) -> list[torch.Tensor]:
    """Each gradient as its input: broadcast where the program kept it smaller, in its dtype."""
    return [
        g if g.shape == tensors[i].shape and g.dtype == tensors[i].dtype
        else g.expand(tensors[i].shape).to(tensors[i].dtype).contiguous()
        for g, i in zip(grads, wrt)
    ]


def _zeros(op, shape, dtype, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros(shape, dtype=op._torch_dtype(dtype), device=like.device)


def _key(op, tensors):
    dtypes = [op._np_dtype(t, i) for i, t in enumerate(tensors)]
    return op.core.key([tuple(int(d) for d in t.shape) for t in tensors], dtypes)


def _outputs(derived, feed: dict) -> dict:
    outs = derived(*(feed[name] for name in derived.core.inputs))
    return dict(zip(derived.core.outputs, outs if isinstance(outs, tuple) else (outs,)))


def reverse(op, inputs, cotangents, wrt) -> list[torch.Tensor]:
    """The gradients for ``wrt`` as a differentiable computation: Tile's gradient program for these
    inputs run as a ``tile.torch`` op (``<name>_grad_<hash>``), whose backward is Tile's gradient of
    it and whose JVP its linearization: derivatives of any order, in either mode."""
    key = _key(op, inputs)
    g = op.core.gradient(key, tuple(wrt))
    feed = dict(zip(op.core.inputs, inputs))
    for o, cot, (shape, dtype) in zip(op.core.outputs, cotangents, op.core.out_types(key)):
        name = g.cotangents.get(o)
        if name is not None:
            feed[name] = cot if cot is not None else _zeros(op, shape, dtype, inputs[0])
    by_name = _outputs(op._derived(g.program, "grad"), feed)
    result = []
    for i in wrt:
        grad = by_name[g.gradients[op.core.inputs[i]]]
        if grad.shape != inputs[i].shape:
            grad = grad.expand(inputs[i].shape)
        result.append(grad.to(inputs[i].dtype))
    return result


def forward(op, inputs, tangents, wrt) -> list[torch.Tensor | None]:
    """The tangent of each output (None for a non-float one) for the tangents of the inputs at
    ``wrt``: Tile's JVP program run as a ``tile.torch`` op (``<name>_jvp_<hash>``), itself
    differentiable in either mode."""
    key = _key(op, inputs)
    types = op.core.out_types(key)
    if not wrt:  # no tangent in: every float output's tangent is zero
        floats = op.core.differentiable(tuple(types))
        return [_zeros(op, s, d, inputs[0]) if f else None for f, (s, d) in zip(floats, types)]
    lin = op.core.linearization(key, tuple(wrt))
    feed = dict(zip(op.core.inputs, inputs))
    for i in wrt:
        feed[lin.tangents[op.core.inputs[i]]] = tangents[i].to(inputs[i].dtype)
    for o, (shape, dtype) in zip(op.core.outputs, types):
        if o in lin.zeros:
            feed[lin.zeros[o]] = _zeros(op, shape, dtype, inputs[0])
    by_name = _outputs(op._derived(lin.program, "jvp"), feed)
    result: list[torch.Tensor | None] = []
    for o, (shape, dtype) in zip(op.core.outputs, types):
        name = lin.outputs.get(o)
        if name is None:
            result.append(None)
            continue
        t = by_name[name]
        if tuple(t.shape) != tuple(shape):
            t = t.expand(shape)
        result.append(t.to(op._torch_dtype(dtype)))
    return result
