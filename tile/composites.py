"""Builtins defined as expressions of other builtins (PlaidML's inlined "defines").

``builtin_binary_crossentropy(P, T, n)`` is ``-T * log(P) - (1 - T) * log(1 - P)`` and
``reverse_grad(X, s)`` is ``X``. They stay calls through typing and autodiff (each has its own
derivative rule, and ``reverse_grad``'s is not the derivative of its value), and are expanded
here, once, for everything that computes values: the interpreter evaluates the expansion and the
Stripe lowering emits its intrinsics, so every target rounds exactly the same steps in the same
order (each step in the call's result type).
"""

from __future__ import annotations

from tile.dtypes import DType
from tile.typed import TCall, TConst, TensorType, TExpr

COMPOSITES = frozenset({"builtin_binary_crossentropy", "reverse_grad"})

_ONE = TConst(1, TensorType(DType.INT32, ()))


def expand(call: TCall) -> TExpr:
    """``call`` (a composite) as a tree of primitive builtins over the same argument expressions.

    An argument may appear more than once in the tree: callers that must not evaluate it twice
    pass arguments that are already values (names of tensors or scalars)."""
    assert call.fn in COMPOSITES, call.fn
    typ = call.type

    def op(fn: str, *args: TExpr) -> TCall:
        return TCall(fn, args, typ, (), call.span)

    if call.fn == "reverse_grad":
        return op("ident", call.args[0])
    p, t = call.args
    first = op("mul", op("neg", t), op("log", p))
    second = op("mul", op("sub", _ONE, t), op("log", op("sub", _ONE, p)))
    return op("sub", first, second)
