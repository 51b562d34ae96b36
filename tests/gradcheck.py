"""Finite-difference gradient checks shared by the autodiff tests."""

from __future__ import annotations

import math

import numpy as np

import ref_interp
import tile
from ref_interp.run import input_types
from tile.bind import bind


def fd_grad(program, inputs: dict, wrt: str, seed: dict | None = None, h: float = 1e-6) -> np.ndarray:
    """Central differences of ``sum(seed[O] * O)`` (seed defaults to ones) w.r.t. ``inputs[wrt]``."""
    prog = tile.parse(program) if isinstance(program, str) else program
    bound = bind(prog, input_types(prog, inputs), inputs)
    seed = seed or {}
    x = np.asarray(inputs[wrt], np.float64)
    g = np.zeros(x.shape)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        up = ref_interp.run(bound, {**inputs, wrt: xp}, "float64")
        down = ref_interp.run(bound, {**inputs, wrt: xm}, "float64")
        g[idx] = sum(float(np.sum(seed.get(o, 1.0) * (up[o].astype(np.float64) - down[o].astype(np.float64))))
                     for o in up) / (2 * h)
    return g


def assert_close(got, want, length: int) -> None:
    """Within 1e-6 * (1 + |want|) * sqrt(length), ``length`` the longest reduction involved."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    tol = 1e-6 * (1 + np.abs(want)) * math.sqrt(max(length, 1))
    bad = np.abs(got - want) > tol
    assert not bad.any(), f"gradient {got[bad]} vs expected {want[bad]}"
