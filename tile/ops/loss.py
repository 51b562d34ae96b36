"""Losses and regularisation: cross-entropy with integer class targets, and dropout from Tile's
PRNG.

``cross_entropy``: inputs ``X`` (logits, classes on axis 1) and ``T`` (class indices, any integer
dtype), output ``Y``. ``dropout``: inputs ``X`` and ``S`` (the PRNG state, uint32 ``[3, 2048]``),
outputs ``Y`` and ``S2`` (the next state).
"""

from __future__ import annotations

from tile.ops._build import check_rank, decl, dims, function, lit, out, product, ref
from tile.ops.norm import softmax_lines

# The PyTorch function each op computes, as data for the op reference (python -m tile.ops.doc);
# tests/test_ops_doc.py checks that every name exists in torch (``{nd}``: 1, 2 and 3).
TORCH: dict[str, str] = {
    "cross_entropy": "torch.nn.functional.cross_entropy",
    "dropout": "torch.nn.functional.dropout",
}


def cross_entropy(*, rank: int = 2, reduction: str = "mean") -> str:
    """``torch.nn.functional.cross_entropy(X, T)`` for logits ``X[N, C, ..]`` and targets
    ``T[N, ..]``: ``-log_softmax(X)[n, T[n]]``, then ``'mean'`` (over every target), ``'sum'`` or
    ``'none'``. A target outside ``0 .. C-1`` selects no class and contributes 0 (PyTorch raises).
    """
    check_rank(rank, 2)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', not {reduction!r}")
    names = ["N", "C", *dims("L", rank - 2)]
    if rank == 2:
        body = ["Logp = builtin_logsoftmax(X, N, C)"]
    else:
        body = softmax_lines("X", "Logp", rank, 1, True, names, prefix="Ls")
    idx = ["n", "c", *[f"l{k}" for k in range(rank - 2)]]
    tidx = [idx[0], *idx[2:]]
    tsizes = [names[0], *names[2:]]
    pick = f"{ref('T', tidx)} == {ref('Class', idx)} ? {ref('Logp', idx)}"
    body += ["Class = index(Logp, 1)", f"{out('Picked', tidx, tsizes)} = +({pick})"]
    if reduction == "none":
        body.append("Y = -Picked")
    else:
        body.append(f"Total[] = +({ref('Picked', tidx)})")
        body.append("Y = -Total" if reduction == "sum" else f"Y = -Total / ({product(tsizes)})")
    return function([decl("X", names), decl("T", tsizes)], ["Y"], body)


def dropout(p: float = 0.5, *, rank: int, training: bool = True) -> str:
    """``torch.nn.functional.dropout``: each element is kept with probability ``1 - p`` (a draw
    ``V < 1 - p`` of ``prng_value``, §5.8) and scaled by ``1 / (1 - p)``; dropped ones are 0. The
    state ``S`` comes in and ``S2`` goes out, so successive calls draw fresh masks. The draws are
    Tile's generator's, not PyTorch's. Not training (or ``p = 0``), it is ``Y = X`` with no state."""
    check_rank(rank)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], not {p}")
    names = dims("D", rank)
    if not training or p == 0.0:
        return function([decl("X", names)], ["Y"], ["Y = X"])
    keep = 1.0 - p
    body = [f"Draw = prng_step(S{''.join(', ' + d for d in names)})",
            "V = prng_value(Draw)",
            "S2 = prng_state(Draw)"]
    if p == 1.0:
        body.append("Y = X * 0.0")
    else:
        body.append(f"Y = V < {lit(keep)} ? X * {lit(1.0 / keep)} : 0.0")
    return function([decl("X", names), "S"], ["Y", "S2"], body)
