"""Gradients of generated programs against float64 central finite differences and closed forms.

Hypothesis builds random contractions (every aggregation, the combinations, affine indices with
strides and dilations, constraints, ``default``, ranks 0-3) and random elementwise chains over the
differentiable builtins, keeping away from the points where a function has no derivative. Their
``tile.grad_values`` must match finite differences of ``sum(seed * outputs)`` computed through the
interpreter, and plain sums of products must match ``np.einsum``. Second order: a WGAN-GP style
penalty ``sum(DX^2)`` built from a first gradient program, and ``d2/dx2 x^3 = 6x``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import ref_interp
import tile
from tests.gradcheck import assert_close, fd_grad
from tile import ast
from tile.errors import TileIndexError, TileRuntimeError

PROPS = settings(derandomize=True, deadline=None, max_examples=60,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


# ------------------------------------------------------------------------------------ helpers
def check_fd(program, inputs: dict, seed: dict | None = None, wrt=None) -> dict:
    grads = tile.grad_values(program, inputs, wrt=wrt, cotangents=seed, precision="float64")
    length = sum(np.size(v) for v in inputs.values())
    for name, g in grads.items():
        assert g.shape == np.shape(inputs[name])
        assert_close(g, fd_grad(program, inputs, name, seed), length)
    return grads


# ------------------------------------------------------------------- random contractions
VARS = "ijk"
SEP = ", "


def poly_text(terms: list[tuple[int, str]], const: int) -> str:
    parts = [f"{'-' if c < 0 else '+'} {'' if abs(c) == 1 else f'{abs(c)}*'}{v}" for c, v in terms]
    if const:
        parts.append(f"{'-' if const < 0 else '+'} {abs(const)}")
    text = " ".join(parts)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


@st.composite
def dim_poly(draw, variables: str, home: str | None, size: int):
    """One dimension's index polynomial: ``home`` alone (scaled, shifted) or a mix of 1-2 vars."""
    if home is not None:
        coeff = draw(st.sampled_from([1, 1, 2, 3, -1]))
        const = size - 1 if coeff < 0 else draw(st.sampled_from([0, 0, 1, -1]))
        return poly_text([(coeff, home)], const)
    chosen = draw(st.lists(st.sampled_from(variables), min_size=1, max_size=2, unique=True))
    terms = [(draw(st.sampled_from([1, 2, 3])), v) for v in chosen]
    return poly_text(terms, draw(st.sampled_from([0, 0, -1, 1])))


KINDS = [("+", ""), ("+", "*"), ("+", "+"), ("+", "?"), ("=", ""), (">", ""), ("<", ""), ("*", "")]


@st.composite
def contraction_case(draw, agg: str, comb: str):
    n_ops = {"": 1, "*": 2, "+": 2, "?": 3}[comb]
    variables = VARS[:draw(st.integers(1, 3))]
    # Every variable has a "home": a dimension indexed by it alone. That bounds it, and makes the
    # map (variables -> output element, operand elements) injective, so `=` never writes twice
    # (homes in the output) and a `>`/`<` never sees one element twice in one output element.
    tensors = n_ops + 1  # 0 is the output
    homes = {v: 0 if agg == "=" else draw(st.integers(0, tensors - 1)) for v in variables}
    polys, shapes = [], []
    for t in range(tensors):
        mine = [v for v in variables if homes[v] == t]
        assume(len(mine) <= 3)
        extra = draw(st.integers(0, 3 - len(mine))) if agg != "=" or t else 0
        slots = [*mine, *([None] * extra)]
        slots = draw(st.permutations(slots))
        sizes = [draw(st.integers(1, 4)) for _ in slots]
        polys.append([draw(dim_poly(variables, s, n)) for s, n in zip(slots, sizes, strict=True)])
        shapes.append(tuple(sizes))
    names = ["A", "B", "C"][:n_ops]
    refs = [f"{n}[{SEP.join(p)}]" for n, p in zip(names, polys[1:], strict=True)]
    body = {"": "{0}", "*": "{0} * {1}", "+": "{0} + {1}", "?": "{0} == {1} ? {2}"}[comb].format(*refs)
    cons = ""
    if draw(st.booleans()):
        vs = draw(st.lists(st.sampled_from(variables), min_size=1, max_size=2, unique=True))
        cons = f", {' + '.join(vs)} < {draw(st.integers(1, 4))}"
    use_default = draw(st.integers(0, 3)) == 0
    out = f"O[{SEP.join(polys[0])}: {SEP.join(map(str, shapes[0]))}]" if polys[0] else "O[]"
    decls = [*names, *(["D"] if use_default else [])]
    src = (f"function ({SEP.join(decls)}) -> (O) {{ {out} = {agg}({body}){cons}"
           f"{' default D' if use_default else ''}; }}")
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    inputs = {}
    for n, shape in zip(names, shapes[1:], strict=True):
        if comb == "?" and n != "C":  # compared operands: small integers, so equality happens
            inputs[n] = rng.integers(0, 2, shape).astype(np.int32)
        elif agg in (">", "<"):  # well separated values: no ties within finite-difference reach
            inputs[n] = (rng.permutation(math.prod(shape)).reshape(shape) * 0.5 - 1.3).astype(np.float64)
        elif agg == "*":  # away from 0
            inputs[n] = rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
        else:
            inputs[n] = rng.standard_normal(shape)
    if use_default:
        inputs["D"] = rng.standard_normal(shapes[0])
    seed = {"O": rng.standard_normal(shapes[0])}
    return src, inputs, seed


