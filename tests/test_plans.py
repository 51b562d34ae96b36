"""Declared hand-offs (``stripe.plans``): the passes that shape a block for a special emitter attach
its plan, the plan prints and parses back with its block, ``verify`` rejects a plan naming what its
block lacks, and the C-like code generator picks the special emitter by the plan alone: the same
block without its plan runs through the general emitter."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.clike import generate
from backends.driver import kernels as kernel_infos
from backends.opencl.target import OpenCLTarget
from bench.gpu_reductions import SOFTMAX
from stripe.config import target_config
from stripe.ir import Block, walk
from stripe.parser import parse_stripe
from stripe.passes import optimize
from stripe.plans import CombinePlan, GemmPlan, RowPlan
from stripe.printer import format_block
from stripe.verify import StripeError, verify
from tests.pass_support import lowered

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
MATMUL_RELU = "function (A[M, K], B[K, N]) -> (R) { C[i, j: M, N] = +(A[i, k] * B[k, j]); R = relu(C); }"
GLOBAL_SUM = "function (X[N]) -> (S) { S[] = +(X[i]); }"
TALL = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M + 1, N] = +(A[i, k] * B[k, j]); }"


def _optimized(src: str, shapes: dict, target: str = "opencl_gpu", **params) -> Block:
    config = target_config(target)
    if params:  # a step's params changed (row_fusion's rows_per_unit: small programs fuse)
        steps = tuple(replace(s, params=replace(s.params, **params)) if s.pass_ == "row_fusion" else s
                      for s in config.passes)
        config = replace(config, passes=steps)
    return optimize(lowered(src, shapes), config, check=True)  # verify after every pass


def _planned(program: Block, kind: type) -> list[Block]:
    return [b for b in walk(program) if isinstance(b.plan, kind)]


def test_gemm_tile_attaches_its_plan():
    (k,) = _planned(_optimized(MATMUL_RELU, {"A": (64, 64), "B": (64, 64)}), GemmPlan)
    p = k.plan
    roles = ([v for v, _ in p.m], [v for v, _ in p.n], p.batch, [v for v, _ in p.k])
    assert roles == (["i0"], ["i1"], (), ["k"])
    assert (p.a, p.b, p.out, p.epilogue) == ("A", "B", "C", True)
    assert p.shape.tm == 64 and p.tiles["i0"] == 64 and p.tm % p.rm == 0
    # a matmul's output filled just before: the fused form, its sums stored once (gemm_outputs)
    (own,) = _planned(_optimized(MATMUL, {"A": (300, 200), "B": (200, 260)}), GemmPlan)
    assert own.plan.epilogue and own.plan.out == "C_sum"  # the sums' register accumulator
    # an output larger than the product (its last row is never written, so it keeps its fill):
    # the flat nest, adding into the output
    (flat,) = _planned(_optimized(TALL, {"A": (300, 200), "B": (200, 260)}), GemmPlan)
    assert not flat.plan.epilogue and flat.plan.out == "C"
    assert _planned(_optimized(MATMUL, {"A": (64, 64), "B": (64, 64)}, "llvm_cpu"), GemmPlan)


def test_row_fusion_attaches_its_plan():
    (k,) = _planned(_optimized(SOFTMAX, {"X": (64, 1024)}, rows_per_unit=0), RowPlan)
    assert k.plan.rows == tuple(ix.name for ix in k.idxs) == ("i",)
    assert set(k.plan.values) == {"Mx_row", "S_row"} and k.plan.group == dict(k.attrs)["group"]


def test_split_reduction_attaches_its_plans():
    program = _optimized(GLOBAL_SUM, {"X": (1 << 20,)})
    (one,) = [b.plan for b in _planned(program, CombinePlan)]  # one kernel: partials, one combine
    assert one.lane_count == 8192 and one.one_kernel and one.counter and one.out == "S"
    config = target_config("opencl_gpu")
    steps = tuple(replace(s, params=replace(s.params, one_kernel=False)) if s.pass_ == "split_reduction"
                  else s for s in config.passes)
    program = optimize(lowered(GLOBAL_SUM, {"X": (1 << 20,)}), replace(config, passes=steps), check=True)
    plans = [b.plan for b in _planned(program, CombinePlan)]
    assert [p.lane_count for p in plans] == [128, 64]  # the combine's partial and the last combine
    assert all(p.self_init and p.agg == "add" for p in plans) and plans[-1].out == "S"
    assert not _planned(_optimized(GLOBAL_SUM, {"X": (1 << 20,)}, "llvm_cpu"), CombinePlan)  # no mark


@pytest.mark.parametrize("src,shapes,kw", [
    (MATMUL_RELU, {"A": (64, 64), "B": (64, 64)}, {}),
    (SOFTMAX, {"X": (64, 1024)}, {"rows_per_unit": 0}),
    (GLOBAL_SUM, {"X": (1 << 20,)}, {}),
])
def test_plans_print_and_parse_back(src, shapes, kw):
    program = _optimized(src, shapes, **kw)
    text = format_block(program)
    assert "    plan " in text
    assert parse_stripe(text) == program


def test_a_plan_with_a_missing_name_is_rejected():
    text = """0: #kernel block [i:4] (
        plan row(rows: [i], values: [V], group: 4)
        none V[0] fp32(1:1)
    ) {
    }"""
    with pytest.raises(StripeError, match="its row plan needs the tag #row_program"):
        verify(parse_stripe(text))
    program = _optimized(MATMUL, {"A": (64, 64), "B": (64, 64)})
    main = program.stmts[0]
    (k,) = _planned(program, GemmPlan)

    def with_plan(plan) -> Block:
        kernel = replace(k, plan=plan)
        return replace(program, stmts=(replace(main, stmts=(kernel,)),))

    verify(with_plan(k.plan))
    with pytest.raises(StripeError, match="its gemm plan names the index 'x', which the block does not have"):
        verify(with_plan(replace(k.plan, m=(("x", 64),))))
    with pytest.raises(StripeError, match="its gemm plan names the refinement 'Q', which the block does not"):
        verify(with_plan(replace(k.plan, a="Q")))


def _sources(program: Block, drop_plans: bool) -> list:
    infos = kernel_infos(program)
    if drop_plans:
        infos = [replace(i, block=replace(i.block, plan=None)) for i in infos]
    t = OpenCLTarget()
    t.workgroups = True
    return generate(t, infos, {})


@pytest.mark.parametrize("src,shapes,kw,marker", [
    (MATMUL, {"A": (64, 64), "B": (64, 64)}, {}, "__local"),
    (SOFTMAX, {"X": (64, 1024)}, {"rows_per_unit": 0}, "reqd_work_group_size"),
    (GLOBAL_SUM, {"X": (1 << 20,)}, {}, "red[lid]"),
])
def test_the_plan_picks_the_emitter(src, shapes, kw, marker):
    """The planned kernel runs in its special emitter (work-groups), the same kernel without its
    plan in the general one: nothing recognises the block's shape."""
    program = _optimized(src, shapes, **kw)
    special = [s for s in _sources(program, False) if s.local]
    assert len(special) == 1 and marker in special[0].text
    assert not any(s.local or marker in s.text for s in _sources(program, True))
