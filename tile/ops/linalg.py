"""Linear algebra: linear (a dense layer), matmul and bmm.

``linear``: inputs ``X[D0 .., K]``, ``W[O, K]`` (PyTorch's layout), ``B[O]`` when ``bias``.
``matmul``/``bmm``: inputs ``A`` and ``B``. Output ``Y``.
"""

from __future__ import annotations

from tile.ops._build import check_rank, decl, dims, function, out, ref

# The PyTorch function each op computes, as data for the op reference (python -m tile.ops.doc);
# tests/test_ops_doc.py checks that every name exists in torch (``{nd}``: 1, 2 and 3).
TORCH: dict[str, str] = {
    "linear": "torch.nn.functional.linear",
    "matmul": "torch.matmul",
    "bmm": "torch.bmm",
}


def linear(*, rank: int = 2, bias: bool = True) -> str:
    """``torch.nn.functional.linear``: ``Y = X @ W.T + B`` over the last axis of a rank-``rank`` X."""
    check_rank(rank, 1)
    lead = dims("D", rank - 1)
    idx = [f"i{a}" for a in range(rank - 1)]
    y = "Yc" if bias else "Y"
    body = [f"{out(y, [*idx, 'o'], [*lead, 'O'])} = +({ref('X', [*idx, 'k'])} * W[o, k])"]
    inputs = [decl("X", [*lead, "K"]), decl("W", ["O", "K"])]
    if bias:
        inputs.append(decl("B", ["O"]))
        body.append("Y = Yc + B")
    return function(inputs, ["Y"], body)


def matmul(*, rank_a: int = 2, rank_b: int = 2) -> str:
    """``torch.matmul`` for a rank-``rank_a`` A and a rank-``rank_b`` B: a 1-D operand is a vector
    (its axis is dropped from the result), batch axes line up from the right and the result has
    the longer operand's. Batch sizes must be equal where both have the axis: a size-1 batch axis is
    not broadcast against a longer one (a bind-time size error names it)."""
    check_rank(rank_a, 1)
    check_rank(rank_b, 1)
    batch = max(max(rank_a, rank_b) - 2, 0)
    bdims, bidx = dims("Z", batch), [f"b{a}" for a in range(batch)]
    if rank_a == 1:
        a_idx, a_dims, rows, rsize = ["k"], ["K"], [], []
    else:
        nb = rank_a - 2
        a_idx = [*bidx[batch - nb:], "i", "k"]
        a_dims, rows, rsize = [*bdims[batch - nb:], "M", "K"], ["i"], ["M"]
    if rank_b == 1:
        b_idx, b_dims, cols, csize = ["k"], ["K"], [], []
    else:
        nb = rank_b - 2
        b_idx = [*bidx[batch - nb:], "k", "j"]
        b_dims, cols, csize = [*bdims[batch - nb:], "K", "N"], ["j"], ["N"]
    body = [f"{out('Y', [*bidx, *rows, *cols], [*bdims, *rsize, *csize])} = "
            f"+({ref('A', a_idx)} * {ref('B', b_idx)})"]
    return function([decl("A", a_dims), decl("B", b_dims)], ["Y"], body)


def bmm() -> str:
    """``torch.bmm``: ``A[Z, M, K] @ B[Z, K, N]``."""
    return matmul(rank_a=3, rank_b=3)
