"""``self_init``: a contraction that writes every element of an output its lowering just filled
with the identity, over a short reduction, starts each element from the identity itself (no fill
kernel). The interpreter gives bit-identical outputs before and after (same values, same order,
same start), also on floats, infinities and NaNs; what it must leave alone keeps its fill."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import tile
from stripe.ir import Special, walk
from tests.pass_support import (
    assert_located_config_error,
    assert_same_meaning,
    kernels,
    lowered,
    programs,
    run_pass,
)

PARAMS = {"reqs": ["contraction"], "max_reduction": 64}
POOL = """function (I[N, H, W, C]) -> (O) {
    O[n, x, y, c: N, H / 2, W / 2, C] = %s(I[n, 2x + i, 2y + j, c]), i < 2, j < 2;
}"""


def fills(program) -> list[str]:
    return [s.name for b in walk(program) for s in b.stmts if isinstance(s, Special)]


@pytest.mark.parametrize("agg", [">", "<", "+", "*"])
def test_a_pool_starts_from_the_identity_itself(agg):
    program = lowered(POOL % agg, {"I": (2, 6, 8, 3)})
    out = run_pass("self_init", PARAMS, program)
    identity = {">": "agg_init_max", "<": "agg_init_min", "+": "zero", "*": "agg_init_mul"}[agg]
    assert identity in fills(program)
    assert len(kernels(out)) == len(kernels(program)) - 1  # the fill kernel is gone
    (k,) = kernels(out)
    assert identity in [s.name for s in k.stmts if isinstance(s, Special)]  # the accumulator's own
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 8, 3)).astype(np.float32)
    x[0, 0, 0, 0], x[1, 2, 3, 1], x[0, 5, 7, 2] = np.inf, -np.inf, np.nan
    assert_same_meaning(program, out, {"I": x})  # bit for bit, NaN where the interpreter has one


def test_a_3x3_pool_with_the_default_limit():
    src = "function (I[H, W]) -> (O) { O[x, y: H - 2, W - 2] = >(I[x + i, y + j]), i < 3, j < 3; }"
    program = lowered(src, {"I": (8, 9)})
    out = run_pass("self_init", {"reqs": ["contraction"]}, program)  # 9 points: under 16
    assert len(kernels(out)) == 1 and len(kernels(program)) == 2
    assert_same_meaning(program, out)


def test_what_it_leaves_alone():
    cases = [
        # GEMM-shaped, however short its reduction: the micro-kernel starts from zero itself
        ("function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }",
         {"A": (4, 8), "B": (8, 5)}),
        # more reduction points per element than max_reduction
        ("function (A[M, N]) -> (O) { O[i: M] = >(A[i, j]); }", {"A": (3, 65)}),
        # not every element written (odd ones keep the fill)
        ("function (A[N]) -> (O) { O[2 * i: 2 * N] = +(A[i]); }", {"A": (5,)}),
        # a constraint that skips points of some elements
        ("function (A[N]) -> (O) { O[i: N] = >(A[i + j]), i + j < N, j < 3; }", {"A": (6,)}),
    ]
    for src, shapes in cases:
        program = lowered(src, shapes)
        assert run_pass("self_init", PARAMS, program) == program, src


def test_the_llvm_cpu_pipeline_runs_a_max_pool_as_one_kernel():
    exe = tile.compile(POOL % ">", "llvm_cpu.0", {"cache": False})
    x = np.random.default_rng(2).standard_normal((1, 10, 12, 16)).astype(np.float32)
    want = x.reshape(1, 5, 2, 6, 2, 16).max(axis=(2, 4))
    for settings_ in ({}, {"strict": True}):
        exe = tile.compile(POOL % ">", "llvm_cpu.0", {"cache": False, **settings_})
        np.testing.assert_array_equal(exe(I=x)["O"], want)
        (compiled,) = exe._compiled.values()
        assert len(compiled.infos) == 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(families=("contractions", "mixed")))
def test_meaning_is_kept_on_drawn_programs(case):
    program, inputs = case
    assert_same_meaning(program, run_pass("self_init", PARAMS, program), inputs)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("max_reduction", 0, "max_reduction must be at least 1"),
        ("aggs", ["avg"], "'avg' is not an aggregation"),
    ],
)
def test_bad_values_are_located_config_errors(key, value, message):
    assert_located_config_error("self_init", key, value, message)


GEMMS = {"reqs": ["contraction", "kernel"], "gemms": True, "aggs": ["add"], "max_reduction": 1}
MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gemms_take_the_fused_form_without_their_fill(dtype):
    """``gemms`` (opencl_gpu's ``gemm_outputs``): a matmul of any K length whose output was just
    zeroed sums into a local allocation (which starts at zero) and assigns each element once:
    fusion's form of a contraction with an epilogue, which ``stripe.gemm.match`` reads, so the
    tiled kernel stores its sums once and no fill kernel runs. Same meaning, bit for bit."""
    from stripe.gemm import match
    from stripe.passes.tiling import tables_of

    program = lowered(MATMUL, {"A": (9, 300), "B": (300, 7)}, dtype)
    out = run_pass("self_init", GEMMS, program)
    assert fills(program) == ["zero"] and fills(out) == []  # no fill, not even of the local
    tidy = run_pass("prune_indexes", {"reqs": ["main"]}, out)  # the inner block's range-1 indexes
    (k,) = kernels(tidy)
    main = next(b for b in walk(tidy) if k in b.stmts)
    views = tables_of(main)
    g = match(k, views.names, views.dtypes, reorder=False, halves=True)
    assert g is not None and g.epilogue is not None
    assert_same_meaning(program, out)
    # without ``gemms`` a GEMM keeps its fill (the CPU micro-kernel starts from zero itself)
    assert fills(run_pass("self_init", {**GEMMS, "gemms": False}, program)) == ["zero"]


def test_the_opencl_pipeline_runs_a_matmul_as_one_kernel_that_stores_its_sums():
    """opencl_gpu's pipeline (PoCL runs it): the tiled kernel alone (no fill kernel, no read of
    C), the same answer. (A padded convolution keeps its fill: tests/test_plans.py.)"""
    a = np.arange(-40, 40, dtype=np.float32).reshape(10, 8) % 7
    b = np.arange(-28, 28, dtype=np.float32).reshape(8, 7) % 5
    from backends import registry

    if "opencl_cpu.0" not in registry.devices():
        pytest.skip("no opencl_cpu.0 (PoCL) here: the OpenCL pipeline is checked at the Stripe level above")
    f = tile.compile(MATMUL, "opencl_cpu.0")
    np.testing.assert_array_equal(f(A=a, B=b)["C"], a @ b)
    names = [name for name, _ in f.profile()]
    assert len(names) == 1 and "matmul" in names[0], names


def test_a_padded_convolution_with_gemms_keeps_its_constraints_inside():
    """A constraint only skips points (an element with none left keeps the identity either way),
    so with ``gemms`` a padded convolution takes the fused form too, its constraints in the inner
    block; same meaning, bit for bit, also where skipped points meet infinite weights."""
    src = """function (I[N, X, Y, CI], F[KX, KY, CI, CO]) -> (O) {
      O[n, x, y, co : N, X, Y, CO] = +(I[n, x + i - 1, y + j - 1, ci] * F[i, j, ci, co]);
    }"""
    program = lowered(src, {"I": (2, 6, 5, 3), "F": (3, 3, 3, 4)})
    out = run_pass("self_init", GEMMS, program)
    assert fills(program) == ["zero"] and fills(out) == []
    (k,) = kernels(out)
    assert not k.constraints and k.stmts[0].constraints  # moved into the inner block
    rng = np.random.default_rng(2)
    f = rng.integers(-3, 4, (3, 3, 3, 4)).astype(np.float32)
    f[0, 0, 1, 2] = np.inf
    inputs = {"I": rng.integers(-3, 4, (2, 6, 5, 3)).astype(np.float32), "F": f}
    assert_same_meaning(program, out, inputs)
    assert run_pass("self_init", PARAMS, program) == program  # not without gemms


TRANSPOSE = "function (C[M, N]) -> (D) { D[n, m : N, M] = =(C[m, n]); }"


def test_an_assignment_that_writes_every_element_drops_its_fill():
    """``=`` among ``aggs``: the transpose keeps its block unchanged, its zero fill goes, and the
    runner need not zero the output either (``backends.zeroing``)."""
    from backends.zeroing import needs_zero

    program = lowered(TRANSPOSE, {"C": (6, 5)})
    out = run_pass("self_init", {"reqs": ["contraction"]}, program)
    assert "zero" in fills(program) and not fills(out)
    assert kernels(out) == kernels(program)[1:]
    assert needs_zero(out, {"C"}) == set()
    rng = np.random.default_rng(2)
    c = rng.standard_normal((6, 5)).astype(np.float32)
    c[1, 2], c[3, 4] = np.nan, -np.inf
    assert_same_meaning(program, out, {"C": c})


ANY = {"reqs": ["contraction"]}


@pytest.mark.parametrize("src,shapes,params", [
    (TRANSPOSE, {"C": (6, 5)}, {**ANY, "aggs": ["add"]}),  # not asked for
    ("function (C[N]) -> (D) { D[2 * i : 2 * N] = =(C[i]); }", {"C": (5,)}, ANY),  # the odd elements stay
    ("function (C[N]) -> (D) { D[i : N] = =(C[i + j]), j < 2; }", {"C": (5,)}, ANY),  # guarded
], ids=["not-asked", "every-other-element", "constrained"])
def test_an_assignment_keeps_its_fill_unless_it_overwrites_everything(src, shapes, params):
    program = lowered(src, shapes)
    out = run_pass("self_init", params, program)
    assert fills(out) == fills(program) == ["zero"]
    assert_same_meaning(program, out)
