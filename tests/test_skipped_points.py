"""Points a constraint skips contribute nothing on compiled targets, whatever the other operand holds.

The interpreter never combines the operands of a skipped point (semantics §6.3), so a padded
convolution whose filter holds inf or NaN is finite wherever only padding meets them. A kernel that
loads a zero for the skipped operand and multiplies it anyway adds ``0 * inf = NaN``: the tiled
OpenCL kernel carries a flag per loaded element instead (``backends.clike.tiled``), the LLVM
micro-kernel selects on its row conditions. Values are integers, inf and NaN, so every order of
the sum gives the same answer and non-strict results compare exactly too.
"""

from __future__ import annotations

import numpy as np
import pytest

import ref_interp
from backends import registry
from backends.driver import compile_bound
from backends.runner import CompiledProgram
from tests.llvm_runner import assert_same
from tests.opencl_support import DEVICE_ID as OPENCL_DEVICE
from tile import parse
from tile.bind import bind
from tile.inputs import input_types

CONV = """function (I[N, X, Y, CI], F[KX, KY, CI, CO]) -> (O) {
  O[n, x, y, co : N, X, Y, CO] = +(I[n, x + i - 1, y + j - 1, ci] * F[i, j, ci, co]);
}"""
# both operands guarded by their own output index: a skipped point may meet inf in either
BOTH = "function (A[M, K], B[K, N]) -> (O) { O[m, n: 9, 10] = +(A[m + k - 1, k] * B[k, n - k + 2]); }"
# the second operand's guard uses N (the output's contiguous index): a flag per column
SECOND = "function (A[M, K], B[K, N]) -> (O) { O[m, n: 9, 12] = +(A[m, k] * B[k, n + k - 2]); }"
# a guard on an M index that is not the contiguous one: flagged float4 loads along M
ROWS = (
    "function (A[K, X, Y], B[K, N]) -> (O) "
    "{ O[x, y, n: 7, 8, 9] = +(A[k, x + k - 1, y] * B[k, n]); }"
)
MM = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"

# device id and settings: the fast kernels (micro-kernel, tiled) and the general ones
VARIANTS = [
    ("llvm_cpu.0", {}),
    ("llvm_cpu.0", {"microkernel": False}),
    (OPENCL_DEVICE, {}),
    (OPENCL_DEVICE, {"tiled": False}),
]


def compiled(src: str, inputs: dict, dev_id: str, settings: dict) -> CompiledProgram:
    if dev_id is None or dev_id not in registry.devices():
        pytest.skip(f"{dev_id} is not available: {registry.unavailable()}")
    prog = parse(src)
    return compile_bound(bind(prog, input_types(prog, inputs)), registry.get(dev_id), settings)


def specials(rng: np.random.Generator, shape, count: int) -> np.ndarray:
    """Small integers with ``count`` of inf, -inf and NaN each at drawn places."""
    x = rng.integers(-3, 4, shape).astype(np.float32)
    flat = x.reshape(-1)
    where = rng.choice(flat.size, size=min(flat.size, 3 * count), replace=False)
    for k, w in enumerate(where):
        flat[w] = (np.inf, -np.inf, np.nan)[k % 3]
    return x


def cases():
    rng = np.random.default_rng(7)
    conv_i = rng.integers(-3, 4, (2, 9, 9, 4)).astype(np.float32)
    conv_f = rng.integers(-3, 4, (3, 3, 4, 8)).astype(np.float32)
    conv_f[0, 0, 1, 2], conv_f[2, 2, 3, 5], conv_f[0, 2, 0, 0] = np.inf, np.nan, -np.inf
    yield "conv-filter-specials", CONV, {"I": conv_i, "F": conv_f}
    conv_i2 = conv_i.copy()
    conv_i2[0, 0, 0, 0], conv_i2[1, 8, 4, 3] = np.inf, np.nan
    conv_f2 = rng.integers(-3, 4, (3, 3, 4, 8)).astype(np.float32)
    yield "conv-input-specials", CONV, {"I": conv_i2, "F": conv_f2}
    yield "conv-130-outputs", CONV, {
        "I": specials(rng, (1, 5, 7, 3), 1),
        "F": specials(rng, (3, 3, 3, 130), 4),
    }
    yield "both-guarded", BOTH, {"A": specials(rng, (9, 5), 2), "B": specials(rng, (5, 10), 2)}
    yield "second-guarded", SECOND, {"A": specials(rng, (9, 6), 1), "B": specials(rng, (6, 12), 2)}
    yield "rows-guarded", ROWS, {"A": specials(rng, (4, 7, 8), 2), "B": specials(rng, (4, 9), 2)}


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("dev_id, settings", VARIANTS)
@pytest.mark.parametrize("name, src, inputs", list(cases()), ids=[c[0] for c in cases()])
def test_skipped_points_add_nothing(name, src, inputs, dev_id, settings, strict):
    cp = compiled(src, inputs, dev_id, {**settings, "strict": strict})
    want = ref_interp.run(src, inputs)
    assert np.isfinite(want["O"]).any() and not np.isfinite(want["O"]).all(), name  # both kinds
    assert_same(cp(inputs), want)


@pytest.mark.parametrize("src, inputs, flags", [
    (CONV, {"I": np.zeros((2, 9, 9, 4), np.float32), "F": np.zeros((3, 3, 4, 8), np.float32)}, ["Am4"]),
    (BOTH, {"A": np.zeros((9, 5), np.float32), "B": np.zeros((5, 10), np.float32)}, ["Am4", "Bm4"]),
    (SECOND, {"A": np.zeros((9, 6), np.float32), "B": np.zeros((6, 12), np.float32)}, ["Bm4"]),
    (MM, {"A": np.zeros((37, 30), np.float32), "B": np.zeros((30, 41), np.float32)}, []),
])
def test_only_operands_guarded_by_their_own_group_carry_flags(src, inputs, flags):
    """The tiled kernel keeps its plain path where no guard uses the operand's M (N) indexes."""
    source = compiled(src, inputs, OPENCL_DEVICE, {}).library.source
    assert source.count("reqd_work_group_size") == 1
    assert sorted(f for f in ("Am4", "Bm4") if f in source) == flags
