"""Random contractions: the reference interpreter against a naive brute-force evaluator, and plain
sums of products against ``np.einsum``.

Generated contractions have ranks 0-3 per tensor, 0-4 index variables, affine index expressions
``(c1*i + c2*j + k)/d`` with c in -3..3 and d in 1..3 (offsets k random in -3..3, or chosen so that a
random witness point is valid, which keeps most programs non-empty), up to two constraints, every
aggregation and combination, ``default`` tensors, sizes 0..5 and small integer-valued inputs of
several dtypes, so results compare exactly. Every index variable is confined by a condition on it
alone (a tensor index or a constraint), so every generated program is bounded.
"""

from __future__ import annotations

import math
import re
import string

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import ref_interp
import tile.tuples
from tests.bruteforce import AGGS, COMBS, OPERANDS, Poly, Spec, evaluate, index_box
from tile.errors import TileIndexError, TileRuntimeError

VARS = ("i", "j", "k", "l")
DTYPES = [np.dtype(t) for t in (np.int32, np.float64, np.float32, np.int8, np.uint8, np.bool_)]
MAX_BOX = 6000  # points the brute force may try per example (keeps the file fast)
SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.filter_too_much])

small_coeff = st.sampled_from([0, 0, 0, 0, 0, 1, -1, 1, -1, 1, 2, -2, 3, -3])
offset = st.sampled_from([0, 0, 0, 0, 0, 1, -1, 2, -2, 3, -3])
divisor = st.sampled_from([1, 1, 1, 1, 1, 1, 2, 3])
rank = st.sampled_from([0, 1, 1, 2, 2, 3, 3])
bound = st.sampled_from([1, 2, 3, 4, 5, 6, 0])


def finish_poly(draw, coeffs: tuple, n: int, witness: dict[str, int] | None) -> Poly:
    """Give the polynomial a divisor and an offset: a random one, or, with a ``witness`` point, the
    offset that puts its value at the witness on an integer in ``[0, n)`` (so most generated
    contractions have valid tuples)."""
    den = draw(divisor)
    if witness is None or n <= 0:
        return Poly(coeffs, draw(offset), den)
    target = draw(st.integers(0, n - 1))
    return Poly(coeffs, den * target - sum(c * witness[v] for v, c in coeffs), den)


def general_coeffs(draw, variables, must: str | None = None) -> tuple:
    coeffs = []
    for v in variables:
        c = draw(small_coeff)
        if v == must and c == 0:
            c = draw(st.sampled_from([1, -1, 2, -2, 3, -3]))
        coeffs.append((v, c))
    return tuple(coeffs)


def anchor_coeffs(draw, v: str) -> tuple:
    """``v`` alone: a condition on it bounds v whatever the rest of the contraction says."""
    return ((v, draw(st.sampled_from([1, -1, 1, -1, 2, -2]))),)


@st.composite
def specs(draw) -> tuple[Spec, dict[str, tuple[int, ...]]]:
    agg = draw(st.sampled_from(AGGS))
    comb = draw(st.sampled_from(COMBS))
    ranks = [draw(rank) for _ in range(1 + OPERANDS[comb])]
    sizes = [[draw(st.integers(1, 5)) for _ in range(r)] for r in ranks]
    slots = [(t, k) for t, r in enumerate(ranks) for k in range(r)]
    n_vars = draw(st.integers(min(1, len(slots)), min(4, len(slots))))
    variables = VARS[:n_vars]
    witness = {v: draw(st.integers(-2, 4)) for v in variables} if draw(st.integers(0, 3)) else None
    order = draw(st.permutations(slots))
    coeffs: dict[tuple[int, int], tuple] = {}
    constraints = []
    for v, slot in zip(variables, order, strict=False):  # the first n_vars slots
        if len(constraints) < 2 and draw(st.integers(0, 3)) == 0:
            # Confine v by a constraint; its tensor slot then uses v among other indices.
            b = draw(bound)
            constraints.append((finish_poly(draw, anchor_coeffs(draw, v), b, witness), b))
            coeffs[slot] = general_coeffs(draw, variables, must=v)
        else:
            coeffs[slot] = anchor_coeffs(draw, v)
    for slot in order[n_vars:]:
        coeffs[slot] = general_coeffs(draw, variables)
    for _ in range(draw(st.integers(0, 2 - len(constraints)))):
        b = draw(bound)
        constraints.append((finish_poly(draw, general_coeffs(draw, variables), b, witness), b))
    if slots and draw(st.integers(0, 9)) == 0:  # now and then a tensor with no elements
        t, k = draw(st.sampled_from(slots))
        sizes[t][k] = 0
    polys = [tuple(finish_poly(draw, coeffs[(t, k)], sizes[t][k], witness) for k in range(r))
             for t, r in enumerate(ranks)]
    spec = Spec(agg, comb, tuple(sizes[0]), polys[0], tuple(polys[1:]), tuple(constraints),
                default=draw(st.booleans()))
    return spec, {n: tuple(s) for n, s in zip(spec.operands, sizes[1:], strict=True)}


