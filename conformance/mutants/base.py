"""What a seeded defect is: a named, systematic rewrite of what a real device generates, at one
level (the optimized Stripe kernels, the LLVM IR text, the OpenCL C source), with a witness.

A rewrite returns its input unchanged where its pattern does not occur; the device counts the
builds it changed (``MutantCompiler.applied``), so a mutant never passes silently as the identity
on its own witness (``conformance/test_mutants.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

LEVELS = {"stripe": "llvm_cpu.0", "llvm": "llvm_cpu.0", "opencl": "opencl_cpu.0"}  # default base devices


@dataclass(frozen=True)
class Witness:
    """A small program and inputs on which the mutant's answer differs from the interpreter's."""

    source: str
    inputs: dict[str, np.ndarray]
    settings: dict = field(default_factory=dict)  # for tile.compile (a tiled config, say)


@dataclass(frozen=True)
class Mutant:
    name: str
    level: str  # "stripe" (rewrites each KernelInfo's block), "llvm" or "opencl" (the generated text)
    kind: str  # which family of compiler bug: "operator", "identity", "edge", "signedness", ...
    what: str  # one line: the defect
    rewrite: Callable  # Block -> Block, or str -> str
    witness: Witness
    base: str = ""  # the real device it wraps ("": the level's default)

    @property
    def device_id(self) -> str:
        return f"mutant:{self.name}"

    @property
    def base_id(self) -> str:
        return self.base or LEVELS[self.level]


def arrays(dtype, **values) -> dict[str, np.ndarray]:
    """Witness inputs: each keyword a nested list, all of one dtype."""
    return {k: np.asarray(v, dtype=dtype) for k, v in values.items()}
