"""Device-resident tensors (``tile.tensor``, ``out=``, ``resident=``) and the runner's reuse of a
program's buffers across calls, on ``llvm_cpu.0`` and the OpenCL test device (PoCL here).

Every result is compared exactly with numpy or the interpreter on small-integer inputs; reuse is
checked by calls with different inputs giving independent results, and by a returned tensor
staying as it was through later calls."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

import ref_interp
import tile
from tests.opencl_support import DEVICE_ID as OPENCL
from tile.errors import TileInputError

pytestmark = pytest.mark.usefixtures("private_cache")

DEVICES = [
    "llvm_cpu.0",
    pytest.param(OPENCL, marks=pytest.mark.skipif(OPENCL is None, reason="no usable OpenCL device")),
]

MATMUL = """function (A[M, K], B[K, N]) -> (C, D) {
    C[m, n: M, N] = +(A[m, k] * B[k, n]);
    D = C * 2 + 1;
}"""
# a max with a default (an accumulator temporary and a mask), a product, an elementwise chain
MIXED = """function (A[M, K], B[K], F[M]) -> (X, P, E) {
    X[m: M] = >(A[m, k] * B[k]) default F;
    P[k: K] = *(A[m, k]);
    E = exp(A * 0) + A - 1;
}"""


def ints(rng, shape, lo=-3, hi=4, dtype=np.float32):
    return rng.integers(lo, hi, shape).astype(dtype)


def _matmul_inputs(seed):
    rng = np.random.default_rng(seed)
    return ints(rng, (5, 7)), ints(rng, (7, 3))


@pytest.mark.parametrize("dev", DEVICES)
def test_calls_with_different_inputs_give_independent_results(dev):
    """The buffers are reused: results never leak from one call into the next."""
    exe = tile.compile(MIXED, device=dev)
    rng = np.random.default_rng(1)
    for _ in range(3):
        feed = {"A": ints(rng, (4, 6)), "B": ints(rng, (6,)), "F": ints(rng, (4,))}
        got = exe(feed)
        want = ref_interp.run(MIXED, feed)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    cp = next(iter(exe._compiled.values()))
    # one allocation per buffer, kept (host-memory kernels read numpy inputs where they are and
    # write numpy outputs into the arrays they return, whose memory is reused once dropped)
    direct = set(feed) | set(want) if dev == "llvm_cpu.0" else set()
    assert set(cp._owned) == set(cp.buffers) - direct
    assert {n for n, r in cp._handed if not r} == (set(want) if dev == "llvm_cpu.0" else set())


@pytest.mark.parametrize("dev", DEVICES)
def test_numpy_outputs_are_copies(dev):
    exe = tile.compile(MATMUL, device=dev)
    a, b = _matmul_inputs(0)
    first = exe(A=a, B=b)
    exe(A=a + 1, B=b)
    np.testing.assert_array_equal(first["C"], a @ b)


@pytest.mark.parametrize("dev", DEVICES)
def test_resident_inputs_and_outputs(dev):
    exe = tile.compile(MATMUL, device=dev)
    a, b = _matmul_inputs(2)
    A, B = tile.tensor(a, device=dev), tile.tensor(b, device=dev)
    assert (A.shape, A.dtype, A.device) == ((5, 7), np.dtype(np.float32), dev)
    r1 = exe(A=A, B=B, resident=True)
    assert isinstance(r1["C"], tile.Tensor) and r1["C"].device == dev and r1["C"].shape == (5, 3)
    r2 = exe(A=a + 2, B=B, resident=True)  # numpy and tensor inputs mixed
    np.testing.assert_array_equal(r1["C"].numpy(), a @ b)  # not overwritten by the next call
    np.testing.assert_array_equal(r1["D"].numpy(), (a @ b) * 2 + 1)
    np.testing.assert_array_equal(r2["C"].numpy(), (a + 2) @ b)
    np.testing.assert_array_equal(np.asarray(r2["D"]), ((a + 2) @ b) * 2 + 1)
    # an output tensor is an input of the next program
    twice = tile.compile("function (X) -> (Y) { Y = X + X; }", device=dev)
    np.testing.assert_array_equal(twice(X=r1["C"])["Y"], 2 * (a @ b))


@pytest.mark.parametrize("dev", DEVICES)
def test_resident_outputs_setting(dev):
    exe = tile.compile(MATMUL, device=dev, settings={"resident_outputs": True})
    a, b = _matmul_inputs(3)
    got = exe(A=a, B=b)
    assert isinstance(got["C"], tile.Tensor)
    assert isinstance(exe(A=a, B=b, resident=False)["C"], np.ndarray)
    np.testing.assert_array_equal(got["C"].numpy(), a @ b)


@pytest.mark.parametrize("dev", DEVICES)
def test_out_writes_into_the_given_tensor(dev):
    exe = tile.compile(MATMUL, device=dev)
    a, b = _matmul_inputs(4)
    C = tile.empty((5, 3), np.float32, device=dev)
    got = exe(A=tile.tensor(a, dev), B=b, out={"C": C})
    assert got["C"] is C and isinstance(got["D"], np.ndarray)
    np.testing.assert_array_equal(C.numpy(), a @ b)
    exe(A=a - 1, B=b, out={"C": C})  # the same tensor again: overwritten, as asked
    np.testing.assert_array_equal(C.numpy(), (a - 1) @ b)


@pytest.mark.parametrize("dev", DEVICES)
def test_out_may_alias_an_input(dev):
    """``W = W - G`` in place, and a contraction reading the tensor it writes: the input is
    copied first, so every kernel sees the old values."""
    rng = np.random.default_rng(5)
    w, g = ints(rng, (6, 6)), ints(rng, (6, 6))
    W = tile.tensor(w, dev)
    step = tile.compile("function (W, G) -> (O) { O = W - G; }", device=dev)
    step(W=W, G=g, out={"O": W})
    step(W=W, G=g, out={"O": W})
    np.testing.assert_array_equal(W.numpy(), w - 2 * g)
    square = tile.compile("function (A[N, N]) -> (O) { O[i, j: N, N] = +(A[i, k] * A[k, j]); }", dev)
    before = W.numpy()
    square(A=W, out={"O": W})
    np.testing.assert_array_equal(W.numpy(), before @ before)


@pytest.mark.parametrize("dev", DEVICES)
def test_one_tensor_for_two_inputs(dev):
    rng = np.random.default_rng(6)
    a = ints(rng, (4, 4))
    A = tile.tensor(a, dev)
    exe = tile.compile("function (X[N, N], Y[N, N]) -> (O) { O[i, j: N, N] = +(X[i, k] * Y[k, j]); }", dev)
    np.testing.assert_array_equal(exe(X=A, Y=A)["O"], a @ a)
    np.testing.assert_array_equal(exe(X=a, Y=a)["O"], a @ a)  # one numpy array: read in place once
    np.testing.assert_array_equal(exe(X=a.T, Y=a[:, ::-1])["O"], a.T @ a[:, ::-1])  # not contiguous


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.uint16, np.bool_, np.int64])
def test_tensor_round_trip(dev, dtype):
    rng = np.random.default_rng(7)
    arr = rng.integers(0, 2 if dtype is np.bool_ else 5, (3, 5)).astype(dtype)
    t = tile.tensor(arr, dev)
    assert t.dtype == np.dtype(dtype) and t.nbytes == arr.nbytes and t.ndim == 2
    np.testing.assert_array_equal(t.numpy(), arr)
    t.write(arr[::-1])
    np.testing.assert_array_equal(t.numpy(), arr[::-1])
    zero_d = tile.tensor(np.asarray(3, dtype), dev)
    assert zero_d.shape == () and zero_d.numpy() == np.asarray(3, dtype)
    assert "tile.Tensor(shape=(3, 5)" in repr(t)


@pytest.mark.parametrize("dev", DEVICES)
def test_tensor_misuse_is_a_clear_error(dev):
    exe = tile.compile(MATMUL, device=dev)
    a, b = _matmul_inputs(8)
    C = tile.empty((5, 3), np.float32, dev)
    with pytest.raises(TileInputError, match=r"out= for 'C' is a float32\[3, 5\].*output is float32\[5, 3\]"):
        exe(A=a, B=b, out={"C": tile.empty((3, 5), np.float32, dev)})
    with pytest.raises(TileInputError, match=r"out= for 'C' is a int32\[5, 3\]"):
        exe(A=a, B=b, out={"C": tile.empty((5, 3), np.int32, dev)})
    with pytest.raises(TileInputError, match=r"(?s)out= names 'Z'.*outputs are: C, D"):
        exe(A=a, B=b, out={"Z": C})
    with pytest.raises(TileInputError, match=r"must be a tile.Tensor, not ndarray"):
        exe(A=a, B=b, out={"C": np.zeros((5, 3), np.float32)})
    with pytest.raises(TileInputError, match="one tensor for two outputs"):
        exe(A=a, B=b, out={"C": C, "D": C})
    with pytest.raises(TileInputError, match="cannot write an array of shape"):
        C.write(np.zeros((2, 2)))
    with pytest.raises(TileInputError, match="no device 'nope.0'"):
        tile.tensor(a, device="nope.0")
    with pytest.raises(TileInputError, match="interpreter has no device memory"):
        tile.tensor(a, device="interp")
    with pytest.raises(TileInputError, match="the interpreter takes numpy arrays"):
        tile.compile(MATMUL, "interp")(A=tile.tensor(a, dev), B=b)
    np.testing.assert_array_equal(exe(A=a, B=b)["C"], a @ b)  # still usable after the refusals


@pytest.mark.skipif(OPENCL is None, reason="no usable OpenCL device")
def test_tensor_of_another_device_is_refused():
    a, b = _matmul_inputs(9)
    exe = tile.compile(MATMUL, device="llvm_cpu.0")
    with pytest.raises(TileInputError, match=f"'A' is a tensor on {OPENCL}, but this program runs"):
        exe(A=tile.tensor(a, OPENCL), B=b)
    with pytest.raises(TileInputError, match=f"out= for 'C' is a float32\\[5, 3\\] on {OPENCL}"):
        exe(A=a, B=b, out={"C": tile.empty((5, 3), np.float32, OPENCL)})


def test_zero_size_and_zero_d_tensors():
    exe = tile.compile("function (A[N]) -> (O) { O = A * 2; }", "llvm_cpu.0")
    empty = tile.tensor(np.zeros(0, np.float32))
    got = exe(A=empty, resident=True)
    assert got["O"].shape == (0,) and got["O"].numpy().size == 0
    scalar = tile.compile("function (A) -> (O) { O = A + 1; }", "llvm_cpu.0")
    assert scalar(A=tile.tensor(np.float32(2)))["O"] == 3


@pytest.mark.parametrize("dev", DEVICES)
def test_structural_outputs_are_rebuilt_every_call(dev):
    """scatter adds into an output it must first zero; gather and reshape overwrite theirs: reused
    buffers hold the last call's values, so each call must start them again."""
    src = """function (V[N, C], I[N], L[M], D[R, C]) -> (S, G, Z) {
        S = scatter(V, I, L);
        G = gather(D, I);
        Z = reshape(S, 2, M * C / 2);
    }"""
    exe = tile.compile(src, dev)
    rng = np.random.default_rng(10)
    for _ in range(3):
        feed = {"V": ints(rng, (5, 4)), "I": rng.integers(-1, 4, 5).astype(np.int32),
                "L": np.zeros(3, np.float32), "D": ints(rng, (3, 4))}
        got, want = exe(feed), ref_interp.run(src, feed)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("dev", DEVICES)
