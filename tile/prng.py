"""PlaidML's random numbers: ``prng_step``, ``prng_value`` and ``prng_state``, as the language sees them.

A program draws random numbers with three statements that belong together::

    H = prng_step(S, d1, ..., dk);   // S: the uint32 state of shape [3, 2048]
    V = prng_value(H);               // float32 [d1, ..., dk], uniform in [0, 1]
    S2 = prng_state(H);              // uint32 [3, 2048]: the state to pass to the next step

The generator (``ref_interp.prng`` evaluates it, the backends emit it) is PlaidML's: 2048
independent 3-component Tausworthe streams (L'Ecuyer's taus88); element ``i`` (row-major) comes
from stream ``i mod 2048``, which advances once before each element it gives. This module holds
the type rules and ``pair_prng``, the check that the three are used together. The handle ``H``
holds the raw 32-bit draws ``s1 ^ s2 ^ s3`` (so ``prng_value`` is a conversion of it), but it is
opaque to programs: it may only be passed to ``prng_value`` and ``prng_state``. ``pair_prng``
rewrites each ``prng_state(H)`` into ``prng_state(S, d1, ..., dk)``, a function of the state and
the sizes, so that later stages need no handles.
"""

from __future__ import annotations

from collections.abc import Iterable

from tile import ast
from tile.dtypes import DType
from tile.errors import Span, TileNameError, TileShapeError, TileTypeError
from tile.shapes import fmt_shape, may_equal
from tile.typed import TAssign, TCall, TContraction, TensorType, TExpr, TRef, TStatement, calls

STREAMS = 2048
# taus88, L'Ecuyer's three-component Tausworthe generator, as PlaidML's prng_step runs it: per
# component (mask, mask shift left, feedback shift left, shift right), one step being
# s = ((s & mask) << a) ^ (((s << c) ^ s) >> r) in 32-bit arithmetic (ref_interp.prng is its
# meaning; the code generators unroll these numbers)
TAUS88 = ((0xFFFFFFFE, 12, 13, 19), (0xFFFFFFF8, 4, 2, 25), (0xFFFFFFF0, 17, 3, 11))
SCALE = 2.0**-32  # a value is float32(raw) * SCALE
STATE_SHAPE = (3, STREAMS)
NAMES = ("prng_step", "prng_value", "prng_state")
_TRIPLE = "H = prng_step(S, d1, ..., dk); V = prng_value(H); S2 = prng_state(H);"


def step_rule(types, params, span, names, notes) -> TensorType:
    """``prng_step(S, d1, ..., dk)``: S is the uint32 [3, 2048] state; the handle has the sizes given."""
    state = types[0]
    if state.dtype is not DType.UINT32:
        raise TileTypeError(
            f"the state {names[0]} of prng_step must be uint32, not {state.dtype}",
            span,
            hint="the PRNG state is a uint32 tensor of shape [3, 2048] (seed it with random values "
            "greater than 1, 7 and 15 in its three rows)",
        )
    if state.shape is not None and not (
        len(state.shape) == 2
        and all(may_equal(a, b, notes, "PRNG state size") for a, b in zip(state.shape, STATE_SHAPE))
    ):
        raise TileShapeError(
            f"the state {names[0]} of prng_step has shape {fmt_shape(state.shape)}, not (3, 2048)",
            span,
            hint="the PRNG state is a uint32 tensor of shape [3, 2048]: one column per stream",
        )
    if any(p < 0 for p in params):
        raise TileShapeError(
            "prng_step sizes must not be negative",
            span,
            hint="prng_step(S, d1, ..., dk) draws a tensor of sizes d1, ..., dk",
        )
    return TensorType(DType.UINT32, tuple(params))


def value_rule(types, params, span, names, notes) -> TensorType:
    """``prng_value(H)``: float32 of the handle's sizes."""
    return TensorType(DType.FLOAT32, types[0].shape)


def state_rule(types, params, span, names, notes) -> TensorType:
    """``prng_state(H)``: the next uint32 [3, 2048] state."""
    return TensorType(DType.UINT32, STATE_SHAPE)


def state_inputs(program: ast.Program) -> set[str]:
    """The inputs passed as the state of a ``prng_step`` (``bind_symbolic`` makes them uint32)."""
    inputs = {i.name for i in program.inputs}
    return {
        s.expr.args[0].name
        for s in program.stmts
        if isinstance(s, ast.Assignment)
        and isinstance(s.expr, ast.Call)
        and s.expr.fn == "prng_step"
        and s.expr.args
        and isinstance(s.expr.args[0], ast.Name)
        and s.expr.args[0].name in inputs
    }


