"""The work-group-tiled OpenCL kernels of GEMM-shaped contractions: the ``gemm_tile`` pass's
nests, read back (``stripe.gemm_nest``) and emitted by ``backends.clike.tiled``.

Integer-valued inputs compare exactly with numpy and the interpreter at sizes that are multiples
of no tile (1, 3, primes, 1000); random floats compare within ``k·eps·K·max`` (fma and a blocked
order are allowed, semantics §8.3), and bit-exactly in strict mode (no fma, Stripe's K order).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import ref_interp
from backends.clike import generate
from backends.clike.tiled import Tiles
from backends.driver import compile_bound, config_for
from backends.opencl.target import OpenCLTarget
from backends.runner import CompiledProgram
from backends.tune import with_choices
from stripe.gemm_nest import read
from tests.opencl_support import DEVICE_ID, check, device, ints, requires_opencl, run
from tile import parse
from tile.bind import bind
from tile.inputs import input_types

pytestmark = requires_opencl

MM = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"
CONV = """function (I[N, X, Y, CI], F[KX, KY, CI, CO]) -> (O) {
  O[n, x, y, co : N, X, Y, CO] = +(I[n, x + i - 1, y + j - 1, ci] * F[i, j, ci, co]);
}"""


def compiled(src: str, inputs: dict, settings: dict | None = None) -> CompiledProgram:
    prog = parse(src)
    return compile_bound(bind(prog, input_types(prog, inputs)), device(), settings or {})


def tiled_kernels(cp: CompiledProgram) -> int:
    return cp.library.source.count("reqd_work_group_size")


def tolerance(want: np.ndarray, k: int, dtype=np.float32) -> np.ndarray:
    return 4 * np.finfo(dtype).eps * k * np.maximum(1.0, np.abs(want))


@pytest.mark.parametrize(
    "m,k,n", [(1, 1, 1), (1, 9, 5), (3, 5, 7), (5, 7, 4), (127, 129, 131), (1000, 3, 17), (5, 1000, 6)]
)
def test_matmul_odd_sizes_exact(m, k, n):
    rng = np.random.default_rng(m * k * n)
    a, b = ints(rng, (m, k)), ints(rng, (k, n))
    cp = compiled(MM, {"A": a, "B": b})
    assert tiled_kernels(cp) == (min(m, n) >= 2)  # M or N of one point: the general kernel
    np.testing.assert_array_equal(cp({"A": a, "B": b})["C"], a @ b)


def test_transposed_operands_and_batch():
    """Operands whose contiguous index is M or N (not K) and a batch index both operands use."""
    rng = np.random.default_rng(1)
    src = "function (A[Q, K, M], B[Q, N, K]) -> (C) { C[q, m, n : Q, M, N] = +(A[q, k, m] * B[q, n, k]); }"
    a, b = ints(rng, (3, 37, 70)), ints(rng, (3, 65, 37))
    cp = compiled(src, {"A": a, "B": b})
    assert tiled_kernels(cp) == 1
    want = np.einsum("qkm,qnk->qmn", a, b)
    np.testing.assert_array_equal(cp({"A": a, "B": b})["C"], want)


def test_output_transposed_swaps_roles():
    """N is the group holding the output's contiguous index, so the stores stay coalesced."""
    src = "function (A[M, K], B[K, N]) -> (C) { C[n, m : N, M] = +(A[m, k] * B[k, n]); }"
    prog = parse(src)
    a, b = np.zeros((40, 9), np.float32), np.zeros((9, 130), np.float32)
    cp = compile_bound(bind(prog, input_types(prog, {"A": a, "B": b})), device(), {})
    k = max(cp.infos, key=lambda i: i.flops)
    g = read(k.block).gemm
    assert [ix.name for ix in g.n.idxs] == ["m"] and g.b.ref.source == "A"
    rng = np.random.default_rng(2)
    a, b = ints(rng, (40, 9)), ints(rng, (9, 130))
    np.testing.assert_array_equal(cp({"A": a, "B": b})["C"], (a @ b).T)


@pytest.mark.parametrize("shape", [(2, 9, 9, 4, 8), (1, 5, 7, 3, 130), (3, 12, 11, 16, 64)])
def test_conv_padding_exact(shape):
    n, x, y, ci, co = shape
    rng = np.random.default_rng(co)
    inputs = {"I": ints(rng, (n, x, y, ci)), "F": ints(rng, (3, 3, ci, co))}
    cp = compiled(CONV, inputs)
    assert tiled_kernels(cp) == 1
    np.testing.assert_array_equal(cp(inputs)["O"], ref_interp.run(CONV, inputs)["O"])


