"""The float builtins (exp .. atanh, sqrt, floor, ceil, round, sigmoid, pow) and the conversions
(as_float, as_int, as_uint, as_bool) on the OpenCL backend.

Split from ``test_opencl_builtins.py``, whose ``check_builtin`` they share: one program per builtin
over a representative set of operand types, compared with the Tile interpreter within OpenCL's
documented accuracy (exact for sqrt, floor, ceil, round and the conversions: truncation toward
zero, wrap-around, nan and ±inf to 0, single roundings to float16).
"""

from __future__ import annotations

import pytest

from tests.opencl_support import requires_opencl
from tests.test_opencl_builtins import CONVERSIONS, FLOAT_FUNCTIONS, check_builtin

pytestmark = [requires_opencl, pytest.mark.usefixtures("private_cache")]


def test_the_float_functions_are_the_floaty_builtins():
    assert {"exp", "sqrt", "round", "sigmoid", "pow", "atanh"} <= set(FLOAT_FUNCTIONS)
    assert not {"add", "as_float", "max"} & set(FLOAT_FUNCTIONS)


@pytest.mark.parametrize("name", FLOAT_FUNCTIONS)
def test_float_builtin(name):
    check_builtin(name)


@pytest.mark.parametrize("name", CONVERSIONS)
def test_conversion_builtin(name):
    check_builtin(name)
