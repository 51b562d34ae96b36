"""What the shape-generic kernel tests share: a fresh template registry per test, integer-valued
inputs, and a compiled program's generic-kernel report."""

from __future__ import annotations

import numpy as np
import pytest

from backends.llvm import generic


@pytest.fixture(autouse=True)
def fresh_registry():
    """Each test starts (and leaves) with no generic buckets or templates."""
    generic.REGISTRY.clear()
    yield
    generic.REGISTRY.clear()


def ints(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-3, 4, size=shape).astype(np.float32)


def assert_attention_close(got, q, k, r, v) -> None:
    """``got`` is ``softmax(Q K^T + R) V`` (``bench.compile_time.ATTENTION``) within the float32
    sums' bound of S + 8 points (S the sequence length), against float64 numpy."""
    n = q.shape[0]
    m = q.astype(np.float64) @ k.T + r
    e = np.exp(m - m.max(axis=1, keepdims=True))
    want = (e / e.sum(axis=1, keepdims=True)) @ v
    tol = 8 * (n + 8) * np.finfo(np.float32).eps * float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg=f"S={n}")


def generic_info(exe, *args) -> dict:
    """``library.extra["generic"]`` of ``exe`` compiled for these inputs."""
    return exe.prepare(*args).library.extra["generic"]
