"""The Stripe text format (stripe.printer / stripe.parser) and the IR verifier (stripe.verify)."""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stripe.verify
from ref_interp.run import input_types
from stripe import ir
from stripe.ir import AGG_OPS, Block, Dim, Location, RefDir, Refinement, TensorShape
from stripe.lower import lower
from stripe.parser import parse_stripe
from stripe.printer import format_block, format_program
from stripe.verify import StripeError, verify
from tile import parse
from tile.affine import Affine
from tile.bind import bind
from tile.dtypes import DType
from tile.errors import TileError, TileSyntaxError


def aff(const: int = 0, **coeffs: int | Fraction) -> Affine:
    return Affine.build(coeffs, const)


def roundtrip(b: Block) -> str:
    text = format_block(b)
    assert parse_stripe(text) == b, text
    assert format_block(parse_stripe(text)) == text
    return text


CONV = """\
0: #program block [] ( // conv
    #input #user none I[0, 0, 0, 0] fp32(1:512, 16:32, 16:2, 2:1)
    #input #user none K[0, 0, 0, 0] fp32(3:24, 3:8, 2:4, 4:1)
    #output #user none O[0, 0, 0, 0] fp32(1:784, 14:56, 14:4, 4:1)
) {
  0: #main block [] ( // main
      in I[0, 0, 0, 0] fp32(1:512, 16:32, 16:2, 2:1)
      in K[0, 0, 0, 0] fp32(3:24, 3:8, 2:4, 4:1)
      out O[0, 0, 0, 0]:assign fp32(1:784, 14:56, 14:4, 4:1)
  ) {
    0: #agg_op_add #comb_op_mul #contraction #kernel block [ci:2, co:4, kx:3, ky:3, n:1, x:14, y:14] ( // O
        // O[n, x, y, co: 1, 14, 14, 4] = +(I[n, x + kx, y + ky, ci] * K[kx, ky, ci, co])
        out O[n, x, y, co]:add fp32(1:784, 1:56, 1:4, 1:1)
        in I[n, kx + x, ky + y, ci] fp32(1:512, 1:32, 1:2, 1:1)
        in K[kx, ky, ci, co] fp32(1:24, 1:8, 1:4, 1:1)
    ) {
      0: $I = load(I)
      1: $K = load(K)
      2: $O = mul($I, $K):fp32
      3: O = store($O)
    }
  }
}
"""


def test_conv_program_parses_to_the_expected_tree_and_prints_back_verbatim():
    b = parse_stripe(CONV)
    assert (b.name, b.tags, b.idxs) == ("conv", frozenset({"program"}), ())
    dense = TensorShape.dense(DType.FLOAT32, (1, 16, 16, 2))
    assert b.refs[0] == Refinement(RefDir.NONE, "I", (aff(),) * 4, dense, tags=frozenset({"input", "user"}))
    (main,) = b.stmts
    assert main.ref("O").agg_op == "assign" and main.ref("O").dir is RefDir.OUT
    (k,) = main.stmts
    assert k.tags == frozenset({"agg_op_add", "comb_op_mul", "contraction", "kernel"})
    assert [(i.name, i.range) for i in k.idxs][:2] == [("ci", 2), ("co", 4)]
    assert k.comments == ("O[n, x, y, co: 1, 14, 14, 4] = +(I[n, x + kx, y + ky, ci] * K[kx, ky, ci, co])",)
    assert k.ref("I").access[1] == aff(kx=1, x=1) and k.ref("I").shape == dense.scalar_view()
    mul = ir.Intrinsic("mul", ("$I", "$K"), ("$O",), DType.FLOAT32)
    assert k.stmts == (ir.Load("I", "$I"), ir.Load("K", "$K"), mul, ir.Store("$O", "O"))
    assert format_block(b) == CONV and format_program(b) == CONV
    verify(b)


