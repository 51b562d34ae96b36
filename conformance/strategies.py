"""Hypothesis strategies for valid Tile programs, with inputs: the conformance suite's families.

Each strategy draws a ``Case``: Tile source, input arrays, and how exactly a target must match the
interpreter (``exact``: integer-valued data whose every intermediate is exact in its type;
otherwise a tolerance in units of the output type's epsilon, scaled by the reduction length).

Families:
* ``contractions`` — rank 0–5 outputs, affine and rational index polynomials (strides, dilations,
  padding, skipping, reversal), constraints, output sizes smaller and larger than natural, every
  aggregation and combination, ``default``; six dtypes, now and then mixed within one program;
* ``elementwise`` — chains over every elementwise builtin with broadcasting and mixed dtypes, and
  chains through the structural builtins (reshape, shape, gather, scatter, softmaxes, casts);
* ``mixed`` — contractions and elementwise statements feeding each other, several outputs;
* ``gradients`` — gradient programs of drawn contractions, chains and mixed programs
  (``tile.gradient``);
* ``defracted`` — drawn contractions and mixed programs printed after reduce and defract;
* ``flat`` — the same printed at the flat stage as Tile over 1-D views of every tensor;
* ``sized`` — programs whose output sizes are 0-D inputs (a compiled target builds for their values);
* ``optimized`` — contractions, chains and mixed programs through every target config's passes,
  each pass checked by the Stripe interpreter (``conformance.optimized``), then on the target;
* ``products`` — matmuls, batched matmuls and convolutions (the GEMM shape) of random normal
  float32/float16/bfloat16 data, checked in each precision mode (``conformance.precision``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from conformance import sweeps
from conformance.conv_transpose import ConvT, size_arrays

AGGS = ["+", "*", ">", "<", "="]
INT_DTYPES = [np.int32, np.int8, np.int64, np.uint8]
FLOAT_DTYPES = [np.float32, np.float64, np.float16]


@dataclass
class Case:
    family: str
    source: str
    inputs: dict[str, np.ndarray]
    exact: bool = True
    ulps: float = 0.0  # tolerance in output-type epsilons, times the reduction length
    length: int = 1
    notes: dict = field(default_factory=dict)


def _array(rng: np.random.Generator, shape, dtype, lo=-3, hi=3) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind == "u":
        lo = 0
    return rng.integers(lo, hi + 1, shape).astype(dtype)


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


CONTRACTION_DTYPES = [np.float32, np.int32, np.float64, np.int8, np.uint8, np.int64]


@st.composite
def contraction_sweep(draw) -> Case:
    """Every aggregation and combination at once, over rows that tell each from its neighbours
    (``conformance.sweeps``): a third of the draws, so among a run's first examples."""
    dtype = draw(st.sampled_from(CONTRACTION_DTYPES))
    src, inputs, length = sweeps.contraction_program(dtype, draw(st.integers(0, 2**32 - 1)))
    return Case("contraction", src, inputs, length=length)


def contractions() -> st.SearchStrategy[Case]:
    return st.one_of(drawn_contractions(), contraction_sweep())  # (last: a failure shrinks away from it)


@st.composite
def drawn_contractions(draw) -> Case:
    src, shapes, length = draw(st.one_of(conv_like(), general(), high_rank()))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = draw(st.sampled_from(CONTRACTION_DTYPES))
    mixed_types = draw(st.integers(0, 3)) == 0  # now and then each input its own type: promotion
    inputs = {
        n: _array(rng, s, draw(st.sampled_from(CONTRACTION_DTYPES)) if mixed_types else dtype)
        for n, s in shapes.items()
    }
    return Case("contraction", src, inputs, length=length)


