"""Half-type matrix products on targets without matrix units sum in float32 and round once, as the
interpreter does (docs/semantics.md §8.1.1; ``stripe.lower.widens``): a float16 running sum of
ones stalls at 2048 (bfloat16's at 256), the product does not. Before, ``llvm_cpu.0`` summed a
float16 matmul in float16: 50x PyTorch's error at K = 4096."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from backends import driver, registry
from stripe.lower import widens
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
    assert widens(False, {}) and widens(True, {"tensor_core": object()})
    assert not widens(False, {"tensor_core": object()})


def test_the_lowered_product_is_widened_only_where_the_target_has_no_unit():
    ins = {"A": np.ones((4, 8), np.float16), "B": np.ones((8, 4), np.float16)}
    bound = driver.bind_inputs(parse(MATMUL), ins)
    dev = registry.get("llvm_cpu.0")
    build = driver.build(bound, dev, {"cache": False})
    assert "C_f32" in {r.into for r in build.lowered.refs}, "llvm_cpu.0 has no matrix unit: widened"
    from tests.test_cuda_device import _stand_in

    build = driver.build(bound, _stand_in(), {"cache": False})
    assert "C_f32" not in {r.into for r in build.lowered.refs}, "a tensor-core target takes the narrow form"
