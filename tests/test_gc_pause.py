"""``tile.gc_pause.paused_gc``: the collector is off inside, back as it was after (nested, across
threads, after an exception), and what compiles inside it is unchanged."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import tile
from bench.cases import long_chain, long_chain_ref
from tile.gc_pause import paused_gc


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_off_inside_and_back_after_nesting_and_errors(collector_on):
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner exit leaves the outer pause alone
    assert gc.isenabled()
    with pytest.raises(ValueError), paused_gc():
        raise ValueError("inside")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off(collector_on):
    gc.disable()
    with paused_gc():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_as_a_decorator(collector_on):
    @paused_gc()
    def state() -> bool:
        return gc.isenabled()

    assert state() is False and state() is False  # each call pauses afresh
    assert gc.isenabled()


def test_the_last_thread_to_leave_turns_it_back_on(collector_on):
    inside, leave = threading.Barrier(2), threading.Event()
    seen = []

    def worker():
        with paused_gc():
            inside.wait()
            leave.wait()
            seen.append(gc.isenabled())

    t = threading.Thread(target=worker)
    t.start()
    with paused_gc():
        inside.wait()
    assert not gc.isenabled()  # the worker is still inside
    leave.set()
    t.join()
    assert seen == [False] and gc.isenabled()


def test_a_chain_compiles_to_the_same_answer_with_the_collector_on_or_off(collector_on):
    a = np.arange(50, dtype=np.float32)
    src = long_chain(60)
    got = tile.compile(src, device="llvm_cpu.0", settings={"cache": False})(A=a)["O"]
    gc.disable()
    again = tile.compile(src, device="llvm_cpu.0", settings={"cache": False})(A=a)["O"]
    assert gc.isenabled() is False
    np.testing.assert_array_equal(got, long_chain_ref(a, 60))  # small integers: exact
    np.testing.assert_array_equal(again, got)
