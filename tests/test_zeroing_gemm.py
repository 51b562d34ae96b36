"""``backends.zeroing`` on GPU GEMM nests: opencl_gpu's ``gemm_outputs`` (``self_init`` with
``gemms``) makes each GEMM one tiled kernel that stores every output element once, and where the
sizes do not divide by the tiles its nest clips the edge tiles with constraints. Such a nest needs
no fill of the runner's own; a constraint that cuts off real elements, or a store that aggregates,
still does. Each claim is checked against a point-by-point enumeration of the nest (``stores``),
which shares nothing with the module's algebra, and end to end on an OpenCL device (two calls)."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

import tile
from backends.driver import compile_bound, optimized
from backends.zeroing import needs_zero
from stripe.config import target_config
from stripe.ir import Block, Store
from stripe.parser import parse_stripe
from stripe.printer import format_block
from stripe.verify import verify
from tests.opencl_support import DEVICE_ID, device, requires_opencl
from tests.pass_support import lowered
from tile.affine import Affine
from tile.bind import bind
from tile.inputs import input_types

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n: M, N] = +(A[m, k] * B[k, n]); }"
BATCHED = "function (A[B, M, K], D[B, K, N]) -> (C) { C[b, m, n: B, M, N] = +(A[b, m, k] * D[b, k, n]); }"
VALID = """function (I[N, X, Y, CI], F[KX, KY, CI, CO]) -> (C) {
  C[n, x, y, co : N, X - 2, Y - 2, CO] = +(I[n, x + i, y + j, ci] * F[i, j, ci, co]);
}"""
PADDED = """function (I[N, X, Y, CI], F[KX, KY, CI, CO]) -> (C) {
  C[n, x, y, co : N, X, Y, CO] = +(I[n, x + i - 1, y + j - 1, ci] * F[i, j, ci, co]);
}"""


def gpu(src: str, shapes: dict, dtype=np.float32) -> Block:
    """``src`` through opencl_gpu's pipeline (its config's own sizes; no device needed)."""
    return optimized(lowered(src, shapes, dtype), target_config("opencl_gpu"))


def inputs(program: Block) -> set[str]:
    return {r.into for r in program.refs if "input" in r.tags}


def clipped(program: Block, name: str = "C") -> bool:
    """Whether the block that stores ``name`` carries constraints somewhere on its way (edge tiles)."""
    (kernel,) = [k for k in program.stmts[0].stmts if any(r.source == name for r in k.refs)]
    store = kernel.stmts[-1]
    return any(b.constraints for b in _blocks(store))


def _blocks(block: Block):
    yield block
    for s in block.stmts:
        if isinstance(s, Block):
            yield from _blocks(s)


def stores(program: Block, name: str = "C") -> tuple[Counter, int]:
    """How many times the first kernel naming ``name`` stores each element (an index tuple), by
    running its nest point by point, and how many stores fall outside the buffer."""
    shape = program.ref(name).shape
    sizes, strides = shape.sizes, tuple(d.stride for d in shape.dims)
    kernel = next(k for k in program.stmts[0].stmts if any(r.source == name for r in k.refs))
    seen: Counter = Counter()
    outside = [0]

    def visit(block: Block, parent: str, env: dict, base: tuple[int, ...]) -> None:
        (ref,) = [r for r in block.refs if r.source == parent]
        assert tuple(d.stride for d in ref.shape.dims) == strides
        starts = [int(ix.affine.evaluate(env)) if ix.affine is not None else 0 for ix in block.idxs]
        for point in itertools.product(*(range(s, s + ix.range) for s, ix in zip(starts, block.idxs))):
            vals = {ix.name: v for ix, v in zip(block.idxs, point)}
            if any(c.evaluate(vals) < 0 for c in block.constraints):
                continue
            at = tuple(b + int(a.evaluate(vals)) for b, a in zip(base, ref.access))
            for s in block.stmts:
                if isinstance(s, Store) and s.into == ref.into:
                    if all(0 <= i < n for i, n in zip(at, sizes)):
                        seen[at] += 1
                    else:
                        outside[0] += 1
                elif isinstance(s, Block) and any(r.source == ref.into for r in s.refs):
                    visit(s, ref.into, vals, at)

    visit(kernel, name, {}, (0,) * len(sizes))
    return seen, outside[0]


def assert_each_element_once(program: Block, name: str = "C") -> None:
    seen, outside = stores(program, name)
    shape = program.ref(name).shape.sizes
    assert outside == 0 and len(seen) == int(np.prod(shape)) and set(seen.values()) == {1}


SMALL = [
    ("matmul fp32", MATMUL, {"A": (100, 37), "B": (37, 70)}, np.float32),
    ("matmul fp16", MATMUL, {"A": (100, 48), "B": (48, 70)}, np.float16),
    ("batched", BATCHED, {"A": (3, 50, 20), "D": (3, 20, 30)}, np.float32),
    ("conv valid fp16", VALID, {"I": (2, 13, 11, 16), "F": (3, 3, 16, 24)}, np.float16),
    ("conv padded fp16", PADDED, {"I": (2, 13, 11, 16), "F": (3, 3, 16, 24)}, np.float16),
]


@pytest.mark.parametrize("name, src, shapes, dtype", SMALL, ids=[c[0] for c in SMALL])
def test_edge_tiles_store_every_element_once(name, src, shapes, dtype):
    """Small GEMMs whose sizes leave edge tiles: the nest is clipped, ``needs_zero`` proves it
    covers its output, and the enumeration agrees (each element once, none outside)."""
    program = gpu(src, shapes, dtype)
    assert len(program.stmts[0].stmts) == 1  # one kernel: no fill kernel either
    assert clipped(program), format_block(program)
    assert needs_zero(program, inputs(program)) == set()
    assert_each_element_once(program)


LARGE = [
    ("matmul 1024 fp32", MATMUL, {"A": (1024, 1024), "B": (1024, 1024)}, np.float32, False),
    ("matmul 1024 fp16", MATMUL, {"A": (1024, 1024), "B": (1024, 1024)}, np.float16, False),
    ("matmul 1000 fp32", MATMUL, {"A": (1000, 1000), "B": (1000, 1000)}, np.float32, True),
    ("matmul 1000 fp16", MATMUL, {"A": (1000, 1000), "B": (1000, 1000)}, np.float16, True),
    ("matmul 4097 fp32", MATMUL, {"A": (4097, 4097), "B": (4097, 4097)}, np.float32, True),
    ("matmul 4097 fp16", MATMUL, {"A": (4097, 4097), "B": (4097, 4097)}, np.float16, True),
    ("batched 8x1000 fp32", BATCHED, {"A": (8, 1000, 1000), "D": (8, 1000, 1000)}, np.float32, True),
    ("batched 8x512 fp16", BATCHED, {"A": (8, 512, 512), "D": (8, 512, 512)}, np.float16, False),
    ("conv 3x3 valid fp16", VALID, {"I": (32, 56, 56, 64), "F": (3, 3, 64, 64)}, np.float16, None),
    ("conv 3x3 padded fp16", PADDED, {"I": (32, 56, 56, 64), "F": (3, 3, 64, 64)}, np.float16, None),
]


@pytest.mark.parametrize("name, src, shapes, dtype, edges", LARGE, ids=[c[0] for c in LARGE])
def test_gpu_gemms_need_no_fill(name, src, shapes, dtype, edges):
    """The sizes the brief names, on opencl_gpu's own sizes: with or without edge tiles (``edges``:
    whether the store nest is clipped; None where the tiles chosen decide it), no fill of C.
    Before clipped nests were proven, the five with edges zeroed C on every call."""
    program = gpu(src, shapes, dtype)
    assert len(program.stmts[0].stmts) == 1
    if edges is not None:
        assert clipped(program) == edges
    assert needs_zero(program, inputs(program)) == set()


def edit_store(program: Block, edit) -> Block:
    """``program`` (one kernel) with ``edit`` applied to each block of its store nest (the kernel's
    last statement: the fused epilogue that assigns C)."""
    main = program.stmts[0]
    (kernel,) = main.stmts

    def visit(b: Block) -> Block:
        b = edit(b)
        return replace(b, stmts=tuple(visit(s) if isinstance(s, Block) else s for s in b.stmts))

    kernel = replace(kernel, stmts=(*kernel.stmts[:-1], visit(kernel.stmts[-1])))
    return replace(program, stmts=(replace(main, stmts=(kernel,)),))


def _rows(edit_clip):
    """An edit of the clip on C's rows (``-64*m_o - m_q - 4*m_t_o + 99 >= 0``, M = 100)."""
    def edit(b: Block) -> Block:
        cs = []
        for c in b.constraints:
            cs.extend(edit_clip(c) if c.const == 99 else [c])
        return replace(b, constraints=tuple(cs))
    return edit


