"""reduce, defract and flatten on hand-written cases: the autodiff post's worked example, the
tutorial's skipping / pooling cases, PlaidML's "Subdivision" test, a lattice needing splits that
are not a divisibility chain, the located errors, and the CLI.

Every expectation is computed independently (plain loops over the language definition, or by
hand); each program is evaluated at every stage in exact precision on integer-valued inputs.
``flat_tuples`` enumerates a flat contraction's valid index tuples straight from its fields (the
form a backend consumes), so ownership and the flat meaning are checked without the interpreter.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

import ref_interp
import tile
from tile.ast import CombOp
from tile.bind import bind
from tile.dtypes import DType
from tile.errors import TileError, TileIndexError, TileRuntimeError
from tile.transforms import STAGES, FlatContraction, apply_stage, defract, flatten, reduce, transform
from tile.transforms.emit import format_flat_program
from tile.typed import TContraction, TensorType

REPO = Path(__file__).resolve().parents[1]
RNG = np.random.default_rng(7)


# ------------------------------------------------------------------------------------ helpers
def contraction(src: str, **shapes: tuple[int, ...]) -> TContraction:
    types = {k: TensorType(DType.FLOAT32, v) for k, v in shapes.items()}
    (c,) = [s for s in bind(tile.parse(src), types).stmts if isinstance(s, TContraction)]
    return c


def ints(shape, lo=-3, hi=4) -> np.ndarray:
    return RNG.integers(lo, hi, size=shape).astype(np.float32)


def polys(acc) -> list[str]:
    return [str(p) for p in acc.polys]


def assert_exact(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    assert all(a == b for a, b in zip(got.flat, want.flat)), (got, want)


def assert_every_stage(src: str, inputs: dict, want: np.ndarray, out: str = "O") -> None:
    for stage in STAGES:
        got = ref_interp.run(src, inputs, "exact", stage=stage)[out]
        assert got.dtype == object, stage  # exact precision: Fractions, no rounding anywhere
        assert_exact(got, want)


def flat_tuples(f: FlatContraction) -> list[tuple[tuple[int, ...], list[int]]]:
    """Every valid index tuple of ``f`` with its element offset per access (output first):
    indices in ``[0, range)``, every constraint ``lo <= coeffs·idx <= hi``, and each access's
    offset inside its tensor (per-dimension validity the ranges do not imply is a constraint)."""
    accesses = (f.output, *f.operands)
    sizes = [math.prod(a.type.shape) for a in accesses]
    out = []
    for idx in itertools.product(*(range(r) for r in f.ranges)):
        if not all(k.lo <= sum(a * x for a, x in zip(k.coeffs, idx)) <= k.hi for k in f.constraints):
            continue
        offsets = [a.offset + sum(s * x for s, x in zip(a.strides, idx)) for a in accesses]
        if all(0 <= o < n for o, n in zip(offsets, sizes)):
            out.append((idx, offsets))
    return out


def check_ownership(f: FlatContraction) -> list:
    """No output element is reached from two different values of the output-owning indices."""
    owning = [k for k, s in enumerate(f.output.strides) if s]
    assert tuple(f.names[k] for k in owning) == f.output_indices
    tuples = flat_tuples(f)
    owners: dict[int, set] = defaultdict(set)
    for idx, offsets in tuples:
        owners[offsets[0]].add(tuple(idx[k] for k in owning))
    shared = {o: sorted(s) for o, s in owners.items() if len(s) > 1}
    assert not shared, f"output offsets written by several output-index tuples: {shared}"
    return tuples


def flat_value(f: FlatContraction, inputs: dict) -> np.ndarray:
    """The flat contraction evaluated from its fields alone (unwritten elements 0)."""
    agg = {"+": sum, "*": math.prod, ">": max, "<": min, "=": lambda v: v[0]}[f.agg.value]
    buffers = [np.asarray(inputs[a.tensor]).reshape(-1) for a in f.operands]
    writes: dict[int, list] = defaultdict(list)
    for _, offsets in flat_tuples(f):
        reads = [int(b[o]) for b, o in zip(buffers, offsets[1:])]
        writes[offsets[0]].append(reads[0] if f.comb is CombOp.NONE else
                                  reads[0] * reads[1] if f.comb.value == "*" else reads[0] + reads[1])
    out = np.zeros(math.prod(f.type.shape), dtype=object)
    for where, vals in writes.items():
        out[where] = agg(vals)
    return out.reshape(f.type.shape)


def integral_everywhere(c: TContraction) -> bool:
    ps = [p for acc in (c.output, *c.operands) for p in acc.polys] + [k.poly for k in c.constraints]
    return all(p.is_integral for p in ps)


# ----------------------------------------------------------------- the autodiff post's example
SEED = """function (DO[N, OH, OW, CO], K[KH, KW, CI, CO]) -> (DI) {
    DI[n, 3*y + 2*j, 3*x + 2*i, ci: N, 3*OH, 3*OW, CI] = +(DO[n, y, x, co] * K[j, i, ci, co]);
}
"""
SEED_SHAPES = {"DO": (2, 3, 3, 7), "K": (2, 2, 5, 7)}
SEED_DEFRACTED = ("DI[v0_0, v1_0 + 3*v1_1, v2_0 + 3*v2_1, v3_0: 2, 9, 9, 5] = "
                  "+(DO[v0_0, -v1_0 + v1_1 - 2*v4_0, -v2_0 + v2_1 - 2*v5_0, v6_0] * "
                  "K[2*v1_0 + 3*v4_0, 2*v2_0 + 3*v5_0, v3_0, v6_0]), "
                  "v1_0 < 3, v2_0 < 3;")


def seed_expected(do: np.ndarray, k: np.ndarray) -> np.ndarray:
    di = np.zeros((2, 9, 9, 5), dtype=object)
    for n, y, x, co, j, i, ci in itertools.product(range(2), range(3), range(3), range(7), range(2), range(2),
                                                   range(5)):
        di[n, 3 * y + 2 * j, 3 * x + 2 * i, ci] += int(do[n, y, x, co]) * int(k[j, i, ci, co])
    return di


def test_seed_reduce_matches_the_post():
    r = reduce(contraction(SEED, **SEED_SHAPES))
    assert polys(r.output) == ["v0", "v1", "v2", "v3"]
    assert [r.operands[0].tensor, r.operands[1].tensor] == ["DO", "K"]
    assert polys(r.operands[0]) == ["v0", "1/3*v1 - 2/3*v4", "1/3*v2 - 2/3*v5", "v6"]
    assert polys(r.operands[1]) == ["v4", "v5", "v3", "v6"]
    assert r.constraints == ()  # every old index is already forced to be an integer


def test_seed_defract_matches_the_post():
    d = defract(reduce(contraction(SEED, **SEED_SHAPES)))
    assert polys(d.output) == ["v0_0", "v1_0 + 3*v1_1", "v2_0 + 3*v2_1", "v3_0"]
    assert polys(d.operands[0]) == ["v0_0", "-v1_0 + v1_1 - 2*v4_0", "-v2_0 + v2_1 - 2*v5_0", "v6_0"]
    assert polys(d.operands[1]) == ["2*v1_0 + 3*v4_0", "2*v2_0 + 3*v5_0", "v3_0", "v6_0"]
    assert [(str(k.poly), k.bound) for k in d.constraints] == [("v1_0", 3), ("v2_0", 3)]
    assert integral_everywhere(d)
    assert transform(contraction(SEED, **SEED_SHAPES), "defracted") == d


def test_seed_values_and_flat_form():
    do, k = ints(SEED_SHAPES["DO"]), ints(SEED_SHAPES["K"])
    want = seed_expected(do, k)
    assert_every_stage(SEED, {"DO": do, "K": k}, want, "DI")
    f = flatten(defract(reduce(contraction(SEED, **SEED_SHAPES))))
    assert f.output_indices == ("v0_0", "v1_0", "v1_1", "v2_0", "v2_1", "v3_0")
    tuples = check_ownership(f)
    assert len(tuples) == 2 * 3 * 3 * 7 * 2 * 2 * 5  # every original tuple exactly once
    assert_exact(flat_value(f, {"DO": do, "K": k}), want)


# ---------------------------------------------------------- tutorial and PlaidML test cases
SKIPPING = "function (I[N, M]) -> (O) { O[2 * i: N] = +(I[2 * i, j]); }"
POOLING = "function (I[N]) -> (O) { O[i: (N + 1) / 2] = >(I[2 * i + j]), j < 2; }"
SUBDIVISION = "function (I[N], K[M]) -> (O) { O[i: N] = +(I[i/2 + k/2] * K[k]); }"


def skipping_expected(i: np.ndarray) -> np.ndarray:
    o = np.zeros(i.shape[0], dtype=object)
    for a in range(0, i.shape[0], 2):
        o[a] = sum(int(x) for x in i[a])
    return o


def pooling_expected(i: np.ndarray) -> np.ndarray:
    n = i.shape[0]
    return np.array([max(int(x) for x in i[2 * a: 2 * a + 2]) for a in range((n + 1) // 2)], dtype=object)


def subdivision_expected(i: np.ndarray, k: np.ndarray) -> np.ndarray:
    o = np.zeros(i.shape[0], dtype=object)
    for a, b in itertools.product(range(i.shape[0]), range(k.shape[0])):
        if (a + b) % 2 == 0 and (a + b) // 2 < i.shape[0]:
            o[a] += int(i[(a + b) // 2]) * int(k[b])
    return o


@pytest.mark.parametrize("src, shapes, expected", [
    (SKIPPING, {"I": (5, 3)}, skipping_expected),
    (SKIPPING, {"I": (6, 2)}, skipping_expected),
    (POOLING, {"I": (5,)}, pooling_expected),
    (POOLING, {"I": (8,)}, pooling_expected),
    (SUBDIVISION, {"I": (6,), "K": (3,)}, subdivision_expected),
    (SUBDIVISION, {"I": (7,), "K": (4,)}, subdivision_expected),
], ids=["skip5", "skip6", "pool5", "pool8", "subdiv6", "subdiv7"])
def test_tutorial_cases_every_stage(src, shapes, expected):
    inputs = {k: ints(v) for k, v in shapes.items()}
    want = expected(*inputs.values())
    assert_every_stage(src, inputs, want)
    c = contraction(src, **shapes)
    d = transform(c, "defracted")
    assert integral_everywhere(d)
    f = flatten(d)
    check_ownership(f)
    assert_exact(flat_value(f, inputs), want)


def test_subdivision_has_a_parity_index():
    c = contraction(SUBDIVISION, I=(6,), K=(3,))
    assert transform(c, "reduced") == c  # its output index is already a single variable
    d = defract(c)
    assert 2 in [k.bound for k in d.constraints]  # one index is a parity digit 0 <= p < 2
    f = flatten(d)
    assert len(f.names) == 3
    parity = [n for n, r in zip(f.names, f.ranges) if r == 2 and n in f.output_indices]
    assert parity, f.names


def test_skipping_writes_only_even_elements_from_one_owner():
    f = transform(contraction(SKIPPING, I=(5, 3)), "flat")
    tuples = check_ownership(f)
    assert sorted({offsets[0] for _, offsets in tuples}) == [0, 2, 4]
    assert len(tuples) == 3 * 3


# ------------------------------------------------- splits that are not a divisibility chain
MIXED = "function (A[N], B[M]) -> (O) { O[i: 12] = +(A[i/2 + j/2] * B[i/3 + k/3]); }"


def test_mixed_radix_splits():
    """``j`` needs ``i`` modulo 2 and ``k`` needs it modulo 3: 2 and 3 are no divisibility chain
    (the original failed with "Unable to remove modulo operations")."""
    a, b = ints((6,)), ints((4,))
    want = np.zeros(12, dtype=object)
    count = 0
    for i, j, k in itertools.product(range(12), range(-12, 12), range(-12, 12)):
        if (i + j) % 2 == 0 and (i + k) % 3 == 0 and 0 <= (i + j) // 2 < 6 and 0 <= (i + k) // 3 < 4:
            want[i] += int(a[(i + j) // 2]) * int(b[(i + k) // 3])
            count += 1
    assert_every_stage(MIXED, {"A": a, "B": b}, want)
    d = transform(contraction(MIXED, A=(6,), B=(4,)), "defracted")
    assert integral_everywhere(d)
    f = flatten(d)
    tuples = check_ownership(f)
    assert len(tuples) == count
    assert_exact(flat_value(f, {"A": a, "B": b}), want)


def test_fractional_constant_offset():
    src = "function (A[N]) -> (O) { O[i: 7] = +(A[(i + 1)/2]); }"
    a = ints((4,))
    want = np.array([int(a[(i + 1) // 2]) if i % 2 else 0 for i in range(7)], dtype=object)
    assert_every_stage(src, {"A": a}, want)


# -------------------------------------------------- flatten's rounding of merged bounds
def test_flat_merged_parallel_bounds_round_inward():
    """``A[i + j]`` and ``B[x, 2*i + 2*j - 1]`` merge into one range ``1/2 <= i + j <= 9/2``; the
    flat integer bounds must be ``1 <= i + j <= 4``. Otherwise i + j = 0 reads B[x, -1], which
    lies inside B's buffer (as B[x - 1, 8]) for x >= 1."""
    src = "function (A[N], B[X, M]) -> (O) { O[i, x: 4, 3] = +(A[i + j] * B[x, 2*i + 2*j - 1]); }"
    a, b = ints((6,)), ints((3, 9))
    want = np.zeros((4, 3), dtype=object)
    for i, x, j in itertools.product(range(4), range(3), range(-4, 6)):
        if 0 <= i + j < 6 and 0 <= 2 * i + 2 * j - 1 < 9:
            want[i, x] += int(a[i + j]) * int(b[x, 2 * i + 2 * j - 1])
    f = flatten(contraction(src, A=(6,), B=(3, 9)))
    assert_exact(flat_value(f, {"A": a, "B": b}), want)
    assert_every_stage(src, {"A": a, "B": b}, want)