# ---------------------------------------------------------------------------- elementwise
# exact: the same bits on every target (float32, then TF32; 1 + 2^-11 and its multiples are ties),
# but not integer-valued, so a later sum of its values may round
ROUND_TF32 = "round_tf32({0} * 1.00048828125)"
UNARY_EXACT = [
    "-{0}",
    "abs({0})",
    "relu({0})",
    "{0} * {0}",
    "floor({0} / 2)",
    "ceil({0} / 2)",
    "round({0} / 2)",
    "as_int({0}, 8)",
    "as_float({0}, 64)",
    "{0} > 0",
    "~({0} > 1)",
    "reverse_grad({0}, 2)",
    ROUND_TF32,
    "index({0}, 0)",  # (last: the mixed family leaves it out)
]
BINARY_EXACT = [
    "{0} + {1}",
    "{0} - {1}",
    "{0} * {1}",
    "{0} / {1}",
    "max({0}, {1})",
    "min({0}, {1})",
    "{0} == {1}",
    "{0} != {1}",
    "{0} < {1} ? {0} : {1}",
    "{0} <= {1}",
    "{0} >= {1}",
    "mod({0}, {1} == 0 ? 2 : {1})",  # x mod 0 (0, or nan) is in the builtin tests; here the sign rule
]
INT_ONLY = ["{0} & {1}", "{0} | {1}", "{0} ^ {1}", "{0} << 2", "{0} >> 1"]
UNARY_FLOAT = [
    "exp({0} / 4)",
    "log(abs({0}) + 1)",
    "sqrt(abs({0}))",
    "sin({0})",
    "cos({0})",
    "tan({0} / 4)",
    "sinh({0} / 2)",
    "cosh({0} / 2)",
    "tanh({0})",
    "asin({0} / 4)",
    "acos({0} / 4)",
    "atan({0})",
    "asinh({0})",
    "acosh(abs({0}) + 1)",
    "atanh({0} / 4)",
    "sigmoid({0})",
    "pow(abs({0}) + 1, 0.5)",
    "recip({0})",
    "builtin_binary_crossentropy(sigmoid({0}) * 0.5 + 0.25, {0}, 1)",
]


def _partner(draw, names: dict[str, tuple], shape: tuple) -> str:
    """A name whose shape broadcasts with ``shape``."""
    ok = []
    for n, s in names.items():
        try:
            np.broadcast_shapes(s, shape)
        except ValueError:
            continue
        ok.append(n)
    return draw(st.sampled_from(ok))


@st.composite
def chain(draw) -> Case:
    """Elementwise statements over every arithmetic, comparison, bit and float builtin."""
    n, m = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    shapes = {"X": (n, m), "Y": draw(st.sampled_from([(n, m), (m,), (1, m), (n, 1), ()]))}
    int_mode = draw(st.booleans())
    dtype = draw(st.sampled_from(INT_DTYPES if int_mode else FLOAT_DTYPES))
    # now and then Y has its own type, so every promotion rule meets the targets
    y_dtype = draw(st.sampled_from(INT_DTYPES if int_mode else FLOAT_DTYPES + INT_DTYPES[:1]))
    pool = UNARY_EXACT + BINARY_EXACT + (INT_ONLY if int_mode else []) + ([] if int_mode else UNARY_FLOAT)
    names, stmts, inexact = ["X", "Y"], [], False
    for k in range(draw(st.integers(1, 4))):
        template = draw(st.sampled_from(pool))
        inexact |= template in UNARY_FLOAT
        args = [draw(st.sampled_from(names)) for _ in range(2)]
        stmts.append(f"T{k} = {template.format(*args)};")
        names.append(f"T{k}")
    src = f"function (X, Y) -> ({names[-1]}) {{ {' '.join(stmts)} }}"
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = {"X": _array(rng, shapes["X"], dtype), "Y": _array(rng, shapes["Y"], y_dtype)}
    return Case("elementwise", src, inputs, exact=not inexact, ulps=8.0)


