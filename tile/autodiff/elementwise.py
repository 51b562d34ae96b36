"""Derivatives of the elementwise builtins, as Tile expressions.

``local_adjoints(fn, args, y, g)`` returns, for each tensor argument, the expression whose value is
that argument's share of the adjoint ``g`` (or ``None`` where no gradient flows), with ``args`` the
arguments' syntax, ``y`` the call's own value and ``g`` the adjoint of the call. Shape-changing
builtins (reshape, gather, scatter, the softmaxes) are handled by the caller, which needs the
adjoint at exactly the call's shape.

Tie rules: elementwise ``max``/``min`` send the whole gradient to the first argument on ties;
``abs`` uses +1 at 0; ``relu`` uses 0 at 0. ``mod(a, b)`` is ``a - b * trunc(a / b)``, so (away
from its jumps) its derivatives are 1 and ``-trunc(a / b)``, written ``-(a - y) / b``.
``builtin_binary_crossentropy`` has its true derivatives (PlaidML divided them by ``n``, a bug);
``reverse_grad(X, s)`` is the identity whose gradient is ``-s`` times the adjoint, as in PlaidML.
The float conversions ``as_float``, ``as_bfloat`` and ``round_tf32`` pass the adjoint through (a
change of precision, not a step function: its true derivative, zero almost everywhere, would stop
every gradient of a program that emulates a lower precision).
"""

from __future__ import annotations

from tile import ast
from tile.autodiff.build import add, call, cond, div, lit, mul, neg, sub

ZERO_GRADIENT = frozenset(
    {
        "cmp_eq",
        "cmp_ne",
        "cmp_lt",
        "cmp_gt",
        "cmp_le",
        "cmp_ge",
        "bit_and",
        "bit_or",
        "bit_xor",
        "bit_not",
        "bit_left",
        "bit_right",
        "floor",
        "ceil",
        "round",
        "as_int",
        "as_uint",
        "as_bool",
        "index",
        "shape",
        # the numbers depend only on the uint32 state, which has no gradient (PlaidML: no rule)
        "prng_step",
        "prng_value",
        "prng_state",
    }
)
# simple_reduce is bound as the `+` contraction it stands for (tile.simple_reduce), whose rule applies
STRUCTURAL = frozenset(
    {"reshape", "gather", "scatter", "builtin_softmax", "builtin_logsoftmax", "simple_reduce"}
)

_ZERO = lit(0)
_ONE = lit(1)


def _sq(x: ast.Expr) -> ast.Expr:
    return mul(x, x)


def local_adjoints(fn: str, args: list[ast.Expr], y: ast.Expr, g: ast.Expr) -> list[ast.Expr | None]:
    a = args
    if fn in ZERO_GRADIENT:
        return [None] * len(args)
    rules = {
        "add": lambda: [g, g],
        "sub": lambda: [g, neg(g)],
        "mul": lambda: [mul(g, a[1]), mul(g, a[0])],
        "div": lambda: [div(g, a[1]), neg(div(mul(g, a[0]), _sq(a[1])))],
        "mod": lambda: [g, neg(mul(g, div(sub(a[0], y), a[1])))],
        "recip": lambda: [neg(mul(g, _sq(y)))],
        "reverse_grad": lambda: [neg(mul(a[1], g)), None],
        "builtin_binary_crossentropy": lambda: [
            mul(g, sub(div(sub(_ONE, a[1]), sub(_ONE, a[0])), div(a[1], a[0]))),
            mul(g, sub(call("log", sub(_ONE, a[0])), call("log", a[0]))),
        ],
        "neg": lambda: [neg(g)],
        "ident": lambda: [g],
        "as_float": lambda: [g],
        "as_bfloat": lambda: [g],
        "round_tf32": lambda: [g],  # a change of precision, like as_float: the gradient passes through
        "abs": lambda: [cond(ast.Binary("<", a[0], _ZERO), neg(g), g)],
        "relu": lambda: [cond(ast.Binary(">", a[0], _ZERO), g, _ZERO)],
        "max": lambda: [
            cond(ast.Binary(">=", a[0], a[1]), g, _ZERO),
            cond(ast.Binary(">=", a[0], a[1]), _ZERO, g),
        ],
        "min": lambda: [
            cond(ast.Binary("<=", a[0], a[1]), g, _ZERO),
            cond(ast.Binary("<=", a[0], a[1]), _ZERO, g),
        ],
        "cond": lambda: [None, cond(a[0], g, _ZERO), cond(a[0], _ZERO, g)],
        "pow": lambda: [
            mul(mul(g, a[1]), call("pow", a[0], sub(a[1], _ONE))),
            mul(mul(g, call("log", a[0])), y),
        ],
        "exp": lambda: [mul(g, y)],
        "log": lambda: [div(g, a[0])],
        "sqrt": lambda: [div(g, mul(lit(2), y))],
        "sin": lambda: [mul(g, call("cos", a[0]))],
        "cos": lambda: [neg(mul(g, call("sin", a[0])))],
        "tan": lambda: [mul(g, add(_ONE, _sq(y)))],
        "sinh": lambda: [mul(g, call("cosh", a[0]))],
        "cosh": lambda: [mul(g, call("sinh", a[0]))],
        "tanh": lambda: [mul(g, sub(_ONE, _sq(y)))],
        "asin": lambda: [div(g, call("sqrt", sub(_ONE, _sq(a[0]))))],
        "acos": lambda: [neg(div(g, call("sqrt", sub(_ONE, _sq(a[0])))))],
        "atan": lambda: [div(g, add(_ONE, _sq(a[0])))],
        "asinh": lambda: [div(g, call("sqrt", add(_sq(a[0]), _ONE)))],
        "acosh": lambda: [div(g, call("sqrt", sub(_sq(a[0]), _ONE)))],
        "atanh": lambda: [div(g, sub(_ONE, _sq(a[0])))],
        "sigmoid": lambda: [mul(mul(g, y), sub(_ONE, y))],
    }
    rule = rules.get(fn)
    assert rule is not None, f"no derivative rule for builtin {fn}"
    return rule()


def has_rule(fn: str) -> bool:
    """Whether ``fn`` is covered (a derivative, a zero gradient, or a structural rule)."""
    if fn in ZERO_GRADIENT or fn in STRUCTURAL:
        return True
    try:
        local_adjoints(fn, [ast.Name("A"), ast.Name("B"), ast.Name("C")], ast.Name("Y"), ast.Name("G"))
    except (AssertionError, IndexError):
        return False
    return True
