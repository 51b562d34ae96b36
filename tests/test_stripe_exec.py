"""The Stripe interpreter on hand-built programs (stripe.ir dataclasses, no parser).

Every expectation comes from numpy or plain Python over the definition in ``stripe/ir.py``'s
docstring, on integer-valued inputs so float results compare exactly.
"""

from __future__ import annotations

import re
import time
from fractions import Fraction

import numpy as np
import pytest

from ref_interp import stripe_exec
from ref_interp.stripe_exec import run_stripe, stripe_input_names
from stripe.ir import (
    Block,
    Constant,
    Dim,
    Index,
    Intrinsic,
    Load,
    LoadIndex,
    RefDir,
    Refinement,
    Special,
    Store,
    TensorShape,
)
from tile.affine import Affine
from tile.dtypes import DType
from tile.errors import TileInputError, TileRuntimeError

F32, F64, I32, I64 = DType.FLOAT32, DType.FLOAT64, DType.INT32, DType.INT64
U32, BOOL = DType.UINT32, DType.BOOL
RNG = np.random.default_rng(3)


# ------------------------------------------------------------------------------- builders
def af(text: str | int) -> Affine:
    """``"2*i + k - 1"`` as an Affine."""
    coeffs: dict[str, int] = {}
    const = 0
    for sign, term in re.findall(r"([+-]?)([^+-]+)", str(text).replace(" ", "")):
        s = -1 if sign == "-" else 1
        if "*" in term:
            c, v = term.split("*")
            coeffs[v] = coeffs.get(v, 0) + s * int(c)
        elif term.isdigit():
            const += s * int(term)
        else:
            coeffs[term] = coeffs.get(term, 0) + s
    return Affine.build(coeffs, const)


def idxs(spec: str) -> tuple[Index, ...]:
    """``"i:2 j:3 x=i"``: ranges, or range-1 passthroughs of a parent index affine."""
    out = []
    for part in spec.split():
        name, sep, rest = part.partition(":")
        if sep:
            out.append(Index(name, int(rest)))
        else:
            name, _, aff = part.partition("=")
            out.append(Index(name, 1, af(aff)))
    return tuple(out)


def ref(name, access, shape: TensorShape, dir=RefDir.IN, agg="", from_=None) -> Refinement:
    return Refinement(dir, name, tuple(af(a) for a in access), shape, from_=from_, agg_op=agg)


def L(r, s):
    return Load(r, s)


def S(s, r):
    return Store(s, r)


def op(name, ins, out, dt, params=()):
    return Intrinsic(name, tuple(ins), (out,), dt, params)


class Prog:
    """A program: buffers (root refinements), a main block refining them whole, and kernels."""

    def __init__(self, **bufs: tuple):
        self.shapes = {}
        self.tags = {}
        for name, (dt, sizes, tag) in bufs.items():
            self.shapes[name] = TensorShape.dense(dt, tuple(sizes))
            self.tags[name] = tag

    def r(self, name, access, dir=RefDir.IN, agg="", sizes=None) -> Refinement:
        """A kernel's refinement of buffer ``name``: a scalar view, or ``sizes`` with the buffer's strides."""
        full = self.shapes[name]
        dims = tuple(Dim(1 if sizes is None else s, d.stride) for s, d in zip(sizes or full.sizes, full.dims))
        return ref(name, access, TensorShape(full.dtype, dims), dir, agg)

    def whole(self, name, dir=RefDir.OUT) -> Refinement:
        return ref(name, [0] * len(self.shapes[name].dims), self.shapes[name], dir)

    def build(self, *kernels: Block) -> Block:
        dirs = {"input": RefDir.IN, "output": RefDir.OUT, "tmp": RefDir.INOUT}
        roots, mains = [], []
        for name, shape in self.shapes.items():
            tags = self.tags[name].split()
            zero = tuple(Affine() for _ in shape.dims)
            roots.append(Refinement(RefDir.NONE, name, zero, shape, tags=frozenset(["user", *tags])))
            d = RefDir.INOUT if len(tags) > 1 else dirs[tags[0]]
            mains.append(Refinement(d, name, zero, shape))
        main = Block("main", refs=tuple(mains), stmts=kernels, tags=frozenset({"main"}))
        return Block("program", refs=tuple(roots), stmts=(main,), tags=frozenset({"program"}))


