"""Fused elementwise epilogues on the CPU micro-kernel (``backends/llvm/epilogue.py``): ``llvm_cpu``
fuses a GEMM-shaped contraction with its elementwise consumers, ``gemm_tile`` tiles the fused
kernel, and the code generator runs it as one micro-kernel whose final tiles go through the
epilogue (bias, relu, scale, residual) before they are stored. Strict runs are bit-identical to
the interpreter on random floats; integer-valued inputs match numpy exactly; sizes are no
multiple of any tile."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from backends.llvm import LlvmCpuDevice, device
from backends.llvm.epilogue import read_fused
from ref_interp.stripe_exec import run_stripe
from stripe.config import target_config
from stripe.passes import optimize
from tests.llvm_runner import assert_same, execute, lowered

RNG = np.random.default_rng(14)
DEVICE = LlvmCpuDevice(threads=4)
BIAS_RELU = """function (A[M, K], B[K, N], Bias[N]) -> (O) {
    C[i, j: M, N] = +(A[i, k] * B[k, j]);
    O = relu(C + Bias);
}"""
SCALE_RESIDUAL = """function (A[M, K], B[K, N], R[M, N]) -> (O) {
    C[i, j: M, N] = +(A[i, k] * B[k, j]);
    O = C * 0.5 + R;
}"""
CONV = """function (I[N, H, W, CI], F[KH, KW, CI, CO], Bias[CO]) -> (O) {
    C[n, x, y, co: N, H - 2, W - 2, CO] = +(I[n, x + kx, y + ky, ci] * F[kx, ky, ci, co]);
    O = relu(C + Bias);
}"""
PADDED = """function (I[N, H, W, CI], F[KH, KW, CI, CO], Bias[CO]) -> (O) {
    C[n, x, y, co: N, H, W, CO] = +(I[n, x + kx - 1, y + ky - 1, ci] * F[kx, ky, ci, co]);
    O = relu(C + Bias);
}"""
SIZES = [(1, 1, 1), (3, 5, 7), (13, 300, 17), (130, 17, 129), (67, 1000, 131)]


def ints(*shape: int) -> np.ndarray:
    return RNG.integers(-3, 4, shape).astype(np.float32)


def floats(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def run(src: str, ins: dict, how: dict):
    """The ``llvm_cpu`` pipeline's program run on the device: (outputs, kernels, the untiled
    program, the indexes of the kernels run with a fused epilogue)."""
    program = lowered(src, ins)
    tiled = optimize(program, target_config("llvm_cpu"))
    got, kernels = execute(tiled, ins, {"min_parallel_points": 1, **how}, DEVICE)
    return got, kernels, program, kernels[0].library.extra["fused_epilogues"]


def matmul_ins(m: int, k: int, n: int, make, residual: bool) -> dict:
    ins = {"A": make(m, k), "B": make(k, n)}
    ins.update({"R": make(m, n)} if residual else {"Bias": make(n)})
    return ins


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize(("m", "k", "n"), SIZES)
def test_bias_relu_is_one_kernel_exact_and_strict(m, k, n, threads):
    ins = matmul_ins(m, k, n, ints, False)
    got, kernels, _, fused = run(BIAS_RELU, ins, {"threads": threads})
    np.testing.assert_array_equal(got["O"], np.maximum(ins["A"] @ ins["B"] + ins["Bias"], 0))
    if min(m, n) > 1:  # a GEMM: one kernel (1 x 1 x 1 is none: it does not fuse, ``a_gemm``)
        assert len(kernels) == 1 and fused == [0] and read_fused(kernels[0].info.block) is not None
    else:
        assert fused == []
    ins = matmul_ins(m, k, n, floats, False)
    got, _, program, _ = run(BIAS_RELU, ins, {"threads": threads, "strict": True})
    assert_same(got, run_stripe(program, ins))


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize(("m", "k", "n"), SIZES[1:])
def test_scale_and_residual(m, k, n, threads):
    ins = matmul_ins(m, k, n, ints, True)
    got, kernels, _, fused = run(SCALE_RESIDUAL, ins, {"threads": threads})
    np.testing.assert_array_equal(got["O"], (ins["A"] @ ins["B"]) * np.float32(0.5) + ins["R"])
    assert len(kernels) == 1 and fused == [0]
    ins = matmul_ins(m, k, n, floats, True)
    got, _, program, _ = run(SCALE_RESIDUAL, ins, {"threads": threads, "strict": True})
    assert_same(got, run_stripe(program, ins))


def conv_ref(i: np.ndarray, f: np.ndarray, bias: np.ndarray, pad: int) -> np.ndarray:
    i = np.pad(i, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    n, h, w, _ = i.shape
    out = np.zeros((n, h - 2, w - 2, f.shape[3]), np.float32)
    for kx in range(3):
        for ky in range(3):
            out += np.einsum("nxyc,cd->nxyd", i[:, kx : kx + h - 2, ky : ky + w - 2], f[kx, ky])
    return np.maximum(out + bias, 0)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize(("src", "pad"), [(CONV, 0), (PADDED, 1)])
@pytest.mark.parametrize(("n", "h", "w", "ci", "co"), [(1, 7, 9, 3, 5), (2, 13, 11, 8, 67)])
def test_conv3x3_bias_relu_nhwc(src, pad, n, h, w, ci, co, threads):
    ins = {"I": ints(n, h, w, ci), "F": ints(3, 3, ci, co), "Bias": ints(co)}
    got, kernels, _, fused = run(src, ins, {"threads": threads})
    np.testing.assert_array_equal(got["O"], conv_ref(ins["I"], ins["F"], ins["Bias"], pad))
    assert len(kernels) == 1 and fused == [0]
    ins = {"I": floats(n, h, w, ci), "F": floats(3, 3, ci, co), "Bias": floats(co)}
    got, _, program, _ = run(src, ins, {"threads": threads, "strict": True})
    assert_same(got, run_stripe(program, ins))


def test_partial_sums_wait_in_an_output_the_epilogue_overwrites():
    """K = 1000 is past llvm_cpu's K tile: between K blocks the partial sums wait in the output,
    which the epilogue overwrites (``=``) and never reads."""
    ins = matmul_ins(40, 1000, 70, ints, False)
    tiled = optimize(lowered(BIAS_RELU, ins), target_config("llvm_cpu"))
    flat, tiles, epi = read_fused(tiled.stmts[0].stmts[-1])
    assert epi.partials and tiles[0] < 1000
    assert [r.into for r in flat.refs] == ["$a", "$b", "$out"]


@pytest.mark.parametrize("threads", [1, 3])
def test_without_partials_one_pass_over_k(monkeypatch, threads):
    """An epilogue whose output may not hold partial sums runs with no K blocks (one pass)."""

    calls = []

    def no_partials(kernel):
        got = read_fused(kernel)
        calls.append(got is not None)
        return got and (*got[:2], replace(got[2], partials=False))

    monkeypatch.setattr(device, "read_fused", no_partials)
    ins = matmul_ins(40, 1000, 70, ints, False)
    got, kernels, _, fused = run(BIAS_RELU, ins, {"threads": threads})
    np.testing.assert_array_equal(got["O"], np.maximum(ins["A"] @ ins["B"] + ins["Bias"], 0))
    assert fused == [0] and calls[0]
    ins = matmul_ins(40, 1000, 70, floats, False)
    got, _, program, _ = run(BIAS_RELU, ins, {"threads": threads, "strict": True})
    assert_same(got, run_stripe(program, ins))


def test_the_product_kept_as_a_second_output():
    src = """function (A[M, K], B[K, N], Bias[N]) -> (C, O) {
        C[i, j: M, N] = +(A[i, k] * B[k, j]);
        O = relu(C + Bias);
    }"""
    ins = matmul_ins(37, 50, 70, ints, False)
    got, _, _, _ = run(src, ins, {"threads": 3})
    np.testing.assert_array_equal(got["C"], ins["A"] @ ins["B"])
    np.testing.assert_array_equal(got["O"], np.maximum(ins["A"] @ ins["B"] + ins["Bias"], 0))


def test_without_the_micro_kernel_the_nest_runs_as_plain_loops():
    ins = matmul_ins(19, 23, 37, ints, False)
    got, kernels, _, fused = run(BIAS_RELU, ins, {"threads": 2, "microkernel": False})
    np.testing.assert_array_equal(got["O"], np.maximum(ins["A"] @ ins["B"] + ins["Bias"], 0))
    assert len(kernels) == 1 and fused == []


def test_only_gemms_fuse_with_their_consumers():
    """``a_gemm``: a vector-matrix product (no GEMM: its plain loops would run the reduction
    innermost, down A's columns, once fused) stays a kernel of its own; ``A @ B.T`` fuses and
    packs its gathered panels of B."""
    vecmat = "function (X[K], A[K, N]) -> (O) { C[j: N] = +(X[k] * A[k, j]); O = relu(C); }"
    ins = {"X": ints(300), "A": ints(300, 70)}
    got, kernels, _, fused = run(vecmat, ins, {"threads": 2})
    np.testing.assert_array_equal(got["O"], np.maximum(ins["X"] @ ins["A"], 0))
    assert len(kernels) > 1 and fused == []
    abt = """function (A[M, K], B[N, K], Bias[N]) -> (O) {
        C[i, j: M, N] = +(A[i, k] * B[j, k]);
        O = relu(C + Bias);
    }"""
    ins = {"A": floats(45, 90), "B": floats(77, 90), "Bias": floats(77)}
    got, kernels, program, fused = run(abt, ins, {"threads": 3, "strict": True})
    assert len(kernels) == 1 and fused == [0]
    assert_same(got, run_stripe(program, ins))


@pytest.mark.parametrize("cast", ["as_float(C, 16)", "as_int(relu(C), 32)"])
def test_an_output_of_another_type_holds_no_partial_sums(cast):
    """The epilogue converts the float32 sum: the output cannot hold partial sums, so the
    micro-kernel makes one pass over K (1000, past the K tile) and never touches it itself."""
    src = f"function (A[M, K], B[K, N]) -> (O) {{ C[i, j: M, N] = +(A[i, k] * B[k, j]); O = {cast}; }}"
    ins = {"A": ints(45, 1000), "B": ints(1000, 70)}
    got, kernels, program, fused = run(src, ins, {"threads": 3})
    assert len(kernels) == 1 and fused == [0]
    assert not read_fused(kernels[0].info.block)[2].partials
    assert_same(got, run_stripe(program, ins))
    ins = {"A": floats(45, 1000), "B": floats(1000, 70)}
    got, _, program, _ = run(src, ins, {"threads": 3, "strict": True})
    assert_same(got, run_stripe(program, ins))


def test_float64_with_k_blocks_bit_identical():
    ins = {k: v.astype(np.float64) for k, v in matmul_ins(29, 700, 45, floats, False).items()}
    got, kernels, program, fused = run(BIAS_RELU, ins, {"threads": 3, "strict": True})
    assert len(kernels) == 1 and fused == [0] and " x double>" in kernels[0].library.source
    assert_same(got, run_stripe(program, ins))
