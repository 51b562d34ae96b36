"""``stripe.ir.evolve`` is ``dataclasses.replace`` for the IR's nodes: the same node for every
class and field, the original untouched, and an unknown field an error."""

from __future__ import annotations

import dataclasses

import pytest

from stripe.ir import (
    Block,
    Constant,
    Dim,
    Index,
    Intrinsic,
    Load,
    LoadIndex,
    Location,
    RefDir,
    Refinement,
    Special,
    Store,
    TensorShape,
    evolve,
)
from tile.affine import Affine
from tile.dtypes import DType

SHAPE = TensorShape(DType.FLOAT32, (Dim(4, 1),))
REF = Refinement(RefDir.IN, "A", (Affine.var("i"),), SHAPE, from_="B", agg_op="add", tags=frozenset({"t"}))
NODES = [
    Location("DRAM", (Affine.constant(1),)),
    Dim(4, 1),
    SHAPE,
    REF,
    Index("i", 4, Affine.var("j")),
    Load("A", "$a"),
    Store("$a", "A"),
    LoadIndex(Affine.var("i"), "$i"),
    Constant("$c", 1.5, DType.FLOAT32),
    Intrinsic("add", ("$a", "$b"), ("$c",), DType.FLOAT32),
    Special("zero", (), ("A",)),
    Block("k", (Index("i", 4),), (Affine.var("i"),), (REF,), (Load("A", "$a"),), frozenset({"kernel"})),
]
OTHER = {int: 7, str: "x", tuple: (), frozenset: frozenset({"u"}), float: 2.5}


@pytest.mark.parametrize("node", NODES, ids=lambda n: type(n).__name__)
def test_evolve_is_replace_for_every_field(node):
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        new = OTHER.get(type(value), value)  # another value where one of its type is at hand
        got = evolve(node, **{f.name: new})
        assert got == dataclasses.replace(node, **{f.name: new}) and type(got) is type(node)
        assert getattr(got, f.name) == new
    assert evolve(node) == node and evolve(node) is not node


def test_unknown_field_is_an_error():
    with pytest.raises(TypeError, match="Refinement has no field"):
        evolve(REF, acess=())
    assert REF.access == (Affine.var("i"),)  # the original is untouched
