"""``TILE_POISON_BUFFERS=1``: new output and temporary buffers start as 0xFF bytes, so a target
whose kernels leave an element unwritten shows a wrong value (the conformance suite sets it)."""

from __future__ import annotations

import numpy as np
import pytest

import tile
from backends import registry
from backends.hal import Device, Event, Executor, Kernel
from backends.runner import POISON_ENV, allocate

TARGETS = [d for d in ("llvm_cpu.0", "opencl_cpu.0") if d in registry.devices()]


@pytest.mark.parametrize("device", TARGETS)
def test_a_poisoned_buffer_starts_as_ones(device, monkeypatch):
    ex = registry.get(device).executor
    monkeypatch.setenv(POISON_ENV, "1")
    assert (allocate(ex, 40).read() == 0xFF).all()
    monkeypatch.setenv(POISON_ENV, "0")
    allocate(ex, 40)  # unpoisoned: whatever the memory held (nothing to assert on its contents)


class _Idle(Kernel):
    """A kernel that writes nothing (a target that forgot the work)."""

    def __init__(self, inner: Kernel):
        self.info = inner.info

    def run(self, params, deps=()) -> Event:
        return Event.done(0.0)


class _IdleExecutor(Executor):
    def __init__(self, inner: Executor):
        self.inner = inner
        self.host_memory = getattr(inner, "host_memory", False)

    def allocate(self, size: int):
        return self.inner.allocate(size)

    def copy(self, src, src_offset, dst, dst_offset, length, deps=()):
        return self.inner.copy(src, src_offset, dst, dst_offset, length, deps)

    def prepare(self, library, index):
        return _Idle(self.inner.prepare(library, index))


class _IdleDevice(Device):
    def __init__(self, inner: Device):
        self.id, self.description = "idle_cpu.0", "kernels that write nothing (a test fixture)"
        self.capabilities, self.compiler = inner.capabilities, inner.compiler
        self.executor = _IdleExecutor(inner.executor)


@pytest.mark.skipif("llvm_cpu.0" not in registry.devices(), reason="the idle device wraps llvm_cpu.0")
def test_an_unwritten_output_shows_as_poison(monkeypatch):
    monkeypatch.setitem(registry.devices(), "idle_cpu.0", _IdleDevice(registry.get("llvm_cpu.0")))
    monkeypatch.setenv(POISON_ENV, "1")
    src = "function (X) -> (O) { O = X + 1; }"
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    for _ in range(2):  # the second call's buffers are the first's: still never written
        got = tile.compile(src, "idle_cpu.0", {"cache": False})({"X": x})["O"]
        assert (got == -1).all(), got
