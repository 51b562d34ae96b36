"""stripe.cost: the tile model autotile ranks with, and the per-kernel estimate of ``--report``;
every number below is derived by hand in its comment."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np

from stripe.config import TARGETS
from stripe.cost import TileModel, estimate, ops_per_point, view_bytes
from stripe.hardware import ExecUnit, Hardware, MemUnit
from stripe.ir import Location
from stripe.parser import parse_stripe
from tests.pass_support import hardware, lowered
from tests.test_pass_autotile import CONV_11, MATMUL, MATMUL_8, TINY, conv_11_tiled
from tile.cli import main


def test_view_bytes_rounds_the_contiguous_dim_to_lines():
    assert view_bytes((8, 8), (8, 1), 4, 64) == 8 * 64  # 8 rows of 32 bytes: a line each
    assert view_bytes((8, 17), (17, 1), 4, 64) == 8 * 128  # 68-byte rows: two lines each
    assert view_bytes((16, 3), (1, 16), 4, 64) == 3 * 64  # the contiguous dim may come first
    assert view_bytes((3, 3, 4), (12, 4, 1), 4, 64) == 9 * 64
    assert view_bytes((5,), (7,), 4, 64) == 5 * 64  # no stride-1 dim: a line per element
    assert view_bytes((), (), 8, 4) == 8  # a scalar of 8 bytes in 4-byte lines


def test_ops_per_point():
    kernels = parse_stripe(MATMUL_8).stmts[0].stmts
    assert ops_per_point(kernels[0]) == 0  # zero(): a special, no arithmetic
    assert ops_per_point(kernels[1]) == 2  # mul, and the add of the aggregation
    exp = lowered("function (A[N]) -> (O) { O = exp(A); }", {"A": (4,)}).stmts[0].stmts[0]
    assert ops_per_point(exp) == 1


def test_tile_model_by_hand():
    kernel = parse_stripe(MATMUL_8).stmts[0].stmts[1]  # [k:8, m:8, n:8], A[m, k], B[k, n], C[m, n]
    model = TileModel(kernel, TINY, "SRAM", {n: (8, 8) for n in "ABC"})  # 4-byte lines
    assert model.flops == 512 * 2 and model.capacity == 256 and model.owned == {1, 2}
    # (k, m, n) = (4, 8, 1): outer [2, 1, 8] = 16 points. A 8x4 = 32 floats, B 4x1, C 8x1.
    # A is reused across n (innermost split, A does not use it): 16/8 = 2 loads * 128 B = 256;
    # B 16 * 16 B = 256; C, read and written, 2 * 16 * 32 B = 1024.
    c = model.evaluate((4, 8, 1))
    assert (c.footprint, c.traffic, c.parallel) == (4 * (32 + 4 + 8), 256 + 256 + 1024, 8)
    # The whole block: one point, everything once; C twice. No outer index of the output: 1.
    c = model.evaluate((8, 8, 8))
    assert (c.footprint, c.traffic, c.parallel) == (3 * 256, 256 + 256 + 512, 1)
    # Single points: A (m, k) stays across n: 64 loads of 4 B; B and C every one of 512 points.
    c = model.evaluate((1, 1, 1))
    assert (c.footprint, c.traffic, c.parallel) == (12, 64 * 4 + 512 * 4 + 2 * 512 * 4, 64)
    assert c.bytes_per_flop == c.traffic / 1024


def test_matmul_tile_is_the_optimum():
    # The tiling tests/test_pass_autotile.py's test_matmul_tiny_memory expects (derived there) is
    # the best of every power-of-two tiling that fits.
    kernel = parse_stripe(MATMUL_8).stmts[0].stmts[1]
    model = TileModel(kernel, TINY, "SRAM", {n: (8, 8) for n in "ABC"})
    sizes = (1, 2, 4, 8)
    feasible = [model.evaluate(t) for t in itertools.product(sizes, repeat=3)]
    feasible = [c for c in feasible if c.footprint <= 256]  # TINY's memory
    best = min(feasible, key=lambda c: c.key())
    assert best.tiles == (8, 4, 1)
    assert (best.footprint, best.traffic, best.flops, best.parallel) == (176, 1280, 1024, 16)


def test_tile_model_lines_and_clipping():
    # 64-byte lines: a 1x1 tile still moves a whole line; a tile is clipped to its parent view.
    hw = Hardware(1000, {"M": MemUnit(1, 1, 64)}, {"PE": ExecUnit()})
    kernel = parse_stripe(CONV_11).stmts[0].stmts[1]  # [ci:3, co:4, kx:3, x:11], I[kx + x - 1, ci]
    model = TileModel(kernel, hw, "M", {"I": (11, 3), "K": (3, 3, 4), "O": (11, 4)})
    # Whole block: I spans 3 + 11 - 1 = 13 rows, clipped to the 11 of its parent; K 9 rows; O 11.
    c = model.evaluate((3, 4, 3, 11))
    assert c.footprint == (11 + 9 + 11) * 64
    assert c.traffic == (11 + 9 + 2 * 11) * 64
    # x tiles of 4 (3 tiles): I 6 rows each time; K once (x is the only split index); O 4 rows.
    c = model.evaluate((3, 4, 3, 4))
    assert (c.footprint, c.traffic) == ((6 + 9 + 4) * 64, (3 * 6 + 9 + 2 * 3 * 4) * 64)


def test_estimate_matmul():
    # llvm_cpu: 2 CPUs x 16 ops/cycle = 32; DRAM buses: 16 B/cycle; 64-byte lines.
    program = lowered(MATMUL, {"A": (8, 16), "B": (16, 4)})
    report = estimate(program, hardware("llvm_cpu"))
    zero, mm = report.kernels
    # zero(C): C is 8 rows of 16 bytes = 8 lines, written once: 512 B = 32 cycles.
    assert (zero.name, zero.flops, zero.bytes, zero.cycles) == ("k0_C", 0, {"DRAM": 512}, 32)
    # [k:16, m:8, n:4]: 512 points x 2 = 1024 flops = 32 cycles. A 8 rows of 64 B = 512 B,
    # B 16 rows of 16 B = 1024 B, C 8 lines read and written = 1024 B: 2560 B = 160 cycles.
    assert (mm.flops, mm.compute_cycles, mm.bytes, mm.memory_cycles) == (1024, 32, {"DRAM": 2560}, 160)
    assert mm.cycles == 160
    assert (report.flops, report.cycles, report.bytes) == (1024, 192, {"DRAM": 3072})


def test_estimate_tiled_conv():
    # conv_11_tiled(4): outer [ci:1, co:1, kx:1, x:3], inner [ci:3, co:4, kx:3, x:4].
    program = parse_stripe(conv_11_tiled(4))
    report = estimate(program, hardware("llvm_cpu"))
    zero, conv = report.kernels
    assert zero.bytes == {"DRAM": 11 * 64}  # O: 11 rows of 16 bytes
    # flops: 3 outer points x 144 inner points x 2 (the partial last tile counts whole) = 864,
    # 27 cycles. Bytes: per outer point the tiles I (6 rows), K (9 rows), O (4 rows, twice):
    # (6 + 9 + 8) lines x 64 = 1472, x 3 points = 4416 B = 276 cycles at 16 B/cycle.
    assert (conv.flops, conv.compute_cycles, conv.bytes) == (864, 27, {"DRAM": 4416})
    assert conv.cycles == 276

    # Inner refinements placed in L1 count there as well: the inner block touches over its box
    # I (3 + 4 - 1 rows), K 9, O 4 twice: again 1472 B per outer point. L1's fastest bus is 64
    # B/cycle (69 cycles); the DRAM level still dominates.
    main = program.stmts[0]
    outer = main.stmts[1]
    inner = outer.stmts[0]
    l1 = Location("L1")
    inner = dataclasses.replace(inner, refs=tuple(dataclasses.replace(r, location=l1) for r in inner.refs))
    outer = dataclasses.replace(outer, stmts=(inner,))
    located = dataclasses.replace(program, stmts=(dataclasses.replace(main, stmts=(main.stmts[0], outer)),))
    conv = estimate(located, hardware("llvm_cpu")).kernels[1]
    assert conv.bytes == {"DRAM": 4416, "L1": 4416}
    assert (conv.memory_cycles, conv.cycles) == (276, 276)

    # On accel, a block located on CONV computes at 4 x 512 ops/cycle; DRAM moves 64 B/cycle.
    on_conv = dataclasses.replace(main.stmts[1], location=Location("CONV"))
    program = dataclasses.replace(program, stmts=(dataclasses.replace(main, stmts=(main.stmts[0], on_conv)),))
    conv = estimate(program, hardware("accel")).kernels[1]
    assert (conv.compute_cycles, conv.memory_cycles, conv.cycles) == (864 / 2048, 4416 / 64, 69)


def test_report_format():
    program = lowered(MATMUL, {"A": (8, 16), "B": (16, 4)})
    lines = estimate(program, hardware("llvm_cpu")).format().splitlines()
    assert lines[0].split() == ["kernel", "flops", "compute", "bytes", "DRAM", "memory", "cycles"]
    assert lines[1].split() == ["k0_C", "0", "0", "512", "32", "32"]
    assert lines[2].split() == ["k1_C", "1024", "32", "2560", "160", "160"]
    assert lines[3].split() == ["total", "1024", "32", "3072", "192", "192"]
    assert lines[4] == "estimated 192 cycles = 0.064 us at 3000 MHz"


def test_cli_report(tmp_path, capsys):
    # llvm_cpu's hardware with no passes, so the program reported is the lowered one.
    config = json.loads((TARGETS / "llvm_cpu.json").read_text())
    (tmp_path / "cpu.json").write_text(json.dumps({**config, "passes": []}))
    (tmp_path / "mm.tile").write_text(MATMUL)
    args = ["--stage", "optimized", "--config", str(tmp_path / "cpu.json"), "--report"]
    assert main(["emit", str(tmp_path / "mm.tile"), *args, "--shape", "A=8x16", "--shape", "B=16x4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2].split() == ["total", "1024", "32", "3072", "192", "192"]


# A work-group nest as gemm_tile writes it (issue: --report charged every work-group all of A, B and
# C, 4.29 GB for a 1024^3 matmul): whole-buffer views at every level, tiles only in the accesses.
GROUPED = """0: #program block [] ( // program
    #input #user none A[0, 0] fp32(64:64, 64:1)
    #input #user none B[0, 0] fp32(64:64, 64:1)
    #output #user none C[0, 0] fp32(64:64, 64:1)
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(64:64, 64:1)
      in B[0, 0] fp32(64:64, 64:1)
      out C[0, 0] fp32(64:64, 64:1)
  ) {
    0: #kernel block [i:4, j:2] ( // k1_C
        in A[16*i, 0] fp32(64:64, 64:1)
        in B[0, 32*j] fp32(64:64, 64:1)
        out C[16*i, 32*j]:add fp32(64:64, 64:1)
    ) {
      0: block [k:8] (
          in A[0, 8*k] fp32(64:64, 64:1)
          in B[8*k, 0] fp32(64:64, 64:1)
          out C[0, 0]:add fp32(64:64, 64:1)
      ) {
        0: block [m:16, n:32, kk:8] (
            in A[m, kk] fp32(1:64, 1:1)
            in B[kk, n] fp32(1:64, 1:1)
            out C[m, n]:add fp32(1:64, 1:1)
        ) {
          0: $A = load(A)
          1: $B = load(B)
          2: $v = mul($A, $B):fp32
          3: C = store($v)
        }
      }
    }
  }
}
"""


def test_estimate_charges_a_work_group_its_tiles_not_the_whole_buffers():
    (mm,) = estimate(parse_stripe(GROUPED), hardware("llvm_cpu")).kernels
    # 8 groups (16 x 32 tiles of C). Each reads A's 16 rows x 64 (16 rows of 256 B = 4096 B), B's
    # 64 rows x 32 columns (64 rows of 128 B = 8192 B) and reads and writes its C tile (16 rows of
    # 128 B, twice = 4096 B): 16384 B a group, 131072 B in all (the whole views: 8 x 65536).
    assert mm.bytes == {"DRAM": 8 * (16 * 256 + 64 * 128 + 2 * 16 * 128)}
    assert mm.flops == 2 * 64 * 64 * 64


def test_opencl_gpu_report_of_a_square_matmul_grows_as_n_cubed():
    from backends.driver import bind_inputs
    from stripe.config import target_config
    from stripe.lower import lower
    from stripe.passes import optimize
    from tile.parser import parse

    mm = "function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
    cfg = target_config("opencl_gpu")
    got = {}
    for n in (512, 1024):
        a = np.zeros((n, n), np.float32)
        program = optimize(lower(bind_inputs(parse(mm), {"A": a, "B": a})), cfg)
        kernel = program.stmts[0].stmts[-1]
        groups = {ix.name: ix.range for ix in kernel.idxs}
        tm, tn = n // groups["i"], n // groups["j"]  # the work-group tile of C
        # by hand: per group, A's tm x n rows, B's n x tn panel, C's tile read and written
        want = groups["i"] * groups["j"] * 4 * (tm * n + n * tn + 2 * tm * tn)
        got[n] = estimate(program, cfg.hardware).kernels[-1].bytes["GLOBAL"]
        assert got[n] == want, (n, tm, tn)
    assert got[1024] < 300 * 2**20  # 4.29 GB before
