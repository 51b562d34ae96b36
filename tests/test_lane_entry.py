"""A small lane's native call as a Python builtin (backends/llvm/pyentry.py, ``Lane._one_call``):
made after ``NATIVE_AFTER`` calls for a lane of little work on ``llvm_cpu``, with the plan's
results; refused for a lane of much work (it would hold the GIL through it)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the lanes are reached through tile.torch")
tt = pytest.importorskip("tile.torch", reason="the lanes are reached through tile.torch")

from backends.lane import ENTRY_ELEMENTS, NATIVE_AFTER  # noqa: E402
from backends.runner import CompiledProgram  # noqa: E402
from tests.torch_routes import in_threads  # noqa: E402
from tile.torch_lane import signature  # noqa: E402


def ints(*shape, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).integers(-3, 4, shape)).float()


def _lane(op, *tensors):
    return op._lanes[signature(tensors)].lane


def test_a_small_lane_runs_through_its_entry_with_the_plans_results(monkeypatch):
    mul = tt.op("function (A[N], B[N]) -> (C) { C = A * B + A; }", name="entry_small")
    a, b = ints(5), ints(5, seed=1)
    mul(a, b)
    lane = _lane(mul, a, b)
    for _ in range(NATIVE_AFTER):
        assert lane._entry is None  # (built only once the lane has run NATIVE_AFTER times)
        assert torch.equal(mul(a, b), a * b + a)
    assert lane._entry is not None and lane.native

    def refuse(*args, **kwargs):
        raise AssertionError("the general path ran")

    monkeypatch.setattr(CompiledProgram, "run", refuse)
    monkeypatch.setattr(lane, "_plan", [])  # (a call that passes ran the entry, not the plan)
    for seed in range(3):
        a, b = ints(5, seed=seed + 2), ints(5, seed=seed + 5)
        assert torch.equal(mul(a, b), a * b + a)


def test_the_entry_checks_its_arguments():
    add = tt.op("function (A[N], B[N]) -> (C) { C = A + B; }", name="entry_args")
    a, b = ints(2), ints(2, seed=1)
    for _ in range(NATIVE_AFTER + 1):
        add(a, b)
    entry = _lane(add, a, b)._entry.fn
    with pytest.raises(TypeError, match="takes 3 addresses"):
        entry(a.data_ptr(), b.data_ptr())
    with pytest.raises(TypeError):
        entry(a.data_ptr(), b.data_ptr(), "not an address")
    out = torch.empty(2)
    assert entry(a.data_ptr(), b.data_ptr(), out.data_ptr()) is True
    assert torch.equal(out, a + b)


def test_a_lane_of_much_work_keeps_its_plan():
    n = ENTRY_ELEMENTS  # (three buffers of n elements: over the limit)
    add = tt.op("function (A[N], B[N]) -> (C) { C = A + B; }", name="entry_big")
    a, b = ints(n), ints(n, seed=1)
    for _ in range(NATIVE_AFTER + 1):
        assert torch.equal(add(a, b), a + b)
    assert _lane(add, a, b)._entry is None


def test_an_entry_passes_the_lanes_temporaries():
    """A program with a temporary (``T``): its address is fixed in the entry, after the call's."""
    src = """function (A[N, M]) -> (O) {
        T[i: N] = +(A[i, j]);
        O[i: N] = +(T[i] * A[i, j]);
    }"""
    f = tt.op(src, name="entry_temporary")
    for seed in range(NATIVE_AFTER + 4):
        a = ints(3, 5, seed=seed)
        assert torch.equal(f(a), a.sum(1) * a.sum(1))
    lane = _lane(f, a)
    assert lane._fixed and lane._entry is not None


def test_threads_calling_one_lane_get_their_own_results():
    """The entry's array is on its stack; the sequence's tables are shared, and the lane's lock
    serializes calls: four threads calling one op at one signature each get their own sums."""
    add = tt.op("function (A[N], B[N]) -> (C) { C = A + B; }", name="entry_threads")
    a, b = ints(4), ints(4, seed=1)
    for _ in range(NATIVE_AFTER + 1):
        add(a, b)
    assert _lane(add, a, b)._entry is not None
    wrong = []

    def work(seed):
        for i in range(300):
            x, y = ints(4, seed=seed), torch.full((4,), float(i))
            if not torch.equal(add(x, y), x + y):
                wrong.append((seed, i))

    in_threads(work)
    assert not wrong