def pair_prng(stmts: Iterable[TStatement], outputs: Iterable[tuple[str, Span]]) -> tuple[TStatement, ...]:
    """Check that every ``prng_step`` has its ``prng_value`` and ``prng_state`` and that the handle
    goes nowhere else; return the statements with each ``prng_state(H)`` made ``prng_state(S, d..)``.

    PlaidML 0.7 required the three together too: a ``prng_value`` or ``prng_state`` of anything but
    a ``prng_step`` result, and a ``prng_step`` without its ``prng_state``, were errors; a
    ``prng_step`` without ``prng_value`` silently returned the state unchanged, which we refuse.
    """
    stmts = tuple(stmts)
    handles: dict[str, TCall] = {}
    readers: dict[str, set[str]] = {}
    for s in stmts:
        found = list(calls(s.expr)) if isinstance(s, TAssign) else []
        for c in found:
            if c.fn == "prng_step" and not (isinstance(s, TAssign) and s.expr is c):
                raise TileNameError(
                    "prng_step must be the whole right-hand side of its own statement",
                    c.span,
                    hint=f"name the handle so both prng_value and prng_state can read it: {_TRIPLE}",
                )
        for c in found:
            if c.fn in ("prng_value", "prng_state"):
                arg = c.args[0]
                if not (isinstance(arg, TRef) and arg.name in handles):
                    raise TileNameError(
                        f"{c.fn} needs the handle a prng_step returns",
                        c.span,
                        hint=f"draw with the three together: {_TRIPLE}",
                    )
                readers[arg.name].add(c.fn)
        for name, span in _other_uses(s, handles):
            raise TileNameError(
                f"the PRNG handle '{name}' can only be passed to prng_value and prng_state",
                span,
                hint="use V = prng_value(H) for the numbers and prng_state(H) for the next state",
            )
        if isinstance(s, TAssign) and isinstance(s.expr, TCall) and s.expr.fn == "prng_step":
            handles[s.name] = s.expr
            readers[s.name] = set()
    for name, span in outputs:
        if name in handles:
            raise TileNameError(
                f"the PRNG handle '{name}' cannot be an output",
                span,
                hint="return prng_value(H) and prng_state(H) instead",
            )
    for s in stmts:
        if s.name in handles:
            missing = [fn for fn in ("prng_value", "prng_state") if fn not in readers[s.name]]
            if missing == ["prng_state"]:
                raise TileNameError(
                    f"'{s.name}' = prng_step(...) has no prng_state({s.name}): the next step "
                    "would draw the same numbers again",
                    s.span,
                    hint=f"return the new state and pass it to the next step: {_TRIPLE}",
                )
            if missing:
                raise TileNameError(
                    f"'{s.name}' = prng_step(...) has no prng_value({s.name}): it draws nothing "
                    "(PlaidML 0.7 silently returned the state unchanged)",
                    s.span,
                    hint=f"use the three together: {_TRIPLE}",
                )
    return tuple(_rewrite_state(s, handles) for s in stmts)


def _other_uses(s: TStatement, handles: dict[str, TCall]):
    """(name, span) of each read of a handle other than as the argument of prng_value/prng_state."""
    if isinstance(s, TContraction):
        for acc in s.operands:
            if acc.tensor in handles:
                yield acc.tensor, acc.span
        if s.default in handles:
            yield s.default, s.span
        return
    yield from _refs(s.expr, handles, allowed=False)


def _refs(e: TExpr, handles: dict[str, TCall], allowed: bool):
    if isinstance(e, TRef) and e.name in handles and not allowed:
        yield e.name, e.span
    elif isinstance(e, TCall):
        ok = e.fn in ("prng_value", "prng_state")
        for a in e.args:
            yield from _refs(a, handles, ok)


def _rewrite_state(s: TStatement, handles: dict[str, TCall]) -> TStatement:
    if not isinstance(s, TAssign):
        return s
    return TAssign(s.name, _rewrite(s.expr, handles), s.span)


def _rewrite(e: TExpr, handles: dict[str, TCall]) -> TExpr:
    if not isinstance(e, TCall):
        return e
    if e.fn == "prng_state":
        step = handles[e.args[0].name]
        return TCall("prng_state", step.args, e.type, step.params, e.span)
    args = tuple(_rewrite(a, handles) for a in e.args)
    return e if args == e.args else TCall(e.fn, args, e.type, e.params, e.span)
