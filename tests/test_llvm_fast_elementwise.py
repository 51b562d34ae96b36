"""Elementwise float code on ``llvm_cpu.0`` outside strict mode uses what docs/semantics.md §8.3
allows, and strict mode does not:

* ``a*b + c`` in an elementwise expression may round once: the IR marks float ``+``/``-``/``*``
  ``contract``, so LLVM emits fused multiply-adds (GELU's erf polynomial: one instruction a step
  instead of two);
* float32 ``exp`` is computed in float32 (``backends.llvm.vmath``), 16 lanes a vector on AVX-512,
  without widening to double (its accuracy: tests/test_llvm_fastpaths.py).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tile
from backends.llvm.host import host_target
from tests.llvm_runner import build, lowered

pytestmark = pytest.mark.usefixtures("private_cache")

FMA_SRC = "function (X, W, B) -> (Y) { Y = X * W + B; }"


def _inputs() -> dict[str, np.ndarray]:
    # X * W = 1 + 2^-11 + 2^-24: two roundings give 1 + 2^-11 (a tie, to even), so Y = 0;
    # one rounding keeps the 2^-24
    x = np.full(37, 1 + 2.0**-12, np.float32)
    return {"X": x, "W": x.copy(), "B": np.full(37, -(1 + 2.0**-11), np.float32)}


def _source(src: str, inputs: dict, settings: dict) -> str:
    library, _ = build(lowered(src, inputs), settings)
    return library.source


def test_elementwise_float_arithmetic_is_marked_contractible_outside_strict():
    inputs = _inputs()
    assert re.search(r"fmul contract float", _source(FMA_SRC, inputs, {}))
    strict = _source(FMA_SRC, inputs, {"strict": True})
    assert "contract" not in strict and "fmul float" in strict


def test_elementwise_multiply_add_rounds_once_outside_strict_only():
    if "+fma" not in host_target()[1].split(","):
        pytest.skip("the host has no fused multiply-add (fma): LLVM keeps two roundings")
    inputs = _inputs()
    fast = tile.compile(FMA_SRC, "llvm_cpu.0")(**inputs)["Y"]
    strict = tile.compile(FMA_SRC, "llvm_cpu.0", {"strict": True})(**inputs)["Y"]
    interp = tile.compile(FMA_SRC, "interp")(**inputs)["Y"]
    np.testing.assert_array_equal(strict, interp)  # two roundings, as the interpreter
    assert (interp == 0).all()
    assert (fast == np.float32(2.0**-24)).all()  # one rounding: the exact value


def test_float32_exp_computes_in_float32():
    src = "function (X) -> (Y) { Y = exp(X); }"
    text = _source(src, {"X": np.zeros(8, np.float32)}, {})
    helper = re.search(r"define internal float @\"?tile\.vexpf\"?\(.*?\n}\n", text, re.S)
    assert helper is not None, "no inline exp helper in the module"
    assert "double" not in helper.group(0)  # no fpext/fptrunc round trip through double