@pytest.mark.parametrize("agg, comb", KINDS)
@settings(PROPS, max_examples=20)
@given(data=st.data())
def test_random_contraction_gradients_match_finite_differences(agg, comb, data):
    src, inputs, seed = data.draw(contraction_case(agg, comb))
    try:
        ref_interp.run(src, inputs, "float64")
    except (TileIndexError, TileRuntimeError):
        assume(False)  # no valid index tuple at all: an error by decision 3, not a gradient question
    grads = check_fd(src, inputs, seed)
    assert set(grads) == {n for n, v in inputs.items() if v.dtype.kind == "f"}


# ------------------------------------------------------------------ random elementwise chains
# (template, arity, kink): each template maps any real arguments into its function's domain and to
# bounded values; ``kink`` names the check that keeps the arguments away from non-differentiability.
OPS = [
    ("{0} + {1}", 2, None), ("{0} - {1}", 2, None), ("{0} * {1}", 2, None), ("-{0}", 1, None),
    ("{0} / (2 + cos({1}))", 2, None), ("ident({0})", 1, None), ("as_float({0}, 64)", 1, None),
    ("exp(sin({0}))", 1, None), ("log(2 + sin({0}))", 1, None), ("sqrt(2 + cos({0}))", 1, None),
    ("sin({0})", 1, None), ("cos({0})", 1, None), ("tan(sin({0}))", 1, None), ("sinh(sin({0}))", 1, None),
    ("cosh(sin({0}))", 1, None), ("tanh({0})", 1, None), ("asin(0.5 * tanh({0}))", 1, None),
    ("acos(0.5 * tanh({0}))", 1, None), ("atan({0})", 1, None), ("asinh({0})", 1, None),
    ("acosh(2 + {0} * {0})", 1, None), ("atanh(0.5 * tanh({0}))", 1, None), ("sigmoid({0})", 1, None),
    ("pow(1.5 + sin({0}), cos({1}))", 2, None),
    ("abs({0})", 1, "zero"), ("relu({0})", 1, "zero"),
    ("max({0}, {1})", 2, "tie"), ("min({0}, {1})", 2, "tie"),
    ("{0} > {1} ? {2} : {3}", 4, "tie"), ("{2} * as_float({0} < {1}, 64)", 3, "tie"),
    ("floor({0})", 1, "integer"), ("ceil({0})", 1, "integer"), ("round({0})", 1, "half"),
]
Y_SHAPES = [lambda n, m: (n, m), lambda n, m: (m,), lambda n, m: (1, m), lambda n, m: (n, 1), lambda n, m: ()]


def kink_distance(kind: str, args: list[np.ndarray]) -> float:
    if kind == "zero":
        return float(np.min(np.abs(args[0]), initial=np.inf))
    if kind == "tie":
        a, b = np.broadcast_arrays(args[0], args[1])
        return float(np.min(np.abs(a - b), initial=np.inf))
    x = args[0]
    off = x - np.floor(x) if kind == "integer" else np.abs(x - np.floor(x) - 0.5)
    return float(np.min(np.minimum(off, 1 - off) if kind == "integer" else off, initial=np.inf))