def test_a_loop_over_resident_calls_reuses_two_buffers(dev):
    """``y = exe(x, resident=True)`` in a loop holds the last tensor while the next call runs:
    the calls alternate between two buffers, each result intact while it is held, and a tensor
    the caller keeps is never written again."""
    exe = tile.compile("function (X) -> (Y) { Y = X + 1; }", device=dev)
    x = np.arange(50, dtype=np.float32)
    kept = exe(X=x - 10, resident=True)["Y"]
    seen = []  # weak references: a strong one would hold the buffer
    out = None
    for k in range(6):
        last = out
        out = exe(X=tile.tensor(x + k, device=dev), resident=True)["Y"]
        np.testing.assert_array_equal(out.numpy(), x + k + 1)
        if last is not None:
            np.testing.assert_array_equal(last.numpy(), x + k)  # the previous result, not overwritten
            assert last._buffer is not out._buffer
        del last
        seen.append(weakref.ref(out._buffer))
    alive = {id(r()) for r in seen if r() is not None}  # the runner keeps what it reuses
    assert all(r() is not None for r in seen) and len(alive) == 2 and id(kept._buffer) not in alive
    np.testing.assert_array_equal(kept.numpy(), x - 9)


@pytest.mark.skipif(OPENCL is None, reason="no usable OpenCL device")
def test_an_out_tensor_is_zeroed_where_the_program_starts_from_zeros(monkeypatch):
    """An output the runner would zero-fill in its own buffer (``backends.zeroing`` cannot prove
    the kernels write all of it: here a triangular matmul, whose constraint leaves elements
    unwritten) is zero-filled in an ``out=`` tensor too, after an input copied from the same
    tensor."""
    src = "function (A[N, N]) -> (O) { O[i, j: N, N] = +(A[i, k] * A[k, j]), i + j < N; }"
    square = tile.compile(src, OPENCL)
    rng = np.random.default_rng(6)
    w = ints(rng, (20, 20))
    assert "O" in square.prepare(A=w).zeroed
    W = tile.tensor(w, OPENCL)
    fills = []
    zero = W._buffer.zero
    monkeypatch.setattr(W._buffer, "zero", lambda deps=(): fills.append(len(deps)) or zero(deps))
    square(A=W, out={"O": W})
    assert len(fills) == 1
    i, j = np.indices((20, 20))
    np.testing.assert_array_equal(W.numpy(), np.where(i + j < 20, w @ w, 0))