def make_array(rng: np.random.Generator, shape, dt: np.dtype) -> np.ndarray:
    if dt == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    lo = 0 if dt.kind == "u" else -3
    return rng.integers(lo, 4, size=shape).astype(dt)


@st.composite
def cases(draw):
    spec, shapes = draw(specs())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = {n: make_array(rng, shapes[n], draw(st.sampled_from(DTYPES))) for n in spec.operands}
    if spec.default:
        inputs["D"] = make_array(rng, spec.out_sizes, draw(st.sampled_from(DTYPES)))
    return spec, inputs


def _tuple_of(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"(\w+)=(-?\d+)", text)}


def check_against_bruteforce(spec: Spec, inputs: dict[str, np.ndarray], precision: str = "native",
                             require=assume) -> None:
    """``require`` filters examples: ``assume`` under Hypothesis; hand-picked cases must qualify."""
    box = index_box(spec, {n: inputs[n].shape for n in spec.operands})
    require(math.prod(len(r) for r in box.values()) <= MAX_BOX)
    want = evaluate(spec, inputs, precision)
    if want.value.dtype.kind == "f":  # every partial sum/product exact in the output's float type
        require(want.bound <= 2 ** (np.finfo(want.value.dtype).nmant + 1))
    src = spec.source()
    if want.valid == 0 and not want.zero_size:
        with pytest.raises(TileIndexError, match="no index tuple of 'O' is valid"):
            ref_interp.run(src, inputs, precision)
        return
    if want.duplicate:
        with pytest.raises(TileRuntimeError) as info:
            ref_interp.run(src, inputs, precision)
        m = re.search(r"`=` writes O\[([-\d, ]*)\] more than once: from \(([^)]*)\) and \(([^)]*)\)",
                      str(info.value))
        assert m, str(info.value)
        where = tuple(int(x) for x in m.group(1).split(",") if x.strip())
        assert where in want.duplicate, (where, want.duplicate)
        first, second = _tuple_of(m.group(2)), _tuple_of(m.group(3))
        assert first != second and first in want.duplicate[where] and second in want.duplicate[where]
        return
    got = ref_interp.run(src, inputs, precision)["O"]
    assert got.dtype == want.value.dtype, (got.dtype, want.value.dtype, src)
    assert got.shape == want.value.shape, src
    np.testing.assert_array_equal(got, want.value, err_msg=src)


@settings(max_examples=800, **SETTINGS)
@given(cases())
def test_random_contractions_match_bruteforce(case):
    check_against_bruteforce(*case)


@settings(max_examples=300, **SETTINGS)
@given(cases(), st.sampled_from(["float64", "exact"]))
def test_random_contractions_in_float64_and_exact_modes(case, precision):
    check_against_bruteforce(*case, precision)


@settings(max_examples=300, **SETTINGS)
@given(cases(), st.sampled_from([1, 2, 5, 16]))
def test_random_contractions_with_tiny_enumeration_chunks(case, chunk):
    # The interpreter enumerates its index box (tile.tuples) in chunks of CHUNK points; tiny chunks
    # exercise the splitting (outer indices iterated, one index cut into steps) on every contraction.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tile.tuples, "CHUNK", chunk)
        check_against_bruteforce(*case)


def P(*terms, const=0, den=1) -> Poly:
    """``P("i", (2, "j"))`` is i + 2*j."""
    return Poly(tuple((t, 1) if isinstance(t, str) else (t[1], t[0]) for t in terms), const, den)


# Hand-picked contractions through the same comparison: each exercises one rule on its own.
FIXED = [
    Spec("+", "", (4,), (P("i", den=2),), ((P("i"),),)),  # i/2 only matches even i
    Spec(">", "", (6,), (P((2, "i")),), ((P("i"),),)),  # skipped odd outputs are 0
    Spec("<", "?", (3,), (P("i"),), ((P("i"),), (P("j"),), (P("j"),))),  # the ?-zero is aggregated
    Spec("=", "", (3,), (P("i"),), ((P("j"),),)),  # duplicate writes
    Spec("=", "*", (2, 2), (P("i"), P("j")), ((P("i"),), (P("j"),))),  # outer product, one writer each
    Spec("+", "", (3,), (P("i"),), ((P("i", (-1, "j")),),), ((P("j"), 3),)),  # cumulative sum
    Spec("+", "", (2,), (P("i"),), ((P("i", const=5),),)),  # empty: i + 5 never in range
    Spec("*", "+", (3,), (P("i"),), ((P("i"),), (P("j"),)), default=True),
    Spec("+", "==", (), (), ((P("i"),), (P("j"),))),  # count equal pairs
    Spec("+", "", (), (), ((),)),  # no index at all: one tuple
    Spec(">", "", (2,), (P("i"),), ((P("i", (2, "j"), const=-1, den=3),),), ((P("j"), 2),)),
]


