"""The Stripe interpreter on hand-built programs (stripe.ir dataclasses built with
``tests/stripe_builders.py``, no parser).

Every expectation comes from numpy or plain Python over the definition in ``stripe/ir.py``'s
docstring, on integer-valued inputs so float results compare exactly.
"""

from __future__ import annotations

import time
from fractions import Fraction

import numpy as np
import pytest

from ref_interp import stripe_exec
from ref_interp.stripe_exec import run_stripe, stripe_input_names
from stripe.ir import Block, Constant, Dim, RefDir, Special, TensorShape
from tests.stripe_builders import (
    BOOL,
    F32,
    F64,
    I32,
    STRUCTURAL,
    U32,
    L,
    Prog,
    S,
    conv_program,
    conv_reference,
    kernel,
    matmul_program,
    op,
    reduce_program,
    ref,
    scalar_program,
)
from tile.dtypes import DType
from tile.errors import TileInputError, TileRuntimeError

RNG = np.random.default_rng(3)


def ints(shape, dtype=np.float32, lo=-4, hi=5):
    return RNG.integers(lo, hi, size=shape).astype(dtype)


def exact_equal(got, want):
    want = np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_array_equal(got, want)


# -------------------------------------------------------------------------- contractions
def test_elementwise_broadcasting_with_zero_accesses():
    p = Prog(A=(F32, (2, 3), "input"), B=(I32, (1, 3), "input"), C=(I32, (2, 1), "input"),
             O=(F32, (2, 3), "output"))
    k = kernel(
        "i:2 j:3",
        [p.r("A", ["i", "j"]), p.r("B", ["0", "j"]), p.r("C", ["i", "0"]), p.r("O", ["i", "j"], RefDir.OUT)],
        [L("A", "$a"), L("B", "$b"), L("C", "$c"), op("mul", ["$b", "$c"], "$m", I32),
         op("add", ["$a", "$m"], "$o", F32), S("$o", "O")],
    )
    a, b, c = ints((2, 3)), ints((1, 3), np.int32), ints((2, 1), np.int32)
    exact_equal(run_stripe(p.build(k), {"A": a, "B": b, "C": c})["O"], a + (b * c).astype(np.float32))


def test_matmul_contraction():
    a, b = ints((5, 7)), ints((7, 4))
    exact_equal(run_stripe(matmul_program(5, 4, 7), {"A": a, "B": b})["C"], a @ b)


def test_max_pooling_with_constraints_and_agg_init():
    n = 9  # O[x] = max(I[2x + k - 1] for k < 3 in range), 5 windows, the edges clipped by constraints
    p = Prog(I=(F32, (n,), "input"), O=(F32, (5,), "output"))
    init = Block("init", refs=(p.whole("O"),), stmts=(Special("agg_init_max", (), ("O",)),))
    pool = kernel(
        "x:5 k:3",
        [p.r("I", ["2*x + k - 1"]), p.r("O", ["x"], RefDir.OUT, "max")],
        [L("I", "$i"), S("$i", "O")],
        constraints=["2*x + k - 1", f"{n} - 2*x - k"],
    )
    x = ints((n,), lo=-9, hi=-1)  # all negative: a zero-initialised output would be wrong
    want = [max(x[2 * o + k - 1] for k in range(3) if 0 <= 2 * o + k - 1 < n) for o in range(5)]
    exact_equal(run_stripe(p.build(init, pool), {"I": x})["O"], np.array(want, np.float32))


def test_conv_1x32x32x16_is_fast():
    i, k = ints((1, 32, 32, 16)), ints((3, 3, 16, 16))
    start = time.perf_counter()
    got = run_stripe(conv_program(), {"I": i, "K": k})["O"]
    elapsed = time.perf_counter() - start
    exact_equal(got, conv_reference(i, k))
    assert elapsed < 6.0, f"the 2.4M-point conv took {elapsed:.2f}s"


def test_chunking_does_not_change_results(monkeypatch):
    monkeypatch.setattr(stripe_exec, "CHUNK", 7)
    a, b = ints((5, 7)), ints((7, 4))
    exact_equal(run_stripe(matmul_program(5, 4, 7), {"A": a, "B": b})["C"], a @ b)
    i, k = ints((1, 5, 4, 2)), ints((3, 3, 2, 3))
    exact_equal(run_stripe(conv_program(5, 4, 2, 3), {"I": i, "K": k})["O"], conv_reference(i, k))