# The slides' autotiled convolution ("AFTER"), with the intrinsic's type our IR requires.
SLIDES_AFTER = "0: #agg_op_add #comb_op_mul #contraction #CONV #kernel " + """\
block [ci:1, co:1, kx:1, ky:1, x:256, y:256] ( // kernel_0
  // O1[x, y, co : X, Y, C2] = +(I[-1 + kx + x, -1 + ky + y, ci] * K1[kx, ky, ci, co])
  out<DRAM[0]> O1[4*x, 4*y, 16*co]:add i8(4:65536, 4:64, 16:1)
  in<DRAM[0]> I[kx + 4*x, ky + 4*y, 32*ci] i8(4:32768, 4:32, 32:1)
  in<DRAM[0]> K1[kx, ky, 32*ci, 16*co] i8(1:6144, 1:2048, 32:1, 16:32)
) {
  0: #CONV_inner block [ci:32, co:64, kx:3, ky:3, x:4, y:4] ( // kernel_0
    out<DRAM[0]> O1[x, y, co]:add i8(1:65536, 1:64, 1:1)
    in<DRAM[0]> I[-1 + kx + x, -1 + ky + y, ci] i8(1:32768, 1:32, 1:1)
    in<DRAM[0]> K1[kx, ky, ci, co] i8(1:6144, 1:2048, 1:1, 1:32)
  ) {
    0: $I = load(I);  1: $K1 = load(K1);  2: $O1 = mul($I, $K1):i8;  3: O1 = store($O1)
  }}
"""


def r8(d: RefDir, name: str, access: tuple[Affine, ...], *dims: tuple[int, int], agg: str = "") -> Refinement:
    shape = TensorShape(DType.INT8, tuple(Dim(s, t) for s, t in dims))
    return Refinement(d, name, access, shape, agg_op=agg, location=Location("DRAM", (aff(),)))


def idxs(**ranges: int) -> tuple[ir.Index, ...]:
    return tuple(ir.Index(n, r) for n, r in ranges.items())


def slides_after() -> Block:
    mul = ir.Intrinsic("mul", ("$I", "$K1"), ("$O1",), DType.INT8)
    body = (ir.Load("I", "$I"), ir.Load("K1", "$K1"), mul)
    inner_refs = (
        r8(RefDir.OUT, "O1", (aff(x=1), aff(y=1), aff(co=1)), (1, 65536), (1, 64), (1, 1), agg="add"),
        r8(RefDir.IN, "I", (aff(-1, kx=1, x=1), aff(-1, ky=1, y=1), aff(ci=1)), (1, 32768), (1, 32), (1, 1)),
        r8(RefDir.IN, "K1", (aff(kx=1), aff(ky=1), aff(ci=1), aff(co=1)), (1, 6144), (1, 2048), (1, 1),
           (1, 32)),
    )
    inner = Block("kernel_0", idxs(ci=32, co=64, kx=3, ky=3, x=4, y=4), (), inner_refs,
                  (*body, ir.Store("$O1", "O1")), frozenset({"CONV_inner"}))
    outer_refs = (
        r8(RefDir.OUT, "O1", (aff(x=4), aff(y=4), aff(co=16)), (4, 65536), (4, 64), (16, 1), agg="add"),
        r8(RefDir.IN, "I", (aff(kx=1, x=4), aff(ky=1, y=4), aff(ci=32)), (4, 32768), (4, 32), (32, 1)),
        r8(RefDir.IN, "K1", (aff(kx=1), aff(ky=1), aff(ci=32), aff(co=16)), (1, 6144), (1, 2048), (32, 1),
           (16, 32)),
    )
    tags = frozenset({"agg_op_add", "comb_op_mul", "contraction", "CONV", "kernel"})
    comment = "O1[x, y, co : X, Y, C2] = +(I[-1 + kx + x, -1 + ky + y, ci] * K1[kx, ky, ci, co])"
    outer_idxs = idxs(ci=1, co=1, kx=1, ky=1, x=256, y=256)
    return Block("kernel_0", outer_idxs, (), outer_refs, (inner,), tags, (comment,))


def conv_program(kernel: Block) -> Block:
    bufs = {"I": (1024, 1024, 32), "K1": (3, 3, 32, 64), "O1": (1024, 1024, 64)}
    shapes = {n: TensorShape.dense(DType.INT8, s) for n, s in bufs.items()}
    zeros = {n: (aff(),) * len(s) for n, s in bufs.items()}
    root_refs = tuple(Refinement(RefDir.NONE, n, zeros[n], shapes[n], tags=frozenset({"user"})) for n in bufs)
    dirs = {"I": (RefDir.IN, ""), "K1": (RefDir.IN, ""), "O1": (RefDir.OUT, "assign")}
    main_refs = tuple(Refinement(dirs[n][0], n, zeros[n], shapes[n], agg_op=dirs[n][1]) for n in bufs)
    main = Block("main", refs=main_refs, stmts=(kernel,), tags=frozenset({"main"}))
    return Block("layer", refs=root_refs, stmts=(main,), tags=frozenset({"program"}))