def _columns_clip(b: Block) -> Affine | None:
    return next((c for c in b.constraints if c.const == 69), None)


NEGATIVE = {
    # a GEMM nest restricted to half the output's rows
    "half the rows": _rows(lambda c: [Affine(c.terms, c.const - 50)]),
    "one row short": _rows(lambda c: [Affine(c.terms, c.const - 1)]),
    # stores outside the buffer (``verify`` refuses these three; needs_zero must not rely on it)
    "one row past": _rows(lambda c: [Affine(c.terms, c.const + 1)]),
    "no row clip": _rows(lambda c: []),
    # the row and column clips added into one: a row past the end passes where columns are short
    "rows plus columns": lambda b: replace(b, constraints=(b.constraints[0] + b.constraints[1],))
    if _columns_clip(b) is not None else b,
    # a store that aggregates into what C held
    "aggregating store": lambda b: replace(
        b, refs=tuple(replace(r, agg_op="add") if r.source == "C" else r for r in b.refs)
    ),
}


@pytest.mark.parametrize("case", NEGATIVE)
def test_what_still_needs_the_fill(case):
    """Changed store nests of a 100x37x70 matmul: each misses elements, stores outside C, or
    reads C, and keeps its fill (the enumeration shows what each gets wrong)."""
    program = gpu(MATMUL, {"A": (100, 37), "B": (37, 70)})
    assert needs_zero(program, {"A", "B"}) == set()
    changed = edit_store(program, NEGATIVE[case])
    assert changed != program
    assert needs_zero(changed, {"A", "B"}) == {"C"}
    seen, outside = stores(changed)
    if outside == 0:
        verify(changed)
    if case != "aggregating store":
        assert outside > 0 or len(seen) < 100 * 70


