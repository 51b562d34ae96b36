"""The two routes a ``tile.torch`` op's hot call takes (``tile.torch_hot``), as a fixture: the
tests of a module using ``call_route`` run once on each, their ops named apart (``op`` keeps one
op per name).

* ``python``: no call is compiled (``COMPILED_CALLS`` off): the hot path's Python functions.
* ``compiled``: a lane's entry, hence its compiled call (``compiled_call``), after 2 runs of the
  lane, not ``NATIVE_AFTER``: a test's third call at a signature is the compiled one's, so
  every guard the module shows declining declines through it too (its tensors checked as one,
  ``_guards``); ``compiled-reads``: the same, each tensor's facts read one by one.
"""

from __future__ import annotations

import threading

import pytest


@pytest.fixture(params=["python", "compiled", "compiled-reads"])
def call_route(request, monkeypatch):
    import backends.lane as lane_module
    import tile.torch as tt
    import tile.torch_hot as hot_module

    route = request.param
    if route == "python":
        monkeypatch.setattr(hot_module, "COMPILED_CALLS", False)
    else:
        monkeypatch.setattr(lane_module, "NATIVE_AFTER", 2)
        monkeypatch.setattr(hot_module, "TENSOR_GUARDS", route == "compiled")
    make = tt.op

    def named_apart(source, *, name=None, **kwargs):
        return make(source, name=name and f"{name}_{route.replace('-', '_')}", **kwargs)

    monkeypatch.setattr(tt, "op", named_apart)
    return route


def in_threads(work, count: int = 4) -> None:
    """Runs ``work(seed)`` for seeds ``0 .. count - 1`` on as many threads at once, and waits."""
    threads = [threading.Thread(target=work, args=(s,)) for s in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