def test_flat_merged_bounds_after_defract():
    """Found by Hypothesis: only (i, j) = (1, 0) is valid (-2*i + 2 in [0, 1] needs i >= 1/2), so
    only O[2] is written. The defracted constraint ``0 <= -2*v0_1 + 2 <= 1`` merges with A's
    ``0 <= v0_1 <= 1`` into ``1/2 <= v0_1 <= 1``, which must round to v0_1 = 1."""
    src = "function (A[N, M]) -> (O) { O[2*i + j: 3] = +(A[i, j]), -2*i + 2 < 2; }"
    a = np.array([[2], [1]], np.float32)
    want = np.array([0, 0, 1], dtype=object)
    assert_every_stage(src, {"A": a}, want)
    f = transform(contraction(src, A=(2, 1)), "flat")
    assert len(check_ownership(f)) == 1
    assert_exact(flat_value(f, {"A": a}), want)


def test_ownership_check_detects_shared_outputs():
    """The checker itself: without reduce, ``O[i + j]`` is written from several (i, j)."""
    c = contraction("function (A[N, M]) -> (O) { O[i + j: 5] = +(A[i, j]); }", A=(3, 3))
    with pytest.raises(AssertionError, match="several output-index tuples"):
        check_ownership(flatten(c))
    check_ownership(transform(c, "flat"))


