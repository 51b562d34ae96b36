"""The ONNX lane on llvm_cpu.0 runs its kernels as one native call (backends/llvm/sequence.py)
where each runs as one chunk on the calling thread: the same kernels on the same addresses, so the
results are the per-kernel plan's bits; a kernel split over threads keeps the per-kernel plan."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="tile.onnx needs the onnx package (pip install -e '.[onnx]')")

from backends.lane import NATIVE_AFTER, Lane  # noqa: E402
from backends.llvm.sequence import NativeSequence  # noqa: E402
from tests.test_onnx_lane import expected, model  # noqa: E402
from tile.onnx.backend import Backend  # noqa: E402


def _lane(rep):
    (lane,) = rep._lanes.values()
    return lane


def test_the_lane_runs_its_kernels_as_one_native_call(monkeypatch):
    monkeypatch.delenv("TILE_DEBUG", raising=False)
    m, w, b = model()
    rep = Backend.prepare(m, "llvm_cpu.0", settings={"threads": 1})
    rng = np.random.default_rng(5)
    xs = [rng.integers(-4, 5, (8, 64)).astype(np.float32) for _ in range(3)]
    for _ in range(NATIVE_AFTER + 1):  # (the first call is the general path's)
        rep.run([xs[0]])
    plan = _lane(rep).lane._plan
    assert len(plan) == 1 and isinstance(plan[0][0], NativeSequence)
    assert len(_lane(rep).lane.program._order) > 1  # (several kernels behind the one call)
    monkeypatch.setattr(Lane, "_one_call", lambda *a: None)  # the same model, kernel by kernel
    per_kernel = Backend.prepare(m, "llvm_cpu.0", settings={"threads": 1})
    per_kernel.run([xs[0]])
    assert len(_lane(per_kernel).lane._plan) > 1
    for x in xs:
        y, mx = rep.run([x])
        y2, mx2 = per_kernel.run([x])
        np.testing.assert_array_equal(y, expected(x, w, b)[0])
        np.testing.assert_array_equal(mx, expected(x, w, b)[1])
        np.testing.assert_array_equal(y, y2)
        np.testing.assert_array_equal(mx, mx2)


def test_a_kernel_split_over_threads_keeps_the_per_kernel_plan(monkeypatch):
    monkeypatch.delenv("TILE_DEBUG", raising=False)
    m, w, b = model(k=512, n=512)
    x = np.random.default_rng(6).integers(-4, 5, (8, 512)).astype(np.float32)
    rep = Backend.prepare(m, "llvm_cpu.0", settings={"threads": 2, "min_parallel_points": 1})
    rep.run([x])
    if _lane(rep) is None:  # (seen on a 2-core AVX2 host: one kernel's stack past 64 KiB)
        pytest.skip("no raw lane for this model here: a kernel's stack passes the inline allowance "
                    "(backends/llvm/inline_blocks.py) at this host's vector width, so it runs on the "
                    "dispatcher thread and Lane.of declines the program")
    program = _lane(rep).lane.program
    if all(len(program.kernels[k].ranges()) == 1 for k in program._order):
        pytest.skip("no kernel of this program splits over 2 threads here (its schedule keeps one chunk)")
    plan = _lane(rep).lane._plan
    assert not any(isinstance(go, NativeSequence) for go, _ in plan)
    y, mx = rep.run([x])
    np.testing.assert_array_equal(y, expected(x, w, b)[0])


def test_read_only_and_fresh_inputs_take_the_lane_with_exact_results(monkeypatch):
    """The lane reads an input's address through the buffer protocol, or through
    ``__array_interface__`` where the array is read-only; an input at a constant's address or
    twice the same memory still goes the general way."""
    monkeypatch.delenv("TILE_DEBUG", raising=False)
    m, w, b = model()
    rep = Backend.prepare(m, "llvm_cpu.0", settings={"threads": 1})
    x = np.random.default_rng(8).integers(-4, 5, (8, 64)).astype(np.float32)
    rep.run([x])
    lane = _lane(rep)
    frozen = x.copy()
    frozen.setflags(write=False)
    for arr in (x, frozen):
        out = lane({"x": arr})
        assert out is not None
        (y, mx) = (out[n] for n in lane.names)
        np.testing.assert_array_equal(y, expected(x, w, b)[0])
        np.testing.assert_array_equal(mx, expected(x, w, b)[1])
    constant = next(f for f in lane.feeds if isinstance(f, int))
    assert constant in lane.fixed
    assert lane({"x": x[:, ::2]}) is None  # (strided: the general path)
