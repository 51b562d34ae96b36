"""Numeric operators of the ``ai.onnx.ml`` domain (Binarizer, ArrayFeatureExtractor) and
TfIdfVectorizer over integer tokens.

TfIdfVectorizer counts each n-gram of its (constant) pool: for every skip distance, the token
slices ``X[i + j*(skip+1)]`` are compared with the n-gram's tokens and the matches summed along
the sequence; each count is scattered to its output column by a constant one-hot row.
"""

from __future__ import annotations

import numpy as np

from tile.dtypes import DType
from tile.onnx.context import Context, Value
from tile.onnx.ops_shape import gather_axis, reshape, take, wrap_negative
from tile.onnx.registry import converter
from tile.ops.reduce import contraction

ML = "ai.onnx.ml"


@converter(f"{ML}:Binarizer")
def binarizer(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    t = ctx.lit(ctx.attr("threshold", 0.0), x.dtype)
    return [ctx.let(f"{x} > {t} ? {ctx.lit(1, x.dtype)} : {ctx.lit(0, x.dtype)}", "Binarized")]


@converter(f"{ML}:ArrayFeatureExtractor")
def array_feature_extractor(ctx: Context, node) -> list[Value]:
    x, ind = ctx.input(0), ctx.input(1)
    ind = reshape(ctx, ind, (ind.size,))
    return [gather_axis(ctx, x, wrap_negative(ctx, ind, x.shape[-1]), x.rank - 1)]


@converter("TfIdfVectorizer")
def tfidf(ctx: Context, node) -> list[Value]:
    x = ctx.input(0)
    if x.dtype.is_float or x.dtype is DType.BOOL:
        raise ctx.unsupported(f"tokens of type {x.dtype} (integer tokens only)")
    lo, hi = ctx.attr("min_gram_length"), ctx.attr("max_gram_length")
    max_skip, mode = ctx.attr("max_skip_count"), ctx.attr("mode")
    starts = list(ctx.attr("ngram_counts"))
    columns = list(ctx.attr("ngram_indexes"))
    pool = list(ctx.attr("pool_int64s", ()))
    if not pool:
        raise ctx.unsupported("a string pool")
    weights = list(ctx.attr("weights", ())) or [1.0] * len(columns)
    width = max(columns) + 1
    rows = x.shape[0] if x.rank == 2 else 1
    seq = reshape(ctx, x, (rows, x.shape[-1]))
    length = seq.shape[1]
    grams = []  # (tokens, column, weight) of each pool n-gram, n = 1, 2, ...
    bounds = [*starts, len(pool)]
    k = 0
    for n in range(1, len(starts) + 1):
        for p in range(bounds[n - 1], bounds[n], n):
            grams.append((pool[p:p + n], columns[k], weights[k]))
            k += 1
    out = None
    for tokens, column, weight in grams:
        n = len(tokens)
        if not lo <= n <= hi:
            continue
        hits = []
        for skip in range(max_skip + 1 if n > 1 else 1):
            span = (n - 1) * (skip + 1)
            if span >= length:
                continue
            count = length - span
            match = " & ".join(
                f"({take(ctx, seq, 1, np.arange(j * (skip + 1), j * (skip + 1) + count))} == "
                f"{ctx.lit(tok, seq.dtype)})" for j, tok in enumerate(tokens))
            m = ctx.let(f"as_float({match}, 32)", "Match")
            summed = contraction("$", "+", m.name, 2, [1], True, [str(rows), str(count)])
            hits.append(ctx.emit(summed, "Count"))
        if not hits:
            continue
        total = ctx.let(" + ".join(h.name for h in hits), "Count") if len(hits) > 1 else hits[0]
        one = ctx.lit(1, DType.FLOAT32)
        value = {"TF": total.name, "IDF": f"({total} > {ctx.lit(0, DType.FLOAT32)} ? {one} : "
                 f"{ctx.lit(0, DType.FLOAT32)}) * {ctx.lit(weight, DType.FLOAT32)}",
                 "TFIDF": f"{total} * {ctx.lit(weight, DType.FLOAT32)}"}[mode]
        onehot = ctx.constant((np.arange(width) == column).astype(np.float32).reshape(1, width))
        term = ctx.let(f"{value} * {onehot}", "Column")
        out = term if out is None else ctx.let(f"{out} + {term}", "Counts")
    if out is None:
        out = ctx.constant(np.zeros((rows, width), np.float32))
    return [reshape(ctx, out, (width,) if x.rank == 1 else (rows, width))]


_COMPARE = {0: "<=", 1: "<", 2: ">=", 3: ">", 4: "==", 5: "!="}


@converter(f"{ML}:TreeEnsemble")
def tree_ensemble(ctx: Context, node) -> list[Value]:
    """Constant trees as arithmetic: each leaf's indicator is the AND of the branch conditions on
    its path (elementwise over the rows), and each target sums its leaves' weights times their
    indicators (``aggregate_function`` SUM or AVERAGE)."""
    x = ctx.input(0)
    a = {k: ctx.attr(k, None) for k in (
        "aggregate_function", "leaf_targetids", "leaf_weights", "n_targets", "nodes_falseleafs",
        "nodes_falsenodeids", "nodes_featureids", "nodes_modes", "nodes_splits", "nodes_trueleafs",
        "nodes_truenodeids", "post_transform", "tree_roots", "membership_values",
        "nodes_missing_value_tracks_true")}
    agg = 1 if a["aggregate_function"] is None else int(a["aggregate_function"])
    tracks = any(a["nodes_missing_value_tracks_true"] or ())
    if agg not in (0, 1) or (a["post_transform"] or 0) != 0 or tracks:
        raise ctx.unsupported("only SUM/AVERAGE aggregation, no post transform and no missing-value tracking")
    modes = [int(m) for m in np.asarray(a["nodes_modes"]).ravel()]
    splits = np.asarray(a["nodes_splits"], dtype=np.float64).ravel()
    members, groups = {}, []
    if a["membership_values"] is not None:
        current = []
        for v in np.asarray(a["membership_values"], dtype=np.float64).ravel():
            if np.isnan(v):
                groups.append(current)
                current = []
            else:
                current.append(v)
        groups.append(current)
        for k, m in enumerate(i for i, mode in enumerate(modes) if mode == 6):
            members[m] = groups[k] if k < len(groups) else []
    rows = x.shape[0]
    columns = {}

    def feature(f: int) -> Value:
        if f not in columns:
            columns[f] = reshape(ctx, take(ctx, x, 1, [f]), (rows,))
        return columns[f]

    def test(k: int) -> str:
        col = feature(int(a["nodes_featureids"][k]))
        if modes[k] == 6:
            return " | ".join(f"({col} == {ctx.lit(v, x.dtype)})" for v in members[k]) or f"({col} != {col})"
        return f"({col} {_COMPARE[modes[k]]} {ctx.lit(splits[k], x.dtype)})"

    leaves: dict[int, list[str]] = {}

    def walk(k: int, path: list[str]) -> None:
        cond = ctx.let(test(k), "Branch")
        for taken, ids, is_leaf in ((cond.name, "nodes_truenodeids", "nodes_trueleafs"),
                                    (f"~{cond}", "nodes_falsenodeids", "nodes_falseleafs")):
            nxt = int(a[ids][k])
            if a[is_leaf][k]:
                leaves.setdefault(nxt, []).append(" & ".join([*path, taken]))
            else:
                walk(nxt, [*path, taken])

    for root in a["tree_roots"]:
        walk(int(root), [])
    out = np.zeros((1, int(a["n_targets"])))
    total = None
    for leaf, paths in leaves.items():
        onehot = out.copy()
        onehot[0, int(a["leaf_targetids"][leaf])] = a["leaf_weights"][leaf]
        row = ctx.constant(onehot.astype(x.dtype.numpy), x.dtype)
        for p in paths:
            hit = reshape(ctx, ctx.cast(ctx.let(p, "Leaf"), x.dtype), (rows, 1))
            term = ctx.let(f"{hit} * {row}", "Weighted")
            total = term if total is None else ctx.let(f"{total} + {term}", "Sum")
    if agg == 0:
        total = ctx.let(f"{total} / {ctx.lit(len(a['tree_roots']), x.dtype)}", "Average")
    return [total]
