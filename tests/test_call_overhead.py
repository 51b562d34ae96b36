"""What the runner keeps between calls to cut their host work: kernels bound to the last call's
buffers (``Kernel.bind``, rebound when a call passes others), the compiled program picked by the
inputs' shapes and dtypes without typing them again, and dependencies without repeats.

Results are compared exactly with numpy on small-integer inputs."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import tile
from backends.hal import Event
from backends.runner import pending
from tests.opencl_support import DEVICE_ID as OPENCL

pytestmark = pytest.mark.usefixtures("private_cache")

DEVICES = [
    "llvm_cpu.0",
    pytest.param(OPENCL, marks=pytest.mark.skipif(OPENCL is None, reason="no usable OpenCL device")),
]

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n: M, N] = +(A[m, k] * B[k, n]); }"
ROW_SUM = "function (A[M, N]) -> (O) { O[i: M] = +(A[i, j]); }"


def ints(rng, shape):
    return rng.integers(-3, 4, shape).astype(np.float32)


@pytest.mark.parametrize("dev", DEVICES)
def test_other_tensors_rebind_the_kernels(dev):
    """Tensor A, then tensor B, then A again, into one out= tensor and then another: each call
    computes on the tensors it was given, not on the ones the kernels were bound to before."""
    exe = tile.compile(MATMUL, device=dev)
    rng = np.random.default_rng(0)
    a, b, a2, b2 = ints(rng, (5, 7)), ints(rng, (7, 3)), ints(rng, (5, 7)), ints(rng, (7, 3))
    A, B, A2, B2 = (tile.tensor(x, device=dev) for x in (a, b, a2, b2))
    out1, out2 = tile.empty((5, 3), device=dev), tile.empty((5, 3), device=dev)
    for x, y, X, Y, out in [
        (a, b, A, B, out1),
        (a, b, A, B, out1),  # the same buffers: the bound kernels are launched as they are
        (a2, b, A2, B, out1),
        (a2, b2, A2, B2, out2),
        (a, b, A, B, out1),
        (b2.T.copy(), a2.T.copy(), None, None, out2),  # numpy inputs of other shapes: another build
        (a2, b, A2, B, out2),
    ]:
        if X is None:
            got = exe(A=x, B=y)["C"]
        else:
            got = exe(A=X, B=Y, out={"C": out})["C"].numpy()
        np.testing.assert_array_equal(got, x @ y)
    # numpy inputs (read in place on the CPU: a new buffer each call) and tensors, alternating
    for _ in range(3):
        x, y = ints(rng, (5, 7)), ints(rng, (7, 3))
        np.testing.assert_array_equal(exe(A=x, B=y)["C"], x @ y)
        np.testing.assert_array_equal(exe(A=A, B=B, out={"C": out1})["C"].numpy(), a @ b)


@pytest.mark.parametrize("dev", DEVICES)
def test_a_plain_run_between_bound_launches(dev):
    """A kernel run directly on other buffers sets its arguments: the runner's binding must set
    its own again before the next launch (OpenCL keeps arguments on the kernel object)."""
    exe = tile.compile(ROW_SUM, device=dev)
    rng = np.random.default_rng(1)
    a, other = ints(rng, (6, 9)), ints(rng, (6, 9))
    A, out = tile.tensor(a, device=dev), tile.empty((6,), device=dev)
    np.testing.assert_array_equal(exe(A=A, out={"O": out})["O"].numpy(), a.sum(1))
    cp = exe._last
    ex = cp.device.executor
    bufs = {n: ex.allocate(A.nbytes if n == "A" else cp.buffers[n].elements * 4) for n in cp.buffers}
    bufs["A"].write(other.reshape(-1).view(np.uint8)).wait()
    events: list[Event] = []
    for info, kernel in zip(cp.infos, cp.kernels):
        events = [kernel.run([bufs[b] for b in info.buffers], events)]
    got = bufs["O"].read(events).view(np.float32)
    np.testing.assert_array_equal(got, other.sum(1))
    np.testing.assert_array_equal(exe(A=A, out={"O": out})["O"].numpy(), a.sum(1))


@pytest.mark.parametrize("dev", DEVICES)
def test_bound_kernels_keep_no_tensor_alive(dev):
    """The bindings hold weak references: a tensor the caller drops is freed, and a new tensor
    (which may reuse its memory) is bound afresh."""
    exe = tile.compile(ROW_SUM, device=dev)
    rng = np.random.default_rng(2)
    out = tile.empty((4,), device=dev)
    for _ in range(3):
        a = ints(rng, (4, 5))
        A = tile.tensor(a, device=dev)
        np.testing.assert_array_equal(exe(A=A, out={"O": out})["O"].numpy(), a.sum(1))
        gone = weakref.ref(A._buffer)
        del A
        gc.collect()
        assert gone() is None


def test_quick_key_picks_the_program_for_the_shapes():
    """The compiled program is found again from the inputs' shapes and dtypes; other shapes or
    dtypes, or a tensor for an array, never reuse a program built for others."""
    exe = tile.compile(ROW_SUM, device="llvm_cpu.0")
    rng = np.random.default_rng(3)
    for shape, dtype in [((3, 4), np.float32), ((3, 5), np.float32), ((3, 4), np.int32),
                         ((3, 4), np.float32), ((3, 5), np.float32)]:
        a = rng.integers(-3, 4, shape).astype(dtype)
        got = exe(A=a)["O"]
        assert got.dtype == dtype and got.shape == (shape[0],)
        np.testing.assert_array_equal(got, a.sum(1))
        np.testing.assert_array_equal(exe(A=tile.tensor(a))["O"], a.sum(1))
    assert len(exe._compiled) == 3


def test_size_inputs_are_keyed_by_value():
    """A 0-D input used as a size picks the program by its value: no quick key for it."""
    src = "function (A[N], K) -> (O) { O[i: K] = +(A[i]); }"
    exe = tile.compile(src, device="llvm_cpu.0")
    a = np.arange(6, dtype=np.float32)
    for k in (2, 3, 2):
        got = exe(A=a, K=np.int32(k))["O"]
        np.testing.assert_array_equal(got, a[:k])
    assert not exe._quick


def test_pending_drops_repeats_and_finished_events():
    done, a, b = Event.done(), Event(), Event()
    a._future = b._future = object()  # stand-ins for events still running
    assert pending([done, a, done, a, b, a]) == [a, b]
    assert pending([done]) == [] and pending([a]) == [a] and pending([]) == []


@pytest.mark.parametrize("dev", DEVICES)
def test_a_host_write_between_calls_is_waited_for(dev):
    """A call depends on the events of the tensors it is given: when a tensor still holds the last
    call's events the call skips them (the last call's work is waited for anyway), but a host
    write since (``Tensor.write``) is a new event, and the call reads what it wrote."""
    exe = tile.compile(ROW_SUM, device=dev)
    rng = np.random.default_rng(4)
    a = ints(rng, (6, 5))
    A = tile.tensor(a, device=dev)
    for _ in range(3):
        np.testing.assert_array_equal(exe(A=A, resident=True)["O"].numpy(), a.sum(1))
        assert A._events == exe._last._last  # read by that call: its events, as the program's
        a = ints(rng, (6, 5))
        A.write(a)
        assert A._events != exe._last._last
    out = tile.empty((6,), device=dev)
    for _ in range(2):  # out= tensors too: written by the host between calls, rewritten by the call
        out.write(np.full(6, 99, np.float32))
        np.testing.assert_array_equal(exe(A=A, out={"O": out})["O"].numpy(), a.sum(1))


@pytest.mark.parametrize("dev", DEVICES)
def test_tile_debug_set_between_calls_of_one_program(dev, monkeypatch, capsys):
    """TILE_DEBUG is read at every call (its unset case by a quicker test): set between two calls
    of one compiled program it prints that call's kernels, unset again it prints nothing."""
    exe = tile.compile(ROW_SUM, device=dev)
    A = tile.tensor(np.ones((4, 3), np.float32), device=dev)
    monkeypatch.delenv("TILE_DEBUG", raising=False)
    exe(A=A, resident=True)["O"].wait()
    assert "tile: kernel" not in capsys.readouterr().err
    for value, prints in (("1", True), ("0", False), ("2", True)):
        monkeypatch.setenv("TILE_DEBUG", value)
        exe(A=A, resident=True)["O"].wait()
        assert ("tile: kernel" in capsys.readouterr().err) is prints, value
    monkeypatch.delenv("TILE_DEBUG")
    np.testing.assert_array_equal(exe(A=A, resident=True)["O"].numpy(), np.full(4, 3, np.float32))
    assert "tile: kernel" not in capsys.readouterr().err