CASTS = ["as_uint({0}, 8)", "as_uint({0}, 16)", "as_uint({0}, 32)", "as_int({0}, 16)", "as_bool({0})",
         "ident({0})", "as_float({0}, 32)", "as_float({0}, 16)", "as_bfloat({0}, 16)", "round_tf32({0})"]


@st.composite
def structural(draw) -> Case:
    """Chains through the structural builtins — reshape (to and from 0-D), shape, gather and scatter
    (with indices out of range, which clamp), the row softmaxes, simple_reduce, a dropout-style mask
    from the PRNG (the state threaded through the steps) — and the casts (as_uint of negatives
    wraps)."""
    n, m = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    shapes: dict[str, tuple] = {"X": (n, m), "I": (draw(st.integers(1, 4)),)}
    dtype = draw(st.sampled_from(FLOAT_DTYPES + INT_DTYPES))
    stmts, inexact, length, state = [], False, 1, "S"
    for k in range(draw(st.integers(1, 4))):
        name, pre = f"T{k}", ""
        a = draw(st.sampled_from([x for x, s in shapes.items() if x != "I"]))
        sa = shapes[a]
        ops = ["reshape", "shape", "cast", "binary", "prng"]
        ops += ["gather", "scatter", "simple_reduce"] if sa else []
        ops += ["softmax"] if len(sa) == 2 else []
        op = draw(st.sampled_from(ops))
        if op == "reshape":
            size = int(np.prod(sa))
            shapes_ = [(size,), (1, size), tuple(reversed(sa)) or (1,), (size, 1)]
            # one element: to 0-D as often as not (and from 0-D, when sa is ())
            new = draw(st.sampled_from([(), (), (1,), (1, 1)] if size == 1 else shapes_))
            expr, shape = f"reshape({a}{''.join(f', {d}' for d in new)})", new
        elif op == "simple_reduce":
            # trailing-aligned sizes, each 1 (summed) or kept; the leading dims are summed
            kept = sa[draw(st.integers(0, len(sa))) :]
            new = tuple(draw(st.sampled_from([1, d])) for d in kept)
            expr, shape = f"simple_reduce({a}{''.join(f', {d}' for d in new)})", new
            inexact, length = True, max(length, int(np.prod(sa)))  # float sums after casts may round
        elif op == "prng":
            pre = f"H{k} = prng_step({state}{''.join(f', {d}' for d in sa)}); S{k} = prng_state(H{k}); "
            expr, shape, state = f"prng_value(H{k}) < 0.5 ? {a} : {a} * 0", sa, f"S{k}"
        elif op == "shape":
            expr, shape = f"shape({a})", (len(sa),)
        elif op == "cast":
            expr, shape = draw(st.sampled_from(CASTS)).format(a), sa
        elif op == "binary":
            b = _partner(draw, {x: s for x, s in shapes.items() if x != "I"}, sa)
            expr = draw(st.sampled_from(BINARY_EXACT)).format(a, b)
            shape = np.broadcast_shapes(sa, shapes[b])
        elif op == "gather":
            idx = draw(st.sampled_from(["I"] + [x for x, s in shapes.items() if x != "I" and len(s) <= 2]))
            ix = idx if idx == "I" else f"as_int({idx}, 32)"
            expr, shape = f"gather({a}, {ix})", shapes[idx] + sa[1:]
        elif op == "scatter":
            like = draw(st.sampled_from([x for x, s in shapes.items() if s]))
            ix = draw(st.sampled_from([f"as_int({a}, 32)", f"index({a}, 0)"]))
            expr, shape = f"scatter({a}, {ix}, {like})", (shapes[like][0],)
            length = max(length, int(np.prod(sa)))  # duplicates add up
        else:
            fn = draw(st.sampled_from(["builtin_softmax", "builtin_logsoftmax"]))
            expr, shape, inexact = f"{fn}({a}, {sa[0]}, {sa[1]})", sa, True
            length = max(length, sa[1])
        if len(shape) > 4 or int(np.prod(shape)) > 256:
            break
        stmts.append(f"{pre}{name} = {expr};")
        shapes[name] = tuple(shape)
    assume(stmts)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = {"X": _array(rng, shapes["X"], dtype), "I": _array(rng, shapes["I"], np.int32, -1, n)}
    if state != "S":  # taus88 seeds: components above 1, 7 and 15
        inputs["S"] = np.stack([rng.integers(lo, 2**32, 2048, dtype=np.uint32) for lo in (2, 8, 16)])
    last = stmts[-1].rsplit("; ", 1)[-1].split(" ")[0]  # after a PRNG step's own statements
    src = f"function ({', '.join(inputs)}) -> ({last}) {{ {' '.join(stmts)} }}"
    return Case("elementwise", src, inputs, exact=not inexact, ulps=16.0, length=length)


