"""A program with two errors reports the same one on every target: the first in statement order, as
the interpreter, which runs statements in order, finds it (issue 37, item 4). Compiled targets check
`=` double writes from the shapes before lowering finds an empty index space; a double write after
such an error, even in dead code, must not be reported ahead of it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tile
from tests.opencl_support import DEVICE_ID as OPENCL
from tile.errors import TileIndexError, TileRuntimeError

DEVICES = [
    "interp",
    "llvm_cpu.0",
    pytest.param(OPENCL, marks=pytest.mark.skipif(OPENCL is None, reason="no usable OpenCL device")),
]

EMPTY = "E[i: 3] = +(A[i + 5]);"  # A has 3 elements: no tuple is valid (an index error)
TWICE = "D[j: 1] = =(A[i]);"  # every i writes D[0] (a runtime error)
EMPTY_LINE, TWICE_LINE = "no index tuple of 'E' is valid", "`=` writes D[0] more than once"


def program(first: str, second: str, outputs: str) -> str:
    return f"function (A[N]) -> ({outputs}) {{\n  {first}\n  {second}\n  O = A;\n}}"


def error_of(src: str, dev: str) -> tile.TileError:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tile.TileIndexWarning)  # D's unused j is meant here
        with pytest.raises(tile.TileError) as err:
            tile.compile(src, dev)(A=np.arange(3, dtype=np.float32))
    return err.value


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("outputs", ["O", "E, D", "D, O"], ids=["dead", "live", "half"])
def test_an_earlier_index_error_comes_before_a_later_double_write(dev, outputs):
    err = error_of(program(EMPTY, TWICE, outputs), dev)
    assert isinstance(err, TileIndexError), str(err)
    assert EMPTY_LINE in err.message and err.span.line == 2


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("outputs", ["O", "E, D"], ids=["dead", "live"])
def test_an_earlier_double_write_comes_before_a_later_index_error(dev, outputs):
    err = error_of(program(TWICE, EMPTY, outputs), dev)
    assert type(err) is TileRuntimeError, str(err)
    assert TWICE_LINE in err.message and err.span.line == 2


@pytest.mark.parametrize("dev", DEVICES)
def test_a_double_write_after_valid_contractions_is_still_found(dev):
    fine = "S[i: 3] = +(A[i]);"
    err = error_of(program(fine, TWICE, "S, O"), dev)
    assert type(err) is TileRuntimeError and TWICE_LINE in err.message and err.span.line == 3
