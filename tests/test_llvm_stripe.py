"""The LLVM backend on hand-built Stripe (nested blocks, views, locals) and its threading rule.

Programs come from the Stripe interpreter's own tests (``tests/test_stripe_exec.py`` builders);
each runs on the device and must equal ``run_stripe`` exactly, and numpy where it has a closed
form. The threading tests check the rule of ``backends/llvm/schedule.py`` on kernels where
splitting the first index would race, and that split kernels really use several threads.
"""

from __future__ import annotations

import numpy as np
import pytest

from backends.llvm import LlvmCpuDevice
from backends.llvm.schedule import plan
from ref_interp.stripe_exec import run_stripe
from stripe.ir import Block, Constant, Dim, LoadIndex, RefDir, Refinement, Special, TensorShape
from tests.llvm_runner import (
    assert_same,
    buffer_names,
    execute,
    lowered,
    private_cache,  # noqa: F401  (autouse fixture)
)
from tests.test_stripe_exec import (
    F32,
    F64,
    I32,
    I64,
    U32,
    L,
    Prog,
    S,
    af,
    conv_program,
    conv_reference,
    idxs,
    kernel,
    matmul_kernel,
    op,
    ref,
    scalar_program,
    tiled_matmul,
)
from tile.dtypes import DType

RNG = np.random.default_rng(5)
FOUR = LlvmCpuDevice(threads=4)


def ints(shape, dtype=np.float32, lo=-4, hi=5):
    return RNG.integers(lo, hi, size=shape).astype(dtype)


def same(program: Block, inputs: dict | None = None, settings: dict | None = None, device=None) -> dict:
    """The device's outputs, after checking they equal the Stripe interpreter's exactly."""
    inputs = inputs or {}
    got, kernels = execute(program, inputs, settings, **({"device": device} if device else {}))
    assert_same(got, run_stripe(program, inputs))
    return got


# ------------------------------------------------------------------ nested blocks and views
@pytest.mark.parametrize("m", [8, 7])
def test_tiled_matmul_nested_blocks_with_offset_refinements(m):
    a, b = ints((m, 5)), ints((5, 6))
    np.testing.assert_array_equal(same(tiled_matmul(m, 6, 5), {"A": a, "B": b})["C"], a @ b)


def test_child_accesses_use_the_parent_view_strides():
    p = Prog(A=(I32, (2, 3), "input"), O=(I32, (3, 2), "output"))
    leaf_refs = (
        ref("AT", ["r", "c"], TensorShape.dense(I32, (1, 1))),
        ref("O", ["r", "c"], p.shapes["O"].scalar_view(), RefDir.OUT),
    )
    leaf = Block("leaf", idxs("r:3 c:2"), (), leaf_refs, (L("AT", "$v"), S("$v", "O")))
    view = Block(
        "view",
        (),
        (),
        (ref("AT", ["0", "0"], TensorShape(I32, (Dim(3, 1), Dim(2, 3))), from_="A"), p.whole("O")),
        (leaf,),
    )
    a = ints((2, 3), np.int32)
    np.testing.assert_array_equal(same(p.build(view), {"A": a})["O"], a.T)


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("agg", ["add", "mul", "max", "min", "assign", ""])
@pytest.mark.parametrize("dt", [I32, F32, DType.BOOL, DType.UINT8])
def test_every_agg_op_with_and_without_init(agg, nested, dt):
    x = ints((3, 4), dt.numpy, -3 if dt.is_signed else 0, 4)
    p = Prog(X=(dt, x.shape, "input"), O=(dt, (2,), "output"))
    body = (L("X", "$x"), S("$x", "O"))
    refs = (p.r("X", ["i", "j"]), p.r("O", ["0"], RefDir.OUT, agg))
    if nested:
        leaf = Block(
            "leaf",
            (),
            (),
            tuple(ref(r.into, ["0"] * len(r.access), r.shape, r.dir, r.agg_op) for r in refs),
            body,
        )
        body = (leaf,)
    init = Block(
        "init",
        refs=(p.whole("O"),),
        stmts=(Special(f"agg_init_{agg if agg in ('mul', 'max', 'min') else 'add'}", (), ("O",)),),
    )
    same(p.build(init, kernel("i:3 j:4", refs, body)), {"X": x})
    same(p.build(kernel("i:3 j:4", refs, body)), {"X": x})


def test_assign_last_writer_wins():
    p = Prog(O=(I64, (4,), "output"))
    body = [LoadIndex(af("10*i + j"), "$v"), S("$v", "O")]
    k = kernel("i:3 j:4", [p.r("O", ["j"], RefDir.OUT, "assign")], body)
    for settings in ({}, {"reorder": False}):
        got = same(p.build(k), settings=settings)
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
    outer = Block("outer", idxs("i:3"), (), outer_refs, (acc, put))
    a = np.array([1, 2, 5], np.int32)
    np.testing.assert_array_equal(same(p.build(outer), {"A": a})["O"], 4 * a)  # not a running sum


def test_specials_inside_a_nested_block_on_strided_views():
    # per row t: O[t] (a 3-vector view) = reshape of the transposed 3 x 1 view of A's column t
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


def test_padding_constraints_load_index_and_constants():
    i, k = ints((1, 5, 4, 2)), ints((3, 3, 2, 3))
    np.testing.assert_array_equal(same(conv_program(5, 4, 2, 3), {"I": i, "K": k})["O"], conv_reference(i, k))
    p = Prog(A=(F32, (3,), "input"), O=(F32, (3, 4), "output"))
    body = [
        L("A", "$a"),
        LoadIndex(af("3*i - j + 2"), "$x"),
        Constant("$h", 0.1, F32),
        Constant("$t", 3, I32),
        op("mul", ["$a", "$h"], "$ah", F32),
        op("mul", ["$x", "$t"], "$xt", I64),
        op("add", ["$ah", "$xt"], "$o", F32),
        S("$o", "O"),
    ]
    same(
        p.build(kernel("i:3 j:4", [p.r("A", ["i"]), p.r("O", ["i", "j"], RefDir.OUT)], body)), {"A": ints(3)}
    )