def test_store_constraint():
    """A constraint without reduction indexes guards the store (an upper triangle here)."""
    src = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]), m - n + 2 < 200; }"
    rng = np.random.default_rng(3)
    check(src, {"A": ints(rng, (70, 11)), "B": ints(rng, (11, 67))})


def test_random_floats_within_tolerance():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((67, 513), dtype=np.float32)
    b = rng.standard_normal((513, 129), dtype=np.float32)
    got = run(MM, {"A": a, "B": b})["C"]
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.all(np.abs(got - want) <= tolerance(want, 513))


# The interpreter sums in order of first appearance, and so does the lowered Stripe block: any
# names agree (CONV's (i, j, ci) differed while the lowering listed indexes alphabetically).
CONV_ABC = """function (I[N, X, Y, CI], F[KX, KY, CI, CO]) -> (O) {
  O[n, x, y, co : N, X, Y, CO] = +(I[n, x + a - 1, y + b - 1, c] * F[a, b, c, co]);
}"""


@pytest.mark.parametrize(
    "src,shapes",
    [
        (MM, {"A": (37, 300), "B": (300, 41)}),
        (CONV_ABC, {"I": (2, 7, 6, 5), "F": (3, 3, 5, 9)}),
        (CONV, {"I": (2, 7, 6, 5), "F": (3, 3, 5, 9)}),
    ],
)
def test_strict_is_bit_identical(src, shapes):
    """Strict mode: no fma and Stripe's K order, so the interpreter's roundings exactly."""
    rng = np.random.default_rng(5)
    inputs = {k: rng.standard_normal(s, dtype=np.float32) for k, s in shapes.items()}
    cp = compiled(src, inputs, {"strict": True})
    assert tiled_kernels(cp) == 1 and "fma(" not in cp.library.source
    got = cp(inputs)
    want = ref_interp.run(src, inputs)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_float64():
    if not device().capabilities.fp64:
        pytest.skip(f"{DEVICE_ID} has no float64")
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((33, 70)), rng.standard_normal((70, 129))
    got = run(MM, {"A": a, "B": b})["C"]
    want = a @ b
    assert got.dtype == np.float64
    assert np.all(np.abs(got - want) <= tolerance(want, 70, np.float64))


def test_not_matched_stays_general():
    """Integer contractions and matrix-vector products keep the general kernels."""
    rng = np.random.default_rng(7)
    a, b = ints(rng, (9, 5), dtype=np.int32), ints(rng, (5, 4), dtype=np.int32)
    cp = compiled(MM, {"A": a, "B": b})
    assert tiled_kernels(cp) == 0
    np.testing.assert_array_equal(cp({"A": a, "B": b})["C"], a @ b)
    # a matrix-vector product (N is 1): the general kernels, split_reduction's lanes where long
    src = "function (A[M, K], B[K]) -> (C) { C[m : M] = +(A[m, k] * B[k]); }"
    a, b = ints(rng, (6, 4000)), ints(rng, (4000,))
    cp = compiled(src, {"A": a, "B": b})
    assert tiled_kernels(cp) == 0
    np.testing.assert_array_equal(cp({"A": a, "B": b})["C"], a @ b)


