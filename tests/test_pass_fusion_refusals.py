"""The ``fusion`` pass refuses what would change a program's meaning: a consumer reading what the
producer writes at another point, breaking ownership, writing what the producer reads or writes,
specials and local allocations (Before = Expected in Stripe text)."""

from __future__ import annotations

from stripe.parser import parse_stripe
from stripe.printer import format_block
from tests.pass_support import check_rewrite, lowered
from tests.test_pass_fusion import MERGE


def assert_refused(before_text: str, params: dict | None = None) -> None:
    check_rewrite("fusion", params or {}, before_text, before_text)


def test_refuses_shifted_read():
    """B reads T[i + 1]: at outer point i it would read what A writes only at i + 1."""
    before = lowered("function (X[N]) -> (R) { T = X * X; R[i : 3] = =(T[i + 1]); }", {"X": (4,)})
    assert_refused(format_block(before))


def test_refuses_transposed_read_that_breaks_ownership():
    """B reads T both as T[x, y] and T[y, x]: no outer point owns both elements."""
    src = "function (X[N, M]) -> (R) { T = X + X; R[x, y : N, M] = +(T[x, y] * T[y, x]); }"
    assert_refused(format_block(lowered(src, {"X": (3, 3)})))


TWO_KERNELS = """
0: #program block [] ( // program
    #input #output #user none X[0] fp32(3:1)
    #tmp none T[0] fp32(3:1)
    #output #user none O[0] fp32(3:1)
) {
  0: #main block [] ( // main
      inout X[0] fp32(3:1)
      inout T[0] fp32(3:1)
      out O[0] fp32(3:1)
  ) {
    0: #kernel block [i:3] ( // k0_T
        in X[A_READ] fp32(1:1)
        out T[i]:assign fp32(1:1)
        out O[i]:add fp32(1:1)
    ) {
      0: $X = load(X)
      1: T = store($X)
      2: O = store($X)
    }
    1: #kernel block [i:3] ( // k1
        in T[i] fp32(1:1)
        out B_OUT[i]:add fp32(1:1)
    ) {
      0: $T = load(T)
      1: B_OUT = store($T)
    }
  }
}
"""


def test_refuses_consumer_writing_what_producer_reads():
    """At outer point 2, A would read X[0], which B already changed at point 0."""
    assert_refused(TWO_KERNELS.replace("A_READ", "-i + 2").replace("B_OUT", "X"))


def test_refuses_consumer_writing_what_producer_writes():
    assert_refused(TWO_KERNELS.replace("A_READ", "i").replace("B_OUT", "O"))


def test_refuses_specials_and_local_allocations():
    local = MERGE.replace("in W = X[j] fp32(1:1)", "in W = X[j] fp32(1:1)\n        none L[0] fp32(1:1)")
    assert_refused(local)
    copy = """#kernel #special block [] ( // k1_R
        in T[0] fp32(3:1)
        out R[0]:assign fp32(3:1)
    ) {
      0: R = copy(T)
    }
    """
    assert_refused(format_block(parse_stripe(MERGE[: MERGE.index("#kernel block [j:3]")] + copy + "}}")))
