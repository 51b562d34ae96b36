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


def generic_info(exe, *args) -> dict:
    """``library.extra["generic"]`` of ``exe`` compiled for these inputs."""
    return exe.prepare(*args).library.extra["generic"]
