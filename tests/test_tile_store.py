"""Whole-line output stores of the launched GEMM kernel (``backends.cuda.tile_store``), checked
without a GPU: which outputs take them, and, by running the kernel's own address lines for every
lane, that each sum of a warp's rows reaches its own output element exactly once, the ``__local``
writes of a store instruction in distinct banks and the reads in whole 16-byte chunks. Running
them needs an H100/H200: tests/test_tma_gpu.py (integers exact, random values bit for bit as the
per-fragment stores)."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from tests.test_tensorize import PADDED_CONV, VALID_CONV, plans
from tests.test_tma import MLP, MM, generated, launched_kernel, optimized

SHAPES = {"A": (512, 256), "B": (256, 512)}
# a wider output: the product is added to it (zeroed first), not finished by an epilogue
MM_WIDE = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N + 8] = +(A[m, k] * B[k, n]); }"


def c_eval(expr: str, env: dict) -> int:
    """A C integer expression of non-negative values, in Python."""
    expr = expr.replace("(long)", "").replace("(ulong)", "").replace("/", "//")
    return eval(expr, {}, dict(env))


def simulate(text: str) -> tuple[dict, list, list]:
    """Run warp 0's staged stores of its first tile for every lane: the output element (row, column
    of the tile) each sum's bytes reach, each ``__local`` write instruction's 32 addresses and each
    read instruction's 32 addresses."""
    body = text[text.index("const uint Ws_at"):]
    es = 2 if "cvt.rn." in body else 4
    smem: dict[int, tuple[int, int]] = {}  # byte -> (row, column) of the tile
    out: dict[tuple[int, int], list[int]] = {}
    writes, reads, sb, acc, place = [], [], None, None, None
    for line in body.splitlines():
        line = line.strip()
        if m := re.search(r"\{(c0_(\d+)_(\d+))\};", line):
            acc = (int(m[2]), int(m[3]))  # the pair's second element, at the store
        elif line.startswith("const uint sb = "):
            sb = line.removeprefix("const uint sb = ").rstrip(";")
        elif "st.shared" in line:
            j, e = acc
            at = re.search(r'"r"\((Ws_at .*)\) : "memory"', line)[1]
            addrs = []
            for lane in range(32):
                env = {"Ws_at": 0, "lg": lane // 4, "lt": lane % 4}
                env["sb"] = c_eval(sb, env)
                a = c_eval(at, env)
                addrs.append(a)
                row, col = (e // 2) * 8 + lane // 4, 8 * j + 2 * (lane % 4)
                smem[a], smem[a + es] = (row, col), (row, col + 1)
            writes.append(addrs)
        elif line.startswith("const int sr = "):  # a read's row and chunk, then the row's indexes
            place = [line.removeprefix("const int ").replace(",", ";").replace("/", "//")]
        elif line.startswith("const int ") and place is not None:
            place.append(line.removeprefix("const int ").replace("/", "//"))
        elif "ld.shared.v4" in line:
            at = re.search(r'"r"\((Ws_at .*)\) : "memory"', line)[1]
            origins = {o: 0 for o in re.findall(r"\b[mn]0_\w+", " ".join(place))}  # the first tile
            chunks = []
            for lane in range(32):
                env = {"lane": lane, "wy": 0, **origins}  # warp 0
                exec("\n".join(place), {}, env)
                chunks.append((c_eval(at, {**env, "Ws_at": 0}), env))
            reads.append([a for a, _ in chunks])
            place = None
        elif line.startswith("*(__global uint4*)"):
            off = re.search(r"\(__global uint4\*\)\(\w+ \+ (.*)\) = \(uint4\)", line)[1]
            for a, env in chunks:
                origins = {o: 0 for o in re.findall(r"\b[mn]0_\w+", off)}
                dst = c_eval(off, {**env, **origins})
                for b in range(16 // es):
                    out.setdefault(smem[a + b * es], []).append(dst + b)
    return out, writes, reads


@pytest.mark.parametrize("dtype,precision", [
    (np.float16, None), (ml_dtypes.bfloat16, None), (np.float32, "tf32"), (np.float32, "3xtf32")
])
def test_every_sum_reaches_its_element_once_through_conflict_free_local_memory(dtype, precision):
    p, cfg = optimized(MM, SHAPES, dtype, precision=precision)
    (k,) = [k for k in generated(p, cfg) if k.launch]
    assert "Ws_at" in k.text and "vstore_half" not in k.text
    out, writes, reads = simulate(k.text)
    tn = 128
    assert set(out) == {(r, c) for r in range(16) for c in range(tn)}  # warp 0: 16 rows, every column
    for (r, c), dsts in out.items():
        assert dsts == [r * 512 + c], (r, c, dsts)  # once, at its element of C
    es = 2 if dtype != np.float32 else 4
    for addrs in writes:  # one 4-byte (8-byte) store per lane: 32 (16 per half-warp) distinct banks
        per_phase = 32 if es == 2 else 16
        for ph in range(0, 32, per_phase):
            assert len({a // 4 % 32 for a in addrs[ph: ph + per_phase]}) == per_phase
    for addrs in reads:  # 16-byte reads: each quarter-warp reads 8 distinct chunks of 128 bytes
        assert all(a % 16 == 0 for a in addrs)
        for q in range(0, 32, 8):
            assert len({a // 16 % 8 for a in addrs[q: q + 8]}) == 8


def test_the_fused_epilogue_finishes_each_sum_into_the_staged_registers():
    shapes = {"X": (512, 256), "W": (256, 512), "Bias": (512,)}
    plan, k = launched_kernel(MLP, shapes)
    body = k.text[k.text.index("const uint Ws_at"):]
    assert body.count("vload_half(at_Bias") == plan.tn // 8 * 4  # the bias per sum, 4 per fragment
    assert "o0[0] = s_t3" in body and "vstore_half" not in body  # relu's result into the register
    out, *_ = simulate(k.text)
    assert all(dsts == [r * 512 + c] for (r, c), dsts in out.items())


def test_an_output_the_product_is_added_to_keeps_the_per_fragment_stores():
    p, cfg = optimized(MM_WIDE, SHAPES)
    (k,) = [k for k in generated(p, cfg) if k.launch]
    assert "Ws_at" not in k.text and "st.shared" not in k.text and "vstore_half_rte" in k.text


@pytest.mark.parametrize("src", [VALID_CONV, PADDED_CONV])
def test_a_convolution_on_opencls_kernel_stores_its_rows_through_the_k_steps_buffers(src):
    """The implicit GEMM's rows are (image, row, column) boxes of the tile: each row's offset
    comes from its own indexes, its 64 channels contiguous; the K steps' buffers hold the rows
    once every warp's products are done (one barrier)."""
    x = 18 if src is VALID_CONV else 16
    p, cfg = optimized(src, {"I": (2, x, x, 64), "F": (3, 3, 64, 64)})
    (plan,) = plans(p)
    (k,) = generated(p, cfg, launch_bytes=0)
    assert k.launch is None and "wgmma.mma_async" in k.text
    after = k.text[k.text.rindex("wgmma.wait_group"):]
    assert after.index("barrier(") < after.index("const uint Cs_at = As_at;") < after.index("Ws_at +")
    out, *_ = simulate(k.text)
    per = dict(plan.m)  # the tile's box of (image, row, column)
    for (r, c), dsts in out.items():
        img, row, col = r // (per["x"] * per["y"]), r // per["y"] % per["x"], r % per["y"]
        assert dsts == [((img * 16 + row) * 16 + col) * 64 + c], (r, c)
    assert len(out) == 16 * plan.tn
