"""Float32 ``exp`` on ``llvm_cpu.0`` outside strict mode is computed in float32
(``backends.llvm.vmath``), 16 lanes a vector on AVX-512, without widening to double (its accuracy:
tests/test_llvm_fastpaths.py). Elementwise ``a*b + c`` keeps two roundings: the conformance sweep's
``CHAINS`` (conformance/sweeps.py) hold every elementwise operation to one rounding each, so the IR
marks no ``contract`` there.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.llvm_runner import build, lowered

pytestmark = pytest.mark.usefixtures("private_cache")


def _source(src: str, inputs: dict, settings: dict) -> str:
    library, _ = build(lowered(src, inputs), settings)
    return library.source


def test_float32_exp_computes_in_float32():
    src = "function (X) -> (Y) { Y = exp(X); }"
    text = _source(src, {"X": np.zeros(8, np.float32)}, {})
    helper = re.search(r"define internal float @\"?tile\.vexpf\"?\(.*?\n}\n", text, re.S)
    assert helper is not None, "no inline exp helper in the module"
    assert "double" not in helper.group(0)  # no fpext/fptrunc round trip through double


def test_elementwise_multiply_add_keeps_two_roundings():
    src = "function (X, W, B) -> (Y) { Y = X * W + B; }"
    x = np.full(37, 1 + 2.0**-12, np.float32)
    text = _source(src, {"X": x, "W": x, "B": x}, {})
    assert "contract" not in text and "fmul float" in text
