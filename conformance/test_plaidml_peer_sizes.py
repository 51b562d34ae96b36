"""0-D inputs used as sizes against PlaidML 0.7.0 (docs/semantics.md §6.3.1 and §10).

PlaidML takes a size input only as a ``plaidml.Integer`` binding (the peer sends a Python int as
one); here it is a 0-D array. The programs are PlaidML's own transposed convolutions
(``conformance/conv_transpose.py`` writes them as ``plaidml/op.py`` did, for the configurations of its
Keras tests and ours) and the other places a size input can go; they must agree exactly on
integer-valued inputs. The ways PlaidML differs are named cases. Skipped, with the reason, where
PlaidML 0.7.0 is not installed or does not run.
"""

from __future__ import annotations

import numpy as np
import pytest

import ref_interp
from conformance import plaidml_peer
from conformance.conv_transpose import CASES, size_arrays
from tile.errors import TileInputError


@pytest.mark.parametrize("name", [n for n in CASES if n != "empty_output"])  # O[..: 0] aborts PlaidML
def test_conv_transpose_agrees(peer, name):
    c = CASES[name]
    src, (o, k) = c.source(), c.inputs(np.random.default_rng(15))
    for size in c.sizes:
        theirs = peer.run(src, {"O": o, "K": k, **{n: int(v) for n, v in size_arrays(size).items()}})["I"]
        ours = ref_interp.run(src, {"O": o, "K": k, **size_arrays(size)})["I"]
        np.testing.assert_array_equal(theirs, c.reference(o, k, size))
        np.testing.assert_array_equal(ours, theirs)


A = np.array([1, 2, 3], np.float32)
AGREE = {
    "output-size": ("function (A[N], S) -> (O) { O[i: S] = +(A[i]); }", 5, [1, 2, 3, 0, 0]),
    "index-shift": ("function (A[N], S) -> (O) { O[i: N] = +(A[i + S]); }", 1, [2, 3, 0]),
    "reshape": ("function (A[N], S) -> (O) { O = reshape(A, S, 1); }", 3, [[1], [2], [3]]),
    "int-in-elementwise": ("function (A[N], S) -> (O) { C[i: S] = +(A[i]); O = S / 2 + A; }", 5, [3, 4, 5]),
}


@pytest.mark.parametrize("name", list(AGREE))
def test_size_uses_agree(peer, name):
    src, s, want = AGREE[name]
    theirs = peer.run(src, {"A": A, "S": s})["O"]
    ours = ref_interp.run(src, {"A": A, "S": np.int32(s)})["O"]
    np.testing.assert_array_equal(theirs, np.array(want, np.float32))
    np.testing.assert_array_equal(ours, theirs)


SIZE = "function (A[N], S) -> (O) { O[i: S] = +(A[i]); }"


def _fails(peer, src: str, inputs: dict, text: str) -> None:
    with pytest.raises(plaidml_peer.PeerError) as info:
        peer.run(src, inputs)
    assert info.value.kind == "error" and text in str(info.value), str(info.value)


def test_a_0d_tensor_is_no_size_there(peer):
    """§10: PlaidML needs a plaidml.Integer; a 0-D tensor (what an array is) is refused."""
    _fails(peer, SIZE, {"A": A, "S": np.array(5, np.int32)}, "requires it to be a constant integer")
    assert ref_interp.run(SIZE, {"A": A, "S": np.array(5, np.int32)})["O"].tolist() == [1, 2, 3, 0, 0]


def test_a_negative_size_is_out_of_memory_there(peer):
    _fails(peer, SIZE, {"A": A, "S": -2}, "Out of memory")
    with pytest.raises(TileInputError, match="holds -2, which is negative"):
        ref_interp.run(SIZE, {"A": A, "S": np.int32(-2)})


def test_a_dimension_named_like_a_size_input_is_a_duplicate_there(peer):
    src = "function (S, A[S]) -> (O) { O[i: S] = +(A[i]); }"
    _fails(peer, src, {"A": A, "S": 3}, "Duplicate input parameter")
    assert ref_interp.run(src, {"A": A, "S": np.int32(3)})["O"].tolist() == [1, 2, 3]
