"""The ``gemm_tile`` pass: GEMM-shaped kernels as work-group / K-step / fill / thread / register
nests (``stripe.passes.gemm_tile``). Meaning is checked with the Stripe interpreter before and
after on integer inputs (exact), and on random floats bit for bit (the pass keeps each element's
K order, so strict mode may run it); the structure and the cost model's tiles directly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from ref_interp.stripe_exec import run_stripe
from stripe.config import pass_params, target_config
from stripe.gemm import match
from stripe.gemm_model import GemmModel, index_tiles, k_tiles
from stripe.hardware import Hardware
from stripe.ir import Block, Index, walk
from stripe.passes import optimize
from stripe.passes.gemm_tile import GemmTileConfig
from tests.pass_support import assert_same_meaning, inputs_for, lowered, programs, run_pass

PARAMS = {"reqs": ["contraction", "kernel"]}
MM = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"
BMM = "function (A[Q, M, K], B[Q, K, N]) -> (C) { C[q, m, n : Q, M, N] = +(A[q, m, k] * B[q, k, n]); }"
CONV = """function (I[N, X, Y, CI], F[KX, KY, CI, CO]) -> (O) {
  O[n, x, y, co : N, X, Y, CO] = +(I[n, x + i - 1, y + j - 1, ci] * F[i, j, ci, co]);
}"""
STRIDED = """function (I[N, X, Y, CI], F[KX, KY, CI, CO]) -> (O) {
  O[n, x, y, co : N, (X + 1) / 2, (Y + 1) / 2, CO] =
      +(I[n, 2 * x + i - 1, 2 * y + j - 1, ci] * F[i, j, ci, co]);
}"""
FUSED = """function (I[N, X, Y, CI], F[KX, KY, CI, CO], B[CO]) -> (O) {
  T[n, x, y, co : N, X, Y, CO] = +(I[n, x + i - 1, y + j - 1, ci] * F[i, j, ci, co]);
  O = relu(T + B);
}"""


def tiled(program: Block, target: str = "opencl_gpu", params: dict | None = None) -> Block:
    return run_pass("gemm_tile", params or PARAMS, program, target)


def nests(program: Block) -> list[Block]:
    return [b for b in walk(program) if "gpu_group" in b.tags]


def optimized(src: str, shapes: dict) -> Block:
    """Through the opencl_gpu pipeline before gemm_tile (fusion made the epilogue)."""
    cfg = target_config("opencl_gpu")
    return optimize(lowered(src, shapes), cfg, after="reduce_constraints")


@pytest.mark.parametrize(
    "m,k,n", [(1, 1, 1), (3, 5, 7), (2, 1, 2), (37, 5, 70), (127, 13, 131), (1000, 3, 17), (5, 61, 6)]
)
def test_matmul_sizes_keep_meaning(m, k, n):
    p = lowered(MM, {"A": (m, k), "B": (k, n)})
    out = tiled(p)
    assert len(nests(out)) == (min(m, n) >= 2)  # a side of one point: a matrix-vector product
    assert_same_meaning(p, out)


def test_batched_matmul():
    p = lowered(BMM, {"A": (3, 37, 11), "B": (3, 11, 70)})
    out = tiled(p)
    (g,) = nests(out)
    assert [ix.name for ix in g.idxs][0] == "q" and g.idxs[0].range == 3  # batch: tile 1
    assert_same_meaning(p, out)


@pytest.mark.parametrize("src", [CONV, STRIDED], ids=["padded", "strided"])
def test_padded_and_strided_conv(src):
    p = lowered(src, {"I": (2, 9, 7, 3), "F": (3, 3, 3, 5)})
    out = tiled(p)
    assert len(nests(out)) == 1
    assert_same_meaning(p, out)
    assert_same_meaning(p, out, seed=1)


def test_fused_epilogue():
    p = optimized(FUSED, {"I": (2, 7, 5, 3), "F": (3, 3, 3, 17), "B": (17,)})
    assert any("fused" in b.tags for b in walk(p))
    out = tiled(p)
    (g,) = nests(out)
    assert "fused" in g.tags and len(g.stmts) == 2  # the K steps, then the epilogue's threads
    assert_same_meaning(p, out)


def test_levels_and_tiles_of_a_matmul():
    p = lowered(MM, {"A": (300, 40), "B": (40, 200)})
    (g,) = nests(tiled(p))
    (kstep,) = g.stmts
    fa, fb, thread = kstep.stmts
    (reg,) = thread.stmts
    assert "gpu_kstep" in kstep.tags and "gpu_fill" in fa.tags and "gpu_fill" in fb.tags
    assert "gpu_thread" in thread.tags and "reg" in reg.tags
    locals_ = [r for r in kstep.refs if r.location is not None]
    assert {r.location.name for r in locals_} == {"LOCAL"}
    # 300 x 200 on 132 units: 64x64 tiles of 4x4 registers (the rule), K step 16
    tm = np.prod([ix.range for ix in fa.idxs if ix.name == "m"])
    tn = np.prod([ix.range for ix in fb.idxs if ix.name == "n"])
    threads = np.prod([ix.range for ix in thread.idxs if ix.affine is None])
    regs = np.prod([ix.range for ix in reg.idxs if ix.affine is None and ix.name != "k"])
    kt = next(ix.range for ix in reg.idxs if ix.name == "k")
    assert (tm, tn, threads, regs, kt) == (64, 64, 256, 16, 16)
    assert [ix.range for ix in g.idxs] == [5, 4]  # ceil(300/64), ceil(200/64)


def test_strict_order_bit_identical_on_random_floats():
    """K tiles keep Stripe's order, so even rounded sums are the interpreter's bit for bit."""
    p = lowered(CONV, {"I": (1, 6, 5, 20), "F": (3, 3, 20, 9)})
    out = tiled(p)
    rng = np.random.default_rng(3)
    ins = {"I": rng.standard_normal((1, 6, 5, 20)).astype(np.float32),
           "F": rng.standard_normal((3, 3, 20, 9)).astype(np.float32)}
    want, got = run_stripe(p, ins)["O"], run_stripe(out, ins)["O"]
    np.testing.assert_array_equal(got, want)


def test_pass_does_not_reorder_and_runs_in_strict():
    from stripe.passes import PASSES

    assert not PASSES["gemm_tile"].reorders


def test_second_run_leaves_the_nest():
    p = lowered(MM, {"A": (40, 9), "B": (9, 33)})
    once = tiled(p)
    assert tiled(once) == once


def test_choices_take_runners_up():
    p = lowered(MM, {"A": (256, 64), "B": (64, 256)})
    first = tiled(p)
    second = tiled(p, params={**PARAMS, "choices": {"k1_C": 1}})
    assert first != second
    assert_same_meaning(p, second)


def model(m: int, k: int, n: int, hw: Hardware | None = None) -> GemmModel:
    p = lowered(MM, {"A": (m, k), "B": (k, n)})
    kernel = p.stmts[0].stmts[-1]
    main = p.stmts[0]
    g = match(kernel, tuple(r.into for r in main.refs), {r.into: r.shape.dtype for r in main.refs}, False)
    cfg = pass_params("gemm_tile", PARAMS)
    return GemmModel(g, hw or target_config("opencl_gpu").hardware, cfg)


@pytest.mark.parametrize(
    "size,tiles",
    [(4096, (128, 128, 8, 8, 8)), (8192, (128, 128, 8, 8, 8)), (1024, (64, 64, 4, 4, 16)),
     (100, (64, 64, 4, 4, 16)), (40, (32, 32, 4, 4, 16))],
)
def test_rule_restates_the_measured_choice(size, tiles):
    """The tiles the code generator chose before (bench/RESULTS.md) for square matmuls on 132
    compute units: 1024 has 64 tiles of 128x128, fewer than the units, so both sides halve."""
    assert model(size, size, size).rule().tiles == tiles


def test_rule_follows_the_hardware():
    hw = target_config("opencl_gpu").hardware
    few = Hardware(hw.clock_mhz, hw.mem_units, {"GPU": type(hw.exec_units["GPU"])(8, 256, 1, 256)},
                   hw.tx_units, hw.buses)
    assert model(1024, 1024, 1024, few).rule().tiles == (128, 128, 8, 8, 8)  # 64 groups fill 8 units
    small = Hardware(hw.clock_mhz, hw.mem_units, {"GPU": type(hw.exec_units["GPU"])(132, 256, 1, 64)},
                     hw.tx_units, hw.buses)
    ranked = GemmModel(model(4096, 4096, 4096).g, small, model(8, 8, 8).cfg).ranking()
    assert ranked and all(t.threads <= 64 for t in ranked)  # work-groups of at most 64 work-items


def test_index_tiles_pad_least():
    conv = (Index("n", 8), Index("x", 56), Index("y", 56))
    assert index_tiles(conv, 64) == {"n": 1, "x": 8, "y": 8}
    assert index_tiles(conv, 128) == {"n": 2, "x": 8, "y": 8}
    assert index_tiles((Index("m", 1000),), 128) == {"m": 128}
    assert index_tiles((Index("a", 2), Index("b", 3)), 32) == {"a": 2, "b": 16}


def test_k_tiles_keep_order():
    assert k_tiles((Index("i", 3), Index("j", 3), Index("ci", 64)), 16) == {"i": 1, "j": 1, "ci": 16}
    assert k_tiles((Index("i", 3), Index("j", 3), Index("ci", 3)), 16) == {"i": 1, "j": 3, "ci": 3}
    assert k_tiles((Index("k", 1000),), 8) == {"k": 8}


@settings(max_examples=25, deadline=None)
@given(programs(families=("contractions", "mixed")))
def test_drawn_programs_keep_meaning(case):
    program, inputs = case
    cfg = target_config("opencl_gpu")
    before = optimize(program, cfg, after="reduce_constraints")
    out = tiled(before)
    assert_same_meaning(program, out, inputs_for(program))


def test_config_names_a_missing_memory():
    from stripe.config import ConfigError

    with pytest.raises(ConfigError, match="no memory 'SRAM'"):
        tiled(lowered(MM, {"A": (4, 4), "B": (4, 4)}), params={**PARAMS, "memory": "SRAM"})


def test_default_config_fields():
    cfg = GemmTileConfig(reqs=("contraction",))
    assert cfg.memory == "LOCAL" and cfg.group_set == ("gpu_group",) and cfg.reg_set == ("reg",)


@pytest.mark.parametrize(
    "src,shapes",
    [
        (MM, {"A": (37, 5), "B": (5, 70)}),
        (BMM, {"A": (3, 37, 11), "B": (3, 11, 70)}),
        (CONV, {"I": (2, 9, 7, 3), "F": (3, 3, 3, 5)}),
        (STRIDED, {"I": (2, 9, 7, 3), "F": (3, 3, 3, 5)}),
    ],
)
def test_nest_reads_back(src, shapes):
    """``stripe.gemm_nest.read`` recovers the GEMM and the tiles of every nest the pass makes (it
    rebuilds the nest and compares), and refuses a nest changed after the pass."""
    from dataclasses import replace

    from stripe.gemm_nest import read

    p = lowered(src, shapes)
    main = p.stmts[0]
    kernel = next(b for b in main.stmts if "contraction" in b.tags)
    want = match(kernel, tuple(r.into for r in main.refs), {r.into: r.shape.dtype for r in main.refs}, False)
    (g,) = nests(tiled(p))
    nest = read(g)
    assert nest is not None
    got = nest.gemm
    for grp in ("m", "n", "k", "batch"):
        assert getattr(got, grp).idxs == getattr(want, grp).idxs
    assert got.a.access == want.a.access and got.b.guards == want.b.guards
    kstep = g.stmts[0]
    fa = kstep.stmts[0]
    assert all(nest.tiles[ix.name] == ix.range for ix in fa.idxs if ix.affine is None)
    assert read(replace(g, stmts=(replace(kstep, stmts=kstep.stmts[::-1]),))) is None
    assert read(kernel) is None