def test_tile_choice_and_plain_c_target():
    """The tiles are the nest's, which the pass's cost model chose for this device (128 rows of 8
    per work-item for a big M, 32 columns of 4 for a small N, halved while the work-groups do not
    fill the compute units); plain C has no work-groups and runs the nest as loops."""
    prog = parse(MM)
    a = np.zeros((300, 8), np.float32)
    b = np.zeros((8, 40), np.float32)
    cp = compile_bound(bind(prog, input_types(prog, {"A": a, "B": b})), device(), {})
    k = max(cp.infos, key=lambda i: i.flops)
    t = Tiles.of(read(k.block))
    units = sum(u.count for u in cp.config.hardware.exec_units.values())
    tm = 128 if units <= 6 else 64  # 300 x 40 in 128 x 32 tiles is 6 work-groups
    assert (t.tm, t.tn, t.rm, t.rn, t.threads) == (tm, 32, tm // 16, 4, 128)
    ocl = generate(OpenCLTarget(), [k], {})[0]
    assert ocl.local == t.threads and ocl.work_items == -(-300 // tm) * 2 * t.threads  # 40: 2 tiles
    from backends.clike.target import CTarget

    assert generate(CTarget(), [k], {})[0].local == 0


def test_choices_are_other_tilings():
    """The pass's ``choices`` (what the tuner tries) give other tiles, named in the kernel, and the
    same exact answer."""
    rng = np.random.default_rng(8)
    a, b = ints(rng, (70, 33)), ints(rng, (33, 45))
    cfg = config_for(device())
    names = set()
    for rank in (0, 1, 2, 5):
        settings = {"config": with_choices(cfg, {"tile_gemms": {"k1_C": rank}}), "cache": False}
        cp = compiled(MM, {"A": a, "B": b}, settings)
        names |= set(re.findall(r"void (tile_k\d+_matmul\w+)\(", cp.library.source))
        np.testing.assert_array_equal(cp({"A": a, "B": b})["C"], a @ b)
    assert len(names) == 4


def test_a_changed_nest_runs_as_loops():
    """A nest without its plan (a later pass changed it and dropped the plan) is not read as one:
    the general kernel runs it, with the same answer."""
    from dataclasses import replace

    rng = np.random.default_rng(11)
    a, b = ints(rng, (40, 9)), ints(rng, (9, 36))
    cp = compiled(MM, {"A": a, "B": b})
    k = max(cp.infos, key=lambda i: i.flops)
    assert read(k.block) is not None
    changed = replace(k.block, plan=None)
    assert read(changed) is None
    assert generate(OpenCLTarget(), [replace(k, block=changed)], {})[0].local == 0


@pytest.mark.parametrize(
    "src,shapes",
    [
        (
            "function (A[M, K], B[K, N], Bias[N]) -> (C) { T[m, n : M, N] = +(A[m, k] * B[k, n]); "
            "C = relu(T + Bias); }",
            {"A": (130, 17), "B": (17, 129), "Bias": (129,)},
        ),
        (
            """function (I[N, X, Y, CI], F[KX, KY, CI, CO], Bias[CO]) -> (R) {
              O[n, x, y, co : N, X, Y, CO] = +(I[n, x + i - 1, y + j - 1, ci] * F[i, j, ci, co]);
              R = relu(O + Bias);
            }""",
            {"I": (1, 5, 7, 3), "F": (3, 3, 3, 70), "Bias": (70,)},
        ),
    ],
)
def test_fused_epilogue(src, shapes):
    """The optimizer fuses the elementwise consumer; it runs on each element before the store."""
    rng = np.random.default_rng(9)
    inputs = {k: ints(rng, s) for k, s in shapes.items()}
    cp = compiled(src, inputs)
    assert tiled_kernels(cp) == 1 and len(cp.infos) <= 2  # the zero-fill kernel at most, and this
    want = ref_interp.run(src, inputs)
    for name, got in cp(inputs).items():
        np.testing.assert_array_equal(got, want[name])


@pytest.mark.parametrize(
    "src,shapes",
    [
        (MM, {"A": (68, 36), "B": (36, 132)}),  # both operands: rows of a multiple of 4
        (MM, {"A": (68, 37), "B": (37, 132)}),  # A's rows of 37: scalar loads for A only
        (CONV, {"I": (2, 6, 7, 8), "F": (3, 3, 8, 12)}),  # the input along ci, the filter along co
    ],
)
def test_float4_global_loads(src, shapes):
    """Four adjacent, aligned elements that the same guards keep are one ``float4`` load."""
    rng = np.random.default_rng(10)
    inputs = {k: ints(rng, s) for k, s in shapes.items()}
    cp = compiled(src, inputs)
    loads = cp.library.source.count("*(__global const float4*)")
    assert loads >= (1 if shapes["A" if "A" in shapes else "I"][-1] % 4 else 2)
    want = ref_interp.run(src, inputs)
    for name, got in cp(inputs).items():
        np.testing.assert_array_equal(got, want[name])


def test_kernel_names_carry_the_tiles():
    """``backends.naming`` names a kernel before the generator chooses its tiles; the tiled kernel's
    symbol adds them (work-group tile, register block, K step), and so do profiles."""
    a, b = np.ones((300, 200), np.float32), np.ones((200, 260), np.float32)
    cfg = config_for(device())
    given = compiled(MM, {"A": a, "B": b}, {"config": with_choices(cfg, {"tile_gemms": {"k1_C": 0}})})
    k = max(given.infos, key=lambda i: i.flops)
    name = f"tile_k0_matmul_300x260x200_{Tiles.of(read(k.block)).suffix}"
    assert f"void {name}(" in given.library.source
    np.testing.assert_array_equal(given({"A": a, "B": b})["C"], a @ b)
    assert [n for n, _ in given.profile()] == [name]  # no fill kernel: the sums are stored once
    chosen = compiled(MM, {"A": a, "B": b}).library.source
    assert re.search(r"void tile_k0_matmul_300x260x200_t(32|64|128)x(32|64|128)r[48]x[48]k(8|16)\(", chosen)