@st.composite
def chain_case(draw):
    n, m = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    y_shape = draw(st.sampled_from(Y_SHAPES))(n, m)
    inputs = {"X": rng.uniform(-1.5, 1.5, (n, m)), "Y": rng.uniform(-1.5, 1.5, y_shape)}
    names = ["X", "Y"]
    stmts, kinks = [], []
    for k in range(draw(st.integers(1, 4))):
        template, arity, kink = draw(st.sampled_from(OPS))
        args = [draw(st.sampled_from(names[-3:] if k else names)) for _ in range(arity)]
        stmts.append(f"T{k} = {template.format(*args)};")
        if kink:
            kinks.append((kink, args))
        names.append(f"T{k}")
    outs = [names[-1]] + ([names[2]] if len(names) > 3 and draw(st.booleans()) else [])
    body = " ".join(stmts)
    probe = f"function (X[N, M], Y) -> ({SEP.join(names[2:])}) {{ {body} }}"
    src = f"function (X[N, M], Y) -> ({SEP.join(outs)}) {{ {body} }}"
    return src, probe, inputs, kinks, outs


@PROPS
@given(chain_case(), st.integers(0, 2**31))
def test_random_elementwise_chains_match_finite_differences(case, seed_seed):
    src, probe, inputs, kinks, outs = case
    values = {**inputs, **ref_interp.run(probe, inputs, "float64")}
    for kind, args in kinks:
        assume(kink_distance(kind, [values[a] for a in args]) > 1e-3)
    rng = np.random.default_rng(seed_seed)
    seed = {o: rng.standard_normal(values[o].shape) for o in outs}
    check_fd(src, inputs, seed)


# -------------------------------------------------------------------------- closed forms
EINSUMS = {
    "matmul": ("ik,kj->ij", (2, 3), (3, 4)),
    "batched": ("bik,bkj->bij", (2, 2, 3), (2, 3, 2)),
    "transposed": ("ki,jk->ij", (3, 2), (4, 3)),
    "outer": ("i,j->ij", (3,), (4,)),
    "dot": ("i,i->", (5,), (5,)),
    "one-sided sum": ("ij,k->ik", (2, 3), (4,)),
}


def einsum_program(spec: str, shape_a, shape_b) -> str:
    (a, b), o = spec.split("->")[0].split(","), spec.split("->")[1]
    size = {**dict(zip(a, shape_a, strict=True)), **dict(zip(b, shape_b, strict=True))}
    out = f"O[{SEP.join(o)}: {SEP.join(str(size[c]) for c in o)}]" if o else "O[]"
    return f"function (A, B) -> (O) {{ {out} = +(A[{SEP.join(a)}] * B[{SEP.join(b)}]); }}"


def einsum_grads(spec: str, a: np.ndarray, b: np.ndarray, d: np.ndarray):
    (sa, sb), so = spec.split("->")[0].split(","), spec.split("->")[1]
    # An index only A has is summed in the forward pass: its gradient is constant along it.
    da = np.einsum(f"{so},{sb},{sa}->{sa}", d, b, np.ones_like(a))
    db = np.einsum(f"{so},{sa},{sb}->{sb}", d, a, np.ones_like(b))
    return da, db


def check_einsum(spec: str, a: np.ndarray, b: np.ndarray, d: np.ndarray) -> None:
    src = einsum_program(spec, a.shape, b.shape)
    got = tile.grad_values(src, {"A": a, "B": b}, cotangents={"O": d}, precision="float64")
    da, db = einsum_grads(spec, a, b, d)
    length = max(a.size, b.size)
    assert_close(got["A"], da, length)
    assert_close(got["B"], db, length)


@pytest.mark.parametrize("name", list(EINSUMS))
def test_sum_of_products_matches_einsum(name):
    spec, shape_a, shape_b = EINSUMS[name]
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal(shape_a), rng.standard_normal(shape_b)
    out = np.einsum(spec, a, b)
    check_einsum(spec, a, b, rng.standard_normal(out.shape))


