"""The OpenCL backend on hand-built Stripe (nested blocks, views, locals) and its work-item rule.

Programs come from the Stripe interpreter's tests (``tests/test_stripe_exec.py`` builders, as in
``test_llvm_stripe.py``); each runs through the HAL on the OpenCL device and must equal
``run_stripe`` exactly, and numpy where it has a closed form. The work-item tests check that a kernel
is spread over exactly its owned indexes and that, on random floats, every element still receives
its writes in the interpreter's order.
"""

from __future__ import annotations

import numpy as np
import pytest

from backends.hal import KernelInfo
from ref_interp.stripe_exec import run_stripe
from stripe.ir import Block, Dim, LoadIndex, RefDir, Refinement, Special, TensorShape
from tests.llvm_runner import buffer_names
from tests.opencl_support import (
    assert_same,
    device,
    private_cache,  # noqa: F401  (autouse fixture)
    requires_opencl,
)
from tests.test_stripe_exec import F32, F64, I32, I64, L, Prog, S, af, idxs, kernel, op, ref, tiled_matmul
from tile.dtypes import DType

pytestmark = requires_opencl
RNG = np.random.default_rng(9)


def ints(shape, dtype=np.float32, lo=-4, hi=5):
    return RNG.integers(lo, hi, size=shape).astype(dtype)


def execute(program: Block, inputs: dict, settings: dict | None = None):
    """Run every ``#main`` kernel through the HAL; return (outputs by name, the library)."""
    dev = device()
    roots = frozenset(r.into for r in program.refs)
    infos = [KernelInfo(k.name, k, buffer_names(k, roots)) for k in program.stmts[0].stmts]
    settings = {"buffer_dtypes": {r.into: r.shape.dtype.value for r in program.refs}, **(settings or {})}
    library = dev.compiler.build(infos, settings)
    ex = dev.executor
    bufs, events = {}, []
    for r in program.refs:
        buf = ex.allocate(r.shape.elements * r.shape.dtype.numpy.itemsize)
        view = buf.map_discard()
        if r.into in inputs:
            arr = np.ascontiguousarray(np.asarray(inputs[r.into]).astype(r.shape.dtype.numpy))
            view[:] = arr.reshape(-1).view(np.uint8)
        events.append(buf.unmap(view))
        bufs[r.into] = buf
    for k, info in enumerate(infos):
        events = [ex.prepare(library, k).run([bufs[b] for b in info.buffers], events)]
    outs = {}
    for r in program.refs:
        if "output" in r.tags:
            raw = bufs[r.into].map_current(events)
            outs[r.into] = raw.view(r.shape.dtype.numpy)[: r.shape.elements].reshape(r.shape.sizes)
    return outs, library


def same(program: Block, inputs: dict | None = None) -> dict:
    got, _ = execute(program, inputs or {})
    assert_same(got, run_stripe(program, inputs or {}))
    return got


@pytest.mark.parametrize("m", [8, 7])
def test_tiled_matmul_nested_blocks_with_offset_refinements(m):
    a, b = ints((m, 5)), ints((5, 6))
    np.testing.assert_array_equal(same(tiled_matmul(m, 6, 5), {"A": a, "B": b})["C"], a @ b)


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("agg", ["add", "mul", "max", "min", "assign", ""])
def test_every_agg_op_in_a_kernel_and_a_nested_block(agg, nested):
    dt = [I32, F32, DType.BOOL, DType.UINT8][len(agg) % 4]
    x = ints((3, 4), dt.numpy, -3 if dt.is_signed else 0, 4)
    p = Prog(X=(dt, x.shape, "input"), O=(dt, (2,), "output"))
    body = (L("X", "$x"), S("$x", "O"))
    refs = (p.r("X", ["i", "j"]), p.r("O", ["0"], RefDir.OUT, agg))
    if nested:
        leaf_refs = tuple(ref(r.into, ["0"] * len(r.access), r.shape, r.dir, r.agg_op) for r in refs)
        body = (Block("leaf", (), (), leaf_refs, body),)
    init = Block(
        "init",
        refs=(p.whole("O"),),
        stmts=(Special(f"agg_init_{agg if agg in ('mul', 'max', 'min') else 'add'}", (), ("O",)),),
    )
    same(p.build(init, kernel("i:3 j:4", refs, body)), {"X": x})


