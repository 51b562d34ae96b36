"""OpenCL profiling is opt-in: calls go to a plain queue; ``profile()`` and ``TILE_DEBUG`` time
kernels on the device's profiling queue (``driver.Driver.profiling``), and what a caller holds
stays as the call left it."""

from __future__ import annotations

import numpy as np
import pytest

import tile
from backends import registry
from backends.hal import Event

pyopencl = pytest.importorskip("pyopencl")

DEV = "opencl_cpu.0"
SUM = "function (X[N]) -> (S) { S[] = +(X[i]); }"


def _device():
    try:
        return registry.get(DEV)
    except tile.TileError as e:
        pytest.skip(f"no {DEV}: {str(e).splitlines()[0]}")


def profiled(event) -> bool:
    props = event.cl_event.command_queue.properties
    return bool(props & pyopencl.command_queue_properties.PROFILING_ENABLE)


def test_calls_are_not_profiled_and_profile_still_times_the_kernels():
    _device()
    exe = tile.compile(SUM, device=DEV)
    x = tile.tensor(np.arange(1024, dtype=np.float32) % 7, device=DEV)
    want = float((np.arange(1024) % 7).sum())
    r = exe(X=x, resident=True)["S"]
    launched = exe._last._launched
    assert launched and not any(profiled(e) for e in launched)
    with pytest.raises(ValueError, match="not profiled"):
        _ = launched[-1].duration
    x.write(np.ones(1024, np.float32))  # profile() must not recompute r from the new values
    prof = exe.profile()
    assert [n for n, _ in prof] == [exe._last.symbol(k) for k in range(len(exe._last.infos))]
    assert all(s >= 0 for _, s in prof) and sum(s for _, s in prof) > 0
    assert exe.profile() == prof  # the same profile until the next call
    assert r.numpy() == want
    again = exe(X=x, resident=True)["S"]  # the kernels are bound to the call's buffers again
    assert again.numpy() == 1024 and r.numpy() == want
    assert not any(profiled(e) for e in exe._last._launched)


def test_the_profiled_rerun_reads_the_inputs_as_they_are(monkeypatch):
    """Its scratch copy of an input holds the input's values (kernels can run faster on zeros),
    and the caller's tensors keep theirs."""
    dev = _device()
    exe = tile.compile(SUM, device=DEV)
    x = tile.tensor(np.arange(1024, dtype=np.float32) % 7, device=DEV)
    r = exe(X=x, resident=True)["S"]
    x.write(np.full(1024, 3, np.float32))
    made = []
    allocate = dev.executor.allocate
    monkeypatch.setattr(dev.executor, "allocate", lambda size: made.append(allocate(size)) or made[-1])
    exe.profile()
    (scratch_x,) = [b for b in made if b.size == 4096]
    np.testing.assert_array_equal(scratch_x.read().view(np.float32), np.full(1024, 3, np.float32))
    assert r.numpy() == float((np.arange(1024) % 7).sum())


def test_tile_debug_calls_are_profiled(monkeypatch, capsys):
    _device()
    exe = tile.compile(SUM, device=DEV)
    x = np.arange(100, dtype=np.float32)
    exe(X=x)
    monkeypatch.setenv("TILE_DEBUG", "1")
    assert exe(X=x)["S"] == x.sum()
    assert all(profiled(e) for e in exe._last._launched)
    assert "tile: kernel" in capsys.readouterr().err
    monkeypatch.delenv("TILE_DEBUG")
    assert exe(X=x)["S"] == x.sum()
    assert not any(profiled(e) for e in exe._last._launched)


def test_the_queues_keep_commands_in_order_across_a_switch():
    dev = _device()
    ex = dev.executor
    src, dst = ex.allocate(4000), ex.allocate(4000)
    data = np.arange(1000, dtype=np.float32).view(np.uint8)
    up = src.unmap(data.copy())  # not blocking, on the plain queue
    with ex.profiled():
        copied = ex.copy(src, 0, dst, 0, 4000, [up])
        assert profiled(copied)
        with ex.profiled():  # nests
            pass
    assert copied.duration >= 0
    assert dev.queue is dev.plain
    np.testing.assert_array_equal(dst.read([copied]), data)
    assert isinstance(dst.zero(), Event) and not dst.read().any()
