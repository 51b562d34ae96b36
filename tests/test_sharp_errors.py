"""Errors in the right form from the API (issue 37, item 4): a ``TileError`` saying what was expected
instead of a raw Python exception, and one reading of a dtype name for the API and the CLI.

The command-line cases (missing-input hints, Ctrl-C) are in tests/test_sharp_errors_cli.py; the
order of errors across targets in tests/test_error_order.py."""

from __future__ import annotations

import numpy as np
import pytest

import tile
from tile.errors import TileInputError
from tile.settings import KNOWN, TileSettingsError

ADD = "function (A[N], B[N]) -> (C) { C = A + 2 * B; }"


# ---------------------------------------------------------------- compile and compile_file


def test_compile_file_of_a_missing_file_names_it(tmp_path):
    path = tmp_path / "missing.tile"
    with pytest.raises(TileInputError) as err:
        tile.compile_file(path, "interp")
    assert f"'{path}' does not exist" in err.value.message
    assert "tile.compile(text)" in err.value.hint


def test_compile_file_of_a_folder_or_a_non_path(tmp_path):
    with pytest.raises(TileInputError, match="is a directory"):
        tile.compile_file(tmp_path, "interp")
    with pytest.raises(TileInputError, match="expects a file path .* not int"):
        tile.compile_file(123, "interp")


def test_compile_file_still_reads_a_file(tmp_path):
    path = tmp_path / "add.tile"
    path.write_text(ADD)
    got = tile.compile_file(path, "interp")(A=np.arange(3.0), B=np.ones(3))["C"]
    np.testing.assert_array_equal(got, np.arange(3.0) + 2)


@pytest.mark.parametrize(
    "program, type_name, hint",
    [
        (123, "int", "pass the program text"),
        (b"function", "bytes", "decode it first"),
        (None, "NoneType", ""),
    ],
)
def test_compile_of_a_non_string_says_text_was_expected(program, type_name, hint):
    with pytest.raises(TileInputError) as err:
        tile.compile(program, "interp")
    assert "expects Tile source text (a str) or a parsed tile.Program" in err.value.message
    assert err.value.message.endswith(f"not {type_name}")
    assert hint in err.value.hint


def test_compile_of_a_parsed_program_still_works():
    got = tile.compile(tile.parse(ADD), "interp")(A=np.arange(3.0), B=np.ones(3))["C"]
    np.testing.assert_array_equal(got, np.arange(3.0) + 2)


# ---------------------------------------------------------------- positional inputs

DEVICES = ["interp", "llvm_cpu.0"]


@pytest.mark.parametrize("dev", DEVICES)
def test_positional_inputs_in_declaration_order(dev):
    f = tile.compile(ADD, dev)
    a, b = np.arange(4, dtype=np.float32), np.arange(4, dtype=np.float32)[::-1].copy()
    want = a + 2 * b
    np.testing.assert_array_equal(f(a, b)["C"], want)
    np.testing.assert_array_equal(f(a, B=b)["C"], want)  # mixed: the rest by name
    np.testing.assert_array_equal(f({"A": a, "B": b})["C"], want)  # one mapping, as before
    np.testing.assert_array_equal(f(A=a, B=b)["C"], want)


@pytest.mark.parametrize("dev", DEVICES)
def test_positional_inputs_prepare_too(dev):
    f = tile.compile(ADD, dev)
    a = np.ones(3, np.float32)
    compiled = f.prepare(a, a)
    assert (compiled is None) == (dev == "interp")


def test_too_many_positional_inputs_name_the_inputs():
    f = tile.compile(ADD, "interp")
    a = np.ones(3)
    with pytest.raises(TileInputError) as err:
        f(a, a, a)
    assert "3 positional inputs given to a program of 2" in err.value.message
    assert "A, B" in err.value.hint


def test_an_input_given_twice_is_an_error():
    f = tile.compile(ADD, "interp")
    a = np.ones(3)
    with pytest.raises(TileInputError, match="'A' is given both positionally and by name"):
        f(a, A=a)
    with pytest.raises(TileInputError, match="mapping of inputs must be the only positional"):
        f({"A": a}, a)


# ---------------------------------------------------------------- settings


@pytest.mark.parametrize("settings", ["strict", ["strict"], 3])
def test_settings_that_are_not_a_mapping(settings):
    with pytest.raises(TileSettingsError) as err:
        tile.compile(ADD, "interp", settings=settings)
    assert "settings must be a dict of setting names to values" in err.value.message
    assert "unknown setting" not in err.value.message  # not read letter by letter
    assert 'settings={"strict": True}' in err.value.hint


def test_a_mapping_of_settings_is_still_checked_by_name():
    with pytest.raises(TileSettingsError, match="unknown setting 'stirct'"):
        tile.compile(ADD, "interp", settings={"stirct": True})
    assert "strict" in KNOWN


# ---------------------------------------------------------------- dtype names


@pytest.mark.parametrize("alias", ["float", "double", "int", "f4", float, int])
def test_empty_refuses_numpy_aliases_as_the_cli_does(alias, tmp_path):
    from tile.inputs import parse_shape_spec

    name = alias if isinstance(alias, str) else alias.__name__
    with pytest.raises(TileInputError) as api:
        tile.empty((2,), alias, device="llvm_cpu.0")
    with pytest.raises(TileInputError) as cli:
        parse_shape_spec(f"A=2:{name}")
    assert api.value.message == f"unknown dtype '{name}' for the tensor"
    assert cli.value.message == f"unknown dtype '{name}' in --shape 'A=2:{name}'"
    assert api.value.hint == cli.value.hint
    assert "float32" in api.value.hint and "bfloat16" in api.value.hint


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", np.float16, np.dtype("uint8"), bool])
def test_empty_takes_tile_names_and_numpy_types(dtype):
    t = tile.empty((2, 3), dtype, device="llvm_cpu.0")
    assert t.shape == (2, 3)
    assert t.tile_dtype.value == (dtype if isinstance(dtype, str) else np.dtype(dtype).name)


# ---------------------------------------------------------------- gradient dtypes

SQUARE_SUM = "function (A[N], W[N]) -> (C) { C = A * A * W; }"


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gradients_take_their_inputs_dtype_whatever_the_cotangent(dtype):
    a = np.array([1, -2, 3], dtype)
    w = np.array([2, 1, -1], dtype)
    cot = np.array([1.0, 2.0, -3.0])  # float64
    grads = tile.grad_values(SQUARE_SUM, {"A": a, "W": w}, cotangents={"C": cot})
    assert grads["A"].dtype == dtype and grads["W"].dtype == dtype
    np.testing.assert_array_equal(grads["A"], (2 * a * w * cot).astype(dtype))  # small integers: exact
    np.testing.assert_array_equal(grads["W"], (a * a * cot).astype(dtype))