def kernel(spec, refs, stmts, constraints=(), name="kernel") -> Block:
    return Block(name, idxs(spec), tuple(af(c) for c in constraints), tuple(refs), tuple(stmts))


def ints(shape, dtype=np.float32, lo=-4, hi=5):
    return RNG.integers(lo, hi, size=shape).astype(dtype)


def exact_equal(got, want):
    want = np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_array_equal(got, want)


def matmul_kernel(p: Prog, m, n, k) -> Block:
    return kernel(
        f"i:{m} j:{n} k:{k}",
        [p.r("A", ["i", "k"]), p.r("B", ["k", "j"]), p.r("C", ["i", "j"], RefDir.OUT, "add")],
        [L("A", "$a"), L("B", "$b"), op("mul", ["$a", "$b"], "$c", F32), S("$c", "C")],
    )


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
    p = Prog(A=(F32, (5, 7), "input"), B=(F32, (7, 4), "input"), C=(F32, (5, 4), "output"))
    a, b = ints((5, 7)), ints((7, 4))
    exact_equal(run_stripe(p.build(matmul_kernel(p, 5, 4, 7)), {"A": a, "B": b})["C"], a @ b)


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


def conv_program(h=32, w=32, ci=16, co=16) -> Block:
    p = Prog(I=(F32, (1, h, w, ci), "input"), K=(F32, (3, 3, ci, co), "input"),
             O=(F32, (1, h, w, co), "output"))
    return p.build(
        kernel(
            f"n:1 x:{h} y:{w} c:{co} kx:3 ky:3 d:{ci}",
            [p.r("I", ["n", "x + kx - 1", "y + ky - 1", "d"]), p.r("K", ["kx", "ky", "d", "c"]),
             p.r("O", ["n", "x", "y", "c"], RefDir.OUT, "add")],
            [L("I", "$i"), L("K", "$k"), op("mul", ["$i", "$k"], "$p", F32), S("$p", "O")],
            constraints=["x + kx - 1", f"{h} - x - kx", "y + ky - 1", f"{w} - y - ky"],
        )
    )