def test_slides_tiled_conv_parses_to_the_hand_built_tree_and_round_trips():
    b = parse_stripe(SLIDES_AFTER)
    assert b == slides_after()
    text = roundtrip(b)
    assert "out<DRAM[0]> O1[4*x, 4*y, 16*co]:add i8(4:65536, 4:64, 16:1)" in text
    assert "in<DRAM[0]> I[kx + x - 1, ky + y - 1, ci] i8(1:32768, 1:32, 1:1)" in text
    assert "  0: #CONV_inner block [ci:32, co:64, kx:3, ky:3, x:4, y:4] ( // kernel_0\n" in text
    roundtrip(conv_program(b))


def test_verify_catches_the_slides_inner_block_overrunning_its_tile():
    # The slides' inner block keeps the untiled halo (-1 + kx + x) with no constraint, so at the
    # first and last tiles it reads one row outside I: positions are checked in the buffer.
    overrun = r"layer/main/kernel_0/kernel_0: refinement 'I'.*dim 0 covers \[-1, 1024\] .* of 'I'"
    with pytest.raises(StripeError, match=overrun):
        verify(conv_program(slides_after()))
    fixed = SLIDES_AFTER.replace("co:64, kx:3, ky:3", "co:16, kx:1, ky:1")
    verify(conv_program(parse_stripe(fixed.replace("-1 + kx + x, -1 + ky + y", "kx + x, ky + y"))))


# The slides' untiled conv kernel ("Stripe Top"), full size: too many points to enumerate, so the
# bounds come from Fourier–Motzkin over its padding constraints.
SLIDES_TOP = """\
0: #agg_op_add #comb_op_mul #contraction #kernel block [ci:32, co:64, kx:3, ky:3, x:1024, y:1024] (
    // O1[x, y, co : X, Y, C2] = +(I[-1 + kx + x, -1 + ky + y, ci] * K1[kx, ky, ci, co])
    -1 + kx + x >= 0
    1024 - kx - x >= 0
    -1 + ky + y >= 0
    1024 - ky - y >= 0
    out<[0]> O1[x, y, co]:add i8(1:65536, 1:64, 1:1)
    in<[0]> I[-1 + kx + x, -1 + ky + y, ci] i8(1:32768, 1:32, 1:1)
    in<[0]> K1[kx, ky, ci, co] i8(1:6144, 1:2048, 1:64, 1:1)
) {
0: $I = load(I); 1: $K1 = load(K1); 2: $O1 = mul($I, $K1):i8; 3: O1 = store($O1)
}
"""


def test_verify_bounds_large_constrained_blocks_by_fourier_motzkin():
    top = parse_stripe(SLIDES_TOP)
    assert top.constraints[1] == aff(1024, kx=-1, x=-1) and top.refs[0].location == Location("", (aff(),))
    verify(conv_program(top))
    with pytest.raises(StripeError, match=r"refinement 'I'.*dim 1 covers \[0, 1024\] .* outside \[0, 1023\]"):
        verify(conv_program(replace(top, constraints=top.constraints[:3])))
    with pytest.raises(StripeError, match=r"refinement 'I'.*dim 0 covers \[-1, 1023\]"):
        verify(conv_program(replace(top, constraints=top.constraints[1:])))
    # over integers 2*kx + 2*x - 1 >= 0 is kx + x >= 1, so I's dim 0 stays >= 0
    verify(conv_program(replace(top, constraints=(aff(-1, kx=2, x=2), *top.constraints[1:]))))


