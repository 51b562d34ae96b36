"""Drawn contractions (the ``contractions`` family): convolutions and pools, general affine and
rational contractions, rank 3-5 outputs, and the sweep of every aggregation (``conformance.sweeps``)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from conformance import sweeps
from conformance.case import AGGS, CONTRACTION_DTYPES, Case, small_ints


# --------------------------------------------------------------------------- contractions
@st.composite
def conv_like(draw):
    """1-D/2-D convolutions and pools with stride, dilation, padding and odd output sizes."""
    rank = draw(st.integers(1, 2))
    size = [draw(st.integers(3, 7)) for _ in range(rank)]
    k = [draw(st.integers(1, 3)) for _ in range(rank)]
    stride = [draw(st.integers(1, 3)) for _ in range(rank)]
    dil = [draw(st.integers(1, 2)) for _ in range(rank)]
    pad = [draw(st.integers(0, 1)) for _ in range(rank)]
    natural = [
        max(1, (s + 2 * p - d * (kk - 1) - 1) // st_ + 1)
        for s, p, d, kk, st_ in zip(size, pad, dil, k, stride)
    ]
    out = [n + draw(st.integers(-1, 1)) for n in natural]
    out = [max(1, o) for o in out]
    xs = [f"x{i}" for i in range(rank)]
    ks = [f"k{i}" for i in range(rank)]
    idx = [f"{st_}*{x} + {d}*{kk} - {p}" for x, kk, st_, d, p in zip(xs, ks, stride, dil, pad)]
    pool = draw(st.booleans())
    agg = draw(st.sampled_from(["+", ">", "<"] if pool else ["+"]))
    if pool:
        cons = ", ".join(f"{kk} < {n}" for kk, n in zip(ks, k))
        body = (
            f"O[{', '.join(xs)}, c: {', '.join(map(str, out))}, C] = {agg}(I[{', '.join(idx)}, c]), {cons};"
        )
        header = f"function (I[{', '.join('X' + str(i) for i in range(rank))}, C]) -> (O)"
        shapes = {"I": (*size, 2)}
    else:
        body = (
            f"O[{', '.join(xs)}, co: {', '.join(map(str, out))}, CO] = "
            f"+(I[{', '.join(idx)}, ci] * K[{', '.join(ks)}, ci, co]);"
        )
        header = (
            f"function (I[{', '.join('X' + str(i) for i in range(rank))}, CI], "
            f"K[{', '.join('K' + str(i) for i in range(rank))}, CI, CO]) -> (O)"
        )
        shapes = {"I": (*size, 2), "K": (*k, 2, 3)}
    return f"{header} {{ {body} }}", shapes, int(np.prod(k)) * 2


@st.composite
def general(draw):
    """Affine contractions: multi-variable and rational output indices, constraints, every comb op."""
    nv = draw(st.integers(1, 3))
    vs = ["i", "j", "k"][:nv]
    out_rank = draw(st.integers(0, min(2, nv)))

    def poly(anchor: str | None) -> str:
        terms = []
        for v in vs:
            c = 1 if v == anchor else draw(st.sampled_from([0, 0, 0, 1, -1, 2]))
            if c:
                terms.append(f"{c}*{v}" if c != 1 else v)
        den = draw(st.sampled_from([1, 1, 1, 2])) if anchor is None else 1
        text = " + ".join(terms) or "0"
        off = draw(st.integers(-1, 1))
        text = f"({text})/{den}" if den != 1 else text
        return f"{text} + {off}" if off else text

    out_polys = [poly(vs[d]) if draw(st.booleans()) else vs[d] for d in range(out_rank)]
    comb = draw(st.sampled_from(["", "*", "+", "==", "?"]))
    n_ops = {"": 1, "*": 2, "+": 2, "==": 2, "?": 3}[comb]
    names = ["A", "B", "C"][:n_ops]
    op_polys = []
    for n in range(n_ops):
        rank = draw(st.integers(1, 2))
        op_polys.append([poly(vs[(n + d) % nv]) for d in range(rank)])
    cons = []
    for v in vs:  # every index bounded on its own
        if draw(st.integers(0, 3)) == 0:
            cons.append(f"{v} < {draw(st.integers(1, 4))}")
    agg = draw(st.sampled_from(AGGS if comb not in ("==",) else [">", "<"]))
    if agg == "=" and draw(st.booleans()):
        agg = ">"  # half the time: a `=` that writes twice is refused, which the targets must match
    sizes = [draw(st.integers(1, 5)) for _ in out_polys]
    outs = ", ".join(out_polys)
    out_spec = f"O[{outs}: {', '.join(map(str, sizes))}]" if out_polys else "O[]"
    refs = [f"{n}[{', '.join(p)}]" for n, p in zip(names, op_polys)]
    body = (
        refs[0]
        if comb == ""
        else f"{refs[0]} == {refs[1]} ? {refs[2]}"
        if comb == "?"
        else f" {comb} ".join(refs)
    )
    default = draw(st.booleans()) and comb != "=="
    tail = "".join(f", {c}" for c in cons) + (" default D" if default else "")
    header = ", ".join(names + (["D"] if default else []))
    src = f"function ({header}) -> (O) {{ {out_spec} = {agg}({body}){tail}; }}"
    shapes = {n: tuple(draw(st.integers(1, 4)) for _ in p) for n, p in zip(names, op_polys)}
    if default:
        shapes["D"] = tuple(sizes)
    return src, shapes, 16


@st.composite
def high_rank(draw):
    """Rank 3–5 outputs over up to 6 index variables: transposes, broadcasts, partial reductions,
    an occasional shifted/strided/rational access, sizes off natural, every aggregation."""
    out_rank = draw(st.integers(3, 5))
    vs = [f"i{d}" for d in range(out_rank + draw(st.integers(0, 6 - out_rank)))]
    permute = draw(st.integers(0, 2)) == 0  # a transpose or broadcast: every element written once
    if permute:
        vs = vs[:out_rank]
    outs, summed = vs[:out_rank], vs[out_rank:]
    size = {v: draw(st.integers(1, 3)) for v in vs}
    comb = draw(st.sampled_from(["", "*", "+"]))
    names = ["A"] if comb == "" else ["A", "B"]
    reads: dict[str, list[str]] = {n: [] for n in names}
    for v in summed:  # a summed index must be read somewhere, or nothing bounds it
        reads[draw(st.sampled_from(names))].append(v)
    for v in outs:
        for n in names:
            if draw(st.booleans()):
                reads[n].append(v)
    polys, shapes = {}, {}
    for n in names:
        vars_ = draw(st.permutations(reads[n]))[:5] or [draw(st.sampled_from(outs))]
        ps, dims = [], []
        for v in vars_:
            form = "v" if permute else draw(st.sampled_from(["v", "v", "v", "v+1", "2v", "v/2", "v+w"]))
            w = draw(st.sampled_from(vs))
            text, top = {
                "v": (v, size[v] - 1),
                "v+1": (f"{v} + 1", size[v]),
                "2v": (f"2*{v}", 2 * size[v] - 2),
                "v/2": (f"{v}/2", (size[v] - 1) // 2),
                "v+w": (f"{v} + {w}", size[v] + size[w] - 2),
            }[form]
            ps.append(text)
            dims.append(max(1, top + 1 - draw(st.integers(0, 1))))  # sometimes one short: skipping
        polys[n], shapes[n] = ps, tuple(dims)
    injective = not summed and all(p in outs for n in names for p in polys[n])
    agg = draw(st.sampled_from(["=", "="] + AGGS if injective else AGGS[:-1]))
    sizes = [max(1, size[v] + draw(st.integers(-1, 1))) for v in outs]
    cons = [f"{v} < {size[v]}" for v in summed if draw(st.integers(0, 3)) == 0]
    default = draw(st.integers(0, 3)) == 0
    refs = [f"{n}[{', '.join(polys[n])}]" for n in names]
    body = refs[0] if comb == "" else f" {comb} ".join(refs)
    tail = "".join(f", {c}" for c in cons) + (" default D" if default else "")
    header = ", ".join(names + (["D"] if default else []))
    src = (
        f"function ({header}) -> (O) {{ O[{', '.join(outs)}: {', '.join(map(str, sizes))}] = "
        f"{agg}({body}){tail}; }}"
    )
    if default:
        shapes["D"] = tuple(sizes)
    return src, shapes, int(np.prod([size[v] for v in summed]))


@st.composite
def contraction_sweep(draw, large: bool = True, all_types: bool = True) -> Case:
    """Every aggregation and combination at once, over rows that tell each from its neighbours
    (``conformance.sweeps``), as often as not at the large extents (``large``), with every integer
    type's max and sum (``all_types``): a share of the draws, so among a run's first examples."""
    dtype = draw(st.sampled_from(CONTRACTION_DTYPES))
    seed = draw(st.integers(0, 2**32 - 1))
    large = large and draw(st.booleans())
    src, inputs, length = sweeps.contraction_program(dtype, seed, large, all_types)
    return Case("contraction", src, inputs, length=length)


def contractions(large: bool = True, all_types: bool = True) -> st.SearchStrategy[Case]:
    """Drawn contractions, or (a third of the draws) the sweep (``large``: now and then at
    ``sweeps.LARGE``; ``all_types``: with every integer type)."""
    # (the sweep last: a failure shrinks away from it. A third, not a half: each sweep holds every
    # integer type, 32-41 kernels, and a family that passes compiles each; a mutant's text-level
    # defect compiles them without the cache)
    return st.one_of(drawn_contractions(), drawn_contractions(), contraction_sweep(large, all_types))


@st.composite
def drawn_contractions(draw) -> Case:
    src, shapes, length = draw(st.one_of(conv_like(), general(), high_rank()))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = draw(st.sampled_from(CONTRACTION_DTYPES))
    mixed_types = draw(st.integers(0, 3)) == 0  # now and then each input its own type: promotion
    inputs = {
        n: small_ints(rng, s, draw(st.sampled_from(CONTRACTION_DTYPES)) if mixed_types else dtype)
        for n, s in shapes.items()
    }
    return Case("contraction", src, inputs, length=length)
