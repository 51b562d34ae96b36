"""The optimizers of ONNX's ``ai.onnx.preview.training`` domain: Adagrad, Momentum, Adam.

Each updates its tensors elementwise by the formulas of the ONNX specification; the learning rate
``R`` and step count ``T`` are 0-D inputs, so their values may change from call to call.
"""

from __future__ import annotations

from tile.dtypes import DType
from tile.onnx.context import Context, Value
from tile.onnx.registry import converter

DOMAIN = "ai.onnx.preview.training"


def _groups(ctx: Context, count: int) -> tuple[Value, Value, list[list[Value]]]:
    """R, T and the per-tensor inputs in ``count`` groups (X.., G.., then the states)."""
    r, t = ctx.input(0), ctx.input(1)
    rest = [ctx.input(i) for i in range(2, ctx.n_inputs)]
    n = len(rest) // count
    return r, t, [rest[k * n:(k + 1) * n] for k in range(count)]


def _f(ctx: Context, v, dtype: DType) -> str:
    return ctx.lit(v, dtype)


@converter(f"{DOMAIN}:Adagrad")
def adagrad(ctx: Context, node) -> list[Value]:
    r, t, (xs, gs, hs) = _groups(ctx, 3)
    decay, eps = ctx.attr("decay_factor", 0.0), ctx.attr("epsilon", 0.0)
    norm = ctx.attr("norm_coefficient", 0.0)
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        d = x.dtype
        tf = ctx.cast(t, d)
        rate = ctx.let(f"{ctx.cast(r, d)} / ({_f(ctx, 1, d)} + {tf} * {_f(ctx, decay, d)})", "Rate")
        greg = ctx.let(f"{_f(ctx, norm, d)} * {x} + {g}", "G")
        h2 = ctx.cast(ctx.let(f"{h} + {greg} * {greg}", "H"), d)
        adaptive = ctx.let(f"sqrt({h2}) + {_f(ctx, eps, d)}", "Adaptive")
        new_x.append(ctx.cast(ctx.let(f"{x} - {rate} * {greg} / {adaptive}", "X"), d))
        new_h.append(h2)
    return new_x + new_h


@converter(f"{DOMAIN}:Momentum")
def momentum(ctx: Context, node) -> list[Value]:
    r, t, (xs, gs, vs) = _groups(ctx, 3)
    alpha, beta = ctx.attr("alpha"), ctx.attr("beta")
    norm, mode = ctx.attr("norm_coefficient"), ctx.attr("mode")
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        d = x.dtype
        greg = ctx.let(f"{_f(ctx, norm, d)} * {x} + {g}", "G")
        b = ctx.let(f"{t} > {ctx.lit(0, t.dtype)} ? {_f(ctx, beta, d)} : {_f(ctx, 1, d)}", "Beta")
        v2 = ctx.cast(ctx.let(f"{_f(ctx, alpha, d)} * {v} + {b} * {greg}", "V"), d)
        rate = ctx.cast(r, d)
        step = f"{v2}" if mode == "standard" else f"({greg} + {_f(ctx, alpha, d)} * {v2})"
        new_x.append(ctx.cast(ctx.let(f"{x} - {rate} * {step}", "X"), d))
        new_v.append(v2)
    return new_x + new_v


@converter(f"{DOMAIN}:Adam")
def adam(ctx: Context, node) -> list[Value]:
    r, t, (xs, gs, vs, hs) = _groups(ctx, 4)
    alpha, beta = ctx.attr("alpha", 0.9), ctx.attr("beta", 0.999)
    eps, norm = ctx.attr("epsilon", 1e-6), ctx.attr("norm_coefficient", 0.0)
    post = ctx.attr("norm_coefficient_post", 0.0)
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        d = x.dtype
        one, a, b = _f(ctx, 1, d), _f(ctx, alpha, d), _f(ctx, beta, d)
        greg = ctx.let(f"{_f(ctx, norm, d)} * {x} + {g}", "G")
        v2 = ctx.cast(ctx.let(f"{a} * {v} + ({one} - {a}) * {greg}", "V"), d)
        h2 = ctx.cast(ctx.let(f"{b} * {h} + ({one} - {b}) * {greg} * {greg}", "H"), d)
        root = ctx.let(f"sqrt({h2}) + {_f(ctx, eps, d)}", "Root")
        tf, rate = ctx.cast(t, d), ctx.cast(r, d)
        adjusted = ctx.let(f"{t} > {ctx.lit(0, t.dtype)} ? {rate} * sqrt({one} - pow({b}, {tf})) / "
                           f"({one} - pow({a}, {tf})) : {rate}", "Rate")
        x2 = ctx.let(f"{x} - {adjusted} * ({v2} / {root})", "X")
        new_x.append(ctx.cast(ctx.let(f"({one} - {_f(ctx, post, d)}) * {x2}", "X"), d))
        new_v.append(v2)
        new_h.append(h2)
    return new_x + new_v + new_h
