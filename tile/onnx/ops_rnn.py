"""Recurrent layers: RNN, GRU, LSTM, unrolled over the (static) sequence length.

Each time step is a few statements: the step's input slice, its products with the gate weights
(contractions over the input and hidden sizes) and the gates' elementwise update, all in the
ONNX equations' order. ``sequence_lens`` shorter than the sequence is not supported (refused).
"""

from __future__ import annotations

import numpy as np

from tile.onnx.context import Context, Value
from tile.onnx.ops_shape import permute, reshape, take
from tile.onnx.registry import converter

_ACT = {  # ONNX's recurrent activations; {alpha}, {beta}, {zero}, {one}: literals of x's type
    "Tanh": "tanh({x})", "Sigmoid": "sigmoid({x})", "Relu": "relu({x})",
    "Affine": "{alpha} * {x} + {beta}", "LeakyRelu": "{x} < {zero} ? {alpha} * {x} : {x}",
    "ThresholdedRelu": "{x} > {alpha} ? {x} : {zero}", "ScaledTanh": "{alpha} * tanh({beta} * {x})",
    "HardSigmoid": "max({zero}, min({one}, {alpha} * {x} + {beta}))",
    "Elu": "{x} < {zero} ? {alpha} * (exp({x}) - {one}) : {x}",
    "Softsign": "{x} / ({one} + abs({x}))", "Softplus": "log(exp({x}) + {one})",
}


class _Cell:
    """The weights of one direction and helpers to write a step."""

    def __init__(self, ctx: Context, d: int, gates: int, hidden: int, x: Value):
        self.ctx, self.hidden, self.gates = ctx, hidden, gates
        w, r = ctx.input(1), ctx.input(2)
        self.w = [self._row(take(ctx, w, 0, [d]), g) for g in range(gates)]  # [H, in]
        self.r = [self._row(take(ctx, r, 0, [d]), g) for g in range(gates)]  # [H, H]
        b = ctx.input(3) if ctx.has(3) else None
        if b is not None:
            bd = reshape(ctx, take(ctx, b, 0, [d]), (2 * gates, hidden))
            self.wb = [reshape(ctx, take(ctx, bd, 0, [g]), (hidden,)) for g in range(gates)]
            self.rb = [reshape(ctx, take(ctx, bd, 0, [gates + g]), (hidden,)) for g in range(gates)]
        else:
            self.wb = self.rb = None

    def _row(self, m: Value, g: int) -> Value:
        m = reshape(self.ctx, m, m.shape[1:])
        return take(self.ctx, m, 0, np.arange(g * self.hidden, (g + 1) * self.hidden))

    def product(self, a: Value, m: Value) -> Value:
        """``a @ m.T`` for a [batch, k] and m [H, k]."""
        return self.ctx.emit(f"$[b, h: {a.shape[0]}, {m.shape[0]}] = +({a}[b, k] * {m}[h, k])", "Gate")

    def pre(self, g: int, xt: Value, h: Value | None, with_r_bias: bool = True) -> Value:
        """``xt W_g^T + h R_g^T + Wb_g + Rb_g`` (terms left out where absent)."""
        terms = [self.product(xt, self.w[g]).name]
        if h is not None:
            terms.append(self.product(h, self.r[g]).name)
        if self.wb is not None:
            terms.append(self.wb[g].name)
            if with_r_bias:
                terms.append(self.rb[g].name)
        return self.ctx.let(" + ".join(terms), "Pre")


def _activation(ctx: Context, name: str, x: Value, alpha, beta) -> Value:
    template = _ACT.get(name)
    if template is None:
        raise ctx.unsupported(f"activation {name}")
    lit = {"alpha": ctx.lit(alpha if alpha is not None else 0.01, x.dtype),
           "beta": ctx.lit(beta if beta is not None else 0.0, x.dtype),
           "zero": ctx.lit(0, x.dtype), "one": ctx.lit(1, x.dtype)}
    text = template.format(x=x, **lit)
    return ctx.cast(ctx.let(text, name), x.dtype)


def _setup(ctx: Context, gates: int, default_acts: list[str]):
    x = ctx.input(0)
    layout = ctx.attr("layout", 0)
    if layout:
        x = permute(ctx, x, [1, 0, 2])
    seq, batch, _ = x.shape
    if ctx.has(4):
        lens = ctx.const(4)
        if (np.asarray(lens) != seq).any():
            raise ctx.unsupported("sequence_lens shorter than the sequence")
    hidden = ctx.attr("hidden_size", None) or ctx.raw(2).shape[-1]
    direction = ctx.attr("direction", "forward")
    dirs = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    acts = list(ctx.attr("activations", ()))
    alphas = list(ctx.attr("activation_alpha", ()))
    betas = list(ctx.attr("activation_beta", ()))
    per = len(default_acts)
    if not acts:
        acts = default_acts * len(dirs)
    if ctx.attr("clip", None) is not None:
        raise ctx.unsupported("clip")

    def act(d: int, k: int, v: Value) -> Value:
        j = d * per + k
        return _activation(ctx, acts[j], v, alphas[j] if j < len(alphas) else None,
                           betas[j] if j < len(betas) else None)

    steps = [reshape(ctx, take(ctx, x, 0, [t]), (batch, x.shape[2])) for t in range(seq)]
    return x, layout, seq, batch, hidden, dirs, act, steps


def _initial(ctx: Context, i: int, d: int, batch: int, hidden: int) -> Value | None:
    if not ctx.has(i):
        return None
    return reshape(ctx, take(ctx, ctx.input(i), 0, [d]), (batch, hidden))


