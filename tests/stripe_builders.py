"""Hand-built Stripe programs for the tests of every Stripe executor; not a test module.

The builders (``af``, ``idxs``, ``ref``, ``kernel``, ``Prog`` ...) write ``stripe.ir`` trees
without the parser. The programs below them are the structural cases that the Stripe interpreter
(``test_stripe_exec.py``) and the backends (``test_llvm_stripe.py``, ``test_opencl_stripe.py``)
all run: each test feeds its own inputs and checks its own expectations.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from stripe import ir
from stripe.ir import Block, Dim, RefDir, Refinement, TensorShape
from tile.affine import Affine
from tile.dtypes import DType

F32, F64, I32, I64 = DType.FLOAT32, DType.FLOAT64, DType.INT32, DType.INT64
U32, BOOL = DType.UINT32, DType.BOOL


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


def idxs(spec: str) -> tuple[ir.Index, ...]:
    """``"i:2 j:3 x=i"``: ranges, or range-1 passthroughs of a parent index affine."""
    out = []
    for part in spec.split():
        name, sep, rest = part.partition(":")
        if sep:
            out.append(ir.Index(name, int(rest)))
        else:
            name, _, aff = part.partition("=")
            out.append(ir.Index(name, 1, af(aff)))
    return tuple(out)


def ref(name, access, shape: TensorShape, dir=RefDir.IN, agg="", from_=None) -> Refinement:
    return Refinement(dir, name, tuple(af(a) for a in access), shape, from_=from_, agg_op=agg)


def L(r, s):
    return ir.Load(r, s)


def S(s, r):
    return ir.Store(s, r)


def op(name, ins, out, dt, params=()):
    return ir.Intrinsic(name, tuple(ins), (out,), dt, params)


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


# ------------------------------------------------------------------------------ programs
def matmul_program(m, n, k) -> Block:
    """C (m x n) = A (m x k) @ B (k x n) in float32, one kernel over i, j, k."""
    p = Prog(A=(F32, (m, k), "input"), B=(F32, (k, n), "input"), C=(F32, (m, n), "output"))
    return p.build(kernel(
        f"i:{m} j:{n} k:{k}",
        [p.r("A", ["i", "k"]), p.r("B", ["k", "j"]), p.r("C", ["i", "j"], RefDir.OUT, "add")],
        [L("A", "$a"), L("B", "$b"), op("mul", ["$a", "$b"], "$c", F32), S("$c", "C")],
    ))


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


def reduce_program(agg: str, dt: DType, x_shape=(3, 4), out_size=1, nested=False, init=False) -> Block:
    """O[0] <agg>= X[i, j] over a 3 x 4 box, as one vectorized block or one point per block; O starts
    at 0, or with ``init`` at the aggregation's identity (the sum's for ``assign`` and none)."""
    p = Prog(X=(dt, x_shape, "input"), O=(dt, (out_size,), "output"))
    first = []
    if init:
        name = f"agg_init_{agg if agg in ('mul', 'max', 'min') else 'add'}"
        first = [Block("init", refs=(p.whole("O"),), stmts=(ir.Special(name, (), ("O",)),))]
    body = (L("X", "$x"), S("$x", "O"))
    refs = (p.r("X", ["i", "j"]), p.r("O", ["0"], RefDir.OUT, agg))
    if nested:
        leaf_refs = tuple(ref(r.into, ["0"] * len(r.access), r.shape, r.dir, r.agg_op) for r in refs)
        body = (Block("leaf", (), (), leaf_refs, body),)
    return p.build(*first, kernel("i:3 j:4", refs, body))


def scalar_program(ops: list, dts: dict[str, DType], out_dt: DType) -> Block:
    p = Prog(**{k: (dt, (1,), "input") for k, dt in dts.items()}, O=(out_dt, (1,), "output"))
    loads = [L(k, f"${k}") for k in dts]
    return p.build(kernel("", [p.r(k, ["0"]) for k in dts] + [p.r("O", ["0"], RefDir.OUT)], [*loads, *ops]))


def offsets_program(spec: str, out_access: str) -> Block:
    """O[out_access] += A[i] * B[k] over ``spec`` (A, B float32 (64), O (200)): the kernels of the
    backends' parallelization rules, where splitting an index may or may not race."""
    p = Prog(A=(F32, (64,), "input"), B=(F32, (64,), "input"), O=(F32, (200,), "output"))
    return p.build(kernel(
        spec,
        [p.r("A", ["i"]), p.r("B", ["k"]), p.r("O", [out_access], RefDir.OUT, "add")],
        [L("A", "$a"), L("B", "$b"), op("mul", ["$a", "$b"], "$c", F32), S("$c", "O")],
    ))