def everything() -> Block:
    """A block using every statement kind and every optional field, with awkward names."""
    shape = TensorShape(DType.FLOAT16, (Dim(3, 4), Dim(4, 1)))
    sram = Location("SRAM", (aff(i=1), aff(1)))
    refs = (
        Refinement(RefDir.INOUT, "X", (aff(2, i=3), aff(j=-1)), shape, "I", "max", sram, True,
                   frozenset({"t", "a b"})),
        Refinement(RefDir.OUT, "O", (aff(), aff()), shape, from_="O", location=Location("", (aff(),))),
        Refinement(RefDir.NONE, "in", (), TensorShape(DType.BOOL, ()), location=Location("DRAM"), offset=448),
        Refinement(RefDir.IN, "odd`\n", (aff(Fraction(1, 2), **{"k'": Fraction(-2, 3)}),),
                   TensorShape(DType.UINT64, (Dim(-1, 0),)), agg_op="sum"),
    )
    stmts = (
        ir.Load("X", "$x"), ir.LoadIndex(aff(-1, i=2, j=1), "$i"), ir.Constant("$c", 1.5, DType.FLOAT32),
        ir.Constant("$n", -7, DType.INT64), ir.Constant("$t", True, DType.BOOL),
        ir.Constant("$z", -0.0, DType.FLOAT64), ir.Constant("$e", 1e-300, DType.FLOAT64),
        ir.Constant("$inf", -math.inf, DType.FLOAT32),
        ir.Intrinsic("add", ("$x", "$c"), ("$y",), DType.FLOAT32),
        ir.Intrinsic("as_int", ("$y",), ("$q",), DType.INT8, (8, -1)),
        ir.Intrinsic("load", (), (), DType.UINT8), ir.Intrinsic("f", ("$a",), ("$b", "$c2"), DType.INT16),
        ir.Store("$y", "O"), ir.Special("reshape", ("I",), ("O",), (2, -3), ("row major", 'q"\\')),
        ir.Special("zero", (), ("O",)), ir.Special("store", ("a",), ("b",)), ir.Special("sync", (), ()),
        Block(), Block(comments=("",)),
    )
    return Block(
        "all", (ir.Index("i", 4), ir.Index("j", 0, aff(3, i=-2)), ir.Index("block", 1, aff())),
        (aff(-1, i=1, j=1), aff(5)), refs, stmts, frozenset({"kernel"}),
        ("plain", "  padded ", '"quoted"', "two\nlines", ""),
        Location("GPU", (aff(),)), (("m", 3), ("r", 0.1), ("s", "a\tb"), ("f", False), ("m", 4)),
    )


EVERYTHING = (
    '0: #kernel #m=3 #r=0.1 #s="a\\tb" #f=false #m=4 block<GPU[0]> '
    "[i:4, j:0 = -2*i + 3, `block`:1 = 0] ( // all\n"
) + r"""    // plain
    // "  padded "
    // "\"quoted\""
    // "two\nlines"
    //
    i + j - 1 >= 0
    5 >= 0
    #`a b` #t inout<SRAM[i, 1]> const X = I[3*i + 2, -j]:max fp16(3:4, 4:1)
    out<[0]> O = O[0, 0] fp16(3:4, 4:1)
    none<DRAM> @0x1c0 `in`[] bool()
    in `odd\u0060\n`[-2/3*k' + 1/2]:sum u64(-1:0)
) {
  0: $x = load(X)
  1: $i = load_index(2*i + j - 1)
  2: $c = (fp32)1.5
  3: $n = (i64)-7
  4: $t = (bool)true
  5: $z = (fp64)-0.0
  6: $e = (fp64)1e-300
  7: $inf = (fp32)-inf
  8: $y = add($x, $c):fp32
  9: $q = as_int($y, 8, -1):i8
  10: `load`():u8
  11: $b, $c2 = f($a):i16
  12: O = store($y)
  13: O = reshape(I, 2, -3, "row major", "q\"\\")
  14: O = zero()
  15: b = `store`(a)
  16: sync()
  17: block [] (
  ) {
  }
  18: block [] (
      //
  ) {
  }
}
"""


def test_every_statement_kind_and_optional_field_prints_as_documented_and_round_trips():
    assert format_block(everything()) == EVERYTHING
    assert parse_stripe(EVERYTHING) == everything()
    z = parse_stripe(EVERYTHING).stmts[5]
    assert isinstance(z, ir.Constant) and math.copysign(1, z.value) == -1
    same = replace(everything(), refs=everything().refs[1:2])
    assert replace(same.refs[0], from_=None) != same.refs[0]  # `O = O` keeps from_ set to its own name
    assert "out<[0]> O[0, 0]" in format_block(replace(same, refs=(replace(same.refs[0], from_=None),)))