def test_assign_last_writer_wins():
    p = Prog(O=(I64, (4,), "output"))
    body = [LoadIndex(af("10*i + j"), "$v"), S("$v", "O")]
    got = same(p.build(kernel("i:3 j:4", [p.r("O", ["j"], RefDir.OUT, "assign")], body)))
    np.testing.assert_array_equal(got["O"], np.array([20, 21, 22, 23], np.int64))


def test_local_allocation_is_fresh_per_point():
    p = Prog(A=(I32, (3,), "input"), O=(I32, (3,), "output"))
    t_shape = TensorShape.dense(I32, (1,))
    acc = Block(
        "acc",
        idxs("i=i k:4"),
        (),
        (ref("A", ["i"], p.shapes["A"].scalar_view()), ref("T", ["0"], t_shape, RefDir.OUT, "add")),
        (L("A", "$a"), S("$a", "T")),
    )
    put = Block(
        "put",
        idxs("i=i"),
        (),
        (ref("T", ["0"], t_shape), ref("O", ["i"], p.shapes["O"].scalar_view(), RefDir.OUT)),
        (L("T", "$t"), S("$t", "O")),
    )
    outer_refs = (
        p.r("A", ["0"], sizes=(3,)),
        p.r("O", ["0"], RefDir.OUT, sizes=(3,)),
        Refinement(RefDir.NONE, "T", (af(0),), t_shape),
    )
    a = np.array([1, 2, 5], np.int32)
    got = same(p.build(Block("outer", idxs("i:3"), (), outer_refs, (acc, put))), {"A": a})
    np.testing.assert_array_equal(got["O"], 4 * a)  # not a running sum


def test_specials_inside_a_nested_block_on_strided_views():
    p = Prog(A=(F64, (3, 4), "input"), O=(F64, (4, 3), "output"))
    inner = Block(
        "inner",
        idxs("t=t"),
        (),
        (
            ref("col", ["0", "t"], TensorShape(F64, (Dim(3, 4), Dim(1, 1))), from_="A"),
            ref("row", ["t", "0"], TensorShape(F64, (Dim(3, 1),)), RefDir.OUT, from_="O"),
        ),
        (Special("reshape", ("col",), ("row",)),),
    )
    outer = Block("outer", idxs("t:4"), (), (p.whole("A", RefDir.IN), p.whole("O")), (inner,))
    a = ints((3, 4), np.float64)
    np.testing.assert_array_equal(same(p.build(outer), {"A": a})["O"], a.T)


def test_refinement_conversions():
    # a refinement typed int8 over a float32 buffer: loads and stores convert
    p = Prog(A=(F32, (4,), "input"), O=(F32, (4,), "output"))
    narrow = Refinement(RefDir.IN, "A", (af("i"),), TensorShape(DType.INT8, (Dim(1, 1),)))
    k = kernel("i:4", [narrow, p.r("O", ["i"], RefDir.OUT, "add")], [L("A", "$a"), S("$a", "O")])
    got = same(p.build(k), {"A": np.array([300.7, -2.7, 127.9, 1e9], np.float32)})
    np.testing.assert_array_equal(got["O"], np.array([44, -2, 127, 0], np.float32))


@pytest.mark.parametrize(
    "spec, access, owned, work",
    [
        ("i:64 k:2", "2*i + k", ("i", "k"), 128),  # rows of 2: both owned
        ("i:64 k:3", "2*i + k", (), 1),  # windows overlap: neither, one work-item
        ("i:64 k:64", "i + k", (), 1),  # the classic race: O[i + k]
        ("k:64 i:64", "i", ("i",), 64),  # reduction index first: k stays in order inside
    ],
)
def test_work_items_are_the_owned_indexes(spec, access, owned, work):
    p = Prog(A=(F32, (64,), "input"), B=(F32, (64,), "input"), O=(F32, (200,), "output"))
    k = kernel(
        spec,
        [p.r("A", ["i"]), p.r("B", ["k"]), p.r("O", [access], RefDir.OUT, "add")],
        [L("A", "$a"), L("B", "$b"), op("mul", ["$a", "$b"], "$c", F32), S("$c", "O")],
    )
    # random floats: any change in the order of one element's additions would show
    ins = {"A": RNG.standard_normal(64).astype(np.float32), "B": RNG.standard_normal(64).astype(np.float32)}
    got, library = execute(p.build(k), ins, {"local_size": 16})
    assert library.extra["owned"] == [owned] and library.extra["work_items"] == [work]
    assert_same(got, run_stripe(p.build(k), ins))