def _outputs(ctx: Context, per_dir: list[list[Value]], finals: list[list[Value]], layout: int) -> list:
    """Y [seq, dirs, batch, H] (or [batch, seq, dirs, H]) and each final state [dirs, batch, H]."""
    seq = len(per_dir[0])
    batch, hidden = per_dir[0][0].shape
    stacked = []
    for t in range(seq):
        parts = [reshape(ctx, per_dir[d][t], (1, 1, batch, hidden)) for d in range(len(per_dir))]
        stacked.append(parts)
    flat = [p for step in stacked for p in step]
    y = _concat(ctx, flat, 0)
    y = reshape(ctx, y, (seq, len(per_dir), batch, hidden))
    if layout:
        y = permute(ctx, y, [2, 0, 1, 3])
    outs = [y]
    for states in finals:
        s = _concat(ctx, [reshape(ctx, v, (1, batch, hidden)) for v in states], 0)
        outs.append(permute(ctx, s, [1, 0, 2]) if layout else s)
    return outs


def _concat(ctx: Context, parts: list[Value], axis: int) -> Value:
    import tile.ops

    if len(parts) == 1:
        return ctx.let(f"ident({parts[0]})")
    return ctx.call(tile.ops.concat(len(parts), rank=parts[0].rank, axis=axis), *parts)[0]


@converter("RNN")
def rnn(ctx: Context, node) -> list[Value]:
    x, layout, seq, batch, hidden, dirs, act, steps = _setup(ctx, 1, ["Tanh"])
    ys, hs = [], []
    for d, direction in enumerate(dirs):
        cell = _Cell(ctx, d, 1, hidden, x)
        h = _initial(ctx, 5, d, batch, hidden)
        out = [None] * seq
        for t in (range(seq) if direction == "forward" else reversed(range(seq))):
            h = act(d, 0, cell.pre(0, steps[t], h))
            out[t] = h
        ys.append(out)
        hs.append(h)
    return _outputs(ctx, ys, [hs], layout)


@converter("GRU")
def gru(ctx: Context, node) -> list[Value]:
    x, layout, seq, batch, hidden, dirs, act, steps = _setup(ctx, 3, ["Sigmoid", "Tanh"])
    before_reset = ctx.attr("linear_before_reset", 0)
    ys, hs = [], []
    for d, direction in enumerate(dirs):
        cell = _Cell(ctx, d, 3, hidden, x)
        h = _initial(ctx, 5, d, batch, hidden)
        out = [None] * seq
        one = ctx.lit(1, x.dtype)
        for t in (range(seq) if direction == "forward" else reversed(range(seq))):
            z = act(d, 0, cell.pre(0, steps[t], h))
            r = act(d, 0, cell.pre(1, steps[t], h))
            if h is None:
                n = act(d, 1, cell.pre(2, steps[t], None))
                h = ctx.let(f"({one} - {z}) * {n}", "H")
            else:
                if before_reset:
                    rh = cell.product(h, cell.r[2])
                    if cell.rb is not None:
                        rh = ctx.let(f"{rh} + {cell.rb[2]}")
                    inner = cell.pre(2, steps[t], None, with_r_bias=False)
                    n = act(d, 1, ctx.let(f"{inner} + {r} * {rh}"))
                else:
                    gated = ctx.let(f"{r} * {h}")
                    n = act(d, 1, cell.pre(2, steps[t], gated))
                h = ctx.let(f"({one} - {z}) * {n} + {z} * {h}", "H")
            out[t] = h
        ys.append(out)
        hs.append(h)
    return _outputs(ctx, ys, [hs], layout)


@converter("LSTM")
def lstm(ctx: Context, node) -> list[Value]:
    x, layout, seq, batch, hidden, dirs, act, steps = _setup(ctx, 4, ["Sigmoid", "Tanh", "Tanh"])
    if ctx.attr("input_forget", 0):
        raise ctx.unsupported("input_forget")
    ys, hs, cs = [], [], []
    for d, direction in enumerate(dirs):
        cell = _Cell(ctx, d, 4, hidden, x)
        h = _initial(ctx, 5, d, batch, hidden)
        c = _initial(ctx, 6, d, batch, hidden)
        peep = None
        if ctx.has(7):
            pd = reshape(ctx, take(ctx, ctx.input(7), 0, [d]), (3, hidden))
            peep = [reshape(ctx, take(ctx, pd, 0, [k]), (hidden,)) for k in range(3)]
        out = [None] * seq
        for t in (range(seq) if direction == "forward" else reversed(range(seq))):
            pre = [cell.pre(g, steps[t], h) for g in range(4)]  # i, o, f, c
            if peep is not None and c is not None:
                pre[0] = ctx.let(f"{pre[0]} + {peep[0]} * {c}")
                pre[2] = ctx.let(f"{pre[2]} + {peep[2]} * {c}")
            i, f, g = act(d, 0, pre[0]), act(d, 0, pre[2]), act(d, 1, pre[3])
            c = ctx.let(f"{i} * {g}" if c is None else f"{f} * {c} + {i} * {g}", "C")
            if peep is not None:
                pre[1] = ctx.let(f"{pre[1]} + {peep[1]} * {c}")
            o = act(d, 0, pre[1])
            h = ctx.let(f"{o} * {act(d, 2, c)}", "H")
            out[t] = h
        ys.append(out)
        hs.append(h)
        cs.append(c)
    return _outputs(ctx, ys, [hs, cs], layout)
