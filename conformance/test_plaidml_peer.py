"""Differential tests against PlaidML 0.7.0, the optional peer (``conformance/plaidml_peer.py``).

Skipped, with the reason, where PlaidML 0.7.0 is not installed or does not run. Otherwise:

* drawn contractions, elementwise and mixed programs run on PlaidML (``llvm_cpu.0``) and on the
  interpreter and must agree, except where a documented deviation applies and shows the way
  PlaidML answered (an abort is not excused by a rounding); the test names the deviation (a
  Hypothesis event: ``pytest --hypothesis-show-statistics``). The classification is
  ``backends/plaidml/differences.py``, shared with the ``plaidml.llvm_cpu.0`` device. In a contraction, the
  elements no tuple writes may hold the aggregation identity there (§10.1), checked element by
  element; written elements must match. Programs the interpreter rejects (unbounded or empty
  index spaces, double ``=`` writes) are not sent: PlaidML hangs, aborts or silently picks a value
  on them (see the named cases);
* every deviation listed in docs/semantics.md §10 that a program can show is a named case below,
  asserting both what PlaidML really does and what our documentation says we do.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import event, given, reject

import ref_interp
import tile
from backends.plaidml import differences as diff
from conformance import plaidml_peer
from conformance.report import Tolerance, compare
from conformance.strategies import contractions, elementwise, mixed
from tile import ast
from tile.errors import (
    TileIndexError,
    TileNameError,
    TileRuntimeError,
    TileShapeError,
    TileSyntaxError,
    TileTypeError,
)
from tile.inputs import input_types


def _on_peer(peer, source: str, inputs: dict, timeout: float | None = None):
    try:
        return peer.run(source, inputs, timeout)
    except plaidml_peer.PeerError as e:
        return e


def _ours(source: str, inputs: dict):
    prog = tile.parse(source)
    bound = tile.bind(prog, input_types(prog, inputs))
    return prog, bound, ref_interp.run(bound, inputs)


# ------------------------------------------------------------------------------ contractions


@given(contractions())
def test_drawn_contractions_agree(peer, case):
    try:
        prog, bound, want = _ours(case.source, case.inputs)
    except tile.TileError:
        reject()  # invalid here; PlaidML hangs, aborts or guesses (named cases below)
    (c,) = bound.stmts
    known = diff.contraction_differences(c)
    got = _on_peer(peer, case.source, case.inputs)
    outcome = _outcome(got, want)
    if outcome == diff.ABORT and (why := diff.unimodular_abort(c)) is not None:
        known.append(why)
    explains = [d for d in known if outcome in d.shows]  # an abort is not explained by a rounding
    if explains:
        event(f"expected difference: {explains[0]}")
        return
    assert not isinstance(got, Exception), f"{got}\n{case.source}"
    w, g = want[c.name], got[c.name]
    assert (g.dtype, g.shape) == (w.dtype, w.shape), case.source
    wrote = diff.written(c)
    eps = float(np.finfo(w.dtype).eps) if w.dtype.kind == "f" else 0.0
    tol = Tolerance(exact=eps == 0.0, ulps=2.0, length=case.length, eps=eps)
    problem = compare({"O": w[wrote]}, {"O": g[wrote]}, tol)
    assert problem is None, f"written elements: {problem}\n{case.source}"
    unwritten = g[~wrote]
    identity = diff.identity(c.agg, w.dtype)
    ok = (unwritten == w[~wrote]) | (unwritten == identity)
    assert ok.all(), f"unwritten elements {unwritten} are neither ours nor {identity}\n{case.source}"
    if (unwritten != w[~wrote]).any():
        event("expected difference: semantics §10.1: skipped positions hold the aggregation identity")


def _outcome(got, want: dict) -> str:
    """How PlaidML answered, as ``Difference.shows`` names it."""
    if isinstance(got, plaidml_peer.PeerError):
        return got.kind
    typed = set(got) == set(want) and all(
        (got[n].dtype, got[n].shape) == (want[n].dtype, want[n].shape) for n in want
    )
    return diff.VALUES if typed else diff.DTYPE


# ------------------------------------------------------------------------------ elementwise


def agree_but_for_documented_deviations(peer, case) -> None:
    try:
        prog, bound, want = _ours(case.source, case.inputs)
    except tile.TileError:
        reject()
    shown = [s.name for s in prog.stmts if s.name not in diff.prng_handles(prog)]  # handles are opaque
    everything = dataclasses.replace(prog, outputs=tuple(ast.Output(n) for n in shown))
    values = {**case.inputs, **ref_interp.run(everything, case.inputs)}
    known = diff.program_differences(bound, values) + diff.simple_reduce_differences(prog, bound)
    got = _on_peer(peer, case.source, case.inputs)
    floats = [np.finfo(t.dtype.numpy).eps for t in bound.types.values() if t.dtype.is_float]
    tol = Tolerance(case.exact, case.ulps, case.length, float(max(floats, default=0.0)))
    problem = str(got) if isinstance(got, Exception) else compare(want, got, tol)
    if problem is not None:
        explains = [d for d in known if _outcome(got, want) in d.shows]
        assert explains, (
            f"PlaidML differs and no documented deviation explains it: {problem}\n"
            f"(documented, but not shown so: {', '.join(map(str, known)) or 'none'})\n{case.source}"
        )
        event(f"expected difference: {explains[0]}")


@given(elementwise())
def test_drawn_elementwise_agree(peer, case):
    agree_but_for_documented_deviations(peer, case)


@given(mixed())
def test_drawn_mixed_programs_agree(peer, case):
    agree_but_for_documented_deviations(peer, case)


# ----------------------------------------------------------------------------- named cases


@dataclass
class V:
    """PlaidML or we answer these values (exactly; nan matches nan)."""

    dtype: str
    values: object

    def check(self, arr: np.ndarray, what: str) -> None:
        want = np.asarray(self.values, dtype=self.dtype)
        assert arr.dtype == want.dtype and arr.shape == want.shape, (what, arr.dtype, arr.shape)
        assert np.array_equal(arr, want, equal_nan=arr.dtype.kind == "f"), (what, arr.tolist())


@dataclass
class Garbage:
    """PlaidML answers with this dtype and shape but reads uninitialised memory: values unasserted."""

    dtype: str
    shape: tuple

    def check(self, arr: np.ndarray, what: str) -> None:
        assert (arr.dtype, arr.shape) == (np.dtype(self.dtype), self.shape), what


class Fails:
    """PlaidML gives no result: ``kind`` is abort, hang or error; ``texts`` are in its message or log."""

    def __init__(self, kind: str, *texts: str):
        self.kind, self.texts = kind, texts


@dataclass
class Raises:
    """Our documented error."""

    error: type
    text: str


def f32(*v):
    return np.array(v, np.float32)


def i32(*v):
    return np.array(v, np.int32)


def i8(*v):
    return np.array(v, np.int8)


def u8(*v):
    return np.array(v, np.uint8)


def b(*v):
    return np.array(v, bool)


FMAX, DMAX = float(np.finfo(np.float32).max), float(np.finfo(np.float64).max)
IMIN = int(np.iinfo(np.int32).min)
NAN = float("nan")
ABORT = Fails("abort")


def fn(inputs: str, body: str) -> str:
    return f"function ({inputs}) -> (O) {{ {body} }}"


STRIDE2 = fn("I[N]", "O[2*i: 2*N] = %s(I[i]);")
SAME = "O[i: N] = =(A[j]);"
JOINT = "O[i - j + 2*k: 3] = +(A[i - j - k, i + j])"
A33 = np.arange(1, 10, dtype=np.float32).reshape(3, 3)
# fmt: off
# name: (source, inputs, what PlaidML does, what we do); the number is the item of docs/semantics.md §10
DEVIATIONS = {
    "1-skipped-product-holds-1": (STRIDE2 % "*", {"I": f32(2, 3, 4)},
                                  V("float32", [2, 1, 3, 1, 4, 0]), V("float32", [2, 0, 3, 0, 4, 0])),
    "1-skipped-max-holds-int-min": (STRIDE2 % ">", {"I": i32(1, 2, 3)},
                                    V("int32", [1, IMIN, 2, IMIN, 3, 0]), V("int32", [1, 0, 2, 0, 3, 0])),
    "1-skipped-min-holds-flt-max": (STRIDE2 % "<", {"I": f32(1, 2, 3)},
                                    V("float32", [1, FMAX, 2, FMAX, 3, 0]), V("float32", [1, 0, 2, 0, 3, 0])),
    "1-skipped-max-float64-holds-dbl-max": (STRIDE2 % ">", {"I": np.array([1.0, 2.0])},
                                            V("float64", [1, -DMAX, 2, 0]), V("float64", [1, 0, 2, 0])),
    "1-skipped-min-int8-holds-127": (STRIDE2 % "<", {"I": i8(1, 2)},
                                     V("int8", [1, 127, 2, 0]), V("int8", [1, 0, 2, 0])),
    "1-skipped-with-default": (fn("A[N], D[M]", "O[2*i: 2*N] = *(A[i]) default D;"),
                               {"A": f32(1, 2, 3), "D": np.full(6, 7, np.float32)},
                               V("float32", [1, 1, 2, 1, 3, 7]), V("float32", [1, 7, 2, 7, 3, 7])),
    "2-assign-last-write-wins": (fn("A[N]", SAME), {"A": f32(1, 2, 3)}, V("float32", [3, 3, 3]),
                                 Raises(TileRuntimeError, "`=` writes O[0] more than once")),
    "3-empty-index-space": (fn("A[N]", "O[i: N] = +(A[i - 7]);"), {"A": f32(1, 2, 3)},
                            ABORT, Raises(TileIndexError, "no index tuple of 'O' is valid")),
    "4-unbounded-index": (fn("I[N]", "O[i: N] = +(I[i + j - k]);"), {"I": f32(1, 2, 3)},
                          Fails("hang"), Raises(TileIndexError, "unbounded")),
    "5-constraint-only-index": (fn("A[N]", "O[i: N] = +(A[i]), j < 2;"), {"A": f32(1, 2)},
                                ABORT, Raises(TileIndexError, "appears only in a constraint")),
    "6-zero-size-output": (fn("A[N]", "O[i: 0] = +(A[i]);"), {"A": f32(1, 2)}, ABORT, V("float32", [])),
    "7-max-nan-depends-on-order": (fn("A, B", "O = max(A, B);"), {"A": f32(NAN, 1), "B": f32(1, NAN)},
                                   V("float32", [NAN, 1]), V("float32", [NAN, NAN])),
    "8-bare-eq-combination": (fn("A[N], B[N]", "O[i: N] = +(A[i] == B[i]);"),
                              {"A": f32(1, 0, -1), "B": f32(1, 0, 0)}, ABORT, V("int32", [1, 1, 0])),
    "9-plus-conditional-is-eq": (fn("A[N], B[N]", "O[i: N] = +(A[i] + B[i] ? B[i]);"),
                                 {"A": f32(1, 2, 3), "B": f32(1, 0, 3)},
                                 V("float32", [1, 0, 3]), Raises(TileSyntaxError, "the conditional form is")),
    "11-bool-equals-uint8-compares-in-bool": (fn("A", "O = (A > 0) == A;"), {"A": u8(3, 1, 0)},
                                              V("bool", [1, 1, 1]), V("bool", [0, 1, 1])),
    "12-exp-of-int": (fn("A", "O = exp(A);"), {"A": i32(0)}, ABORT, V("float32", [1])),
    "12-relu-of-int": (fn("A", "O = relu(A);"), {"A": i32(-1, 2)}, V("float32", [0, 2]), V("int32", [0, 2])),
    "13-float-literal-is-float32": (fn("A", "O = A * 0.1;"), {"A": np.ones(1)},
                                    V("float64", [np.float32(0.1)]), V("float64", [0.1])),
    "14-int-literal-over-int32": (fn("A", "O = A + 2147483648;"), {"A": i32(1)},
                                  V("int32", [-2147483647]), V("int64", [2147483649])),
    "16-float-condition-truncated": (fn("C, A, B", "O = C ? A : B;"),
                                     {"C": f32(-0.5, 0.75, 1.5, 0), "A": f32(1), "B": f32(2)},
                                     V("float32", [2, 2, 1, 2]), V("float32", [1, 1, 1, 2])),
    "16-as-bool-of-float": (fn("C", "O = as_bool(C);"), {"C": f32(-0.5, 0.75, 1.5, 0)},
                            V("bool", [0, 0, 1, 0]), V("bool", [1, 1, 1, 0])),
    "17-gather-needs-int32": (fn("A, I", "O = gather(A, I);"), {"A": f32(1, 2, 3), "I": np.array([0, 2])},
                              Fails("error", "must be INT32"), V("float32", [1, 3])),
    "18-reshape-grows": (fn("A", "O = reshape(A, 2, 2);"), {"A": f32(1, 2, 3)},
                         Garbage("float32", (2, 2)), Raises(TileShapeError, "changes the element count")),
    "20-output-without-input": (fn("A[N]", "O = N;"), {"A": f32(1, 2, 3)}, ABORT, V("int32", 3)),
    "22-or-binds-tighter-than-xor": (fn("A, B, C", "O = A | B ^ C;"), {"A": i32(1), "B": i32(2), "C": i32(3)},
                                     V("int32", [0]), V("int32", [1])),
    "24-bang-is-ignored": (fn("A", "O = !A;"), {"A": f32(1, 2)},
                           V("float32", [1, 2]), Raises(TileSyntaxError, "unexpected character '!'")),
    "25-syntax-error-is-out-of-memory": (fn("A", "O = A + ;"), {"A": f32(1)},
                                         Fails("error", "ResourceExhausted: Out of memory", "unexpected ;"),
                                         Raises(TileSyntaxError, "expected an expression")),
    "25-unknown-function-aborts": (fn("A", "O = foo(A);"), {"A": f32(1)},
                                   ABORT, Raises(TileNameError, "unknown function")),
    "25-bit-op-on-float-aborts": (fn("A", "O = A & A;"), {"A": f32(1)},
                                  ABORT, Raises(TileTypeError, "needs integer or bool operands")),
    "26-int-division-by-zero-element-traps": (fn("A, B", "O = A / B;"), {"A": i32(5, -5), "B": i32(2, 0)},
                                              Fails("abort", "signal 8"), V("int32", [2, 0])),
    "26-int-division-by-literal-zero-is-0": (fn("A", "O = A / 0;"), {"A": i32(5, -5)},
                                             V("int32", [0, 0]), V("int32", [0, 0])),
    "27-int-x-over-x-is-1": (fn("A", "O = A / A;"), {"A": i32(5, 0)}, V("int32", [1, 1]), V("int32", [1, 0])),
    "28-bool-plus-int8-aborts": (fn("A, B", "O = A + B;"), {"A": b(1, 0), "B": i8(1, 2)},
                                 ABORT, V("int8", [2, 2])),
    "28-int8-plus-bool-is-int8": (fn("A, B", "O = B + A;"), {"A": b(1, 0), "B": i8(1, 2)},
                                  V("int8", [2, 2]), V("int8", [2, 2])),
    "28-bool-plus-bool-aborts": (fn("A, B", "O = A + B;"), {"A": b(1, 1), "B": b(1, 0)},
                                 ABORT, V("int32", [2, 1])),
    "28-bool-times-int32-is-int32": (fn("A", "O = (A > 1) * A;"), {"A": i32(0, 2)},
                                     V("int32", [0, 2]), V("int32", [0, 2])),
    "28-bool-less-than-bool-aborts": (fn("A", "O = (A > 1) < (A > 2);"), {"A": i32(0, 2)},
                                      ABORT, V("bool", [0, 0])),
    "28-bit-not-of-bool-aborts": (fn("A", "O = ~(A > 1);"), {"A": i32(0, 2)}, ABORT, V("bool", [1, 0])),
    "28-abs-of-bool-aborts": (fn("A", "O = abs(A > 1);"), {"A": i32(0, 2)}, ABORT, V("bool", [0, 1])),
    "28-relu-of-bool-is-float32": (fn("A", "O = relu(A > 1);"), {"A": i32(0, 2)},
                                   V("float32", [0, 1]), V("bool", [0, 1])),
    "29-asinh-missing": (fn("A", "O = asinh(A);"), {"A": f32(0)}, ABORT, V("float32", [0])),
    "30-unsigned-min-aggregation-is-0": (fn("A[N]", "O[i: N] = <(A[i]);"), {"A": u8(1, 2, 3)},
                                         V("uint8", [0, 0, 0]), V("uint8", [1, 2, 3])),
    "31-float16-max-aggregation-aborts": (fn("A[N]", "O[i: N] = >(A[i]);"),
                                          {"A": np.array([1, 2], np.float16)}, ABORT, V("float16", [1, 2])),
    "32-max-aggregation-drops-nan": (fn("A[N]", "O[] = >(A[i]);"), {"A": f32(1, NAN)},
                                     V("float32", 1.0), V("float32", NAN)),
    "33-index-along-size-1-aborts": (fn("A", "O = index(A, 1);"), {"A": np.ones((2, 1), np.int8)},
                                     ABORT, V("int32", [[0], [0]])),
    "33-index-along-size-2": (fn("A", "O = index(A, 0);"), {"A": np.ones((2, 1), np.int8)},
                              V("int32", [[0], [1]]), V("int32", [[0], [1]])),
    "34-bit-and-of-different-widths-aborts": (fn("A, B", "O = A & B;"), {"A": i8(6), "B": i32(3)},
                                              Fails("abort", "not of the same type"), V("int32", [2])),
    "34-bit-and-with-a-literal-aborts": (fn("A", "O = A & 2;"), {"A": i32(6)},
                                         Fails("abort", "and i32"), V("int32", [2])),
    "34-bit-and-of-int64-and-literal": (fn("A", "O = A & 2;"), {"A": np.array([6], np.int64)},
                                        V("int64", [2]), V("int64", [2])),
    "35-bit-result-converts-unsigned": (fn("A", "O = as_float(A & A, 64);"), {"A": i32(-3, 5)},
                                        V("float64", [4294967293, 5]), V("float64", [-3, 5])),
    "35-bit-result-compares-unsigned": (fn("A", "O = (A & A) < 0;"), {"A": i8(-3, 5)},
                                        V("bool", [0, 0]), V("bool", [1, 0])),
    "35-bit-result-as-condition-aborts": (fn("A", "O = (A & A) ? 1 : 0;"), {"A": i32(-3, 0)},
                                          ABORT, V("int32", [1, 0])),
    "36-max-tie-takes-right-type": (fn("A, B", "O = max(A, B);"), {"A": u8(3), "B": i8(-2)},
                                    V("int8", [-2]), V("uint8", [254])),
    "36-min-tie-takes-left-type": (fn("A, B", "O = min(A, B);"), {"A": u8(3), "B": i8(2)},
                                   V("uint8", [2]), V("uint8", [2])),
    "37-pinned-combination-aborts": (fn("A, B", "O[i + 2*j + 2*k: 1] = +(A[i, j] * B[j - k]);"),
                                     {"A": f32(2, 1).reshape(1, 2), "B": f32(5)}, ABORT, V("float32", [10])),
    "37-runs-when-not-pinned": (fn("A, B", "O[i + 2*j + 2*k: 1] = +(A[i, j] * B[j - k]);"),
                                {"A": f32(2, 1).reshape(1, 2), "B": f32(5, 7)},
                                V("float32", [10]), V("float32", [10])),
    "40-select-combination-type": (fn("A, B, C", "O[] = +(A[i] == B[i] ? C[i]);"),
                                   {"A": f32(2), "B": f32(2), "C": i32(3)}, V("float32", 3), V("int32", 3)),
    "31-float16-softmax-aborts": (fn("A", "O = builtin_softmax(A, 1, 2);"),
                                  {"A": np.array([[0, 0]], np.float16)}, ABORT, V("float16", [[0.5, 0.5]])),
    "12-float16-relu-is-float32": (fn("A", "O = relu(A);"), {"A": np.array([-1, 2], np.float16)},
                                   V("float32", [0, 2]), V("float16", [0, 2])),
    "42-exp-of-float16-aborts": (fn("A", "O = exp(A);"), {"A": np.array([0], np.float16)},
                                 ABORT, V("float16", [1])),
    "42-floor-of-float16-aborts": (fn("A", "O = floor(A);"), {"A": np.array([2.5], np.float16)},
                                   ABORT, V("float16", [2])),
    "41-sum-of-bools-aborts": (fn("A", "O[] = +(A[i]);"), {"A": b(1, 0, 1)}, ABORT, V("int32", 2)),
    "41-assign-of-bools-runs": (fn("A[N]", "O[i: N] = =(A[i]);"), {"A": b(1, 0, 1)},
                                V("bool", [1, 0, 1]), V("bool", [1, 0, 1])),
    "39-int-condition-is-its-low-bit": (fn("C", "O = as_bool(C);"), {"C": i32(0, 1, 2, 3, -2, 256)},
                                        V("bool", [0, 1, 0, 1, 0, 0]), V("bool", [0, 1, 1, 1, 1, 1])),
    "39-int-select-is-its-low-bit": (fn("C", "O = C ? 1 : 0;"), {"C": i32(2, 3)},
                                     V("int32", [0, 1]), V("int32", [1, 1])),
    "38-as-float16-aborts": (fn("A", "O = as_float(A, 16);"), {"A": f32(2.5)}, ABORT, V("float16", [2.5])),
    "38-float16-arithmetic-runs": (fn("A", "O = A + A;"), {"A": np.array([1.5], np.float16)},
                                   V("float16", [3]), V("float16", [3])),
    "12-softmax-of-int-aborts": (fn("A", "O = builtin_softmax(A, 1, 2);"), {"A": i32(1, 1).reshape(1, 2)},
                                 ABORT, V("float32", [[0.5, 0.5]])),
    # (checked by enumerating i, j, k in -20..20 with numpy)
    "37-three-joint-indices-abort": (fn("A", JOINT + ";"), {"A": A33}, ABORT, V("float32", [4, 5, 16])),
    "37-runs-with-j-bounded": (fn("A", JOINT + ", j < 3;"), {"A": A33},
                               V("float32", [4, 5, 9]), V("float32", [4, 5, 9])),
    "37-but-not-with-j-offset": (fn("A", JOINT + ", j + 1 < 4;"), {"A": A33},
                                 ABORT, V("float32", [4, 5, 16])),
    "bug-same-tensor-twice": (fn("A[N, K]", "O[i, j: N, N] = +(A[i, k] * A[j, k]);"),
                              {"A": f32(1, 2, 3, 4).reshape(2, 2)},
                              V("float32", [[5, 5], [25, 25]]), V("float32", [[5, 11], [11, 25]])),
    "bug-c1-minus-x-plus-c2": (fn("A", "O = 1.5 - A + 2.5;"), {"A": f32(1)},
                               V("float32", [5]), V("float32", [3])),
    "bug-0d-float-promotion-not-seen-through-tensors": (fn("C, X[]", "O = C + X;"),
                                                        {"C": i32(1), "X": np.array(1.5, np.float32)},
                                                        V("float32", [2.5]), V("float32", [2.5])),
}
# fmt: on


@pytest.mark.parametrize("name", list(DEVIATIONS))
def test_documented_deviation(peer, name):
    source, inputs, theirs, ours = DEVIATIONS[name]
    hang = isinstance(theirs, Fails) and theirs.kind == "hang"
    got = _on_peer(peer, source, inputs, timeout=3.0 if hang else None)
    if isinstance(theirs, Fails):
        assert isinstance(got, plaidml_peer.PeerError), f"PlaidML answered {got}"
        assert got.kind == theirs.kind and all(t in str(got) for t in theirs.texts), str(got)
    else:
        assert not isinstance(got, Exception), str(got)
        theirs.check(got["O"], "PlaidML")
    if isinstance(ours, Raises):
        with pytest.raises(ours.error, match=re.escape(ours.text)):
            _ours(source, inputs)
    else:
        ours.check(_ours(source, inputs)[2]["O"], "interpreter")