@st.composite
def elementwise_sweep(draw) -> Case:
    """Every exact elementwise builtin and cast at once on values that tell each from its
    neighbours (``conformance.sweeps``); or only those that compute in one type (a device with few
    types runs them); now and then every float builtin on finite values."""
    seed = draw(st.integers(0, 2**32 - 1))
    if draw(st.integers(0, 3)) == 3:
        dtype = draw(st.sampled_from(FLOAT_DTYPES))
        src, inputs = sweeps.transcendental_program(dtype, seed, UNARY_FLOAT)
        return Case("elementwise", src, inputs, exact=False, ulps=8.0)
    dtype = draw(st.sampled_from(FLOAT_DTYPES + INT_DTYPES))
    closed = draw(st.booleans())  # (the first example: everything at once)
    pool = UNARY_EXACT + BINARY_EXACT + CASTS + (INT_ONLY if np.dtype(dtype).kind in "iu" else [])
    src, inputs = sweeps.elementwise_program(dtype, seed, pool, closed)
    return Case("elementwise", src, inputs)


def elementwise() -> st.SearchStrategy[Case]:
    return st.one_of(chain(), structural(), elementwise_sweep())  # (last: a failure shrinks away from it)


# ------------------------------------------------------------------------------- mixed programs
@st.composite
def mixed(draw) -> Case:
    """Contractions and elementwise statements feeding each other — reductions along an axis,
    transposes, matmuls with new inputs, shifted windows, unary and broadcast binary builtins —
    with an intermediate sometimes returned as a second output."""
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int32]))
    is_float = np.dtype(dtype).kind == "f"
    shapes = {"X": tuple(draw(st.integers(1, 4)) for _ in range(draw(st.integers(1, 3))))}
    cur, stmts, inexact, length = "X", [], False, 1
    made: list[str] = []
    for k in range(draw(st.integers(2, 4))):
        name, sc = f"T{k}", shapes[cur]
        r = len(sc)
        idx = [f"i{d}" for d in range(r)]
        kinds = ["unary", "binary"] + (["reduce", "matmul", "window"] if r else [])
        kinds += ["transpose"] if r > 1 else []
        kind = draw(st.sampled_from(kinds))
        if kind == "reduce":
            axis = draw(st.integers(0, r - 1))
            keep = [d for d in range(r) if d != axis]
            shape = tuple(sc[d] for d in keep)
            out = ", ".join(idx[d] for d in keep)
            spec = f"{name}[{out}: {', '.join(map(str, shape))}]" if keep else f"{name}[]"
            agg = draw(st.sampled_from(["+", ">", "<"]))
            stmt = f"{spec} = {agg}({cur}[{', '.join(idx)}]);"
            length *= sc[axis]
        elif kind == "transpose":
            perm = draw(st.permutations(range(r)))
            shape = tuple(sc[p] for p in perm)
            stmt = (
                f"{name}[{', '.join(idx[p] for p in perm)}: {', '.join(map(str, shape))}] = "
                f"=({cur}[{', '.join(idx)}]);"
            )
        elif kind == "matmul":
            w, cols = f"W{k}", draw(st.integers(1, 3))
            shapes[w] = (sc[-1], cols)
            shape = sc[:-1] + (cols,)
            lead = idx[:-1]
            stmt = (
                f"{name}[{', '.join(lead + ['j'])}: {', '.join(map(str, shape))}] = "
                f"+({cur}[{', '.join(lead + ['q'])}] * {w}[q, j]);"
            )
            length *= sc[-1]
        elif kind == "window":
            width, agg = draw(st.integers(2, 3)), draw(st.sampled_from(["+", ">"]))
            shape = sc
            stmt = (
                f"{name}[{', '.join(idx)}: {', '.join(map(str, sc))}] = "
                f"{agg}({cur}[{', '.join(idx[:-1] + [idx[-1] + ' + q'])}]), q < {width};"
            )
            length *= width
        elif kind == "unary":
            template = draw(st.sampled_from(UNARY_EXACT[:-1] + (UNARY_FLOAT if is_float else [])))
            inexact |= template in UNARY_FLOAT or template == ROUND_TF32
            stmt, shape = f"{name} = {template.format(cur)};", sc
        else:
            b = f"B{k}"
            shapes[b] = draw(st.sampled_from([sc, sc[1:], sc[-1:], ()]))
            template = draw(st.sampled_from(BINARY_EXACT))
            inexact |= "/" in template and is_float  # a quotient summed later rounds in any order
            stmt, shape = f"{name} = {template.format(cur, b)};", sc
        stmts.append(stmt)
        shapes[name] = tuple(shape)
        made.append(name)
        cur = name
    outs = [cur] + ([draw(st.sampled_from(made[:-1]))] if len(made) > 1 and draw(st.booleans()) else [])
    ins = [n for n in shapes if n not in made]
    src = f"function ({', '.join(ins)}) -> ({', '.join(outs)}) {{ {' '.join(stmts)} }}"
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = {n: _array(rng, shapes[n], dtype) for n in ins}
    return Case("mixed", src, inputs, exact=not inexact, ulps=64.0, length=length)


