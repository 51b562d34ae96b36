"""The LLVM CPU backend on whole Tile programs: equal to the interpreters, bit for bit.

Every program is lowered to Stripe, built into one module, run kernel by kernel through the HAL
(``tests/llvm_runner.py``) and compared exactly with ``ref_interp.stripe_exec.run_stripe`` and
``ref_interp.run`` on integer-valued inputs (or, where the order of float operations is the point,
on random floats), plus closed forms from numpy where they exist.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings

import ref_interp
from backends.hal import Capabilities, HostBuffer
from backends.llvm import LlvmCpuDevice
from ref_interp.stripe_exec import run_stripe
from tests.llvm_runner import DEVICE, assert_same, build, check, execute, lowered
from tests.test_autodiff_properties import chain_case
from tests.test_bruteforce import cases
from tests.test_transforms import SEED, SEED_SHAPES, seed_expected
from tile.dtypes import DType
from tile.errors import TileIndexError, TileRuntimeError

pytestmark = pytest.mark.usefixtures("private_cache")
RNG = np.random.default_rng(7)


def ints(shape, lo=-3, hi=4, dtype=np.float32):
    return RNG.integers(lo, hi, shape).astype(dtype)


# ----------------------------------------------------------------------------- the device
def test_device_identity_and_capabilities():
    assert DEVICE.id == "llvm_cpu.0"
    assert "LLVM" in DEVICE.description
    caps = DEVICE.capabilities
    assert isinstance(caps, Capabilities) and caps.fp64 and caps.fp16
    assert all(caps.supports(dt) for dt in DType)


def test_library_holds_ir_text_and_engine():
    program = lowered("function (A[N]) -> (O) { O = A + 1; }", {"A": ints(5)})
    lib, infos = build(program)
    assert len(lib.kernels) == len(infos) == 1
    assert 'define void @"tile_k0_' in lib.source and lib.handle is not None
    assert lib.build_seconds > 0


# ----------------------------------------------------------- aggregations x combinations
AGGS = ["+", "*", ">", "<", "="]
COMBS = {
    "none": ("O[i{o} : N{d}] = {agg}(A[i, j]);", "AB"),
    "mul": ("O[i{o} : N{d}] = {agg}(A[i, j] * B[j]);", "AB"),
    "add": ("O[i{o} : N{d}] = {agg}(A[i, j] + B[j]);", "AB"),
    "eq": ("O[i{o} : N{d}] = {agg}(A[i, j] == B[j]);", "AB"),
    "cond": ("O[i{o} : N{d}] = {agg}(A[i, j] == B[j] ? C[i, j]);", "ABC"),
}


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int8])
@pytest.mark.parametrize("comb", list(COMBS))
@pytest.mark.parametrize("agg", AGGS)
def test_every_aggregation_and_combination(agg, comb, dtype):
    text, used = COMBS[comb]
    # `=` must not write an element twice: keep j in the output then
    stmt = text.format(agg=agg, o=", j" if agg == "=" else "", d=", M" if agg == "=" else "")
    src = f"function (A[N, M], B[M], C[N, M]) -> (O) {{ {stmt} }}"
    ins = {"A": ints((3, 4), -2, 3, dtype), "B": ints(4, -2, 3, dtype), "C": ints((3, 4), -2, 3, dtype)}
    ins["A"][0, :2] = ins["B"][:2]  # some equal pairs for == and ?
    check(src, ins)


# ----------------------------------------------------------------------- convolutions
CONV_PAD = """function (I[N, X, Y, CI], K[KX, KY, CI, CO]) -> (O) {
    O[n, x, y, co : N, X, Y, CO] = +(I[n, x + kx - 1, y + ky - 1, ci] * K[kx, ky, ci, co]);
}"""
CONV_STRIDED = """function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {
    O[n, y, x, co: N, H/3, W/3, CO] = +(I[n, 3*y + 2*j, 3*x + 2*i, ci] * K[j, i, ci, co]);
}"""


def conv_same(i: np.ndarray, k: np.ndarray) -> np.ndarray:
    """A 'same'-padded 3x3 convolution in float64 (exact on small integers)."""
    n, x, y, _ = i.shape
    p = np.pad(i.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    out = np.zeros((n, x, y, k.shape[3]))
    for kx in range(3):
        for ky in range(3):
            out += np.einsum("nxyc,cd->nxyd", p[:, kx : kx + x, ky : ky + y], k[kx, ky])
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.int16, np.float16])
def test_conv_with_padding(dtype):
    ins = {"I": ints((2, 5, 4, 3), dtype=dtype), "K": ints((3, 3, 3, 2), dtype=dtype)}
    got = check(CONV_PAD, ins)
    np.testing.assert_array_equal(got["O"], conv_same(ins["I"], ins["K"]).astype(dtype))


def test_strided_dilated_conv():
    ins = {"I": ints((2, 9, 10, 3)), "K": ints((2, 2, 3, 4))}
    got = check(CONV_STRIDED, ins)
    want = np.einsum("nyxjic,jicd->nyxd", _strided_windows(ins["I"]), ins["K"].astype(np.float64))
    np.testing.assert_array_equal(got["O"], want.astype(np.float32))


def _strided_windows(i: np.ndarray) -> np.ndarray:
    out = np.zeros((i.shape[0], 3, 3, 2, 2, i.shape[3]))
    for y in range(3):
        for x in range(3):
            for j in range(2):
                for ii in range(2):
                    out[:, y, x, j, ii] = i[:, 3 * y + 2 * j, 3 * x + 2 * ii]
    return out


def test_autodiff_seed_gradient_defracted():
    do = ints(SEED_SHAPES["DO"])
    k = ints(SEED_SHAPES["K"])
    program = lowered(SEED, {"DO": do, "K": k})
    (kernel,) = [b for b in program.stmts[0].stmts if "contraction" in b.tags]
    assert any(len(r.access[1].terms) > 1 for r in kernel.refs if r.into == "DI")  # v1_0 + 3*v1_1
    got = check(SEED, {"DO": do, "K": k})
    np.testing.assert_array_equal(got["DI"], seed_expected(do, k).astype(np.float32))


def test_max_pool_of_negative_values():
    src = """function (I[N, X, Y, C]) -> (O) {
        O[n, x, y, c : N, (X + 1) / 2, (Y + 1) / 2, C] = >(I[n, 2*x + i, 2*y + j, c]), i < 2, j < 2;
    }"""
    i = ints((1, 5, 6, 2), -9, -1)
    got = check(src, {"I": i})
    p = np.pad(i, ((0, 0), (0, 1), (0, 0), (0, 0)), constant_values=-np.inf)
    want = p.reshape(1, 3, 2, 3, 2, 2).max(axis=(2, 4))
    np.testing.assert_array_equal(got["O"], want)


@pytest.mark.parametrize("agg", ["+", ">", "<", "*", "="])
def test_default_tensor_fills_unwritten_elements(agg):
    src = f"function (A[N], D[M]) -> (O) {{ O[2*i : M] = {agg}(A[i]) default D; }}"
    got = check(src, {"A": ints(3, 1, 5), "D": ints(7, 10, 20)})
    assert (got["O"][1::2] >= 10).all() and (got["O"][0:6:2] < 5).all()


# ------------------------------------------------------------------- special operations
def test_gather_clamps_indices():
    d = ints((4, 3), dtype=np.float64)
    idx = np.array([[0, 5], [-2, 3]], dtype=np.int8)
    got = check("function (D, I) -> (O) { O = gather(D, I) + 1; }", {"D": d, "I": idx})
    np.testing.assert_array_equal(got["O"], d[np.clip(idx, 0, 3)] + 1)


@pytest.mark.parametrize("idx_dtype", [np.int32, np.uint8, np.int64])
def test_scatter_adds_in_order(idx_dtype):
    v = ints((5, 2), dtype=np.float32)
    idx = np.array([0, 9, 2, 0, 1]).astype(idx_dtype)
    got = check("function (V, I, L) -> (O) { O = scatter(V, I, L); }", {"V": v, "I": idx, "L": ints(4)})
    want = np.zeros((4, 2), np.float32)
    np.add.at(want, np.clip(idx.astype(np.int64), 0, 3), v)
    np.testing.assert_array_equal(got["O"], want)


def test_reshape_shape_and_index():
    src = """function (A[N, M]) -> (R, S, X) {
        R = reshape(A, M, N) * 2;
        S = shape(A);
        X = index(A, 1) + 10 * index(A, 0);
    }"""
    a = ints((2, 6), dtype=np.int16)
    got = check(src, {"A": a})
    np.testing.assert_array_equal(got["R"], a.reshape(6, 2) * 2)
    np.testing.assert_array_equal(got["S"], np.array([2, 6], np.int32))
    np.testing.assert_array_equal(got["X"], np.add.outer(10 * np.arange(2), np.arange(6)).astype(np.int32))


def test_softmax_of_constant_rows_is_exact():
    src = "function (X[R, C]) -> (S, L) { S = builtin_softmax(X, R, C); L = builtin_logsoftmax(X, R, C); }"
    x = np.repeat(ints((3, 1), dtype=np.float32), 4, axis=1)
    got = check(src, {"X": x})
    np.testing.assert_array_equal(got["S"], np.full((3, 4), 0.25, np.float32))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32])
def test_softmax_within_rounding(dtype):
    src = "function (X[R, C]) -> (S, L) { S = builtin_softmax(X, R, C); L = builtin_logsoftmax(X, R, C); }"
    x = ints((4, 9), -5, 6, dtype)
    x[1, 2] = x[3, 0] = 1000 if dtype != np.float16 else 60000  # overflows without the max shift
    program = lowered(src, {"X": x})
    got, _ = execute(program, {"X": x})
    # libm's exp and numpy's differ by an ulp or two, and numpy sums pairwise: a few ulps
    assert_same(got, run_stripe(program, {"X": x}), ulps=8 * x.shape[1])
    assert np.isfinite(got["S"]).all() and np.allclose(got["S"].astype(np.float64).sum(axis=1), 1, atol=2e-3)


# ---------------------------------------------------- broadcasting, 0-D and empty tensors
def test_broadcasting():
    src = "function (A, B, C) -> (O) { O = A * B - C; }"
    ins = {"A": ints((3, 1), dtype=np.int8), "B": ints(4, 0, 5, np.uint16), "C": ints((), dtype=np.float64)}
    got = check(src, ins)
    # int8 * uint16 is uint16 (the wider wins), wrapping for negative A; then float64
    want = (ins["A"].astype(np.uint16) * ins["B"]).astype(np.float64) - ins["C"]
    np.testing.assert_array_equal(got["O"], want)


def test_zero_dimensional_tensors():
    src = "function (A[], B[N]) -> (O, P, Q) { O = A * 2 + 1; P[] = +(B[i]); Q[] = >(B[i] * A[]); }"
    ins = {"A": np.array(3, np.int64), "B": ints(5, dtype=np.int64)}
    got = check(src, ins)
    assert got["O"] == 7 and got["P"] == ins["B"].sum() and got["Q"] == (3 * ins["B"]).max()


def test_zero_size_tensors():
    src = """function (A[N, M], B[M]) -> (O, P, Q) {
        O[i : N] = +(A[i, j]);
        P[j : M] = >(A[i, j] * B[j]);
        Q = A + 1;
    }"""
    ins = {"A": np.zeros((0, 3), np.float32), "B": ints(3)}
    got = check(src, ins)
    assert got["O"].shape == (0,) and got["Q"].shape == (0, 3)
    np.testing.assert_array_equal(got["P"], np.zeros(3, np.float32))


def test_float_sums_keep_the_interpreters_order():
    # random (non-integer) floats: an element's sum depends on the order of its terms, which
    # reordered and split loops must keep (the reduction index k stays in order); under strict
    # the micro-kernel's register tiles keep it too and contract nothing into an fma
    a = RNG.standard_normal((33, 70)).astype(np.float32)
    b = RNG.standard_normal((70, 19)).astype(np.float32)
    src = "function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }"
    program = lowered(src, {"A": a, "B": b})
    want = run_stripe(program, {"A": a, "B": b})
    hows = ({}, {"reorder": False}, {"parallel": False}, {"min_parallel_points": 1}, {"microkernel": False})
    for how in hows:
        got, _ = execute(program, {"A": a, "B": b}, {**how, "strict": True})
        assert_same(got, want)
    # not strict: fused multiply-adds round once, within the reduction-length tolerance
    got, _ = execute(program, {"A": a, "B": b}, {})
    eps = float(np.finfo(np.float32).eps)
    mag = np.abs(a) @ np.abs(b)
    assert (np.abs(got["C"] - want["C"]) <= 2 * eps * 70 * np.maximum(mag, 1)).all()


PROPS = settings(
    derandomize=True,
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@PROPS
@given(cases())
def test_random_contractions_equal_the_interpreter(case):
    spec, inputs = case
    src = spec.source()
    try:
        ref_interp.run(src, inputs)
    except (TileIndexError, TileRuntimeError):
        assume(False)  # an empty or doubly-assigned contraction: no value to compare
    program = lowered(src, inputs)
    got, _ = execute(program, inputs, {"min_parallel_points": 1})  # split whatever may be split
    assert_same(got, run_stripe(program, inputs))


@PROPS
@given(chain_case())
def test_random_elementwise_chains_equal_the_interpreter(case):
    _, probe, inputs, _, _ = case
    program = lowered(probe, inputs)
    got, _ = execute(program, inputs)
    # chains of libm functions: each may differ from numpy's by a few ulps, and errors compound
    assert_same(got, run_stripe(program, inputs), ulps=64)


# ----------------------------------------------------------------- HAL behaviour
def test_runs_are_asynchronous_and_respect_dependencies():
    program = lowered("function (A[N]) -> (O) { O = A * 3; }", {"A": ints(1000)})
    lib, infos = build(program)
    ex = DEVICE.executor
    a, o, copy = ex.allocate(4000), ex.allocate(4000), ex.allocate(4000)
    a.map_discard()[:] = np.arange(1000, dtype=np.float32).view(np.uint8)
    kernels = [ex.prepare(lib, i) for i in range(len(infos))]
    bufs = {"A": a, "O": o}
    ev = []
    for info, k in zip(infos, kernels):
        ev = [k.run([bufs[n] for n in info.buffers], ev)]
    done = ex.copy(o, 0, copy, 0, 4000, ev)
    assert done.wait().duration >= 0
    np.testing.assert_array_equal(copy.map_current().view(np.float32), np.arange(1000) * 3)


def test_kernel_refuses_aliased_or_missing_buffers():
    program = lowered("function (A[N], B[N]) -> (O) { O = A + B; }", {"A": ints(4), "B": ints(4)})
    lib, infos = build(program)
    k = DEVICE.executor.prepare(lib, len(infos) - 1)
    a = HostBuffer(16)
    with pytest.raises(ValueError, match="distinct"):
        k.run([a, a, HostBuffer(16)])
    with pytest.raises(ValueError, match="takes 3 buffers"):
        k.run([a])


def test_unknown_intrinsic_is_an_error_at_build():
    from dataclasses import replace

    from stripe.ir import Intrinsic

    program = lowered("function (A[N]) -> (O) { O = A + 1; }", {"A": ints(4)})
    main = program.stmts[0]
    kernel = main.stmts[0]
    stmts = tuple(replace(s, name="frobnicate") if isinstance(s, Intrinsic) else s for s in kernel.stmts)
    bad = replace(program, stmts=(replace(main, stmts=(replace(kernel, stmts=stmts),)),))
    with pytest.raises(TileRuntimeError, match="unknown intrinsic 'frobnicate'"):
        build(bad)


# ----------------------------------------------------------------------- disk cache
def test_second_build_hits_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILE_CACHE_DIR", str(tmp_path))
    src = "function (A[N], B[N]) -> (O) { O = exp(A) * B; }"
    ins = {"A": ints(100), "B": ints(100)}
    program = lowered(src, ins)
    first, _ = build(program)
    assert first.extra["cache"] == "miss" and len(list(tmp_path.glob("*.o"))) == 1
    second, _ = build(program)
    assert second.extra["cache"] == "hit" and second.extra["cache_key"] == first.extra["cache_key"]
    assert_same(execute(program, ins, library=second)[0], execute(program, ins, library=first)[0])
    other, _ = build(program, {"opt": 1})  # settings are part of the key
    assert other.extra["cache"] == "miss" and len(list(tmp_path.glob("*.o"))) == 2
    off, _ = build(program, {"cache": False})
    assert off.extra["cache"] == "off" and len(list(tmp_path.glob("*.o"))) == 2


# ---------------------------------------------------------------------- performance sanity
def test_performance_sanity_matmul_and_conv(capsys):
    a, b = ints((256, 256)), ints((256, 256))
    src = "function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }"
    i, k = ints((1, 56, 56, 64), -2, 3), ints((3, 3, 64, 64), -2, 3)
    report = []
    for name, text, ins, want in [
        ("matmul 256x256 f32", src, {"A": a, "B": b}, lambda: a.astype(np.float64) @ b),
        ("conv 3x3 56x56x64->64 f32", CONV_PAD, {"I": i, "K": k}, lambda: conv_same(i, k)),
    ]:
        program = lowered(text, ins)
        lib, _ = build(program, {"cache": False})
        got, kernels = execute(program, ins, library=lib)  # warm-up
        start = time.perf_counter()
        got, kernels = execute(program, ins, library=lib)
        secs = time.perf_counter() - start
        np.testing.assert_array_equal(got[next(iter(got))], want().astype(np.float32))
        report.append(f"{name}: build {lib.build_seconds * 1e3:.0f} ms, run {secs * 1e3:.2f} ms")
    with capsys.disabled():
        print("\n" + "\n".join(report))


def test_a_fresh_device_with_its_own_pool():
    dev = LlvmCpuDevice(threads=3)
    assert dev.pool.size == 3 and "3 threads" in dev.description
    program = lowered("function (A[N]) -> (O) { O = A * A; }", {"A": ints(50000)})
    got, kernels = execute(program, {"A": np.full(50000, 3, np.float32)}, device=dev)
    assert (got["O"] == 9).all() and len(set(kernels[-1].last_threads)) == 3
