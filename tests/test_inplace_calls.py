"""A numpy-in, numpy-out call on ``llvm_cpu.0`` copies nothing it need not (``backends.runner``):
inputs are read in place, outputs written into the arrays the call returns, and an output's memory
is reused by the next call only once the caller holds nothing over it. Every result is compared
exactly (small integers) with numpy; inputs are checked unchanged after every call."""

from __future__ import annotations

import numpy as np
import pytest

import tile

pytestmark = pytest.mark.usefixtures("private_cache")

DEV = "llvm_cpu.0"
MATMUL = """function (A[M, K], B[K, N]) -> (C, D) {
    C[m, n: M, N] = +(A[m, k] * B[k, n]);
    D = C * 2 + 1;
}"""


def ints(rng, shape):
    return rng.integers(-3, 4, shape).astype(np.float32)


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _compiled(exe):
    return next(iter(exe._compiled.values()))


def test_results_equal_and_inputs_unchanged():
    rng = np.random.default_rng(0)
    exe = tile.compile(MATMUL, DEV)
    for _ in range(3):
        a, b = ints(rng, (9, 13)), ints(rng, (13, 70))
        a0, b0 = a.copy(), b.copy()
        got = exe(A=a, B=b)
        np.testing.assert_array_equal(got["C"], a0 @ b0)
        np.testing.assert_array_equal(got["D"], (a0 @ b0) * 2 + 1)
        np.testing.assert_array_equal(a, a0)
        np.testing.assert_array_equal(b, b0)
        assert got["C"].flags.c_contiguous and got["C"].flags.writeable
        assert not np.shares_memory(got["C"], a) and not np.shares_memory(got["C"], got["D"])


def test_a_dropped_output_is_reused_a_held_one_never():
    rng = np.random.default_rng(1)
    exe = tile.compile(MATMUL, DEV)
    a, b = ints(rng, (8, 8)), ints(rng, (8, 8))
    first = exe(A=a, B=b)["C"]
    second = exe(A=a + 1, B=b)["C"]  # ``first`` is held: new memory
    assert not np.shares_memory(first, second)
    np.testing.assert_array_equal(first, a @ b)
    where = _address(second)
    del second
    third = exe(A=a - 1, B=b)["C"]  # dropped: its memory is written again, no allocation
    assert _address(third) == where
    np.testing.assert_array_equal(third, (a - 1) @ b)
    view = third[2:, 1:]  # a view keeps the memory the caller's
    kept = view.copy()
    del third
    fourth = exe(A=a + 2, B=b)["C"]
    np.testing.assert_array_equal(view, kept)
    np.testing.assert_array_equal(fourth, (a + 2) @ b)
    assert not np.shares_memory(view, fourth)


def test_a_loop_that_keeps_the_last_result_reuses_two_arrays():
    """``out = exe(x)`` in a loop holds the last result while the next call runs: the calls
    alternate between two arrays' memory, each result intact while it is held."""
    exe = tile.compile("function (X) -> (Y) { Y = X + 1; }", DEV)
    x = np.arange(50, dtype=np.float32)
    seen = set()
    out = None
    for k in range(6):
        last = out
        out = exe(X=x + k)["Y"]
        np.testing.assert_array_equal(out, x + k + 1)
        if last is not None:
            np.testing.assert_array_equal(last, x + k)  # the previous result, not overwritten
            assert not np.shares_memory(last, out)
        del last
        seen.add(_address(out))
    assert len(seen) == 2


def test_an_output_given_back_as_an_input():
    """The last call's output as this call's input: it is the caller's, so the output of this
    call goes elsewhere, and reading it in place is safe."""
    rng = np.random.default_rng(2)
    twice = tile.compile("function (X) -> (Y) { Y = X + X; }", DEV)
    x = ints(rng, (5, 6))
    y = twice(X=x)["Y"]
    z = twice(X=y)["Y"]
    np.testing.assert_array_equal(z, 4 * x)
    np.testing.assert_array_equal(y, 2 * x)
    nested = twice(X=twice(X=x)["Y"])["Y"]  # the inner result held only by the call's arguments
    np.testing.assert_array_equal(nested, 4 * x)


def test_inputs_that_need_a_copy():
    """One array for two inputs, a transposed (not contiguous) one, one of another dtype, and one
    misaligned in memory: each still gives the right answer and stays unchanged."""
    rng = np.random.default_rng(3)
    exe = tile.compile("function (X[N, N], Y[N, N]) -> (O) { O[i, j: N, N] = +(X[i, k] * Y[k, j]); }", DEV)
    a = ints(rng, (6, 6))
    raw = np.zeros(a.nbytes + 1, np.uint8)
    odd = raw[1:].view(np.float32).reshape(6, 6)  # 1 byte past an aligned address
    odd[...] = a
    assert not odd.flags.aligned
    cases = [(a, a), (a.T, a[:, ::-1]), (a.astype(np.float64), a), (odd, a)]
    for x, y in cases:
        x0, y0 = np.array(x, copy=True), np.array(y, copy=True)
        got = exe(X=x, Y=y)["O"]
        want = x0.astype(np.float32) @ y0
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(x, x0)
        np.testing.assert_array_equal(y, y0)