def conv_reference(i, k):
    pad = np.pad(i.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    h, w = i.shape[1:3]
    out = sum(np.einsum("nxyd,dc->nxyc", pad[:, a : a + h, b : b + w], k[a, b])
              for a in range(3) for b in range(3))
    return out.astype(np.float32)


def test_conv_with_padding_constraints_small():
    i, k = ints((1, 5, 4, 2)), ints((3, 3, 2, 3))
    exact_equal(run_stripe(conv_program(5, 4, 2, 3), {"I": i, "K": k})["O"], conv_reference(i, k))


def test_conv_1x32x32x16_is_fast():
    i, k = ints((1, 32, 32, 16)), ints((3, 3, 16, 16))
    start = time.perf_counter()
    got = run_stripe(conv_program(), {"I": i, "K": k})["O"]
    elapsed = time.perf_counter() - start
    exact_equal(got, conv_reference(i, k))
    assert elapsed < 6.0, f"the 2.4M-point conv took {elapsed:.2f}s"


def tiled_matmul(m, n, kk, tile=4) -> Block:
    """Outer block over row tiles (views A[4*t, 0] of 4 x K), inner block over the tile."""
    p = Prog(A=(F32, (m, kk), "input"), B=(F32, (kk, n), "input"), C=(F32, (m, n), "output"))
    tiles = -(-m // tile)
    inner = Block(
        "inner",
        idxs(f"t=t ii:{tile} j:{n} k:{kk}"),
        (af(f"{m - 1} - {tile}*t - ii"),),  # the last tile may be partial
        (ref("A", ["ii", "k"], TensorShape(F32, (Dim(1, kk), Dim(1, 1)))),
         ref("B", ["k", "j"], p.shapes["B"].scalar_view()),
         ref("C", ["ii", "j"], TensorShape(F32, (Dim(1, n), Dim(1, 1))), RefDir.OUT, "add")),
        (L("A", "$a"), L("B", "$b"), op("mul", ["$a", "$b"], "$c", F32), S("$c", "C")),
    )
    outer = Block(
        "outer",
        idxs(f"t:{tiles}"),
        (),
        (p.r("A", [f"{tile}*t", "0"], sizes=(tile, kk)), p.r("B", ["0", "0"], sizes=(kk, n)),
         p.r("C", [f"{tile}*t", "0"], RefDir.OUT, "add", sizes=(tile, n))),
        (inner,),
    )
    return p.build(outer)


@pytest.mark.parametrize("m", [8, 7])
def test_tiled_matmul_nested_blocks_with_offset_refinements(m):
    a, b = ints((m, 5)), ints((5, 6))
    exact_equal(run_stripe(tiled_matmul(m, 6, 5), {"A": a, "B": b})["C"], a @ b)


def test_chunking_does_not_change_results(monkeypatch):
    monkeypatch.setattr(stripe_exec, "CHUNK", 7)
    a, b = ints((5, 7)), ints((7, 4))
    p = Prog(A=(F32, (5, 7), "input"), B=(F32, (7, 4), "input"), C=(F32, (5, 4), "output"))
    exact_equal(run_stripe(p.build(matmul_kernel(p, 5, 4, 7)), {"A": a, "B": b})["C"], a @ b)
    i, k = ints((1, 5, 4, 2)), ints((3, 3, 2, 3))
    exact_equal(run_stripe(conv_program(5, 4, 2, 3), {"I": i, "K": k})["O"], conv_reference(i, k))



def test_child_accesses_use_the_parent_view_strides():
    """A block views A (2 x 3) transposed (sizes 3 x 2, strides 1 and 3); its child's access AT[r, c]
    moves by those strides, whatever dims the child declares for its own (scalar) view."""
    p = Prog(A=(I32, (2, 3), "input"), O=(I32, (3, 2), "output"))
    leaf_refs = (ref("AT", ["r", "c"], TensorShape.dense(I32, (1, 1))),
                 ref("O", ["r", "c"], p.shapes["O"].scalar_view(), RefDir.OUT))
    leaf = Block("leaf", idxs("r:3 c:2"), (), leaf_refs, (L("AT", "$v"), S("$v", "O")))
    view = Block("view", (), (), (ref("AT", ["0", "0"], TensorShape(I32, (Dim(3, 1), Dim(2, 3))), from_="A"),
                                  p.whole("O")), (leaf,))
    a = ints((2, 3), np.int32)
    exact_equal(run_stripe(p.build(view), {"A": a})["O"], a.T)

# ------------------------------------------------------------------------------ agg ops
def reduce_all(agg: str, x: np.ndarray, dt=I32, nested=False, init=False, precision="native") -> np.ndarray:
    """O[0] <agg>= X[i, j] over a 3 x 4 box, as one vectorized block or one point per block;
    O starts at 0, or at the aggregation's identity with ``init``."""
    p = Prog(X=(dt, x.shape, "input"), O=(dt, (1,), "output"))
    init_o = Block("init", refs=(p.whole("O"),), stmts=(Special(f"agg_init_{agg}", (), ("O",)),))
    first = [init_o] if init else []
    body = (L("X", "$x"), S("$x", "O"))
    refs = (p.r("X", ["i", "j"]), p.r("O", ["0"], RefDir.OUT, agg))
    if nested:
        leaf = Block("leaf", (), (), tuple(ref(r.into, ["0"] * len(r.access), r.shape, r.dir, r.agg_op)
                                           for r in refs), body)
        return run_stripe(p.build(*first, kernel("i:3 j:4", refs, [leaf])), {"X": x}, precision)["O"]
    return run_stripe(p.build(*first, kernel("i:3 j:4", refs, body)), {"X": x}, precision)["O"]


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
    p = Prog(O=(I64, (4,), "output"))
    body = [LoadIndex(af("10*i + j"), "$v"), S("$v", "O")]
    k = kernel("i:3 j:4", [p.r("O", ["j"], RefDir.OUT, "assign")], body)
    exact_equal(run_stripe(p.build(k))["O"], np.array([20, 21, 22, 23], np.int64))


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
def test_load_index_and_constants():
    p = Prog(A=(F32, (3,), "input"), O=(F32, (3, 4), "output"))
    k = kernel(
        "i:3 j:4",
        [p.r("A", ["i"]), p.r("O", ["i", "j"], RefDir.OUT)],
        [L("A", "$a"), LoadIndex(af("3*i - j + 2"), "$x"), Constant("$h", 0.5, F32), Constant("$t", 3, I32),
         op("mul", ["$a", "$h"], "$ah", F32), op("mul", ["$x", "$t"], "$xt", I64),
         op("add", ["$ah", "$xt"], "$o", F32), S("$o", "O")],
    )
    a = ints((3,))
    ii, jj = np.meshgrid(np.arange(3), np.arange(4), indexing="ij")
    want = (a[:, None] * 0.5 + 3 * (3 * ii - jj + 2)).astype(np.float32)
    exact_equal(run_stripe(p.build(k), {"A": a})["O"], want)


def test_float_constant_keeps_its_double_value():
    p = Prog(A=(F64, (2,), "input"), O=(F64, (2,), "output"))
    k = kernel("i:2", [p.r("A", ["i"]), p.r("O", ["i"], RefDir.OUT)],
               [L("A", "$a"), Constant("$c", 0.1, F32), op("mul", ["$a", "$c"], "$o", F64), S("$o", "O")])
    a = np.array([3.0, 7.0])
    exact_equal(run_stripe(p.build(k), {"A": a})["O"], a * 0.1)  # not a * float32(0.1)


def scalar_program(ops: list, dts: dict[str, DType], out_dt: DType) -> Block:
    p = Prog(**{k: (dt, (1,), "input") for k, dt in dts.items()}, O=(out_dt, (1,), "output"))
    loads = [L(k, f"${k}") for k in dts]
    return p.build(kernel("", [p.r(k, ["0"]) for k in dts] + [p.r("O", ["0"], RefDir.OUT)], [*loads, *ops]))


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
    p = Prog(A=(F32, (5, 7), "input"), B=(F32, (7, 4), "input"), C=(F32, (5, 4), "output"))
    a, b = ints((5, 7)), ints((7, 4))
    got = run_stripe(p.build(matmul_kernel(p, 5, 4, 7)), {"A": a / 3, "B": b}, "exact")["C"]
    want = [[sum(Fraction(float(a[i, k] / np.float32(3))) * int(b[k, j]) for k in range(7)) for j in range(4)]
            for i in range(5)]
    assert got.dtype == object and (got == np.array(want, dtype=object)).all()


# --------------------------------------------------------------------------- structure
def test_local_allocation_is_fresh_per_point():
    """T is the outer block's own buffer: each point of the outer block gets a new zero-filled one."""
    p = Prog(A=(I32, (3,), "input"), O=(I32, (3,), "output"))
    t_shape = TensorShape.dense(I32, (1,))
    acc = Block("acc", idxs("i=i k:4"), (), (ref("A", ["i"], p.shapes["A"].scalar_view()),
                                               ref("T", ["0"], t_shape, RefDir.OUT, "add")),
                (L("A", "$a"), S("$a", "T")))
    put = Block("put", idxs("i=i"), (), (ref("T", ["0"], t_shape),
                                         ref("O", ["i"], p.shapes["O"].scalar_view(), RefDir.OUT)),
                (L("T", "$t"), S("$t", "O")))
    outer_refs = (p.r("A", ["0"], sizes=(3,)), p.r("O", ["0"], RefDir.OUT, sizes=(3,)),
                  Refinement(RefDir.NONE, "T", (af(0),), t_shape))
    outer = Block("outer", idxs("i:3"), (), outer_refs, (acc, put))
    a = np.array([1, 2, 5], np.int32)
    exact_equal(run_stripe(p.build(outer), {"A": a})["O"], 4 * a)  # not the running sum 4, 12, 32


def test_input_names_and_errors():
    p = Prog(A=(F32, (5, 7), "input"), B=(F32, (7, 4), "input"), C=(F32, (5, 4), "output"))
    prog = p.build(matmul_kernel(p, 5, 4, 7))
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