POSITIVE = {
    # a clip scaled by 2 keeps the same points
    "scaled clip": _rows(lambda c: [c * 2]),
    # one that holds at every point (``m_q >= 0``) cuts off nothing
    "always true": lambda b: replace(b, constraints=(*b.constraints, Affine.var("m_q")))
    if "m_q" in {ix.name for ix in b.idxs} else b,
    # both clips written twice
    "repeated clips": lambda b: replace(b, constraints=b.constraints * 2),
}


@pytest.mark.parametrize("case", POSITIVE)
def test_equivalent_clips_need_no_fill(case):
    program = edit_store(gpu(MATMUL, {"A": (100, 37), "B": (37, 70)}), POSITIVE[case])
    verify(program)
    assert needs_zero(program, {"A", "B"}) == set()
    assert_each_element_once(program)


E2E = [
    ("matmul", MATMUL, {"A": (100, 37), "B": (37, 70)},
     lambda x: x["A"] @ x["B"]),
    ("batched", BATCHED, {"A": (3, 50, 20), "D": (3, 20, 30)},
     lambda x: np.einsum("bmk,bkn->bmn", x["A"], x["D"])),
    ("conv padded", PADDED, {"I": (2, 13, 11, 8), "F": (3, 3, 8, 12)},
     lambda x: _conv(np.pad(x["I"], ((0, 0), (1, 1), (1, 1), (0, 0))), x["F"])),
]


def _conv(i: np.ndarray, f: np.ndarray) -> np.ndarray:
    kx, ky = f.shape[:2]
    x, y = i.shape[1] - kx + 1, i.shape[2] - ky + 1
    return sum(np.einsum("nxyc,cd->nxyd", i[:, a:a + x, b:b + y], f[a, b])
               for a in range(kx) for b in range(ky))