# ------------------------------------------------------------------------------ agg ops
def reduce_all(agg: str, x: np.ndarray, dt=I32, nested=False, init=False, precision="native") -> np.ndarray:
    """O[0] <agg>= X[i, j] over a 3 x 4 box (``stripe_builders.reduce_program``)."""
    return run_stripe(reduce_program(agg, dt, x.shape, nested=nested, init=init), {"X": x}, precision)["O"]


@pytest.mark.parametrize("nested", [False, True])
def test_every_agg_op(nested):
    x = ints((3, 4), np.int32, 1, 4)
    assert reduce_all("add", x, nested=nested)[0] == x.sum()
    assert reduce_all("mul", x, nested=nested)[0] == 0  # 0 * anything
    assert reduce_all("mul", x, nested=nested, init=True)[0] == np.prod(x.astype(np.int64))  # fits in int32
    # max/min accumulate with the buffer's initial 0: negatives for max, positives for min
    assert reduce_all("max", -x, nested=nested)[0] == 0 and reduce_all("max", x, nested=nested)[0] == x.max()
    assert reduce_all("min", x, nested=nested)[0] == 0 and reduce_all("min", -x, nested=nested)[0] == -x.max()
    assert reduce_all("max", -x, nested=nested, init=True)[0] == -x.min()
    assert reduce_all("min", x, nested=nested, init=True)[0] == x.min()
    assert reduce_all("assign", x, nested=nested)[0] == x[2, 3]  # the last point in row-major order
    assert reduce_all("", x, nested=nested)[0] == x[2, 3]


def test_assign_last_writer_wins_across_chunks(monkeypatch):
    monkeypatch.setattr(stripe_exec, "CHUNK", 5)
    case = STRUCTURAL["assign_last_writer"](RNG)
    case.check(run_stripe(case.program))


def test_integer_add_wraps_and_max_propagates_nan():
    assert reduce_all("add", np.full((3, 4), 2**30, np.int32))[0] == 0  # 12 * 2**30 wraps to 0 mod 2**32
    x = np.ones((3, 4), np.float32)
    x[1, 2] = np.nan
    assert np.isnan(reduce_all("max", x, F32)[0])



def test_exact_aggregation_keeps_fractions_and_nan():
    x = ints((3, 4)) / np.float32(4)  # quarters: exact in float32
    for agg, want in (("max", x.max()), ("min", x.min()), ("add", x.astype(np.float64).sum())):
        got = reduce_all(agg, x, F32, init=True, precision="exact")
        assert isinstance(got[0], Fraction) and got[0] == Fraction(float(want)), agg
    x[2, 0] = np.nan
    assert np.isnan(float(reduce_all("max", x, F32, init=True, precision="exact")[0]))

# ------------------------------------------------------------------------------ specials
def one_special(name, ins: dict, out: tuple, int_params=(), strided=None) -> np.ndarray:
    """Run ``name`` on whole views of the given inputs into an output O of (dtype, sizes)."""
    bufs = {k: (DType.of(v.dtype), v.shape, "input") for k, v in ins.items()}
    p = Prog(**bufs, O=(out[0], out[1], "output"))
    refs = [strided or p.whole(k, RefDir.IN) for k in ins] + [p.whole("O")]
    blk = Block("special", refs=tuple(refs), stmts=(Special(name, tuple(ins), ("O",), tuple(int_params)),))
    return run_stripe(p.build(blk), ins)["O"]


def test_zero_and_agg_init_specials():
    x = ints((2, 3))
    p = Prog(X=(F32, (2, 3), "input output"))  # an inout buffer: zero overwrites the given values
    blk = Block("z", refs=(p.whole("X", RefDir.INOUT),), stmts=(Special("zero", (), ("X",)),))
    exact_equal(run_stripe(p.build(blk), {"X": x})["X"], np.zeros((2, 3), np.float32))
    for dt, (add, mul, mx, mn) in {
        F32: (0, 1, -np.inf, np.inf),
        I32: (0, 1, -(2**31), 2**31 - 1),
        U32: (0, 1, 0, 2**32 - 1),
        BOOL: (False, True, False, True),
    }.items():
        for agg, want in zip(("add", "mul", "max", "min"), (add, mul, mx, mn)):
            exact_equal(one_special(f"agg_init_{agg}", {}, (dt, (2,))), np.full(2, want, dt.numpy))