# ------------------------------------------------------------------------ structural cases
class Case(NamedTuple):
    """A program, its inputs and the outputs it must give (closed forms)."""

    program: Block
    inputs: dict[str, np.ndarray]
    want: dict[str, np.ndarray]

    def check(self, got: dict[str, np.ndarray]) -> None:
        """``got`` (an executor's outputs) has the wanted outputs: same dtypes, shapes and values."""
        for k, want in self.want.items():
            assert got[k].dtype == want.dtype and got[k].shape == want.shape, (k, got[k].dtype, want.dtype)
            np.testing.assert_array_equal(got[k], want, err_msg=k)


def small_ints(rng: np.random.Generator, shape, dtype=np.float32) -> np.ndarray:
    return rng.integers(-4, 5, size=shape).astype(dtype)


def transposed_view(rng: np.random.Generator) -> Case:
    """A block views A (2 x 3) transposed (sizes 3 x 2, strides 1 and 3); its child's access AT[r, c]
    moves by those strides, whatever dims the child declares for its own (scalar) view."""
    p = Prog(A=(I32, (2, 3), "input"), O=(I32, (3, 2), "output"))
    leaf_refs = (ref("AT", ["r", "c"], TensorShape.dense(I32, (1, 1))),
                 ref("O", ["r", "c"], p.shapes["O"].scalar_view(), RefDir.OUT))
    leaf = Block("leaf", idxs("r:3 c:2"), (), leaf_refs, (L("AT", "$v"), S("$v", "O")))
    view = Block("view", (), (), (ref("AT", ["0", "0"], TensorShape(I32, (Dim(3, 1), Dim(2, 3))), from_="A"),
                                  p.whole("O")), (leaf,))
    a = small_ints(rng, (2, 3), np.int32)
    return Case(p.build(view), {"A": a}, {"O": a.T})


def assign_last_writer(rng: np.random.Generator) -> Case:
    """O[j] = 10*i + j over i < 3, j < 4 with ``assign``: the last writer wins."""
    p = Prog(O=(I64, (4,), "output"))
    body = [ir.LoadIndex(af("10*i + j"), "$v"), S("$v", "O")]
    program = p.build(kernel("i:3 j:4", [p.r("O", ["j"], RefDir.OUT, "assign")], body))
    return Case(program, {}, {"O": np.array([20, 21, 22, 23], np.int64)})


def local_allocation(rng: np.random.Generator) -> Case:
    """T is the outer block's own buffer: each point of the outer block gets a new zero-filled one,
    so O is 4 * A, not the running sum 4, 12, 32."""
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
    a = np.array([1, 2, 5], np.int32)
    return Case(p.build(Block("outer", idxs("i:3"), (), outer_refs, (acc, put))), {"A": a}, {"O": 4 * a})


def nested_reshape(rng: np.random.Generator) -> Case:
    """A special inside a nested block on strided views: per row t, O[t] (a 3-vector view) is the
    reshape of the transposed 3 x 1 view of A's column t."""
    p = Prog(A=(F64, (3, 4), "input"), O=(F64, (4, 3), "output"))
    inner = Block(
        "inner",
        idxs("t=t"),
        (),
        (
            ref("col", ["0", "t"], TensorShape(F64, (Dim(3, 4), Dim(1, 1))), from_="A"),
            ref("row", ["t", "0"], TensorShape(F64, (Dim(3, 1),)), RefDir.OUT, from_="O"),
        ),
        (ir.Special("reshape", ("col",), ("row",)),),
    )
    outer = Block("outer", idxs("t:4"), (), (p.whole("A", RefDir.IN), p.whole("O")), (inner,))
    a = small_ints(rng, (3, 4), np.float64)
    return Case(p.build(outer), {"A": a}, {"O": a.T})