def test_float_constant_keeps_its_double_value():
    p = Prog(A=(F64, (2,), "input"), O=(F64, (2,), "output"))
    k = kernel(
        "i:2",
        [p.r("A", ["i"]), p.r("O", ["i"], RefDir.OUT)],
        [L("A", "$a"), Constant("$c", 0.1, F32), op("mul", ["$a", "$c"], "$o", F64), S("$o", "O")],
    )
    a = np.array([3.0, 7.0])
    np.testing.assert_array_equal(same(p.build(k), {"A": a})["O"], a * 0.1)  # not a * float32(0.1)


def test_mixed_signedness_comparisons_and_refinement_conversions():
    ins = {"A": np.array([-1], np.int32), "B": np.array([1], np.uint32)}
    gt = scalar_program(
        [op("cmp_gt", ["$B", "$A"], "$o", DType.BOOL), S("$o", "O")], {"A": I32, "B": U32}, DType.BOOL
    )
    assert not same(gt, ins)["O"][0]  # compared in uint32 (left wins)
    # a refinement typed int8 over a float32 buffer: loads and stores convert
    p = Prog(A=(F32, (4,), "input"), O=(F32, (4,), "output"))
    narrow = Refinement(RefDir.IN, "A", (af("i"),), TensorShape(DType.INT8, (Dim(1, 1),)))
    k = kernel("i:4", [narrow, p.r("O", ["i"], RefDir.OUT, "add")], [L("A", "$a"), S("$a", "O")])
    got = same(p.build(k), {"A": np.array([300.7, -2.7, 127.9, 1e9], np.float32)})
    np.testing.assert_array_equal(got["O"], np.array([44, -2, 127, 0], np.float32))


# -------------------------------------------------------------------------- threading rule
def offsets_kernel(p: Prog, spec: str, out_access: str) -> Block:
    return kernel(
        spec,
        [p.r("A", ["i"]), p.r("B", ["k"]), p.r("O", [out_access], RefDir.OUT, "add")],
        [L("A", "$a"), L("B", "$b"), op("mul", ["$a", "$b"], "$c", F32), S("$c", "O")],
    )


@pytest.mark.parametrize(
    "spec, access, owned",
    [
        ("i:64 k:2", "2*i + k", ("i", "k")),  # rows of 2: both owned, no two points share an element
        ("i:64 k:3", "2*i + k", ()),  # windows overlap: neither
        ("i:64 k:64", "i + k", ()),  # the classic race: O[i + k]
        ("k:64 i:64", "i", ("i",)),  # reduction index first: split over i, k stays in order inside
    ],
)
def test_owned_indexes(spec, access, owned):
    p = Prog(A=(F32, (64,), "input"), B=(F32, (64,), "input"), O=(F32, (200,), "output"))
    k = offsets_kernel(p, spec, access)
    s = plan(k, buffer_names(k), threads=4)
    assert s.owned == owned and s.split == bool(owned)
    if owned:
        assert s.order[0] == [ix.name for ix in k.idxs].index(owned[0])
    # random floats: any change in the order of one element's additions would show
    a, b = RNG.standard_normal(64).astype(np.float32), RNG.standard_normal(64).astype(np.float32)
    got, kernels = execute(p.build(k), {"A": a, "B": b}, {"min_parallel_points": 1}, device=FOUR)
    assert_same(got, run_stripe(p.build(k), {"A": a, "B": b}))
    assert len(set(kernels[0].last_threads)) == (4 if owned else 1)


def test_lowered_reduction_first_kernel_splits_over_the_output_index():
    src = "function (A[N, M]) -> (O) { O[j : M] = +(A[i, j]); }"
    a = RNG.standard_normal((3000, 8)).astype(np.float32)
    program = lowered(src, {"A": a})
    k = program.stmts[0].stmts[-1]
    assert [ix.name for ix in k.idxs] == ["i", "j"]
    assert plan(k, buffer_names(k), 4).owned == ("j",)
    assert not plan(k, buffer_names(k), 4, reorder=False).split  # Stripe's order: i first, not owned
    want = run_stripe(program, {"A": a})
    for settings in ({}, {"reorder": False}):
        got, kernels = execute(program, {"A": a}, settings, device=FOUR)
        assert_same(got, want)
        assert len(set(kernels[-1].last_threads)) == (4 if not settings else 1)


def test_kernels_run_on_several_threads_with_the_same_answer():
    m, n, kk = 64, 48, 96
    p = Prog(A=(F32, (m, kk), "input"), B=(F32, (kk, n), "input"), C=(F32, (m, n), "output"))
    program = p.build(matmul_kernel(p, m, n, kk))
    ins = {
        "A": RNG.standard_normal((m, kk)).astype(np.float32),
        "B": RNG.standard_normal((kk, n)).astype(np.float32),
    }
    parallel, kernels = execute(program, ins, device=FOUR)
    assert len(set(kernels[0].last_threads)) == 4
    assert kernels[0].ranges() == [(0, 16), (16, 32), (32, 48), (48, 64)]
    single, kernels = execute(program, ins, {"parallel": False}, device=FOUR)
    assert len(kernels[0].last_threads) == 1
    assert_same(parallel, single)
    assert_same(parallel, run_stripe(program, ins))