def test_floats_and_ints_keep_their_exact_value_and_type():
    values = [0.1, 1 / 3, 5e-324, 1.7976931348623157e308, 2.0, 1e16, math.inf, 2**64 + 1, -(2**63), 0, False]
    b = Block(stmts=tuple(ir.Constant(f"$v{k}", v, DType.FLOAT64) for k, v in enumerate(values)))
    back = parse_stripe(roundtrip(b))
    assert [(type(s.value), s.value) for s in back.stmts] == [(type(v), v) for v in values]


def test_parser_accepts_slides_spellings_and_ignores_stray_comments():
    text = "// a file comment\n0: block [] ( // n\n) {\n  // a note\n  0: $a = (i32)1; 1: $b = (i32)2;\n}\n"
    assert parse_stripe(text) == Block(
        "n", stmts=(ir.Constant("$a", 1, DType.INT32), ir.Constant("$b", 2, DType.INT32))
    )
    assert parse_stripe("block [x:2 = 3*y / 3 - 2 * 1] () {}").idxs == (ir.Index("x", 2, aff(-2, y=1)),)
    assert parse_stripe("block [] ( x*2 + 1/2*y - 0 >= 0 ) {}").constraints == (
        aff(Fraction(0), x=2, y=Fraction(1, 2)),
    )


# ------------------------------------------------------------------ Hypothesis round trip
NAMES = st.sampled_from(["x", "I", "$a", "x'", "_t", "in", "load", "block", "const", "fp32", "inf", ""])
NAMES = NAMES | st.text(max_size=4)
TEXTS = st.sampled_from(["O[i] = +(I[i])", " x", '"', "//", ""]) | st.text(max_size=6)
FRACS = st.fractions(min_value=-50, max_value=50, max_denominator=6)
VARS = st.sampled_from(["i", "j", "k", "in", "a b"])
AFFINES = st.builds(Affine.build, st.dictionaries(VARS, FRACS, max_size=3), FRACS)
INTS = st.integers(-(2**70), 2**70)
VALUES = INTS | st.floats(allow_nan=False) | st.booleans()  # nan != nan, so no tree holding one equals itself
DTYPES = st.sampled_from(list(DType))


def tuples(s, n=3):
    return st.lists(s, max_size=n).map(tuple)


LOCS = st.none() | st.builds(Location, NAMES, tuples(AFFINES, 2))
SHAPES = st.builds(TensorShape, DTYPES, tuples(st.builds(Dim, INTS, INTS)))
REFS = st.builds(Refinement, st.sampled_from(list(RefDir)), NAMES, tuples(AFFINES), SHAPES, st.none() | NAMES,
                 st.sampled_from(AGG_OPS) | NAMES, LOCS, st.booleans(), st.frozensets(NAMES, max_size=3),
                 st.none() | st.integers(0, 2**40))
STMTS = st.one_of(
    st.builds(ir.Load, NAMES, NAMES), st.builds(ir.Store, NAMES, NAMES),
    st.builds(ir.LoadIndex, AFFINES, NAMES),
    st.builds(ir.Constant, NAMES, VALUES, DTYPES),
    st.builds(ir.Intrinsic, NAMES, tuples(NAMES), tuples(NAMES), DTYPES, tuples(INTS)),
    st.builds(ir.Special, NAMES, tuples(NAMES), tuples(NAMES), tuples(INTS), tuples(st.text(max_size=4))),
)


def blocks(stmts):
    idxs = tuples(st.builds(ir.Index, NAMES, INTS, st.none() | AFFINES))
    return st.builds(Block, TEXTS, idxs, tuples(AFFINES, 2), tuples(REFS), tuples(stmts, 4),
                     st.frozensets(NAMES, max_size=3), tuples(TEXTS, 2), LOCS,
                     tuples(st.tuples(NAMES, VALUES | st.text(max_size=4)), 2))


@settings(derandomize=True, deadline=None, max_examples=200)
@given(st.recursive(blocks(STMTS), lambda inner: blocks(STMTS | inner), max_leaves=4))
def test_random_block_trees_round_trip(b):
    roundtrip(b)


