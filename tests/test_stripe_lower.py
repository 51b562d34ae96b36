"""Lowering Tile to Stripe: the slides' golden conv, and Stripe execution equal to Tile's exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings

import ref_interp
import tile
from ref_interp.run import input_types
from ref_interp.stripe_exec import run_stripe
from stripe.ir import Block, Intrinsic, Load, RefDir, Special, Store
from stripe.lower import lower
from stripe.parser import parse_stripe
from stripe.printer import format_block
from stripe.verify import verify
from tests.pass_support import kernels
from tests.test_autodiff_properties import chain_case
from tests.test_bruteforce import cases
from tile.affine import Affine
from tile.bind import bind
from tile.errors import TileIndexError, TileRuntimeError

SETTINGS = settings(
    derandomize=True,
    deadline=None,
    max_examples=80,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

SLIDES_CONV = """function (I[X, Y, C1], K1[KX, KY, C1, C2]) -> (O1) {
    O1[x, y, co : X, Y, C2] = +(I[-1 + kx + x, -1 + ky + y, ci] * K1[kx, ky, ci, co]);
}"""


def lowered(src: str, inputs: dict) -> tuple[Block, object]:
    """The lowered program, checked on the way: it verifies and its text round-trips exactly."""
    p = tile.parse(src)
    b = bind(p, input_types(p, inputs))
    prog = lower(b)
    verify(prog)
    assert parse_stripe(format_block(prog)) == prog
    return prog, b


def aff(text: str) -> Affine:
    """An affine written like ``kx + x - 1`` (index names become variables)."""
    names = {v: Affine.var(v) for v in ("ci", "co", "kx", "ky", "x", "y")}
    return Affine() + eval(text, {}, names)


def assert_same(want: dict, got: dict) -> None:
    assert set(want) == set(got)
    for k in want:
        assert want[k].dtype == got[k].dtype, (k, want[k].dtype, got[k].dtype)
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_slides_conv_lowers_to_the_slides_block():
    # The slides' conv with 1024x1024x32 -> 64 shrunk to 8x8x4 -> 3; int8 as on the slides.
    ins = {"I": np.ones((8, 8, 4), np.int8), "K1": np.ones((3, 3, 4, 3), np.int8)}
    prog, _ = lowered(SLIDES_CONV, ins)
    (k,) = kernels(prog, "contraction")
    assert k.has_tags("agg_op_add", "comb_op_mul")
    # the interpreter's order (first appearance, output first), not the slides' alphabetical one:
    # strict mode keeps the order each element receives its values in
    assert [(i.name, i.range) for i in k.idxs] == [
        ("x", 8),
        ("y", 8),
        ("co", 3),
        ("kx", 3),
        ("ky", 3),
        ("ci", 4),
    ]
    assert set(k.constraints) == {aff("kx + x - 1"), aff("8 - kx - x"), aff("ky + y - 1"), aff("8 - ky - y")}
    refs = {r.into: r for r in k.refs}
    out, i, k1 = refs["O1"], refs["I"], refs["K1"]
    assert (out.dir, out.agg_op, out.access) == (RefDir.OUT, "add", (aff("x"), aff("y"), aff("co")))
    assert [(d.size, d.stride) for d in out.shape.dims] == [(1, 24), (1, 3), (1, 1)]
    assert (i.dir, i.access) == (RefDir.IN, (aff("kx + x - 1"), aff("ky + y - 1"), aff("ci")))
    assert [(d.size, d.stride) for d in i.shape.dims] == [(1, 32), (1, 4), (1, 1)]
    assert k1.access == (aff("kx"), aff("ky"), aff("ci"), aff("co"))
    assert [(d.size, d.stride) for d in k1.shape.dims] == [(1, 36), (1, 12), (1, 3), (1, 1)]
    kinds = [type(s) for s in k.stmts]
    assert kinds == [Load, Load, Intrinsic, Store]
    assert k.stmts[2].name == "mul"
    # the program structure: #program -> #main -> kernels; zero-fill before the sum
    assert prog.has_tags("program") and prog.stmts[0].has_tags("main")
    assert [s.name for s in prog.stmts[0].stmts[0].stmts if isinstance(s, Special)] == ["zero"]
    assert {r.into: sorted(r.tags) for r in prog.refs} == {
        "I": ["input", "user"],
        "K1": ["input", "user"],
        "O1": ["output", "user"],
    }
    rng = np.random.default_rng(0)
    ins = {
        "I": rng.integers(-3, 4, (8, 8, 4)).astype(np.int8),
        "K1": rng.integers(-3, 4, (3, 3, 4, 3)).astype(np.int8),
    }
    assert_same(ref_interp.run(SLIDES_CONV, ins), run_stripe(prog, ins))


PROGRAMS = [
    (
        "function (X[N, M], B[M]) -> (Y, Z) { T = relu(X * 2 + B) + index(X, 1); Y[i: N] = >(T[i, j]); "
        "Z = reshape(exp(T), M, N) * 2; }",
        {"X": (2, 3), "B": (3,)},
    ),
    (
        "function (DO[N, OH, OW, CO], K[KH, KW, CI, CO]) -> (DI) { DI[n, 3*y + 2*j, 3*x + 2*i, ci: N, 3*OH, "
        "3*OW, CI] = +(DO[n, y, x, co] * K[j, i, ci, co]); }",
        {"DO": (2, 3, 3, 7), "K": (2, 2, 5, 7)},
    ),
    (
        "function (I[N], D[N]) -> (O, P, Q) { O[i: N] = +(I[i/2]) default D; P[2*i: N] = <(I[i]); "
        "Q[] = *(I[i]), i < 3; }",
        {"I": (6,), "D": (6,)},
    ),
    (
        "function (A[N], B[N], C[N]) -> (O, E) { O[i: N] = +(A[i] == B[j] ? C[j]); "
        "E[i: N] = >(A[i] == B[i]); }",
        {"A": (5,), "B": (5,), "C": (5,)},
    ),
    (
        "function (D[N, M], I[K]) -> (O, S) { O = gather(D, I) * 2; S = scatter(O, I, D); }",
        {"D": (4, 3), "I": None},
    ),
    (
        "function (X[R, C]) -> (Y, L) { Y = builtin_softmax(X, R, C); L = builtin_logsoftmax(X, R, C); }",
        {"X": (2, 3)},
    ),
    ("function (X[N]) -> (Y, Z, W) { Y = N; Z = shape(X); W = 2.5; }", {"X": (3,)}),
    ("function (A[N]) -> (O) { O[i: N] = =(A[i]) default A; }", {"A": (0,)}),
    ("function (A[N], B[M]) -> (O) { O[i, j: N, M] = +(A[i] + B[j]); }", {"A": (3,), "B": (0,)}),
]


@pytest.mark.parametrize("src, shapes", PROGRAMS, ids=range(len(PROGRAMS)))
def test_hand_written_programs_match_tile(src, shapes):
    rng = np.random.default_rng(3)
    ins = {
        k: (np.array([0, 3, 3, 7], np.int32) if s is None else rng.integers(-3, 4, s).astype(np.float32))
        for k, s in shapes.items()
    }
    prog, b = lowered(src, ins)
    assert_same(ref_interp.run(b, ins), run_stripe(prog, ins))


@SETTINGS
@given(cases())
def test_random_contractions_match_tile_exactly(case):
    spec, inputs = case
    src = spec.source()
    try:
        want = ref_interp.run(src, inputs)
    except (TileIndexError, TileRuntimeError):
        assume(False)  # an empty or doubly-assigned contraction: no value to compare
    prog, _ = lowered(src, inputs)
    assert_same(want, run_stripe(prog, inputs))


@SETTINGS
@given(chain_case())
def test_random_elementwise_chains_match_tile_exactly(case):
    src, probe, inputs, _, _ = case
    prog, b = lowered(probe, inputs)
    assert_same(ref_interp.run(b, inputs), run_stripe(prog, inputs))


@pytest.mark.parametrize(
    "src, shapes",
    [
        (
            "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) { O[n, y, x, co: N, H/3, W/3, CO] = "
            "+(I[n, 3*y + 2*j, 3*x + 2*i, ci] * K[j, i, ci, co]); }",
            {"I": (1, 7, 8, 2), "K": (2, 2, 2, 3)},
        ),
        (
            "function (X[N], B[M, N]) -> (Y) { T = tanh(X * 2) + B; Y[] = >(T[i, j]); }",
            {"X": (3,), "B": (2, 3)},
        ),
        ("function (X[N]) -> (Y) { Y[] = *(X[i]); }", {"X": (4,)}),
    ],
)
def test_gradient_programs_match_tile(src, shapes):
    rng = np.random.default_rng(5)
    ins = {k: rng.integers(-2, 3, s).astype(np.float64) for k, s in shapes.items()}
    g = tile.gradient(
        src, shapes={k: v.shape for k, v in ins.items()}, dtypes={k: tile.dtypes.DType.FLOAT64 for k in ins}
    )
    fwd = ref_interp.run(src, ins)
    feed = {**ins, **{cot: np.ones(fwd[o].shape) for o, cot in g.cotangents.items()}}
    prog, b = lowered(tile.printer.format_program(g.program), feed)
    assert_same(ref_interp.run(b, feed), run_stripe(prog, feed))


def test_stripe_text_runs_from_the_command_line(tmp_path):
    import subprocess
    import sys

    src, shapes = PROGRAMS[1]
    ins = {k: np.random.default_rng(1).integers(-3, 4, s).astype(np.float32) for k, s in shapes.items()}
    prog, b = lowered(src, ins)
    (tmp_path / "p.stripe").write_text(format_block(prog))
    np.savez(tmp_path / "in.npz", **ins)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ref_interp",
            "run",
            str(tmp_path / "p.stripe"),
            "--inputs",
            str(tmp_path / "in.npz"),
            "--output",
            str(tmp_path / "out.npz"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["DI"], ref_interp.run(b, ins)["DI"])


def test_comparison_with_a_float_literal_keeps_tile_typing():
    # X == 0.1 compares in promote(float32, float32): the literal is float32(0.1) there, while
    # X64 * 0.1 multiplies by the double nearest 0.1 (the literal's value travels exactly until used).
    x = np.array([0.1, 0.2, np.nextafter(np.float32(0.1), np.float32(1))], np.float32)
    ins = {"X": x, "Y": x.astype(np.float64)}
    src = "function (X, Y) -> (O, P, Q) { O = X == 0.1; P = X <= 0.1; Q = Y * 0.1; }"
    prog, b = lowered(src, ins)
    want = ref_interp.run(b, ins)
    np.testing.assert_array_equal(want["O"], [True, False, False])
    assert_same(want, run_stripe(prog, ins))


@pytest.mark.parametrize(
    "src, shapes, masked",
    [
        ("function (A[M, N]) -> (O) { O[] = >(A[i, j]); }", {"A": (3, 4)}, False),
        ("function (A[M, N]) -> (O) { O[i: M] = <(A[i, j]); }", {"A": (3, 4)}, False),
        ("function (A[M, N]) -> (O) { O[j, i: N, M] = *(A[i, j]); }", {"A": (3, 4)}, False),
        ("function (A[N]) -> (O) { O[i: N] = >(A[N - 1 - i]); }", {"A": (5,)}, False),
        ("function (A[M, N], D[M]) -> (O) { O[i: M] = >(A[i, j]) default D; }", {"A": (3, 3), "D": (3,)},
         False),
        ("function (A[N]) -> (O) { O[i: N] = >(A[i]) default A; }", {"A": (4,)}, False),
        # unwritten elements: skipped (2*i), past the range (N + 1), a constraint, a diagonal
        ("function (A[N]) -> (O) { O[2*i: 2*N] = >(A[i]); }", {"A": (3,)}, True),
        ("function (A[N]) -> (O) { O[i: N + 1] = <(A[i]); }", {"A": (3,)}, True),
        ("function (A[N]) -> (O) { O[i: N] = *(A[i + j]), j < 2; }", {"A": (4,)}, True),
        ("function (A[N]) -> (O) { O[i, i: N, N] = >(A[i]); }", {"A": (3,)}, True),
        ("function (A[N], D[M]) -> (O) { O[i: M] = +(A[i]) default D; }", {"A": (4,), "D": (5,)}, True),
    ],
)
def test_written_masks_only_where_some_element_may_stay_unwritten(src, shapes, masked):
    """``> < *`` (and ``+`` with a default) need a written mask and a select only where some
    output element may get no value; a block without constraints whose output access numbers
    every element aggregates straight into the output, started at the identity."""
    rng = np.random.default_rng(7)
    ins = {k: rng.integers(-9, -1, s).astype(np.float32) for k, s in shapes.items()}  # max != 0
    prog, b = lowered(src, ins)
    bools = [r.into for r in prog.refs if r.shape.dtype.name == "BOOL"]
    assert bool(bools) == masked, bools
    assert bool(kernels(prog, "eltwise_cond")) == masked
    assert_same(ref_interp.run(b, ins), run_stripe(prog, ins))
