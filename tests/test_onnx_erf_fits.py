"""The ONNX importer's float32 Erf (``tile.ops.activation.erf_lines(narrow=True)``) evaluates 26
Horner steps (fits of 8, 10 and 8 terms; 28 with the outer fits a term longer, a sixth slower on
``llvm_cpu.0``), and stays within 2 ulp of erf on a dense float32 sweep (tests/test_onnx_layout.py
checks it through the importer)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tile
from tile.ops.activation import erf_lines


def test_the_narrow_erf_takes_26_horner_steps():
    text = "\n".join(erf_lines("X", "Y", narrow=True))
    steps = re.findall(r"\) \* ErfU\d|[-\d.e]+ \* ErfU\d", text)
    assert len(steps) == 26 - 3  # (each piece's first coefficient starts its chain: no step)


def test_the_narrow_erf_is_within_two_ulps_on_a_dense_sweep():
    special = pytest.importorskip("scipy.special", reason="the reference erf is scipy's")
    bits = np.arange(0, 1 << 31, 4099, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x) & (np.abs(x) < 6)]
    x = np.concatenate([x, -x])
    src = "function (X) -> (Y) { " + "; ".join(erf_lines("X", "Y", narrow=True)) + "; }"
    got = tile.compile(src, "llvm_cpu.0")(X=x)["Y"]
    want = special.erf(x.astype(np.float64))
    spacing = np.spacing(np.maximum(np.abs(want), np.finfo(np.float32).tiny).astype(np.float32))
    assert (np.abs(got - want) / spacing.astype(np.float64)).max() < 2
