"""Normalisation: softmax and log-softmax along an axis; layer, batch and group norm.

Input ``X`` (dims ``D0 ..`` for the softmaxes and layer norm; ``X[N, C, L0, ..]`` or
``X[N, L0, .., C]`` for batch and group norm), output ``Y``. Affine parameters are ``W`` (scale)
and ``B`` (shift); batch norm's running statistics are ``Mean`` and ``Var``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tile.ops._build import axis, check_rank, decl, dims, function, layout_of, lit, product
from tile.ops.reduce import contraction, variance_lines

# The PyTorch function each op computes, as data for the op reference (python -m tile.ops.doc);
# tests/test_ops_doc.py checks that every name exists in torch (``{nd}``: 1, 2 and 3).
TORCH: dict[str, str] = {
    "softmax": "torch.softmax",
    "log_softmax": "torch.log_softmax",
    "layer_norm": "torch.nn.functional.layer_norm",
    "batch_norm": "torch.nn.functional.batch_norm",
    "group_norm": "torch.nn.functional.group_norm",
}


def softmax_lines(src: str, dst: str, rank: int, a: int, log: bool, names: Sequence[str],
                  prefix: str = "") -> list[str]:
    """``dst = (log_)softmax(src)`` along axis ``a``. The last axis goes to the row builtins
    (``builtin_softmax``: a fused row kernel and an exact row-sum gradient); another axis takes the
    maximum, exponentials and their sum as contractions."""
    p = prefix
    fn = "builtin_logsoftmax" if log else "builtin_softmax"
    if a == rank - 1:
        rows = product(list(names[:-1]))
        return [f"{p}Rows = reshape({src}, {rows}, {names[-1]})",
                f"{p}Soft = {fn}({p}Rows, {rows}, {names[-1]})",
                f"{dst} = reshape({p}Soft, {', '.join(names)})"]
    lines = [contraction(f"{p}Top", ">", src, rank, [a], True, names),
             f"{p}Shift = {src} - {p}Top",
             f"{p}Exp = exp({p}Shift)",
             contraction(f"{p}Total", "+", f"{p}Exp", rank, [a], True, names)]
    lines.append(f"{dst} = {p}Shift - log({p}Total)" if log else f"{dst} = {p}Exp / {p}Total")
    return lines


def softmax(*, rank: int, axis: int = -1) -> str:
    """``torch.softmax``."""
    return _softmax(rank, axis, False)


def log_softmax(*, rank: int, axis: int = -1) -> str:
    """``torch.log_softmax``."""
    return _softmax(rank, axis, True)


def _softmax(rank: int, a: int, log: bool) -> str:
    check_rank(rank, 1)
    names = dims("D", rank)
    return function([decl("X", names)], ["Y"], softmax_lines("X", "Y", rank, axis(a, rank), log, names))


def layer_norm(*, rank: int, normalized_ndim: int = 1, eps: float = 1e-5, weight: bool = True,
               bias: bool = True) -> str:
    """``torch.nn.functional.layer_norm`` over the last ``normalized_ndim`` axes, with ``W`` and
    ``B`` of those axes' shape when ``weight`` / ``bias``."""
    check_rank(rank, 1)
    if not 1 <= normalized_ndim <= rank:
        raise ValueError(f"normalized_ndim must be in 1..{rank}, not {normalized_ndim}")
    names = dims("D", rank)
    red = list(range(rank - normalized_ndim, rank))
    body = variance_lines("X", rank, red, True, 0)
    body.append(f"Rstd = 1.0 / sqrt(Var + {lit(eps)})")
    inputs = [decl("X", names)]
    _affine(inputs, body, "Dev * Rstd", weight, bias, names[rank - normalized_ndim:], lambda p: p)
    return function(inputs, ["Y"], body)


def _affine(inputs: list[str], body: list[str], y: str, weight: bool, bias: bool,
            shape: Sequence[str], view: Callable[[str], str]) -> None:
    """``Y = y``, times ``W`` and plus ``B`` (inputs of dims ``shape``, read as ``view(name)``)
    where ``weight`` / ``bias``."""
    if weight:
        inputs.append(decl("W", shape))
        y = f"{y} * {view('W')}"
    if bias:
        inputs.append(decl("B", shape))
        y = f"{y} + {view('B')}"
    body.append(f"Y = {y}")


