"""Matrix products: MatMul (numpy's batch broadcasting), Gemm, Einsum.

Each is one ``+`` contraction. A batch axis of size 1 broadcasts against a longer one by reading
index 0 there (``tile.ops.matmul`` requires equal batch sizes, so the general form is written here).
"""

from __future__ import annotations

import numpy as np

from tile.onnx.context import Context, Value
from tile.onnx.ops_shape import idx, reshape, target
from tile.onnx.panels import a_panels, panel_gemm, panel_weight
from tile.onnx.registry import converter
from tile.onnx.views import read, read_merged


def _batch_index(x_batch, batch, names: list[str]) -> list[str]:
    lead = len(batch) - len(x_batch)
    return ["0" if d == 1 and batch[lead + k] != 1 else names[lead + k] for k, d in enumerate(x_batch)]


def matmul(ctx: Context, a: Value, b: Value) -> Value:
    """``numpy.matmul(a, b)``."""
    a2 = a if a.rank >= 2 else reshape(ctx, a, (1, a.shape[0]))
    b2 = b if b.rank >= 2 else reshape(ctx, b, (b.shape[0], 1))
    m, k = a2.shape[-2:]
    k2, n = b2.shape[-2:]
    if k != k2:
        raise ctx.error(f"inner sizes differ: {a.shape} @ {b.shape}")
    try:
        batch = tuple(np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
    except ValueError:
        raise ctx.error(f"batch shapes do not broadcast: {a.shape} @ {b.shape}") from None
    bi = idx(len(batch), "b")
    ai = [*_batch_index(a2.shape[:-2], batch, bi), "i", "k"]
    bj = [*_batch_index(b2.shape[:-2], batch, bi), "k", "j"]
    shape = [*batch, m, n]
    if k == 0 or 0 in shape:
        return ctx.folded(np.zeros(shape, a.dtype.numpy), a.dtype)
    bounds: list[str] = []
    a_read, subst = read_merged(ctx, a2, ai, bounds, {"k"}) if ctx.b.views.get(b2.name) is None else \
        (read(ctx, a2, ai, bounds), {})
    product = f"{a_read} * {read(ctx, b2, [subst.get(n, n) for n in bj], bounds)}"
    y = ctx.emit(f"{target('$', [*bi, 'i', 'j'], shape)} = +({product}){''.join(', ' + c for c in bounds)}",
                 "MatMul")
    final = [*batch, *([m] if a.rank >= 2 else []), *([n] if b.rank >= 2 else [])]
    return reshape(ctx, y, final) if list(final) != shape else y


@converter("MatMul")
def matmul_node(ctx: Context, node) -> list[Value]:
    a, b = ctx.input(0), ctx.input(1)
    return [ctx.cast(matmul(ctx, a, b), a.dtype)]


@converter("Gemm")
def gemm(ctx: Context, node) -> list[Value]:
    """With ``pack`` (the backend's import), a constant ``B`` given transposed (``transB``, as
    PyTorch exports Linear) is stored K-major: the 64 x 512 x 512 product of bench.onnx_models' MLP
    takes a quarter less time on ``llvm_cpu.0`` reading ``B[k, j]`` than ``B[j, k]``; where it
    spans whole panels, panel by panel (``panels``), and ``A`` is read from its panels."""
    a = ctx.input(0)
    ta, tb = ctx.attr("transA", 0), ctx.attr("transB", 0)
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    raw = ctx.raw(1)
    if ctx.b.pack and raw.const is not None and raw.rank == 2 and not ta and alpha == 1 and beta in (0, 1):
        w = raw.const.T if tb else raw.const  # K-major
        bias = ctx.raw(2) if ctx.has(2) and beta else None
        if a.dtype is raw.dtype and panel_weight(ctx, w, raw.dtype, bias):
            return [panel_gemm(ctx, a, w, bias, node.input[1])]
    if tb and ctx.b.pack and raw.const is not None and raw.rank == 2:
        b, tb = ctx.b.materialize(ctx.folded(raw.const.T.copy(), raw.dtype), f"{node.input[1]}_kmajor"), 0
    else:
        b = ctx.input(1)
    m = a.shape[1] if ta else a.shape[0]
    n = b.shape[0] if tb else b.shape[1]
    a_read, k_at = (f"{a}[k, i]", "k") if ta else a_panels(ctx, a)
    bj = f"j, {k_at}" if tb else f"{k_at}, j"
    y = ctx.emit(f"$[i, j: {m}, {n}] = +({a_read} * {b}[{bj}])", "Gemm")
    if alpha != 1:
        y = ctx.let(f"{ctx.lit(alpha, y.dtype)} * {y}", "Gemm")
    if ctx.has(2) and beta != 0:
        c = ctx.input(2)
        term = c.name if beta == 1 else f"{ctx.lit(beta, c.dtype)} * {c}"
        y = ctx.let(f"{y} + {term}", "Gemm")
    return [ctx.cast(y, a.dtype)]


def _parse_einsum(ctx: Context, equation: str, ranks: list[int]) -> tuple[list[list[str]], list[str]]:
    """Each operand's and the output's axis labels, ``...`` expanded to labels ``.0``, ``.1``, ..
    (aligned from the right, as numpy broadcasts them)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ctx.error(f"equation '{equation}' has {len(terms)} operands, the node {len(ranks)}")
    ell = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0)

    def labels(term: str, rank: int | None) -> list[str]:
        head, dots, tail = term.partition("...")
        n = (rank - len(head) - len(tail)) if rank is not None else ell
        return [*head, *([f".{ell - n + j}" for j in range(n)] if dots else []), *tail]

    ops = [labels(t, r) for t, r in zip(terms, ranks)]
    if arrow:
        out = labels(rhs, None)
    else:
        counts: dict[str, int] = {}
        for o in ops:
            for lab in o:
                counts[lab] = counts.get(lab, 0) + 1
        out = [f".{j}" for j in range(ell)] + sorted(c for c, n in counts.items() if n == 1 and c[0] != ".")
    return ops, out


@converter("Einsum")
def einsum(ctx: Context, node) -> list[Value]:
    xs = ctx.inputs()
    ops, out = _parse_einsum(ctx, ctx.attr("equation"), [x.rank for x in xs])
    size: dict[str, int] = {}
    for x, labels in zip(xs, ops):
        for lab, d in zip(labels, x.shape):
            if d != 1 or lab not in size:
                size[lab] = max(size.get(lab, 1), d) if d != 1 else size.get(lab, 1)
    names = {lab: f"x{n}" for n, lab in enumerate(sorted(size))}

    def ref(x: Value, labels: list[str]) -> str:
        at = ["0" if d == 1 and size[lab] != 1 else names[lab] for lab, d in zip(labels, x.shape)]
        return f"{x}[{', '.join(at)}]"

    acc, acc_labels = xs[0], ops[0]
    if len(xs) == 1:
        lhs = target("$", [names[c] for c in out], [size[c] for c in out])
        y = ctx.emit(f"{lhs} = +({ref(acc, acc_labels)})", "Einsum")
        return [ctx.cast(y, xs[0].dtype)]
    for k in range(1, len(xs)):
        later = {c for o in ops[k + 1:] for c in o} | set(out)
        keep = out if k == len(xs) - 1 else [c for c in dict.fromkeys(acc_labels + ops[k]) if c in later]
        acc = ctx.emit(f"{target('$', [names[c] for c in keep], [size[c] for c in keep])} = "
                       f"+({ref(acc, acc_labels)} * {ref(xs[k], ops[k])})", "Einsum")
        acc_labels = keep
    return [ctx.cast(acc, xs[0].dtype)]