# ------------------------------------------------------------------------- derived programs
@st.composite
def gradients(draw) -> Case:
    import tile
    from tile.printer import format_program

    base = draw(st.one_of(contractions(), elementwise(), mixed()))
    floats = {k: v.astype(np.float64) for k, v in base.inputs.items()}
    try:
        g = tile.gradient(
            base.source,
            shapes={k: v.shape for k, v in floats.items()},
            dtypes={k: tile.dtypes.DType.FLOAT64 for k in floats},
        )
    except tile.TileError:
        from hypothesis import assume

        assume(False)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    feed = dict(floats)
    import ref_interp

    try:
        fwd = ref_interp.run(base.source, floats)
    except tile.TileError:
        from hypothesis import assume

        assume(False)
    for out, cot in g.cotangents.items():
        feed[cot] = _array(rng, fwd[out].shape, np.float64)
    return Case("gradient", format_program(g.program), feed, exact=base.exact, ulps=64.0, length=base.length)


def _staged(draw, stage: str) -> tuple[Case, str]:
    """A drawn contraction or mixed program, and its text after ``stage`` (flat: as Tile over 1-D
    views, see ``tile.transforms.emit.format_flat_program``)."""
    import tile
    from tile.inputs import input_types
    from tile.transforms import apply_stage
    from tile.transforms.emit import format_flat_program, format_stage
    from tile.typed import TAssign

    base = draw(st.one_of(contractions(), mixed()))
    try:
        prog = tile.parse(base.source)
        bound = apply_stage(tile.bind(prog, input_types(prog, base.inputs)), stage)
        text = format_flat_program(bound) if stage == "flat" else format_stage(bound)
        assume(any(not isinstance(x, TAssign) for x in bound.stmts))  # else the stage changes nothing
    except tile.TileError:
        assume(False)
    return base, text