# ----------------------------------------------------------------------------------- errors
def located(err: TileError, src: str, text: str) -> None:
    """``err`` points at the first occurrence of ``text`` in the one-line program ``src``."""
    assert err.span is not None
    assert (err.span.line, err.span.col) == (1, src.index(text) + 1), (err.span, text)
    assert err.hint


def test_flatten_fractional_coefficients_is_located():
    src = "function (I[N]) -> (O) { O[i: 6] = +(I[i/2]); }"
    with pytest.raises(TileIndexError) as e:
        flatten(contraction(src, I=(3,)))
    assert "dimension 0 of 'I'" in e.value.message and "fractional" in e.value.message
    located(e.value, src, "i/2")


def test_reduce_underspecified_is_located():
    src = "function (I[N, M]) -> (O) { O[i + j: 5] = +(I[i, j]); }"
    c = contraction(src, I=(3, 3))
    same = c.output.polys[0]  # every condition is i + j: j - i is left undetermined
    bad = dataclasses.replace(c, operands=(dataclasses.replace(c.operands[0], polys=(same, same)),))
    with pytest.raises(TileIndexError) as e:
        reduce(bad)
    assert "underspecified" in e.value.message
    located(e.value, src, "O[i + j")


def test_defract_empty_lattice_is_located():
    src = "function (A[N], B[M]) -> (O) { O[i: 6] = +(A[i/2] * B[(i + 1)/2]); }"
    c = contraction(src, A=(3,), B=(3,))
    with pytest.raises(TileIndexError) as e:
        defract(c)
    assert "integer" in e.value.message
    located(e.value, src, "O[i")
    for stage in STAGES:  # no valid tuple at all: an error at every stage
        with pytest.raises(TileIndexError):
            ref_interp.run(src, {"A": ints((3,)), "B": ints((3,))}, "exact", stage=stage)