def _channel_dims(rank: int, last: bool) -> tuple[list[str], int]:
    spatial = [f"L{d}" for d in range(rank - 2)]
    return (["N", *spatial, "C"], rank - 1) if last else (["N", "C", *spatial], 1)


def _per_channel(name: str, rank: int, last: bool) -> str:
    """A [C] vector shaped to broadcast against the data (``reshape(V, C, 1, 1)`` channels-first)."""
    return name if last else f"reshape({name}, C{', 1' * (rank - 2)})"


def batch_norm(*, rank: int = 4, training: bool = False, eps: float = 1e-5, weight: bool = True,
               bias: bool = True, stats: bool = False, layout: str = "channels_first") -> str:
    """``torch.nn.functional.batch_norm``.

    Inference (``training=False``): inputs ``X, Mean, Var`` (the running statistics, each ``[C]``)
    then ``W``, ``B``. Training: inputs ``X`` then ``W``, ``B``; the statistics are the batch's
    (mean and biased variance over every axis but the channel). With ``stats=True`` a training op
    also returns ``BatchMean`` and ``BatchVar`` (unbiased, as PyTorch folds into its running
    variance), so the caller can update running statistics.
    """
    check_rank(rank, 2)
    last = rank > 2 and layout_of(layout, rank - 2)
    names, ch = _channel_dims(rank, last)
    inputs, outputs = [decl("X", names)], ["Y"]
    if training:
        red = [a for a in range(rank) if a != ch]
        body = variance_lines("X", rank, red, True, 0, dim_names=names)
        body.append(f"Rstd = 1.0 / sqrt(Var + {lit(eps)})")
        y = "Dev * Rstd"
        if stats:
            count = product([names[a] for a in red])
            outputs += ["BatchMean", "BatchVar"]
            body += ["BatchMean = reshape(Mean, C)",
                     f"BatchVar = reshape(SqSum, C) / ({count} - 1)"]
    else:
        if stats:
            raise ValueError("stats=True needs training=True: inference uses the given statistics")
        inputs += [decl("Mean", ["C"]), decl("Var", ["C"])]
        body = [f"Rstd = 1.0 / sqrt({_per_channel('Var', rank, last)} + {lit(eps)})",
                f"Dev = X - {_per_channel('Mean', rank, last)}"]
        y = "Dev * Rstd"
    _affine(inputs, body, y, weight, bias, ["C"], lambda p: _per_channel(p, rank, last))
    return function(inputs, outputs, body)


def group_norm(groups: int, *, rank: int = 4, eps: float = 1e-5, weight: bool = True, bias: bool = True,
               layout: str = "channels_first") -> str:
    """``torch.nn.functional.group_norm``: statistics per sample over each group of
    ``C / groups`` channels and every spatial position; ``W`` and ``B`` are per channel."""
    check_rank(rank, 2)
    if groups < 1:
        raise ValueError(f"groups must be at least 1, not {groups}")
    last = rank > 2 and layout_of(layout, rank - 2)
    names, _ = _channel_dims(rank, last)
    spatial = [f"L{d}" for d in range(rank - 2)]
    body = [f"CG = C / {groups}", f"Whole = assert_groups_divide_channels(C == {groups} * CG)"]
    if last:
        # [N, L.., G, CG] -> [N, L.. flattened, G, CG]; statistics over axes 1 and 3
        gnames = ["N", "P", str(groups), "CG"]
        body += [f"P = {product(spatial)}", f"Xg = reshape(X, N, P, {groups}, CG)"]
        red = [1, 3]
    else:
        gnames = ["N", str(groups), "E"]
        body += [f"E = CG * {product(spatial)}" if spatial else "E = CG", f"Xg = reshape(X, N, {groups}, E)"]
        red = [2]
    body += variance_lines("Xg", len(gnames), red, True, 0, dim_names=gnames)
    body += [f"Rstd = 1.0 / sqrt(Var + {lit(eps)})", "Ng = Dev * Rstd",
             f"Norm = reshape(Ng, {', '.join(names)})"]
    inputs, y = [decl("X", names)], "Norm"
    _affine(inputs, body, y, weight, bias, ["C"], lambda p: _per_channel(p, rank, last))
    return function(inputs, ["Y"], body)
