"""``conformance.optimized.check_passes``: each distinct program is verified and interpreted once,
and a wrong pass step is still reported at its step, in whichever config it is."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import tile
from conformance import optimized
from conformance.report import Tolerance
from stripe.lower import lower
from stripe.passes import PASSES
from tile.inputs import input_types

SOURCE = "function (X[N, M], Y[M]) -> (O, P) { O[i: N] = +(X[i, j] * Y[j]); P = X * 2 - Y; }"
OTHER = "function (X[N, M], Y[M]) -> (O, P) { O[i: N] = >(X[i, j] + Y[j]); P = X * 3 - Y; }"


def _bound(source: str, inputs: dict):
    prog = tile.parse(source)
    return tile.bind(prog, input_types(prog, inputs), inputs)


@pytest.fixture
def inputs():
    rng = np.random.default_rng(0)
    return {"X": rng.integers(-4, 5, (5, 3)).astype(np.int32), "Y": rng.integers(-4, 5, 3).astype(np.int32)}


def _failures(inputs) -> list[tuple[str, str]]:
    found = []
    optimized.check_passes(_bound(SOURCE, inputs), inputs, Tolerance(),
                           lambda target, problem, want, got: found.append((target, problem)))  # fmt: skip
    return found


def test_each_distinct_program_is_interpreted_once(inputs, monkeypatch):
    from ref_interp import stripe_exec

    runs = []
    real = stripe_exec.run_stripe
    monkeypatch.setattr(stripe_exec, "run_stripe", lambda p, x: (runs.append(p), real(p, x))[1])
    assert _failures(inputs) == []
    steps = sum(len(c.passes) for c in optimized.configs())
    checked = runs[1:]  # (runs[0]: the lowered program, the reference; a first step may equal it)
    assert len(checked) == len(set(checked))  # none twice
    assert len(runs) < steps / 3, (len(runs), steps)  # most steps change nothing on a small program


@pytest.mark.parametrize("which", [2, 7])  # cuda's, and the small variant of a later config
def test_a_wrong_step_is_reported_at_its_step(inputs, monkeypatch, which):
    """A pass that computes something else, only under one config's hardware: every config before
    it agrees, and the failure names that config and the step's name."""
    cfg = optimized.configs()[which]
    spec = cfg.passes[len(cfg.passes) // 2]
    info = PASSES[spec.pass_]
    wrong = lower(_bound(OTHER, inputs))

    def broken(program, params, hardware):
        result = info.fn(program, params, hardware)
        return wrong if hardware == cfg.hardware else result

    monkeypatch.setitem(PASSES, spec.pass_, replace(info, fn=broken))
    found = _failures(inputs)
    first = next(s for s in cfg.passes if s.pass_ == spec.pass_)
    assert [t for t, _ in found] == [f"stripe:{cfg.name}@{first.name}"]
    assert found[0][1].startswith(f"after pass step {first.name} ({spec.pass_}): ")
