"""Scaled dot-product attention.

Inputs ``Q[.., L, E]``, ``K[.., S, E]``, ``V[.., S, EV]`` (the same leading axes), and ``M`` when
``mask`` is ``'bool'`` (True where attention is allowed) or ``'float'`` (added to the scores);
``M`` broadcasts against ``[.., L, S]`` (a float mask should have Q's dtype: a wider one promotes
the result, §4.1). Output ``Y[.., L, EV]``.
"""

from __future__ import annotations

from tile.ops._build import check_rank, decl, dims, function, lit, out, product, ref

# The PyTorch function each op computes, as data for the op reference (python -m tile.ops.doc);
# tests/test_ops_doc.py checks that every name exists in torch (``{nd}``: 1, 2 and 3).
TORCH: dict[str, str] = {
    "scaled_dot_product_attention": "torch.nn.functional.scaled_dot_product_attention",
}


def scaled_dot_product_attention(*, rank: int = 4, mask: str | None = None, is_causal: bool = False,
                                 scale: float | None = None) -> str:
    """``torch.nn.functional.scaled_dot_product_attention`` without dropout:
    ``softmax(Q @ K^T * scale + mask) @ V`` with ``scale = 1 / sqrt(E)`` unless given.

    A bool mask (or ``is_causal``, the lower triangle from the top-left corner) sets the disallowed
    scores to -inf, so a fully masked row is NaN, as in PyTorch. The default scale is computed in
    Q's own float type (``1 / sqrt(E)``, with E converted through a zero of that type) so float64
    attention keeps float64 precision."""
    check_rank(rank, 2)
    if mask not in (None, "bool", "float"):
        raise ValueError(f"mask must be None, 'bool' or 'float', not {mask!r}")
    lead = dims("Z", rank - 2)
    bidx = [f"b{k}" for k in range(rank - 2)]
    inputs = [decl("Q", [*lead, "L", "E"]), decl("K", [*lead, "S", "E"]), decl("V", [*lead, "S", "EV"])]
    body = [f"{out('Scores', [*bidx, 'l', 's'], [*lead, 'L', 'S'])} = "
            f"+({ref('Q', [*bidx, 'l', 'e'])} * {ref('K', [*bidx, 's', 'e'])})"]
    if scale is None:
        # a zero of Q's type with no arithmetic on Q's values: the conditional combination adds
        # 0 for every unequal pair (§6.4), and a coordinate never equals itself plus one
        zeros = ["0"] * rank
        body += ["Coord = index(Q, 0)", "Next = Coord + 1",
                 f"Zero[] = +({ref('Coord', zeros)} == {ref('Next', zeros)} ? {ref('Q', zeros)})",
                 "Scale = 1.0 / sqrt(Zero + E)", "Scaled = Scores * Scale"]
    else:
        body.append(f"Scaled = Scores * {lit(scale)}")
    logits = "Scaled"
    allowed = []
    if mask == "bool":
        inputs.append("M")
        allowed.append("M")
    if is_causal:
        body.append(f"Causal = index(Scaled, {rank - 1}) <= index(Scaled, {rank - 2})")
        allowed.append("Causal")
    if mask == "float":
        inputs.append("M")
        body.append("Biased = Scaled + M")
        logits = "Biased"
    if allowed:
        body.append(f"Masked = {' & '.join(allowed)} ? {logits} : -1.0 / 0.0")
        logits = "Masked"
    rows = product([*lead, "L"])
    body += [f"Rows = reshape({logits}, {rows}, S)", f"Weights = builtin_softmax(Rows, {rows}, S)",
             f"P = reshape(Weights, {', '.join([*lead, 'L', 'S'])})",
             f"{out('Y', [*bidx, 'l', 'v'], [*lead, 'L', 'EV'])} = "
             f"+({ref('P', [*bidx, 'l', 's'])} * {ref('V', [*bidx, 's', 'v'])})"]
    return function(inputs, ["Y"], body)