@st.composite
def einsum_case(draw):
    letters = "pqrs"[:draw(st.integers(1, 4))]
    sizes = {c: draw(st.integers(1, 3)) for c in letters}
    sa = "".join(draw(st.permutations(draw(st.lists(st.sampled_from(letters), max_size=3, unique=True)))))
    rest = [c for c in letters if c not in sa]
    sb = draw(st.lists(st.sampled_from(letters), max_size=3, unique=True))
    sb = "".join(draw(st.permutations(sorted(set(sb) | set(rest)))))
    assume(len(sb) <= 3)
    so = "".join(draw(st.permutations(draw(st.lists(st.sampled_from(letters), max_size=3, unique=True)))))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    a = rng.integers(-3, 4, tuple(sizes[c] for c in sa)).astype(np.float64)
    b = rng.integers(-3, 4, tuple(sizes[c] for c in sb)).astype(np.float64)
    d = rng.integers(-3, 4, tuple(sizes[c] for c in so)).astype(np.float64)
    return f"{sa},{sb}->{so}", a, b, d


@PROPS
@given(einsum_case())
def test_random_sums_of_products_match_einsum_exactly(case):
    spec, a, b, d = case
    got = tile.grad_values(einsum_program(spec, a.shape, b.shape), {"A": a, "B": b}, cotangents={"O": d},
                           precision="float64")
    da, db = einsum_grads(spec, a, b, d)
    np.testing.assert_array_equal(got["A"], da)  # small integers: exact
    np.testing.assert_array_equal(got["B"], db)


# ------------------------------------------------------------------------------ second order
def append(program: ast.Program, extra: str, outputs: tuple[str, ...]) -> ast.Program:
    """``program`` with the statements of ``extra`` (a function body) appended and new outputs."""
    stmts = tile.parse(extra).stmts
    return dataclasses.replace(program, stmts=program.stmts + stmts,
                               outputs=tuple(ast.Output(o) for o in outputs))


@pytest.mark.parametrize("forward", [
    "function (X[N, M], W[M, K]) -> (O) { H[i, k: N, K] = +(X[i, j] * W[j, k]); O = tanh(H); }",
    "function (X[N, M], W[M, K]) -> (O) { H[i, k: N, K] = +(X[i, j] * W[j, k]); O = sigmoid(H) * H; }",
    "function (X[N, M], W[M, K]) -> (O) { H[i: N] = >(X[i, j]); O[i, k: N, K] = +(H[i] * W[j, k]); }",
])
def test_wgan_gp_penalty_gradient_matches_finite_differences(forward):
    first = tile.gradient(forward, wrt=["X"])
    dx, (cot,) = first.gradients["X"], first.cotangents.values()
    penalty = append(first.program, f"function ({dx}) -> (P) {{ Sq = {dx} * {dx}; P[] = +(Sq[i, j]); }}",
                     ("P",))
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 3)), rng.standard_normal((3, 4))
    inputs = {"X": x, "W": w, cot: np.ones((2, 4))}
    # P is really sum((d/dX sum(O))^2): check that first, by finite differences of the forward program
    p = ref_interp.run(penalty, inputs, "float64")["P"]
    assert_close(p, np.sum(fd_grad(forward, {"X": x, "W": w}, "X") ** 2), x.size * w.size)
    grads = tile.grad_values(penalty, inputs, wrt=["X", "W"], precision="float64")
    for name in ("X", "W"):
        assert_close(grads[name], fd_grad(penalty, inputs, name), x.size * w.size)


def test_second_derivative_of_cube_is_six_x():
    first = tile.gradient("function (X) -> (Y) { Y = X * X * X; }")
    x = np.array([-2.0, -1.0, 0.0, 0.5, 3.0])
    second = tile.grad_values(first.program, {"X": x, first.cotangents["Y"]: np.ones(5)}, wrt=["X"],
                              precision="float64")
    np.testing.assert_array_equal(second["X"], 6 * x)
    third = tile.grad(tile.grad(first.program, wrt=["X"]), wrt=["X"])
    feed = {n.name: np.ones(5) for n in third.inputs}
    feed["X"] = x
    (out,) = ref_interp.run(third, feed, "float64").values()
    np.testing.assert_array_equal(out, np.full(5, 6.0))  # d3/dx3 x^3 = 6