def test_copy_converts_and_follows_view_strides():
    a = ints((2, 3), np.int32)
    exact_equal(one_special("copy", {"A": a}, (F32, (2, 3))), a.astype(np.float32))
    transposed = ref("A", ["0", "0"], TensorShape(I32, (Dim(3, 1), Dim(2, 3))))  # a (3, 2) view of A
    exact_equal(one_special("copy", {"A": a}, (I32, (3, 2)), strided=transposed), a.T)


def test_reshape_shape_gather_scatter_specials():
    a = ints((2, 3), np.int32)
    exact_equal(one_special("reshape", {"A": a}, (I32, (3, 2))), a.reshape(3, 2))
    exact_equal(one_special("shape", {"A": a}, (I32, (2,))), np.array([2, 3], np.int32))
    d, i = ints((3, 2)), np.array([[2, -5], [9, 1]], np.int32)  # out-of-range indices clamp
    exact_equal(one_special("gather", {"D": d, "I": i}, (F32, (2, 2, 2))), d[np.clip(i, 0, 2)])
    v, j = ints((4, 2)), np.array([1, 0, 7, 1], np.int32)
    want = np.zeros((3, 2), np.float32)
    for row, at in zip(v, np.clip(j, 0, 2)):
        want[at] += row
    exact_equal(one_special("scatter", {"V": v, "J": j}, (F32, (3, 2))), want)
    like = np.zeros(3, np.int32)
    exact_equal(one_special("scatter", {"V": v, "J": j, "L": like}, (F32, (3, 2))), want)


@pytest.mark.parametrize("name", ["builtin_softmax", "builtin_logsoftmax"])
def test_softmax_specials(name):
    x = ints((2, 3)).astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    want = np.log(want) if name == "builtin_logsoftmax" else want
    got = one_special(name, {"X": x}, (F64, (2, 3)), int_params=(2, 3))
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


def test_unknown_special_and_bad_sizes_are_clear_errors():
    with pytest.raises(TileRuntimeError, match="special 'fft'.*not a special"):
        one_special("fft", {"A": ints((2,))}, (F32, (2,)))
    with pytest.raises(TileRuntimeError, match="special 'copy'.*sizes"):
        one_special("copy", {"A": ints((2,))}, (F32, (3,)))


# ------------------------------------------------------------------- scalars and values
def test_intrinsics_follow_tile_semantics():
    ins = {"A": np.array([-1], np.int32), "B": np.array([1], np.uint32)}
    gt = scalar_program([op("cmp_gt", ["$B", "$A"], "$o", BOOL), S("$o", "O")], {"A": I32, "B": U32}, BOOL)
    assert not run_stripe(gt, ins)["O"][0]  # compared in uint32 (left wins): 1 > 4294967295 is false
    lt = scalar_program([op("cmp_lt", ["$A", "$B"], "$o", BOOL), S("$o", "O")], {"A": I32, "B": U32}, BOOL)
    assert run_stripe(lt, ins)["O"][0]  # compared in int32: -1 < 1
    div = scalar_program([op("div", ["$A", "$B"], "$o", I32), S("$o", "O")], {"A": I32, "B": I32}, I32)
    assert run_stripe(div, {"A": np.array([-7], np.int32), "B": np.array([2], np.int32)})["O"][0] == -3
    assert run_stripe(div, {"A": np.array([5], np.int32), "B": np.array([0], np.int32)})["O"][0] == 0
    cond = scalar_program([op("cond", ["$A", "$B", "$C"], "$o", F32), S("$o", "O")],
                          {"A": F32, "B": F32, "C": F32}, F32)
    got = run_stripe(cond, {"A": np.array([-0.5], np.float32), "B": np.array([2.0], np.float32),
                            "C": np.array([3.0], np.float32)})["O"]
    assert got[0] == 2.0  # -0.5 is true
    cast = scalar_program([op("assign", ["$A"], "$o", DType.INT8), S("$o", "O")], {"A": F32}, DType.INT8)
    assert run_stripe(cast, {"A": np.array([300.7], np.float32)})["O"][0] == 44


