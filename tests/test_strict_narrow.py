"""Strict mode and float16/bfloat16 matrix products (docs/semantics.md §8.1.1, §8.3).

The interpreter computes each product of a float16 or bfloat16 `+(A * B)` contraction exactly in
float32, sums the products in float32 in its row-major order and rounds to the result type once.
Under ``settings={"strict": True}`` every compiled target must give the same bits: random normal
inputs, so a float16 running sum (what the code generators did before) differs (an 8x64x8 float16
matmul by up to 0.023).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import ref_interp
import tile
from backends import registry
from backends.driver import emit
from stripe.config import target_config
from stripe.ir import Intrinsic
from stripe.lower import lower
from stripe.parser import parse_stripe
from stripe.passes import optimize
from stripe.printer import format_block
from stripe.verify import verify
from tile.bind import bind
from tile.dtypes import DType
from tile.inputs import input_types

BF16 = np.dtype(ml_dtypes.bfloat16)

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
BATCHED = "function (A[G, M, K], B[G, K, N]) -> (C) { C[g, i, j: G, M, N] = +(A[g, i, k] * B[g, k, j]); }"
CONV = """function (I[N, X, Y, CI], F[KX, KY, CI, CO]) -> (O) {
    O[n, x, y, co: N, X - 2, Y - 2, CO] = +(I[n, x + i, y + j, ci] * F[i, j, ci, co]);
}"""
DOT = "function (A[K], B[K]) -> (D) { D[] = +(A[k] * B[k]); }"
FUSED = """function (A[M, K], B[K, N], Bias[N]) -> (R) {
    C[i, j: M, N] = +(A[i, k] * B[k, j]);
    R = relu(C * 3 + Bias);
}"""
# a default tensor and a constraint: the product aggregates into a masked temporary, then a select
MASKED = """function (A[M, K], B[K, N], D[M, N]) -> (C) {
    C[i, j: M, N] = +(A[i, k] * B[k, j]), i < 4, k < 40 default D;
}"""

PROGRAMS = {
    "matmul": (MATMUL, {"A": (8, 64), "B": (64, 8)}),
    "batched": (BATCHED, {"A": (3, 5, 48), "B": (3, 48, 7)}),
    "conv": (CONV, {"I": (2, 7, 6, 8), "F": (3, 3, 8, 5)}),
    "dot": (DOT, {"A": (300,), "B": (300,)}),
    "long_dot": (DOT, {"A": (5000,), "B": (5000,)}),  # longer than the LLVM backend's sum blocks
    "large": (MATMUL, {"A": (70, 300), "B": (300, 33)}),  # big enough for the GEMM kernels
    "fused": (FUSED, {"A": (8, 64), "B": (64, 8), "Bias": (8,)}),
    "masked": (MASKED, {"A": (6, 64), "B": (64, 9), "D": (6, 9)}),
}
DTYPES = {"float16": np.dtype(np.float16), "bfloat16": BF16}

# every compiled target this machine may have: those absent skip, naming the device
KNOWN = ("llvm_cpu.0", "opencl_cpu.0", "opencl_gpu.0")
TARGETS = sorted({*KNOWN, *(d for d in registry.devices() if d.startswith(("llvm_", "opencl_")))})


def inputs(program: str, dtype: np.dtype, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = PROGRAMS[program][1]
    return {n: rng.standard_normal(s).astype(np.float32).astype(dtype) for n, s in shapes.items()}


def device_or_skip(device_id: str):
    if device_id not in registry.devices():
        why = {k: v for k, v in registry.unavailable().items() if device_id.startswith(k.split(":")[0])}
        pytest.skip(f"{device_id} is not available here: {why or 'no such device registered'}")
    return registry.get(device_id)


def assert_bits_equal(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k, w in want.items():
        g = np.asarray(got[k])
        assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, w.dtype, g.shape, w.shape)
        gb, wb = g.view(np.uint16), w.view(np.uint16)
        if not np.array_equal(gb, wb):
            worst = np.abs(g.astype(np.float64) - w.astype(np.float64)).max()
            differ = int((gb != wb).sum())
            raise AssertionError(f"{k}: {differ} of {w.size} elements differ, by up to {worst}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("device_id", TARGETS)
def test_strict_matrix_products_are_bit_identical_to_the_interpreter(device_id, program, dtype):
    device_or_skip(device_id)
    src = PROGRAMS[program][0]
    ins = inputs(program, DTYPES[dtype])
    got = tile.compile(src, device_id, settings={"strict": True})(**ins)
    assert_bits_equal(got, ref_interp.run(src, ins))


@pytest.mark.parametrize(
    "device_id, config",
    [("llvm_cpu.0", "llvm_cpu_tiled"), ("opencl_cpu.0", "opencl_gpu"), ("opencl_cpu.0", "opencl_gpu_tiled")],
)
def test_strict_matrix_products_keep_their_bits_under_other_configs(device_id, config):
    device_or_skip(device_id)
    for program in ("matmul", "large", "fused"):
        src = PROGRAMS[program][0]
        ins = inputs(program, DTYPES["float16"], seed=1)
        got = tile.compile(src, device_id, settings={"strict": True, "config": config})(**ins)
        assert_bits_equal(got, ref_interp.run(src, ins))


def test_an_operand_is_converted_to_the_result_type_before_the_float32_product():
    """An int16 operand of a float16 product rounds to float16 first (§6.4): 2049 becomes 2048,
    which a direct conversion to float32 would keep."""
    src = MATMUL
    rng = np.random.default_rng(2)
    ins = {"A": rng.standard_normal((4, 16)).astype(np.float16),
           "B": rng.integers(2040, 2060, (16, 3)).astype(np.int16)}
    want = ref_interp.run(src, ins)
    for device_id in ("llvm_cpu.0", "opencl_cpu.0"):
        if device_id in registry.devices():
            assert_bits_equal(tile.compile(src, device_id, settings={"strict": True})(**ins), want)


@pytest.mark.parametrize("config", ["llvm_cpu", "opencl_cpu", "opencl_gpu"])
@pytest.mark.parametrize("program", PROGRAMS)
def test_the_stripe_interpreter_runs_the_strict_program_bit_identically(program, config):
    from ref_interp.stripe_exec import run_stripe

    src = PROGRAMS[program][0]
    for dtype in DTYPES.values():
        ins = inputs(program, dtype, seed=3)
        p = tile.parse(src)
        lowered = lower(bind(p, input_types(p, ins)), strict=True)
        stripe = optimize(lowered, target_config(config), strict=True, check=True)
        assert_bits_equal(run_stripe(stripe, ins), ref_interp.run(src, ins))


def bound(src: str, ins: dict):
    p = tile.parse(src)
    return bind(p, input_types(p, ins))


def test_the_strict_lowering_sums_into_a_float32_temporary_and_rounds_once():
    ins = {"A": np.zeros((6, 64), np.float16), "B": np.zeros((64, 9), np.int16),
           "D": np.zeros((6, 9), np.float16)}
    program = lower(bound(MASKED, ins), strict=True)
    verify(program)
    assert parse_stripe(format_block(program)) == program
    buffers = {r.into: r.shape.dtype for r in program.refs}
    assert buffers["C_f32"] is DType.FLOAT32 and buffers["C_f32_acc"] is DType.FLOAT32
    kernels = {k.name: k for k in program.stmts[0].stmts}
    product = next(k for k in kernels.values() if "contraction" in k.tags)
    assert [str(s) for s in product.stmts if isinstance(s, Intrinsic)] == [
        str(Intrinsic("assign", ("$B",), ("$B_r",), DType.FLOAT16)),  # int16 to float16 first
        str(Intrinsic("mul", ("$A", "$B_r"), ("$v",), DType.FLOAT32)),
    ]
    last = program.stmts[0].stmts[-1]
    assert last.name.endswith("_C") and [s for s in last.stmts if isinstance(s, Intrinsic)] == [
        Intrinsic("assign", ("$C_f32",), ("$t1",), DType.FLOAT16)
    ]


def test_emit_strict_shows_the_strict_lowering():
    b = bound(MATMUL, {"A": np.zeros((8, 64), np.float16), "B": np.zeros((64, 8), np.float16)})
    for stage in ("stripe", "optimized"):
        assert "C_f32" in emit(b, stage, target="opencl_gpu", strict=True)
        assert "C_f32" not in emit(b, stage, target="opencl_gpu")


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float32])
def test_strict_changes_the_lowering_only_of_narrow_matrix_products(dtype):
    ins = {"A": np.zeros((8, 64), dtype), "B": np.zeros((64, 8), dtype), "Bias": np.zeros(8, dtype)}
    b = bound(FUSED, ins)
    strict, plain = lower(b, strict=True), lower(b)
    assert all(r.shape.dtype is DType.of(np.dtype(dtype)) for r in plain.refs)  # as before: no float32
    assert (strict == plain) == (dtype is np.float32)
    # other contractions of narrow floats keep one rounding per step in their own type
    row_sum = "function (A[M, K]) -> (S) { S[i: M] = +(A[i, k]); }"
    max_product = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = >(A[i, k] * B[k, j]); }"
    for src, names in ((row_sum, "A"), (max_product, "AB")):
        b = bound(src, {k: ins[k] for k in names})
        assert lower(b, strict=True) == lower(b)
