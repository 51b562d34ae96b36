"""Strict mode is bit-identical to the interpreter (semantics §8.3) for any index names.

The interpreter sums each element's values in the row-major order of the contraction's indexes
taken in order of first appearance (output first); the lowered Stripe block lists them in that
order, and strict mode keeps it on every target. Drawn here: contractions with several reduction
indexes under drawn names (so alphabetical order and first appearance disagree), some padded
(``A[o + r - 1]``: constraints that skip points), random float inputs, compared bit for bit on
``llvm_cpu.0`` and the OpenCL device.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ref_interp
import tile
from backends import registry
from tests.opencl_support import DEVICE_ID as OPENCL_DEVICE

NAMES = ("a", "b", "c", "i", "j", "k", "x", "y", "ci", "co", "kx", "n", "zz")
TARGETS = [d for d in ("llvm_cpu.0", OPENCL_DEVICE) if d is not None and d in registry.devices()]


@st.composite
def contractions(draw):
    """``(source, input shapes)``: ``O[outs] = agg(A[..] * B[..])`` with 2-3 reduction indexes
    (each read by an operand), 0-2 output indexes, drawn names, and some dimensions ``o + r - 1``
    (a padded window: the constraints skip the points outside the operand)."""
    n_out = draw(st.integers(0, 2))
    n_red = draw(st.integers(2, 3))
    names = draw(st.permutations(NAMES))[: n_out + n_red]
    outs, reds = names[:n_out], names[n_out:]
    size = {v: draw(st.integers(1, 4)) for v in names}
    dims: dict[str, list[tuple[str, int]]] = {"A": [], "B": []}  # (index expression, size)
    for v in reds:
        for t in draw(st.sampled_from((["A"], ["B"], ["A", "B"]))):
            dims[t].append((v, size[v]))
    for v in outs:
        t = draw(st.sampled_from(("A", "B")))
        pads = [k for k, (e, _) in enumerate(dims[t]) if e in reds and "+" not in e]
        if pads and draw(st.booleans()):  # a padded window over a reduction index
            k = draw(st.sampled_from(pads))
            r = dims[t][k][0]
            dims[t][k] = (f"{v} + {r} - 1", size[v])
        else:
            dims[t].append((v, size[v]))
    for t in ("A", "B"):
        order = draw(st.permutations(range(len(dims[t]))))
        dims[t] = [dims[t][k] for k in order] or [("0", 1)]
    agg = draw(st.sampled_from("+*"))
    out = f"O[{', '.join(outs)}: {', '.join(str(size[v]) for v in outs)}]" if outs else "O[]"
    acc = {t: ", ".join(e for e, _ in dims[t]) for t in ("A", "B")}
    src = f"function (A[{', '.join(f'A{k}' for k in range(len(dims['A'])))}], " \
          f"B[{', '.join(f'B{k}' for k in range(len(dims['B'])))}]) -> (O) " \
          f"{{ {out} = {agg}(A[{acc['A']}] * B[{acc['B']}]); }}"
    shapes = {t: tuple(s for _, s in dims[t]) for t in ("A", "B")}
    return src, shapes


@pytest.mark.skipif(not TARGETS, reason="no compiled target available")
@settings(
    derandomize=True,
    deadline=None,
    max_examples=30,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(contractions(), st.integers(0, 2**32 - 1))
def test_strict_is_bit_identical_for_any_index_names(case, seed):
    src, shapes = case
    rng = np.random.default_rng(seed)
    inputs = {t: rng.standard_normal(s).astype(np.float32) for t, s in shapes.items()}
    want = ref_interp.run(src, inputs)["O"]
    for target in TARGETS:
        got = tile.compile(src, target, settings={"strict": True})(**inputs)["O"]
        np.testing.assert_array_equal(got, want, err_msg=f"{target}: {src}")


def test_first_appearance_differs_from_alphabetical():
    """The convolution whose (i, j, ci) sums differed from the interpreter's before the fix."""
    src = """function (I[N, X, Y, CI], K[KX, KY, CI, CO]) -> (O) {
      O[n, x, y, co: N, X - KX + 1, Y - KY + 1, CO] = +(I[n, x + i, y + j, ci] * K[i, j, ci, co]);
    }"""
    rng = np.random.default_rng(0)
    inputs = {"I": rng.standard_normal((1, 6, 6, 5)).astype(np.float32),
              "K": rng.standard_normal((3, 3, 5, 4)).astype(np.float32)}
    want = ref_interp.run(src, inputs)["O"]
    for target in TARGETS:
        got = tile.compile(src, target, settings={"strict": True})(**inputs)["O"]
        np.testing.assert_array_equal(got, want, err_msg=target)
