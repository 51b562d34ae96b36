"""What the runner proves before reusing a buffer (``backends.zeroing``), what it calls its kernels
(``backends.naming``) and what ``TILE_DEBUG=1`` prints."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tile
from backends import registry
from backends.driver import compile_bound
from backends.hal import HostBuffer
from backends.naming import label
from backends.zeroing import needs_zero
from stripe.parser import parse_stripe
from tests.opencl_support import DEVICE_ID as OPENCL
from tile.bind import bind
from tile.inputs import input_types

pytestmark = pytest.mark.usefixtures("private_cache")

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n: M, N] = +(A[m, k] * B[k, n]); }"


def compiled(src: str, inputs: dict, device: str = "llvm_cpu.0", settings: dict | None = None):
    prog = tile.parse(src)
    return compile_bound(bind(prog, input_types(prog, inputs)), registry.get(device), settings)


def program(kernel: str, out: str = "fp32(4:8, 8:1)") -> str:
    """A Stripe program over ``A`` (input) and ``C`` (output) of sizes 4x8 with one kernel."""
    return f"""0: #program block [] (
    #input #user none A[0, 0] fp32(4:8, 8:1)
    #output #user none C[0, 0] {out}
) {{
  0: #main block [] (
      in A[0, 0] fp32(4:8, 8:1)
      out C[0, 0] {out}
  ) {{
{kernel}
  }}
}}"""


def _ew(idxs: str, access: str, agg: str = "assign", constraints: str = "") -> str:
    return f"""    0: #kernel block [{idxs}] ({constraints}
        in A[{access}] fp32(1:8, 1:1)
        out C[{access}]:{agg} fp32(1:8, 1:1)
    ) {{
      0: $A = load(A)
      1: C = store($A)
    }}"""


@pytest.mark.parametrize(
    "kernel, zeroed",
    [
        (_ew("i:4, j:8", "i, j"), False),  # every element, once
        (_ew("i:4, j:4", "i, 2*j"), True),  # every other column
        (_ew("i:4, j:7", "i, j"), True),  # one column short
        (_ew("i:4, j:8", "i, j", agg="add"), True),  # aggregates into what is there
        (_ew("i:4, j:8", "i, j", constraints="\n        7 - i - j >= 0"), True),
        (
            """    0: #kernel block [i:2, j:2] (
        in A[2*i, 4*j] fp32(2:8, 4:1)
        out C[2*i, 4*j]:assign fp32(2:8, 4:1)
    ) {
      0: block [k:2, l:4] (
          in A[k, l] fp32(1:8, 1:1)
          out C[k, l]:assign fp32(1:8, 1:1)
      ) {
        0: $A = load(A)
        1: C = store($A)
      }
    }""",
            False,  # tiled 2x4: the outer and inner indexes number every element once
        ),
        (
            """    0: #kernel #special block [] (
        out C[0, 0]:assign fp32(4:8, 8:1)
    ) {
      0: C = zero()
    }""",
            False,
        ),
    ],
)
def test_needs_zero(kernel, zeroed):
    prog = parse_stripe(program(kernel))
    assert needs_zero(prog, {"A"}) == ({"C"} if zeroed else set())


@pytest.mark.parametrize("config", [None, "llvm_cpu_tiled", "opencl_gpu_tiled"])
def test_lowered_programs_start_every_buffer_themselves(config):
    """The lowering starts aggregated outputs with a fill kernel and elementwise kernels write
    every element: the runner zeroes nothing of its own (here, at least)."""
    src = """function (A[M, K], B[K, N], F[M]) -> (C, X, E) {
        C[m, n: M, N] = +(A[m, k] * B[k, n]);
        X[m: M] = >(A[m, k]) default F;
        E = exp(C) * 2;
    }"""
    rng = np.random.default_rng(0)
    feed = {"A": rng.integers(-3, 4, (8, 16)).astype(np.float32),
            "B": rng.integers(-3, 4, (16, 4)).astype(np.float32),
            "F": np.zeros(8, np.float32)}
    cp = compiled(src, feed, settings={"config": config} if config else None)
    assert cp.zeroed == set()


def test_reused_buffers_are_not_refilled(monkeypatch):
    """Second call: inputs written, nothing zeroed, nothing allocated."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    cp = compiled("function (A) -> (O) { O = A * 2; }", {"A": a})
    np.testing.assert_array_equal(cp({"A": a})["O"], a * 2)
    owned = dict(cp._owned)
    calls = []
    monkeypatch.setattr(HostBuffer, "zero", lambda self, deps=(): calls.append(self))
    np.testing.assert_array_equal(cp({"A": a + 1})["O"], (a + 1) * 2)
    assert calls == [] and all(cp._owned[k] is b for k, b in owned.items())