@st.composite
def defracted(draw) -> Case:
    base, text = _staged(draw, "defracted")
    return Case("defracted", text, base.inputs, base.exact, base.ulps, base.length)


@st.composite
def flat(draw) -> Case:
    base, text = _staged(draw, "flat")
    return Case("flat", text, base.inputs, base.exact, base.ulps, base.length)


@st.composite
def optimized(draw) -> Case:
    """A contraction, elementwise chain or mixed program whose every config's passes are checked
    (``conformance.optimized``) before the target runs it."""
    base = draw(st.one_of(contractions(), elementwise(), mixed()))
    return Case("optimized", base.source, base.inputs, base.exact, base.ulps, base.length)


# ------------------------------------------------------------------- sizes given as inputs
@st.composite
def transposed(draw) -> tuple[ConvT, tuple[int, ...]]:
    """PlaidML's transposed convolutions (``conformance/conv_transpose.py``) of rank 1-2: any
    padding, stride, dilation and layout, and an output size of 0-9 per axis, which the program
    takes as 0-D inputs ``D0, D1`` (docs/semantics.md §6.3.1)."""
    rank = draw(st.integers(1, 2))
    dims = st.lists(st.integers(1, 3), min_size=rank, max_size=rank).map(tuple)
    kernel, strides, dilation = draw(dims), draw(dims), draw(dims)
    padding = draw(st.sampled_from(["valid", "same_upper", "same_lower", "0", "1", "2"]))
    first = draw(st.booleans())
    spatial = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    size = tuple(draw(st.lists(st.integers(0, 9), min_size=rank, max_size=rank)))
    o_shape = (1, 2, *spatial) if first else (1, *spatial, 2)
    return ConvT(kernel, strides, padding, o_shape, 2, (size,), dilation, first), size


@st.composite
def sized(draw) -> Case:
    """Programs whose output sizes are 0-D inputs: a compiled target builds for their values."""
    c, size = draw(transposed())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    o, k = c.inputs(rng, draw(st.sampled_from(CONTRACTION_DTYPES)))
    length = int(np.prod(c.kernel)) * k.shape[-1]  # each output element sums kernel points x CO
    return Case("sized", c.source(), {"O": o, "K": k, **size_arrays(size)}, length=length)


PRODUCT_DTYPES = [np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
PRODUCT_SOURCES = {
    "matmul": "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }",
    "batched": "function (A[P, M, K], B[P, K, N]) -> (C) "
    "{ C[p, i, j: P, M, N] = +(A[p, i, k] * B[p, k, j]); }",
    "conv": "function (A[M, W, C], B[R, C, N]) -> (O) "
    "{ O[m, x, n: M, W - R + 1, N] = +(A[m, x + r, c] * B[r, c, n]); }",
}


@st.composite
def products(draw) -> Case:
    """A matrix product of random normal data (values unlike integers, so every rounding shows):
    ``notes`` keep the dtype and the reduction length for ``conformance.precision``."""
    kind = draw(st.sampled_from(sorted(PRODUCT_SOURCES)))
    dtype = draw(st.sampled_from(PRODUCT_DTYPES))
    m, n, k = draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(1, 64))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "matmul":
        shapes, length = ((m, k), (k, n)), k
    elif kind == "batched":
        shapes, length = ((2, m, k), (2, k, n)), k
    else:
        r = draw(st.integers(1, 3))
        shapes, length = ((m, r + 2, k), (r, k, n)), r * k
    a, b = (rng.standard_normal(s).astype(dtype) for s in shapes)
    notes = {"dtype": dtype.name, "length": length}
    return Case("products", PRODUCT_SOURCES[kind], {"A": a, "B": b}, False, 8.0, length, notes)


FAMILIES = {
    "contractions": contractions,
    "elementwise": elementwise,
    "mixed": mixed,
    "gradients": gradients,
    "defracted": defracted,
    "flat": flat,
    "optimized": optimized,
    "sized": sized,
    "products": products,
}