# ------------------------------------------------------------------ parse errors
@pytest.mark.parametrize("text, line, col, message, hint", [
    ("block [] () {\n  0: $x = f($a):f33\n}", 2, 17, "expected an element type, found 'f33'", "fp32"),
    ("block [] () {\n  0: $a = (i32)1\n  2: $b = (i32)2\n}", 3, 3, "statement number 2 out of order", "is 1"),
    ("block [] () {\n  0: $a = load(@)\n}", 2, 16, "unexpected character '@'", "backticks"),
    ("block [i:2] (\n    i >= 1\n) {}", 2, 10, "a constraint compares with 0", "x - 3 >= 0"),
    ("block [in:3] () {}", 1, 8, "expected an index name, found 'in'", "`in`"),
    ("block [i:2, j:2] ( i*j >= 0 ) {}", 1, 22, "multiplies two indexes", "linear"),
    ("block [] (\n  in I[0] (1:1)\n) {}", 2, 11, "expected an element type, found '('", "i8"),
    ("block [] () {\n  0: $a = load(A)", 2, 18, "expected '}', found the end of the text", "close"),
    ("block [] () {} block [] () {}", 1, 16, "expected the end of the text, found 'block'", "one root"),
    ("block [] () { 0: $a, $b = load(A) }", 1, 18, "load has one output, not 2", "one name"),
    ("block [] () { 0: O = f(A, 2, B) }", 1, 30, "expected an integer or string parameter", "names"),
    ('block [] () { 0: O = f("s"):i8 }', 1, 27, "no string parameters", "Special"),
    ("#a=x block [] () {}", 1, 4, "expected a number, found 'x'", "1.5"),
    ("block [] ( in `a\\q`[] i8() ) {}", 1, 15, "bad escape in the quoted name", "JSON"),
    ('block [] ( // "unclosed\n) {}', 1, 12, "must be one JSON string", "quote"),
    ("#k in I[] i8() block [] () {}", 1, 4, "expected 'block', found 'in'", "#tags block"),
    ("block [i:2 = 1/0] () {}", 1, 16, "division by zero", "non-zero"),
])
def test_parse_errors_are_located_with_a_caret_and_a_hint(text, line, col, message, hint):
    with pytest.raises(TileSyntaxError) as info:
        parse_stripe(text, "k.stripe")
    e = info.value
    assert (e.span.line, e.span.col) == (line, col), str(e)
    assert message in e.message and hint in e.hint
    shown = str(e).splitlines()
    assert shown[0] == f"k.stripe:{line}:{col}: syntax error: {e.message}"
    assert shown[2].index("^") == 4 + col - 1 and shown[-1] == f"hint: {e.hint}"


# ------------------------------------------------------------------ verify
GOOD = """\
0: #program block [] ( // prog
    #input #user none A[0, 0] fp32(4:3, 3:1)
    #output #user none B[0, 0] fp32(4:3, 3:1)
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(4:3, 3:1)
      out B[0, 0]:assign fp32(4:3, 3:1)
  ) {
    0: #kernel block [i:2, j:3] ( // k
        in A[2*i, j] fp32(2:3, 1:1)
        out B[2*i, j] fp32(2:3, 1:1)
        none T[0] fp32(2:1)
    ) {
      0: T = zero()
      1: block [r:2, i0:1 = i] ( // inner
          i0 + r >= 0
          in A[r, 0] fp32(1:3, 1:1)
          out B[r, 0]:assign fp32(1:3, 1:1)
      ) {
        0: $a = load(A)
        1: $r = load_index(r + i0)
        2: $one = (fp32)1.0
        3: $s = add($a, $one):fp32
        4: $t = assign($s):fp32
        5: B = store($t)
      }
    }
  }
}
"""
K_HEAD = "[i:2, j:3] ( // k\n"


@pytest.fixture(params=["enumerate", "fourier-motzkin"])
def bounds_by(request, monkeypatch):
    """Constrained blocks are bounded point by point, or (past ENUM_LIMIT) by Fourier–Motzkin: the
    verdicts must agree."""
    if request.param == "fourier-motzkin":
        monkeypatch.setattr(stripe.verify, "ENUM_LIMIT", 0)