def refinement_conversion(rng: np.random.Generator) -> Case:
    """A refinement typed int8 over a float32 buffer: loads and stores convert."""
    p = Prog(A=(F32, (4,), "input"), O=(F32, (4,), "output"))
    narrow = Refinement(RefDir.IN, "A", (af("i"),), TensorShape(DType.INT8, (Dim(1, 1),)))
    k = kernel("i:4", [narrow, p.r("O", ["i"], RefDir.OUT, "add")], [L("A", "$a"), S("$a", "O")])
    a = np.array([300.7, -2.7, 127.9, 1e9], np.float32)
    return Case(p.build(k), {"A": a}, {"O": np.array([44, -2, 127, 0], np.float32)})


def load_index_program(half: float) -> Block:
    """O[i, j] = A[i] * half + 3 * (3*i - j + 2), the index from ``load_index``, A float32 (3)."""
    p = Prog(A=(F32, (3,), "input"), O=(F32, (3, 4), "output"))
    return p.build(kernel(
        "i:3 j:4",
        [p.r("A", ["i"]), p.r("O", ["i", "j"], RefDir.OUT)],
        [L("A", "$a"), ir.LoadIndex(af("3*i - j + 2"), "$x"), ir.Constant("$h", half, F32),
         ir.Constant("$t", 3, I32), op("mul", ["$a", "$h"], "$ah", F32), op("mul", ["$x", "$t"], "$xt", I64),
         op("add", ["$ah", "$xt"], "$o", F32), S("$o", "O")],
    ))


def load_index_and_constants(rng: np.random.Generator) -> Case:
    a = small_ints(rng, (3,))
    ii, jj = np.meshgrid(np.arange(3), np.arange(4), indexing="ij")
    want = (a[:, None] * 0.5 + 3 * (3 * ii - jj + 2)).astype(np.float32)
    return Case(load_index_program(0.5), {"A": a}, {"O": want})


def float_constant(rng: np.random.Generator) -> Case:
    """A float32 Constant keeps its double value: O = A * 0.1 in float64, not A * float32(0.1)."""
    p = Prog(A=(F64, (2,), "input"), O=(F64, (2,), "output"))
    k = kernel("i:2", [p.r("A", ["i"]), p.r("O", ["i"], RefDir.OUT)],
               [L("A", "$a"), ir.Constant("$c", 0.1, F32), op("mul", ["$a", "$c"], "$o", F64), S("$o", "O")])
    a = np.array([3.0, 7.0])
    return Case(p.build(k), {"A": a}, {"O": a * 0.1})


def padded_conv(rng: np.random.Generator) -> Case:
    """A 3 x 3 convolution whose padding is four constraints (``conv_program``)."""
    i, k = small_ints(rng, (1, 5, 4, 2)), small_ints(rng, (3, 3, 2, 3))
    return Case(conv_program(5, 4, 2, 3), {"I": i, "K": k}, {"O": conv_reference(i, k)})


def mixed_signedness_compare(rng: np.random.Generator) -> Case:
    """int32 -1 against uint32 1 compares in uint32 (the left operand's type wins): 1 > 4294967295
    is false."""
    gt = scalar_program([op("cmp_gt", ["$B", "$A"], "$o", BOOL), S("$o", "O")], {"A": I32, "B": U32}, BOOL)
    ins = {"A": np.array([-1], np.int32), "B": np.array([1], np.uint32)}
    return Case(gt, ins, {"O": np.array([False])})


def tiled_matmul_case(m: int) -> Callable[[np.random.Generator], Case]:
    def case(rng: np.random.Generator) -> Case:
        a, b = small_ints(rng, (m, 5)), small_ints(rng, (5, 6))
        return Case(tiled_matmul(m, 6, 5), {"A": a, "B": b}, {"C": a @ b})

    case.__name__ = f"tiled_matmul_{m}"
    return case


# the structural cases every Stripe executor runs (``test_structural_case`` in each test file)
STRUCTURAL: dict[str, Callable[[np.random.Generator], Case]] = {
    f.__name__: f
    for f in (padded_conv, tiled_matmul_case(8), tiled_matmul_case(7), transposed_view, assign_last_writer,
              local_allocation, nested_reshape, refinement_conversion, load_index_and_constants,
              float_constant, mixed_signedness_compare)
}