def test_kernel_names_say_what_they_are():
    rng = np.random.default_rng(0)
    a = rng.integers(-3, 4, (64, 32)).astype(np.float32)
    b = rng.integers(-3, 4, (32, 48)).astype(np.float32)
    cp = compiled(MATMUL, {"A": a, "B": b})
    assert [i.name for i in cp.infos] == ["zero", "matmul_64x48x32"]
    assert 'define void @"tile_k1_matmul_64x48x32"' in cp.library.source
    tiled = compiled(MATMUL, {"A": a, "B": b}, settings={"config": "llvm_cpu_tiled"})
    assert tiled.infos[1].name.startswith("matmul_64x48x32_t")
    conv = compiled(
        "function (I[N, X, C], K[R, C, D]) -> (O) { "
        "O[n, x, d: N, X - R + 1, D] = +(I[n, x + r, c] * K[r, c, d]); }",
        {"I": np.zeros((2, 10, 3), np.float32), "K": np.zeros((3, 3, 4), np.float32)},
    )
    assert conv.infos[-1].name == "conv_2x8x4x3x3"
    rows = compiled("function (A[M, N]) -> (S) { S[m: M] = +(A[m, n]); }", {"A": a})
    assert rows.infos[-1].name == "sum_64x32"
    ew = compiled("function (A) -> (O) { O = exp(A) * 2; }", {"A": a})
    assert ew.infos[-1].name == "ew_exp_mul_64x32"
    assert label(parse_stripe(program(_ew("i:4, j:8", "i, j"))).stmts[0].stmts[0]) == "ew_copy_4x8"


@pytest.mark.parametrize(
    "dev",
    ["llvm_cpu.0", pytest.param(OPENCL, marks=pytest.mark.skipif(OPENCL is None, reason="no OpenCL device"))],
)
def test_debug_prints_each_kernel_time_and_rate(dev, monkeypatch, capsys):
    monkeypatch.setenv("TILE_DEBUG", "1")
    a = np.ones((32, 32), np.float32)
    np.testing.assert_array_equal(tile.compile(MATMUL, dev)(A=a, B=a)["C"], a @ a)
    err = capsys.readouterr().err
    # a program's first call is marked as such: its times include one-time start-up
    first = r" \[first call\]\n"
    # (OpenCL's tiled matmul stores its sums once: no fill kernel before it, gemm_outputs; on
    # llvm_cpu.0 the micro-kernel takes its fill over, which is not launched: backends/llvm/fills.py)
    k, kernels = ("1", "1 kernel") if dev == "llvm_cpu.0" else ("0", "1 kernel")
    line = rf"tile: kernel tile_k{k}_matmul_32x32x32\w* \(k1_C[^)]*\): [\d.]+ ms, [\d.]+ GFLOP/s" + first
    assert re.search(line, err)
    assert re.search(rf"tile: {kernels}, [\d.]+ ms \(first call: one-time start-up included", err)
    # llvm_cpu.0 reads numpy inputs in place, but copies the second of two equal ones, and writes
    # the output where the call returns it
    out = "nothing" if dev == "llvm_cpu.0" else r"0.0041 MB \([\d.]+ ms\)"
    copies = rf"tile: copied in (0.0041|0.00819) MB \([\d.]+ ms\), out {out}\n"
    assert re.search(copies, err)
    np.testing.assert_array_equal(tile.compile("function (A) -> (E) { E = A + 1; }", dev)(A=a)["E"], a + 1)
    err = capsys.readouterr().err
    assert re.search(r"tile: kernel tile_k0_ew_add_32x32 \(k0_E\): [\d.]+ ms, [\d.]+ GB/s" + first, err)


@pytest.mark.parametrize(
    "dev",
    ["llvm_cpu.0", pytest.param(OPENCL, marks=pytest.mark.skipif(OPENCL is None, reason="no OpenCL device"))],
)
def test_profile_reports_the_last_calls_kernels(dev):
    exe = tile.compile(MATMUL, dev)
    with pytest.raises(tile.TileError, match="there was none"):
        exe.profile()
    a = np.ones((16, 16), np.float32)
    exe(A=a, B=a)
    prof = exe.profile()
    tiles = "_t32x32r4x4k16" if dev != "llvm_cpu.0" else ""  # OpenCL's tiled kernel names its tiles
    if dev == "llvm_cpu.0":  # its fill, taken over by the micro-kernel, is not launched (llvm/fills.py)
        assert [name for name, _ in prof] == ["tile_k1_matmul_16x16x16"]
    else:  # the tiled kernel stores its sums once: no fill kernel (gemm_outputs)
        assert [name for name, _ in prof] == [f"tile_k0_matmul_16x16x16{tiles}"]
    assert all(secs >= 0 for _, secs in prof) and sum(s for _, s in prof) > 0