@pytest.mark.parametrize("edits", [
    [],
    [(K_HEAD, "[i:3, j:3] ( // k\n        1 - i >= 0\n")],  # the constraint keeps 2*i in bounds
    # reads A[-1] only where the padding-style constraint excludes it
    [(K_HEAD, "[i:2, j:3, p:2] ( // k\n        2*i + p - 1 >= 0\n"), ("A[2*i, j]", "A[2*i + p - 1, j]")],
    [("out B[r, 0]:assign", "out B[r, 0]:add"), ("0: T = zero()", "0: T = copy(A)")],
    [("none T[0] fp32(2:1)", "none T[0] fp32(9:1)")],  # a local allocation has no parent to fit in
])
def test_verify_accepts_good_programs(edits, bounds_by):
    text = GOOD
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    verify(parse_stripe(text))


@pytest.mark.parametrize("old, new, message", [
    ("in A[r, 0]", "in X = C[r, 0]", "refinement 'X' (`in X = C[r, 0] fp32(1:3, 1:1)`) refines 'C', which"),
    ("#user none A[0, 0]", "#user in A[0, 0]", "refinement 'A' ... a root refinement must have dir none"),
    ("#user none B[0, 0]", "#user none B = A[0, 0]", "a root refinement must have dir none"),
    ("none T[0] fp32(2:1)", "none A[0, 0] fp32(2:1, 1:1)", "refinement 'A' is declared twice"),
    ("in A[r, 0] fp32(1:3, 1:1)", "in A[r] fp32(1:3)", "access has rank 1 but its parent 'A' has rank 2"),
    ("in A[r, 0] fp32(1:3, 1:1)", "in A[r, 0] fp32(1:3)", "2 access affines for 1 dims"),
    ("in A[r, 0]", "in A[r, i]", "`i` uses 'i', which is not one of the block's indexes (i0, r)"),
    ("i0 + r >= 0", "i + r >= 0", "constraint `i + r >= 0`: `i + r` uses 'i'"),
    ("load_index(r + i0)", "load_index(j)", "statement 1 (load_index): `j` uses 'j'"),
    ("i0:1 = i]", "i0:1 = r]", "index 'i0': `r` uses 'r', which is not one of the enclosing block's indexes"),
    ("#program block []", "#program block [z:1 = z]", "index 'z': `z` uses 'z'"),
    ("in A[2*i, j]", "in A[2*i, 1/2*j]", "`1/2*j` has a non-integer coefficient"),
    ("i0 + r >= 0", "1/2*r >= 0", "constraint `1/2*r >= 0`: `1/2*r` has a non-integer coefficient"),
    (K_HEAD, "[i:3, j:3] ( // k\n", "inner: refinement 'A' ... dim 0 covers [0, 5] over the index"),
    ("[r:2, i0:1 = i]", "[r:3, i0:1 = i]", "inner: refinement 'A' ... covers [0, 4] ... outside [0, 3]"),
    ("A[2*i, j] fp32(2:3, 1:1)", "A[2*i, j] fp32(2:3, 4:1)", "dim 1 has size 4, larger than its parent's 3"),
    ("in A[2*i, j]", "in A[2*i, j - 1]", "dim 1 covers [-1, 1]"),
    (K_HEAD, "[i:3, j:3] ( // k\n        2 - i >= 0\n", "dim 0 covers [0, 5]"),  # a constraint too weak
    ("in A[2*i, j]", "in A[2*i + j - 1, j]", "dim 0 covers [-1, 4]"),
    ("3: $s = add($a, $one)", "3: $s = add($a, $two)", "uses the scalar '$two' before it is defined"),
    ("1: $r = load_index", "1: $a = load_index", "defines the scalar '$a' a second time"),
    ("4: $t = assign($s)", "4: t = assign($s)", "scalar 't' lacks '$'"),
    ("0: $a = load(A)", "0: $a = load(C)", "statement 0 (`$a = load(C)`) names 'C', which is not a"),
    ("5: B = store($t)", "5: C = store($t)", "names 'C', which is not a refinement of this block"),
    ("0: T = zero()", "0: A = zero()", "statement 0 (`A = zero()`) writes into 'A', an `in` refinement"),
    ("out B[r, 0]:assign", "in B[r, 0]", "statement 5 (`B = store($t)`) writes into 'B', an `in` refinement"),
    ("out B[r, 0]:assign", "out B[r, 0]:sum", "unknown agg_op 'sum'"),
    ("in A[r, 0]", "inout A[r, 0]", "writes (inout) through its parent 'A', which is only `in`"),
    ("in A[2*i, j]", "out A[2*i, j]", "writes (out) through its parent 'A'"),
    ("add($a, $one):fp32", "plus($a, $one):fp32", "unknown intrinsic 'plus'"),
    ("4: $t = assign($s)", "4: $t, $u = assign($s)", "has 2 outputs"),
    ("[i:2, j:3]", "[i:2, i:3]", "index 'i' is declared twice"),
    ("[i:2, j:3]", "[i:2, j:-1]", "index 'j' has a negative range -1"),
])
def test_verify_rejects_each_broken_rule(old, new, message, bounds_by):
    assert old in GOOD
    with pytest.raises(StripeError) as info:
        verify(parse_stripe(GOOD.replace(old, new)))
    e = info.value
    assert all(part in e.message for part in message.split(" ... ")), e.message
    assert e.message.startswith("in block prog") and e.hint and isinstance(e, TileError)
    assert str(e).startswith("stripe error: in block prog")