@pytest.mark.parametrize("spec", FIXED, ids=lambda s: s.source().splitlines()[1].strip())
@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.bool_, np.uint8])
def test_fixed_contractions_match_bruteforce(spec, dtype):
    rng = np.random.default_rng(7)
    shapes = {"A": (5,), "B": (3,), "C": (3,)}
    inputs = {n: make_array(rng, shapes[n][:len(ps)], np.dtype(dtype))
              for n, ps in zip(spec.operands, spec.operand_polys, strict=True)}
    if spec.default:
        inputs["D"] = make_array(rng, spec.out_sizes, np.dtype(np.float64))
    check_against_bruteforce(spec, inputs, require=_must_hold)


def _must_hold(condition: bool) -> None:
    assert condition, "a hand-picked case must be small and exact"


def test_bruteforce_sanity():
    # The brute force itself, on results known by hand: a self-check of the oracle.
    a = np.array([1, 2, 3, 4], np.int32)
    r = evaluate(Spec("+", "", (3,), (P("i"),), ((P("i", (-1, "j")),),), ((P("j"), 3),)), {"A": a})
    np.testing.assert_array_equal(r.value, [1, 3, 6])
    r = evaluate(Spec("<", "?", (1,), (P("i"),), ((P("i"),), (P("j"),), (P("j"),))),
                 {"A": np.array([1]), "B": np.array([1, 3]), "C": np.array([5, 6])})
    np.testing.assert_array_equal(r.value, [0])
    r = evaluate(Spec("=", "", (2,), (P("i", den=2),), ((P("i"),),)), {"A": a})
    assert not r.duplicate and r.valid == 2
    np.testing.assert_array_equal(r.value, [1, 3])  # i/2: i = 0 -> O[0], i = 2 -> O[1]
    r = evaluate(Spec("=", "", (1,), (P(),), ((P("i"),),)), {"A": np.arange(2)})
    assert [e["i"] for e in r.duplicate[(0,)]] == [0, 1]  # O[0] from i = 0 and i = 1
    r = evaluate(Spec("+", "", (2,), (P("i"),), ((P("i", const=5),),)), {"A": a})
    assert r.valid == 0 and not r.zero_size
    r = evaluate(Spec("*", "+", (2,), (P("i"),), ((P("i"),), (P("i"),))),
                 {"A": np.array([200, 1], np.uint8), "B": np.array([100, 1], np.uint8)})
    assert r.value.dtype == np.uint8 and list(r.value) == [44, 2]  # 300 wraps to 44
    assert P((-1, "i"), (2, "j"), const=-3, den=2).text() == "(-i + 2*j - 3)/2"


# ------------------------------------------------------------------------ einsum checks
@st.composite
def einsum_cases(draw):
    letters = string.ascii_lowercase[8:8 + draw(st.integers(1, 4))]  # i, j, k, l
    sizes = {c: draw(st.integers(1, 4)) for c in letters}
    ops = [draw(st.lists(st.sampled_from(letters), max_size=3)) for _ in range(draw(st.integers(1, 2)))]
    used = sorted({c for op in ops for c in op})
    out = draw(st.permutations(used))[:draw(st.integers(0, len(used)))]
    return ops, out, sizes, draw(st.sampled_from([np.int32, np.float64])), draw(st.integers(0, 2**32 - 1))


def check_einsum(ops: list, out: list, sizes: dict, dtype, seed: int) -> None:
    rng = np.random.default_rng(seed)
    arrays = {n: rng.integers(-3, 4, size=[sizes[c] for c in op]).astype(dtype)
              for n, op in zip("AB", ops, strict=False)}
    refs = [f"{n}[{', '.join(op)}]" for n, op in zip("AB", ops, strict=False)]
    head = ", ".join(out) + (": " + ", ".join(str(sizes[c]) for c in out) if out else "")
    src = f"function ({', '.join(arrays)}) -> (O) {{ O[{head}] = +({' * '.join(refs)}); }}"
    formula = ",".join("".join(op) for op in ops) + "->" + "".join(out)
    want = np.einsum(formula, *arrays.values()).astype(dtype)
    got = ref_interp.run(src, arrays)["O"]
    assert got.dtype == want.dtype, src
    np.testing.assert_array_equal(got, want, err_msg=f"{src}  vs  einsum('{formula}')")


@settings(max_examples=150, **SETTINGS)
@given(einsum_cases())
def test_random_einsum(case):
    check_einsum(*case)


NAMED = {"matmul": (["ik", "kj"], "ij"), "batched": (["bik", "bkj"], "bij"),
         "transposed": (["ki", "jk"], "ij"), "trace": (["ii"], ""), "diagonal": (["ii"], "i"),
         "transpose": (["ij"], "ji"), "outer": (["i", "j"], "ij"), "dot": (["i", "i"], ""),
         "batched_trace": (["bii"], "b"), "tensordot": (["ijk", "jkl"], "li"), "sum_all": (["ijk"], "")}


@pytest.mark.parametrize("name", sorted(NAMED))
@settings(max_examples=10, **SETTINGS)
@given(sizes=st.fixed_dictionaries({c: st.integers(1, 4) for c in "bijkl"}),
       dtype=st.sampled_from([np.int32, np.float64]), seed=st.integers(0, 2**32 - 1))
def test_named_einsum(name, sizes, dtype, seed):
    ops, out = NAMED[name]
    check_einsum([list(o) for o in ops], list(out), sizes, dtype, seed)