def test_inputs_of_other_kinds_are_arrays_and_the_mapping_is_the_callers():
    """Lists, scalars and numpy scalars become arrays; a positional mapping and keyword arrays
    merge, and the caller's mapping is left as it was."""
    exe = tile.compile("function (A[N], B) -> (O) { O = A * B; }", device="llvm_cpu.0")
    given = {"A": [1.0, 2.0, 3.0]}
    got = exe(given, B=np.float32(2))["O"]
    np.testing.assert_array_equal(got, np.array([2.0, 4.0, 6.0]))
    assert given == {"A": [1.0, 2.0, 3.0]}
    np.testing.assert_array_equal(exe(A=np.arange(3.0), B=3.0)["O"], np.arange(3.0) * 3)


@pytest.mark.parametrize("dev", DEVICES)
def test_a_loop_keeping_the_last_result_swaps_two_bindings(dev, monkeypatch):
    """A loop ``r = exe(...)`` holds the last result while the next call runs, so the output
    alternates between two buffers: each kernel keeps its binding before the last and swaps back
    to it, binding nothing after the second call; other tensors are bound afresh and computed on."""
    exe = tile.compile(ROW_SUM, device=dev)
    rng = np.random.default_rng(5)
    a, b = ints(rng, (6, 5)), ints(rng, (6, 5))
    A, B = tile.tensor(a, device=dev), tile.tensor(b, device=dev)
    r = exe(A=A, resident=True)
    binds: list[int] = []
    for k, kernel in enumerate(exe._last.kernels):
        counted = lambda params, bind=kernel.bind, k=k: binds.append(k) or bind(params)  # noqa: E731
        monkeypatch.setattr(kernel, "bind", counted)
    outputs = set()
    for i in range(6):
        r = exe(A=A, resident=True)
        np.testing.assert_array_equal(r["O"].numpy(), a.sum(1))
        outputs.add(id(r["O"]._buffer))
        if i == 0:
            after_second = list(binds)
    assert len(outputs) == 2 and binds == after_second
    for x, X in ((b, B), (a, A), (b, B)):
        r = exe(A=X, resident=True)
        np.testing.assert_array_equal(r["O"].numpy(), x.sum(1))
