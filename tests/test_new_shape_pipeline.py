"""A new shape's cost on ``llvm_cpu.0`` (issue 40, ``bench.new_shapes``): a program of microsecond
kernels (``backends.llvm.opt_level.opt_level`` 1) is built without LLVM's loop unrolling, which was
about half of its passes' and machine code's time at a new sequence length; the arithmetic is the
same, so every result is bit-identical to the unrolled build's, strict or not, on random floats.
``unroll`` (a setting) says otherwise either way and is part of the object key."""

from __future__ import annotations

import numpy as np
import pytest

import tile
from backends.llvm.cache import ObjectCache, unpack_entry
from bench.compile_time import ATTENTION

pytestmark = pytest.mark.usefixtures("private_cache")


def _feed(program, s: int, seed: int) -> dict[str, np.ndarray]:
    """Standard normal float32 inputs of every input of ``program`` at sequence length ``s``."""
    rng = np.random.default_rng(seed)
    shapes = {"Q": (s, 8), "K": (s, 8), "R": (s, s), "V": (s, 8)}
    parsed = tile.parse(program) if isinstance(program, str) else program
    names = [i.name for i in parsed.inputs]
    return {n: rng.standard_normal(shapes.get(n, (s, 8))).astype(np.float32) for n in names}


def _built(program, x: dict, settings: dict) -> tuple[dict, int, str, int]:
    """Outputs, the LLVM pipeline level, the object key and the object's size in bytes."""
    exe = tile.compile(program, "llvm_cpu.0", settings)
    out = exe(x)
    extra = exe._last.library.extra
    entry = ObjectCache(extra["cache_key"]).load()
    assert entry is not None, "the object cache stored the object"
    return out, extra["opt"], extra["cache_key"], len(unpack_entry(entry)[2])


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("gradient", [False, True])
def test_small_programs_build_without_unrolling_and_compute_the_same(strict, gradient):
    program = tile.grad(ATTENTION) if gradient else ATTENTION
    x = _feed(program, 21, seed=int(strict) + 2 * int(gradient))
    plain, opt, key, size = _built(program, x, {"strict": strict})
    unrolled, opt_u, key_u, size_u = _built(program, x, {"strict": strict, "unroll": True})
    assert opt == opt_u == 1  # microsecond kernels: the cheaper pipeline
    assert key != key_u  # the setting is in the object key
    assert size < size_u  # the loops were not unrolled (the counted loops' copies are gone)
    for name, want in unrolled.items():  # bit for bit (the float32 words compared as integers)
        got = np.asarray(plain[name])
        np.testing.assert_array_equal(got.view(np.uint32), np.asarray(want).view(np.uint32))
    if not gradient:  # and within float32 rounding of float64 numpy
        q, k, r, v = (x[n].astype(np.float64) for n in "QKRV")
        m = q @ k.T + r
        p = np.exp(m - m.max(axis=1, keepdims=True))
        want = (p / p.sum(axis=1, keepdims=True)) @ v
        tol = 8 * (21 + 8) * np.finfo(np.float32).eps * np.abs(want).max()
        np.testing.assert_allclose(plain["O"], want, rtol=0, atol=tol)


def test_larger_programs_still_unroll_unless_told():
    x = _feed(ATTENTION, 72, seed=5)  # 72 * 72 * 8 products: above the small-kernel bound
    default, opt, key, size = _built(ATTENTION, x, {})
    rolled, opt_r, key_r, size_r = _built(ATTENTION, x, {"unroll": False})
    assert opt == opt_r == 3
    assert key != key_r and size_r < size
    for name, want in default.items():  # integer-free inputs, reassociation allowed: ulps apart
        tol = 8 * (72 + 8) * np.finfo(np.float32).eps * np.abs(want).max()
        np.testing.assert_allclose(rolled[name], want, rtol=0, atol=tol)