@requires_opencl
@pytest.mark.parametrize("name, src, shapes, want", E2E, ids=[c[0] for c in E2E])
def test_two_calls_on_an_opencl_device(name, src, shapes, want):
    """opencl_cpu's pipeline (opencl_gpu's passes; PoCL runs it) tiles these with edge tiles: no
    fill of C, and a second call with other inputs leaves nothing of the first (exact: integers)."""
    rng = np.random.default_rng(7)
    first = {k: rng.integers(-3, 4, v).astype(np.float32) for k, v in shapes.items()}
    prog = tile.parse(src)
    cp = compile_bound(bind(prog, input_types(prog, first)), device(), {"cache": False})
    (out,) = [r.into for r in cp.program.refs if "output" in r.tags]
    if DEVICE_ID == "opencl_cpu.0":
        assert clipped(cp.program, out) and cp.zeroed == set()
    np.testing.assert_array_equal(cp(first)[out], want(first))
    second = {k: rng.integers(-5, 2, v).astype(np.float32) for k, v in shapes.items()}
    np.testing.assert_array_equal(cp(second)[out], want(second))
    np.testing.assert_array_equal(cp(first)[out], want(first))


TILED = """0: #program block [] (
    #input #user none A[0, 0] fp32(10:6, 6:1)
    #output #user none C[0, 0] fp32(10:6, 6:1)
) {
  0: #main block [] (
      in A[0, 0] fp32(10:6, 6:1)
      out C[0, 0] fp32(10:6, 6:1)
  ) {
    0: #kernel block [m:3, n:2] (
        in A[4*m, 4*n] fp32(10:6, 6:1)
        out C[4*m, 4*n] fp32(10:6, 6:1)
    ) {
      0: block [m_q:4, n_q:4, m_o:1 = m, n_o:1 = n] (
          -4*m_o - m_q + %d >= 0
          -4*n_o - n_q + 5 >= 0
          in A[m_q, n_q] fp32(1:6, 1:1)
          out C[m_q, n_q]:%s fp32(1:6, 1:1)
      ) {
        0: $A = load(A)
        1: C = store($A)
      }
    }
  }
}"""


@pytest.mark.parametrize(
    "last_row, agg, zeroed",
    [
        (9, "assign", False),  # 4x4 tiles over 10x6, the edge tiles clipped to the buffer
        (8, "assign", True),  # the last row cut off
        (4, "assign", True),  # half the rows
        (9, "add", True),  # aggregates into what C held
    ],
)
def test_a_hand_written_clipped_nest(last_row, agg, zeroed):
    """The shape of tile_gemms' epilogue in a few lines (outer tiles, inner points reached through
    index affines ``m_o:1 = m``, one clip per dimension), independent of the pipeline's choices."""
    program = parse_stripe(TILED % (last_row, agg))
    verify(program)
    assert needs_zero(program, {"A"}) == ({"C"} if zeroed else set())
    seen, outside = stores(program)
    assert outside == 0 and (len(seen) == 60) == (last_row == 9)


@requires_opencl
def test_a_triangular_gemm_keeps_its_fill_on_an_opencl_device():
    """``i + j < N`` mixes the output's dimensions: the elements it drops are never stored, so C is
    zeroed before every call, and the second call's lower triangle is zero again (exact)."""
    src = "function (A[N, N]) -> (C) { C[i, j: N, N] = +(A[i, k] * A[k, j]), i + j < N; }"
    rng = np.random.default_rng(8)
    first, second = (rng.integers(lo, hi, (20, 20)).astype(np.float32) for lo, hi in ((-3, 4), (-5, 2)))
    prog = tile.parse(src)
    cp = compile_bound(bind(prog, input_types(prog, {"A": first})), device(), {"cache": False})
    assert needs_zero(cp.program, {"A"}) == {"C"}
    keep = np.add.outer(np.arange(20), np.arange(20)) < 20
    for a in (first, second, first):
        np.testing.assert_array_equal(cp({"A": a})["C"], np.where(keep, a @ a, 0))
