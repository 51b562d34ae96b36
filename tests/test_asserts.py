"""``assert_<name>(c)``: bind-time checks of sizes, as PlaidML 0.7's op library writes them."""

from __future__ import annotations

import numpy as np
import pytest

import ref_interp
import tile
from tile.errors import TileShapeError

# The shape of PlaidML 0.7's grouped convolution (op.py adds the Assert line for explicit groups).
GROUPED = """function (I[N, X, CI], K[KX, G, CO]) -> (O) {
    Assert = assert_group_count(G == CI);
    O[n, x, co: N, X - KX + 1, CO] = +(I[n, x + k, g] * K[k, g, co]);
}"""


@pytest.mark.parametrize("device", ["interp", "llvm_cpu.0"])
def test_a_true_assertion_changes_nothing(device):
    rng = np.random.default_rng(0)
    ins = {"I": rng.integers(-3, 4, (2, 5, 3)).astype(np.float32),
           "K": rng.integers(-3, 4, (2, 3, 4)).astype(np.float32)}
    got = ref_interp.run(GROUPED, ins) if device == "interp" else tile.compile(GROUPED, device)(ins)
    want = np.einsum("nxg,gc->nxc", ins["I"][:, :4], ins["K"][0]) + np.einsum(
        "nxg,gc->nxc", ins["I"][:, 1:], ins["K"][1])
    np.testing.assert_array_equal(got["O"], want)


def test_a_false_assertion_is_a_located_error():
    ins = {"I": np.zeros((2, 5, 3), np.float32), "K": np.zeros((2, 4, 4), np.float32)}
    with pytest.raises(TileShapeError) as e:
        ref_interp.run(GROUPED, ins)
    text = str(e.value)
    assert "assertion assert_group_count failed: G == CI is false" in text
    assert ":2:14:" in text and "^" in text and e.value.hint


def test_winograd_style_condition_and_plain_integer():
    src = """function (A[BI, BO], K[S, S, CI, CO]) -> (O) {
        Assert = assert_winograd_valid(BI - CI + 1 == BO);
        Two = assert_nonzero(CO - 1);
        O = A * Two;
    }"""
    ins = {"A": np.ones((4, 2), np.float32), "K": np.ones((3, 3, 3, 3), np.float32)}
    np.testing.assert_array_equal(ref_interp.run(src, ins)["O"], np.full((4, 2), 2, np.float32))
    with pytest.raises(TileShapeError, match="assert_nonzero failed"):
        ref_interp.run(src, {**ins, "K": np.ones((3, 3, 3, 1), np.float32)})


def test_symbolic_sizes_assume_and_note():
    bound = tile.bind_symbolic(tile.parse(GROUPED))
    assert "assumed G == CI (assert_group_count)" in bound.notes
    with pytest.raises(TileShapeError, match="CI \\+ 1 == CI is false"):
        tile.bind_symbolic(tile.parse("function (I[CI]) -> (O) { A = assert_x(CI + 1 == CI); O = I; }"))


def test_one_condition():
    with pytest.raises(TileShapeError, match="takes one condition"):
        ref_interp.run("function (I[N]) -> (O) { A = assert_x(N, N); O = I; }", {"I": np.zeros(2)})