def test_verify_names_the_block_path_and_skips_bounds_of_empty_blocks():
    bad = GOOD.replace("[r:2, i0:1 = i]", "[r:3, i0:1 = i]")
    with pytest.raises(StripeError, match=r"^stripe error: in block prog/main/k/inner: "):
        verify(parse_stripe(bad))
    unnamed = bad.replace("block [r:3, i0:1 = i] ( // inner", "block [r:3, i0:1 = i] (")
    with pytest.raises(StripeError, match=r"^stripe error: in block prog/main/k/\[1\]: "):
        verify(parse_stripe(unnamed))
    verify(parse_stripe(bad.replace("[i:2, j:3]", "[i:2, j:0]")))  # never runs: no bounds to break
    verify(parse_stripe(bad.replace("i0 + r >= 0", "-1 - r >= 0")))  # constraints leave no point


@pytest.mark.parametrize("src, shapes", [
    ("function (I[X, Y, C], K[KX, KY, C, D]) -> (O) { O[x, y, d : X, Y, D] = "
     "+(I[x + i - 1, y + j - 1, c] * K[i, j, c, d]); }", {"I": (5, 4, 2), "K": (3, 3, 2, 2)}),
    ("function (A[N], D[N]) -> (O, P) { O[i: N] = >(A[i/2]) default D; P = reshape(exp(A) + 1, 2, N/2); }",
     {"A": (4,), "D": (4,)}),
])
def test_lowered_programs_verify_and_round_trip(src, shapes):
    p = parse(src)
    prog = lower(bind(p, input_types(p, {k: np.zeros(s, np.float32) for k, s in shapes.items()})))
    verify(prog)
    roundtrip(prog)


CHAIN = """\
0: #program block [] ( // p
    #input #user none A[0] fp32(3:1)
    #output #user none B[0] fp32(3:1)
) {
  0: #main block [] ( // main
      in A[0] fp32(3:1)
      out B[0]:assign fp32(3:1)
  ) {
    0: #kernel block [] ( // k
        in A[-1] fp32(3:1)
        out B[0] fp32(3:1)
    ) {
      0: block [i:3, k:2] ( // inner
          OFFSET_CONSTRAINT
          in A[i + k] fp32(1:1)
          out B[i]:assign fp32(1:1)
      ) {
        0: $a = load(A)
        1: B = store($a)
      }
    }
  }
}
"""


def test_verify_adds_a_constant_offset_of_a_block_without_indexes():
    """A view offset by -1 in a block with no indexes counts in the positions nested blocks touch
    (it once counted as 0, because an empty index box was taken for no box)."""
    verify(parse_stripe(CHAIN.replace("OFFSET_CONSTRAINT", "i + k - 1 >= 0\n          2 - i - k >= 0")))
    with pytest.raises(StripeError, match=r"inner: refinement 'A'.*dim 0 covers \[-1, 2\]"):
        verify(parse_stripe(CHAIN.replace("OFFSET_CONSTRAINT", "")))