def test_precision_modes():
    prog = scalar_program([op("div", ["$A", "$B"], "$o", F32), S("$o", "O")], {"A": F32, "B": F32}, F32)
    ins = {"A": np.array([1.0], np.float32), "B": np.array([3.0], np.float32)}
    exact = run_stripe(prog, ins, "exact")["O"]
    assert exact.dtype == object and isinstance(exact[0], Fraction) and exact[0] == Fraction(1, 3)
    assert run_stripe(prog, ins, "float64")["O"][0] == np.float64(1) / 3
    native = run_stripe(prog, ins)["O"]
    assert native.dtype == np.float32 and native[0] == np.float32(1) / np.float32(3)
    a, b = ints((5, 7)), ints((7, 4))
    got = run_stripe(matmul_program(5, 4, 7), {"A": a / 3, "B": b}, "exact")["C"]
    want = [[sum(Fraction(float(a[i, k] / np.float32(3))) * int(b[k, j]) for k in range(7)) for j in range(4)]
            for i in range(5)]
    assert got.dtype == object and (got == np.array(want, dtype=object)).all()


# --------------------------------------------------------------------------- structure
@pytest.mark.parametrize("name", STRUCTURAL)
def test_structural_case(name):
    """Views, nested blocks, local buffers, last writers, load_index and constants
    (``stripe_builders.STRUCTURAL``): the outputs equal their closed forms exactly."""
    case = STRUCTURAL[name](RNG)
    case.check(run_stripe(case.program, case.inputs))


def test_input_names_and_errors():
    prog = matmul_program(5, 4, 7)
    assert stripe_input_names(prog) == [("A", (5, 7), F32), ("B", (7, 4), F32)]
    a, b = ints((5, 7)), ints((7, 4))
    with pytest.raises(TileInputError, match=r"no array given for input 'B\[7, 4\]'"):
        run_stripe(prog, {"A": a})
    with pytest.raises(TileInputError, match=r"'A\[5, 7\]' was given an array of shape \(7, 5\)"):
        run_stripe(prog, {"A": a.T, "B": b})
    with pytest.raises(TileInputError, match="'Z', which is not an input"):
        run_stripe(prog, {"A": a, "B": b, "Z": a})
    exact_equal(run_stripe(prog, {"A": a.astype(np.int8), "B": b})["C"], a @ b)  # converted to fp32
    with pytest.raises(TileRuntimeError, match="index space has 140 points"):
        run_stripe(prog, {"A": a, "B": b}, max_points=100)


def test_malformed_programs_are_clear_errors():
    p = Prog(A=(F32, (4,), "input"), O=(F32, (4,), "output"))
    oob = kernel("i:4", [p.r("A", ["i + 1"]), p.r("O", ["i"], RefDir.OUT)], [L("A", "$a"), S("$a", "O")])
    with pytest.raises(TileRuntimeError, match=r"a load of refinement 'A' at \(i=3\) reaches element 4"):
        run_stripe(p.build(oob), {"A": ints((4,))})
    unset = kernel("i:4", [p.r("O", ["i"], RefDir.OUT)], [S("$a", "O")])
    with pytest.raises(TileRuntimeError, match="block 'kernel': uses scalar '\\$a' before"):
        run_stripe(p.build(unset), {"A": ints((4,))})
    bad = kernel("i:4", [p.r("O", ["i"], RefDir.OUT)], 
                 [Constant("$c", 1, F32), op("frob", ["$c"], "$o", F32)])
    with pytest.raises(TileRuntimeError, match="unknown intrinsic 'frob'"):
        run_stripe(p.build(bad), {"A": ints((4,))})
    structural = kernel("i:4", [p.r("A", ["i"])], [L("A", "$a"), op("gather", ["$a", "$a"], "$o", F32)])
    with pytest.raises(TileRuntimeError, match="unknown intrinsic 'gather'") as e:
        run_stripe(p.build(structural), {"A": ints((4,))})
    assert "Specials" in e.value.hint
    stray = kernel("i:4", [ref("Q", ["i"], p.shapes["O"].scalar_view(), RefDir.OUT)], [])
    with pytest.raises(TileRuntimeError, match="refines 'Q', which the enclosing block does not have"):
        run_stripe(p.build(stray), {"A": ints((4,))})
    unknown = kernel("i:4", [p.r("O", ["j"], RefDir.OUT)], [])
    with pytest.raises(TileRuntimeError, match="uses 'j', which is not an index here"):
        run_stripe(p.build(unknown), {"A": ints((4,))})