def test_out_and_resident_calls_keep_their_buffers():
    """With ``out=`` or ``resident`` the call returns before its kernels end: inputs are copied
    and outputs never written into numpy memory handed out before."""
    rng = np.random.default_rng(4)
    exe = tile.compile(MATMUL, DEV)
    a, b = ints(rng, (5, 7)), ints(rng, (7, 3))
    plain = exe(A=a, B=b)
    res = exe(A=a + 1, B=b, resident=True)
    C = tile.empty((5, 3), np.float32, DEV)
    exe(A=a - 1, B=b, out={"C": C})
    np.testing.assert_array_equal(plain["C"], a @ b)
    np.testing.assert_array_equal(res["C"].numpy(), (a + 1) @ b)
    np.testing.assert_array_equal(C.numpy(), (a - 1) @ b)


def test_zeroed_outputs_start_from_zero_in_reused_memory():
    """An output the contraction writes only in part (every other element) reads zero elsewhere
    in reused memory too, after the caller scribbled on the array it dropped."""
    exe = tile.compile("function (A[N]) -> (O) { O[2 * i: 2 * N] = +(A[i]); }", DEV)
    a = np.arange(1, 5, dtype=np.float32)
    want = np.zeros(8, np.float32)
    want[::2] = a
    for k in range(3):
        got = exe(A=a + k)["O"]
        np.testing.assert_array_equal(got, want + np.where(want != 0, k, 0))
        got[...] = 99  # the caller scribbles on it, then drops it
        del got
    assert "O" in {n for n, _ in _compiled(exe)._handed}


def test_host_buffers_start_zeroed_on_a_cache_line_and_live_while_viewed():
    """Small host buffers come from malloc, large ones (``MAPPED_BYTES`` on) are mappings of their
    own; either way zeroed, on a cache line, and kept alive by views of them (the runner's reuse
    test counts references to ``data``, which views hold)."""
    import mmap
    import sys

    from backends.hal import LINE, MAPPED_BYTES, HostBuffer

    for n in (1, 100, 4099, MAPPED_BYTES + 5):
        buf = HostBuffer(n)
        assert buf.size == n and buf.data.size == n and buf.address % LINE == 0
        assert not buf.data.any() and buf.data.flags.writeable
        assert isinstance(buf.data.base.obj, mmap.mmap) == (n >= MAPPED_BYTES)
        view = buf.data[n // 2 :].view(np.uint8)
        refs = sys.getrefcount(buf.data)  # the buffer's, the view's, getrefcount's argument
        assert view.base is buf.data and refs == 3
        del buf
        view[:] = 7  # still the buffer's memory, alive through the view
        assert (view == 7).all()


def test_a_small_input_read_in_place_keeps_the_kernels_bound():
    """The same small array again (refilled by the caller between calls) keeps its view and the
    kernels their binding: no rebinding per call; another array gets a view of its own; a large
    input's view is not held after the call (its memory is the caller's to free)."""
    from backends.runner import VIEW_REUSE_BYTES

    rng = np.random.default_rng(5)
    exe = tile.compile(MATMUL, DEV)
    a, b = ints(rng, (4, 6)), ints(rng, (6, 5))
    exe(A=a, B=b)
    prog = _compiled(exe)
    views, bound = dict(prog._views), list(prog._bound)
    for _ in range(3):
        a[...] = ints(rng, a.shape)  # new values, same memory: read in place as they are now
        got = exe(A=a, B=b)
        np.testing.assert_array_equal(got["C"], a @ b)
        assert prog._views == views and all(x is y for x, y in zip(prog._bound, bound))
        del got  # (a held output makes the next call write elsewhere, rebinding its kernels)
    other = a.copy()
    np.testing.assert_array_equal(exe(A=other, B=b)["C"], other @ b)
    assert prog._views["A"].address == _address(other) and prog._views["B"] is views["B"]
    big = ints(rng, (VIEW_REUSE_BYTES // 4 // 6 + 1, 6))
    exe_big = tile.compile(MATMUL, DEV)
    np.testing.assert_array_equal(exe_big(A=big, B=b)["C"], big @ b)
    assert "A" not in _compiled(exe_big)._views and "B" in _compiled(exe_big)._views


def test_a_loop_dropping_results_keeps_one_output_buffer_after_held_ones():
    """After calls whose results were held (each wrote a fresh buffer), a loop that drops each
    result writes the last call's buffer every time: the kernels stay bound."""
    rng = np.random.default_rng(6)
    exe = tile.compile(MATMUL, DEV)
    a, b = ints(rng, (4, 6)), ints(rng, (6, 5))
    held = [exe(A=a, B=b) for _ in range(4)]
    del held
    exe(A=a, B=b)
    prog = _compiled(exe)
    bound = list(prog._bound)
    for _ in range(3):
        np.testing.assert_array_equal(exe(A=a, B=b)["C"], a @ b)
        assert all(x is y for x, y in zip(prog._bound, bound))
