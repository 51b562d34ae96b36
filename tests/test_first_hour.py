"""What a new user meets in the first hour: mistakes refused at ``tile.compile`` (not at the first
call), the likely index typo warned about once, errors that name every class the docs name, a
terminal-safe error echo, and the renamed ``cotangents=`` / ``outputs=`` of the gradient API."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tile
from tile.errors import TileIndexWarning, TileInputError, TileNameError, TileSyntaxError

MATMUL = "function (A[M, L], B[L, N]) -> (C) {\n    C[i, j: M, N] = +(A[i, k] * B[k, j]);\n}\n"
TYPO = "function (A[M, L], B[L, N]) -> (C) {\n    C[i, q: M, N] = +(A[i, k] * B[k, j]);\n}\n"


# ------------------------------------------------------------------ errors at compile()
@pytest.mark.parametrize(
    "body, text, message",
    [
        ("O = expp(A);", "expp(A)", "unknown function 'expp'"),
        ("O = A + Q;", "Q", "unknown name 'Q'"),
        ("O = A + T;\n  T = A;", "T", "'T' is used before it is defined"),
    ],
)
@pytest.mark.parametrize("device", ["interp", "llvm_cpu.0"])
def test_name_errors_come_at_compile_located(body, text, message, device):
    src = f"function (A[N]) -> (O) {{\n  {body}\n}}\n"
    with pytest.raises(TileNameError) as e:
        tile.compile(src, device)
    assert message in e.value.message
    assert e.value.span.line == 2 and src.splitlines()[1][e.value.span.col - 1:].startswith(text)
    assert e.value.hint and "^" in str(e.value)


def test_misspelled_builtin_suggests_the_right_one():
    with pytest.raises(TileNameError) as e:
        tile.compile("function (A[N]) -> (O) { O = expp(A); }", "interp")
    assert e.value.hint == "did you mean 'exp'?"


def test_a_type_error_that_depends_on_the_dtypes_is_left_to_the_call():
    """``A & B`` is an error on float32 (what a check without inputs assumes) but fine on ints: the
    program compiles, runs on int inputs, and a misspelled builtin after it is still found."""
    src = "function (A[N], B[N]) -> (O) { O = A & B; }"
    a = np.array([6, 3], np.int32)
    np.testing.assert_array_equal(tile.compile(src, "interp")(A=a, B=a)["O"], a)
    with pytest.raises(TileNameError, match="unknown function 'sqrtt'"):
        tile.compile("function (A[N], B[N]) -> (O) { T = A & B; O = sqrtt(T); }", "interp")


def test_file_path_as_source_says_to_read_the_file(tmp_path):
    path = tmp_path / "mm.tile"
    path.write_text(MATMUL)
    for text in (str(path), "mm.tile", "models/conv.tile"):
        with pytest.raises(TileInputError) as e:
            tile.compile(text)
        assert "looks like a file path" in e.value.message and "compile_file" in e.value.hint
    f = tile.compile_file(path, "interp")
    out = f(A=np.ones((2, 3), np.float32), B=np.ones((3, 4), np.float32))["C"]
    np.testing.assert_array_equal(out, np.full((2, 4), 3, np.float32))
    path.write_text("function (A[N]) -> (O) {\n  O = expp(A);\n}\n")
    with pytest.raises(TileNameError) as e:
        tile.compile_file(path)
    assert str(e.value).startswith(f"{path}:2:7: name error: unknown function 'expp'")


def test_program_text_is_never_taken_for_a_path():
    with pytest.raises(TileSyntaxError):
        tile.compile("O = A + B")  # no function header: a syntax error, not a path


def test_unknown_device_is_a_device_error_listing_the_ids():
    with pytest.raises(tile.TileDeviceError) as e:
        tile.compile(MATMUL, "llvm_gpu.7")
    assert isinstance(e.value, tile.TileError) and "llvm_cpu.0" in e.value.message


def test_every_error_class_the_docs_name_is_exported():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    text = (root / "README.md").read_text() + "".join(p.read_text() for p in (root / "docs").glob("*.md"))
    named = set(re.findall(r"\bTile[A-Za-z]*(?:Error|Warning)\b", text))
    assert {"TileInputError", "TileDeviceError", "TileResourceError"} <= named
    for name in named:
        cls = getattr(tile, name)
        assert issubclass(cls, (tile.TileError, tile.TileWarning, UserWarning)), name
        assert name in tile.__all__
    assert issubclass(tile.TileConfigError, tile.TileError)


# ------------------------------------------------------------------- the index typo
def test_free_output_index_with_a_summed_one_warns_once_located(tmp_path):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("default")  # Python's own default: once per place
        f = tile.compile(TYPO, "interp")
        tile.compile(TYPO, "interp")  # the same text and place: not again
        f(A=np.ones((2, 3), np.float32), B=np.ones((3, 4), np.float32))  # nor at the call
    got = [w for w in got if not issubclass(w.category, ResourceWarning)]  # (another test's garbage)
    assert [type(w.message) for w in got] == [TileIndexWarning]
    w = got[0].message
    assert "'q'" in w.message and "'j'" in w.message
    shown = str(w).splitlines()
    assert shown[0].startswith("<string>:2:10: warning: output index 'q' of 'C'")
    assert shown[2] == "    " + " " * 9 + "^"
    assert "filterwarnings" in w.hint
    # legal: C repeats the sum over j along q
    a, b = np.ones((2, 3), np.float32), np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(f(A=a, B=b)["C"], np.full((2, 4), b.sum(), np.float32))


def test_the_warning_can_be_silenced_and_matmul_gives_none():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tile.compile(MATMUL, "interp")
        tile.compile("function (A[M, N]) -> (O) { O[i: M] = +(A[i, j]); }", "interp")  # a plain sum
        tile.compile("function (A[M]) -> (O) { O[i, j: M, 3] = =(A[i]); }", "interp")  # a broadcast
        warnings.filterwarnings("ignore", category=tile.TileIndexWarning)
        tile.compile(TYPO.replace("C[", "D[").replace("(C)", "(D)"), "interp")


def test_tile_check_warns_too(tmp_path, capsys):
    from tile.cli import main

    path = tmp_path / "typo.tile"
    path.write_text(TYPO)
    assert main(["check", str(path)]) == 0
    err = capsys.readouterr().err
    assert f"{path}:2:10: warning: output index 'q'" in err and err.count("warning:") == 1


# ---------------------------------------------------------------- the error echo
def test_control_bytes_of_the_source_are_escaped_and_the_caret_stays_put():
    src = "function (A[N]) -> (O) {\n  O = A \x05+ 1;\x7f\x00\n}\n"
    with pytest.raises(TileSyntaxError) as e:
        tile.parse(src)
    lines = str(e.value).splitlines()
    assert lines[1] == "      O = A \\x05+ 1;\\x7f\\x00"
    assert lines[2] == "    " + " " * 8 + "^~~~"
    assert all(c.isprintable() for line in lines for c in line)


# ----------------------------------------------------------- the gradient API's names
def test_cotangents_and_outputs_replace_seed():
    src = "function (X[N]) -> (O, P) { O = X; P = X * X; }"
    x = np.array([1.0, 2.0])
    got = tile.grad_values(src, {"X": x}, cotangents={"P": np.array([2.0, 3.0])})
    np.testing.assert_array_equal(got["X"], 1 + 2 * np.array([2.0, 3.0]) * x)
    assert list(tile.gradient(src, outputs=["P"]).cotangents) == ["P"]
    with pytest.warns(DeprecationWarning, match="cotangents"):
        old = tile.grad_values(src, {"X": x}, seed={"P": np.array([2.0, 3.0])})
    np.testing.assert_array_equal(old["X"], got["X"])
    with pytest.warns(DeprecationWarning, match="outputs"):
        assert tile.grad(src, seed=["P"]) == tile.grad(src, outputs=["P"])


def test_a_program_repr_is_short_and_str_is_its_text():
    g = tile.grad("function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }")
    assert repr(g) == "<tile.Program (A[M, L], B[L, N], DC[M, N]) -> (DA, DB): 2 statements>"
    assert str(g).startswith("function (A[M, L], B[L, N], DC[M, N]) -> (DA, DB) {")
    assert tile.parse(str(g)) == g
    one = tile.parse("function (S) -> (O) { O = S; }")
    assert repr(one) == "<tile.Program (S) -> (O): 1 statement>"
