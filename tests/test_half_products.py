"""Half-type matrix products on targets without matrix units sum in float32 and round once, as the
interpreter does (docs/semantics.md §8.1.1; ``backends.driver.widened``): a float16 running sum of
ones stalls at 2048 (bfloat16's at 256), the product does not. Before, ``llvm_cpu.0`` summed a
float16 matmul in float16: 50x PyTorch's error at K = 4096."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tile
from backends import driver, registry
from tile.parser import parse

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
DOT = "function (A[K], B[K]) -> (C) { C[] = +(A[k] * B[k]); }"
CASES = [("float16", np.float16, 3000), ("bfloat16", ml_dtypes.bfloat16, 300)]


def _devices():
    return [d for d in ("llvm_cpu.0", "opencl_cpu.0") if d in registry.devices()]


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("name, dt, k", CASES)
def test_a_half_product_sums_in_float32(device, name, dt, k):
    import tile

    a, b = np.ones((5, k), dt), np.ones((k, 7), dt)
    got = np.asarray(tile.compile(MATMUL, device=device)(A=a, B=b)["C"], np.float64)
    assert (got == k).all(), f"{name} sum of {k} ones on {device}: {np.unique(got)}"
    got = float(np.asarray(tile.compile(DOT, device=device)(A=np.ones(k, dt), B=np.ones(k, dt))["C"]))
    assert got == k


def test_targets_with_matrix_units_keep_the_narrow_form():
    from dataclasses import replace

    config = driver.config_for(registry.get("llvm_cpu.0"), {})
    units = replace(config, hardware=replace(config.hardware, matrix_units={"tensor_core": object()}))
    assert driver.widened(config, False) is True and driver.widened(units, True) is True
    assert driver.widened(None, True) is True and driver.widened(None, False) is False
    assert driver.widened(units, False) == "unshaped"  # only the products no matrix unit takes


DEPTHWISE = "function (I[N, H, W, C], K[KH, KW, C]) -> (O) { O[n, x, y, c: N, H, W, C] = " \
    "+(I[n, x + kx - 1, y + ky - 1, c] * K[kx, ky, c]); }"


def test_a_tensor_core_target_widens_the_products_no_unit_takes():
    """On cuda.0 (the stand-in sm_90 device) a depthwise convolution has no matrix shape (no index
    of the filter's own): it is lowered widened and its kernel sums in float32, rounding once at
    the store (it summed in float16 before: 3.4x cuDNN's error at 56x56x128); a convolution and a
    matmul keep the narrow form the tensor cores take."""
    from tests.test_cuda_device import _stand_in

    dw = {"I": np.ones((2, 6, 6, 8), np.float16), "K": np.ones((3, 3, 8), np.float16)}
    build = driver.build(driver.bind_inputs(parse(DEPTHWISE), dw), _stand_in(), {"cache": False})
    assert "O_f32" in {r.into for r in build.lowered.refs}
    text = build.library.source
    assert "tile_rh(s_O_f32)" in text and text.count("tile_rh(") == 2, "one rounding (and its definition)"
    mm = {"A": np.ones((64, 64), np.float16), "B": np.ones((64, 64), np.float16)}
    build = driver.build(driver.bind_inputs(parse(MATMUL), mm), _stand_in(), {"cache": False})
    assert "C_f32" not in {r.into for r in build.lowered.refs} and "mma" in build.library.source


def test_the_lowered_product_is_widened_only_where_the_target_has_no_unit():
    ins = {"A": np.ones((4, 8), np.float16), "B": np.ones((8, 4), np.float16)}
    bound = driver.bind_inputs(parse(MATMUL), ins)
    dev = registry.get("llvm_cpu.0")
    build = driver.build(bound, dev, {"cache": False})
    assert "C_f32" in {r.into for r in build.lowered.refs}, "llvm_cpu.0 has no matrix unit: widened"
    from tests.test_cuda_device import _stand_in

    build = driver.build(bound, _stand_in(), {"cache": False})
    assert "C_f32" not in {r.into for r in build.lowered.refs}, "a tensor-core target takes the narrow form"


@pytest.mark.parametrize("name, dt", [("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)])
@pytest.mark.parametrize("m, k, n", [(37, 300, 70), (128, 256, 128), (6, 1000, 65)])
def test_a_half_product_is_the_exact_sum_rounded_once(name, dt, m, k, n):
    """Small integers: every product and float32 partial sum is exact, so the result must be the
    exact product rounded once to the type (edges of the micro-kernel's tiles included)."""
    import tile

    rng = np.random.default_rng(m + k + n)
    a, b = rng.integers(-4, 5, (m, k)), rng.integers(-4, 5, (k, n))
    want = (a @ b).astype(np.float32).astype(dt)
    got = tile.compile(MATMUL, device="llvm_cpu.0")(A=a.astype(dt), B=b.astype(dt))["C"]
    assert np.array_equal(np.asarray(got).astype(np.float32), want.astype(np.float32))


def test_the_micro_kernel_takes_a_widened_half_product_its_half_operand_packed():
    from backends.llvm.match import VectorConfig
    from backends.llvm.microkernel import kernel_match
    from stripe.lower import lower

    cfg = VectorConfig(vector_bytes=64, fma=True, reassoc=True, l1_bytes=48 << 10, l2_bytes=2 << 20)

    def match(dt, widen):
        ins = {"A": np.ones((96, 512), dt), "B": np.ones((512, 64), dt)}
        program = lower(driver.bind_inputs(parse(MATMUL), ins), widen=widen)
        (kernel,) = [k for k in program.stmts[0].stmts if "contraction" in k.tags]
        dims = {r.into: r.shape.dims for r in kernel.refs}
        dts = {r.into: r.shape.dtype for r in kernel.refs}
        return kernel_match(None, kernel, dims, dts, None, cfg, None, None)

    single = match(np.float32, False)
    assert single is not None and "B" in single.in_place_refs, "float32 B is read in place (precondition)"
    half = match(np.float16, True)
    assert half is not None, "the widened float16 product runs on the micro-kernel"
    assert "B" in half.pack_refs and "B" not in half.in_place_refs, "a half operand is packed as float32"
    assert match(np.float16, False) is None, "a product summed in float16 stays plain loops"


GROUPED = ("function (I[N, H, W, G, CG], K[KH, KW, CG, G, CO]) -> (O) { O[n, x, y, g, co: N, H, W, G, CO] = "
           "+(I[n, x + kx - 1, y + ky - 1, g, ci] * K[kx, ky, ci, g, co]); }")


def _grouped_inputs(n: int):
    rng = np.random.default_rng(3)
    return {"I": rng.integers(-3, 4, (n, 56, 56, 32, 4)).astype(np.float16),
            "K": rng.integers(-3, 4, (3, 3, 4, 32, 4)).astype(np.float16)}


def test_the_tiled_simt_kernel_loads_half_operands_through_the_target():
    """A float16 GEMM the tensor cores do not take (a grouped convolution: K = 36, N = 4) runs
    the tiled SIMT kernel; its operand loads go through the target's half load (``vload_half`` on
    CUDA, where ``half`` is the bits: a raw ``b0_I[...]`` read them as an integer, and the H100
    gave non-finite outputs)."""
    from tests.test_cuda_device import _stand_in

    bound = driver.bind_inputs(parse(GROUPED), _grouped_inputs(2))
    build = driver.build(bound, _stand_in(), {"cache": False})
    (name,) = build.library.extra["names"]
    assert "_t128x32" in name, name  # the tiled SIMT kernel
    text = build.library.source
    assert "vload_half(" in text and "b0_I[" not in text and "b1_K[" not in text


def test_the_tiled_simt_kernel_on_half_operands_is_exact(monkeypatch):
    """The same kernel run by PoCL (the OpenCL CPU device given the GPU config's hardware, so that
    the tiles are the H100's): exact on small integers (it failed to build before: a raw half
    load needs cl_khr_fp16)."""
    from backends.opencl.device import OpenCLDevice

    if "opencl_cpu.0" not in registry.devices():
        pytest.skip(f"no opencl_cpu.0 here: {registry.unavailable() or 'no OpenCL CPU device'}")
    monkeypatch.setattr(OpenCLDevice, "hardware", lambda self, hw: hw)
    ins = _grouped_inputs(2)
    f = tile.compile(GROUPED, "opencl_cpu.0", {"config": "opencl_gpu", "cache": False})
    got = f(ins)["O"]
    assert "_t128x32" in f._last.library.extra["names"][0]
    want = tile.compile(GROUPED, "interp")(ins)["O"]
    np.testing.assert_array_equal(got, want)


def test_the_conformance_products_family_reaches_the_tiled_simt_kernel_on_half_operands():
    """The gap that let those raw loads through conformance: its products family now draws large
    products too (``conformance.strategies.large_sizes``), among them float16 ones that the stand-in
    H100's tensor cores decline (few columns, a short reduction), which run the tiled SIMT kernel."""
    from hypothesis import HealthCheck, find, settings

    from conformance.strategies import products
    from tests.test_cuda_device import _stand_in

    dev = _stand_in()

    def simt(case) -> bool:
        if case.inputs["A"].dtype != np.float16 or case.inputs["A"].size < 2000:
            return False
        bound = driver.bind_inputs(parse(case.source), case.inputs)
        name = driver.build(bound, dev, {"cache": False}).library.extra["names"][0]
        return "_t1x" not in name and not name.endswith("f16")  # neither flat nor the tensor cores'

    found = find(products(), simt, settings=settings(max_examples=400, derandomize=True, database=None,
                                                     suppress_health_check=list(HealthCheck)))
    assert found.inputs["A"].dtype == np.float16