def test_assign_writing_twice_is_located_at_every_stage():
    src = "function (A[N, M]) -> (O) {\n    O[1, i + j: 2, 5] = =(A[i, j]);\n}\n"
    for stage in STAGES:
        with pytest.raises(TileRuntimeError) as e:
            ref_interp.run(src, {"A": ints((3, 3))}, "exact", stage=stage)
        assert "O[1, 1] more than once" in e.value.message, stage  # the element, in O's coordinates
        span = e.value.span
        assert span is not None and span.source is not None and (span.line, span.col) == (2, 5), stage


def test_transforms_leave_simple_contractions_alone():
    c = contraction("function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }",
                    A=(2, 3), B=(3, 4))
    assert reduce(c) is c and defract(c) is c
    f = flatten(c)
    assert f.names == ("i", "j", "k") and f.ranges == (2, 4, 3)
    assert [a.strides for a in (f.output, *f.operands)] == [(4, 1, 0), (3, 0, 1), (0, 1, 4)]
    assert f.constraints == ()
    with pytest.raises(ValueError):
        transform(c, "stripe")


# -------------------------------------------------------------------------------------- CLI
def cli(module: str, *args) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_cli_emit_and_run_stages(tmp_path):
    f = tmp_path / "seed.tile"
    f.write_text(SEED)
    shapes = ["--shape", "DO=2x3x3x7", "--shape", "K=2x2x5x7"]
    out = cli("tile", "emit", f, "--stage", "defracted", *shapes)
    assert SEED_DEFRACTED in [line.strip() for line in out.splitlines()]
    do, k = ints(SEED_SHAPES["DO"]), ints(SEED_SHAPES["K"])
    np.savez(tmp_path / "in.npz", DO=do, K=k)
    results = {}
    for stage in ("tile", "flat"):
        cli("ref_interp", "run", f, "--inputs", tmp_path / "in.npz", "--stage", stage,
            "--output", tmp_path / f"{stage}.npz")
        results[stage] = np.load(tmp_path / f"{stage}.npz")["DI"]
    np.testing.assert_array_equal(results["flat"], results["tile"])
    np.testing.assert_array_equal(results["tile"], seed_expected(do, k).astype(np.float32))
    assert results["flat"].dtype == np.float32


def test_cli_emit_flat_tile_runs_to_the_same_answer(tmp_path):
    f = tmp_path / "seed.tile"
    f.write_text(SEED)
    do, k = ints(SEED_SHAPES["DO"]), ints(SEED_SHAPES["K"])
    np.savez(tmp_path / "in.npz", DO=do, K=k)
    text = cli("tile", "emit", f, "--stage", "flat-tile", "--inputs", tmp_path / "in.npz")
    assert "DO_1d = reshape(DO, " in text  # the flat form reads 1-D views, not the tensors
    flat = tmp_path / "flat.tile"
    flat.write_text(text)
    cli("ref_interp", "run", flat, "--inputs", tmp_path / "in.npz", "--output", tmp_path / "out.npz")
    want = seed_expected(do, k).astype(np.float32)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["DI"], want)


def test_flat_tile_refuses_an_index_only_constraints_use():
    # O[2i + j] over A[i, j]: flattening leaves a digit that only a constraint reads
    src = "function (A[N, M]) -> (O) { O[2*i + j: 4] = +(A[i, j]); }"
    prog = tile.parse(src)
    b = tile.bind(prog, {"A": TensorType(DType.FLOAT32, (2, 2))})
    with pytest.raises(TileIndexError, match="only its constraints use") as e:
        format_flat_program(apply_stage(b, "flat"))
    assert "O[2*i + j: 4]" in str(e.value)  # located at the contraction, with a caret
    a = ints((2, 2))
    np.testing.assert_array_equal(ref_interp.run(src, {"A": a}, stage="flat")["O"], a.reshape(-1))
