"""One test per kind of user error: each is a located ``TileError`` with the right class, a
``file:line:col`` header, the source line, a caret under the offending text, and a hint."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ref_interp import contraction, run
from tile.errors import (
    TileError,
    TileIndexError,
    TileInputError,
    TileNameError,
    TileRuntimeError,
    TileShapeError,
    TileSyntaxError,
    TileTypeError,
)

REPO = Path(__file__).resolve().parents[1]
F3 = np.arange(3, dtype=np.float32)
F4 = np.arange(4, dtype=np.float32)


def fails(cls: type[TileError], src: str, inputs: dict, line: int, col: int, text: str, **kw) -> TileError:
    """Run ``src`` and check the error it raises is ``cls`` located at ``text`` (line, col)."""
    src_line = src.splitlines()[line - 1]
    assert src_line[col - 1:col - 1 + len(text)] == text  # the test's own numbers are right
    with pytest.raises(TileError) as info:
        run(src, inputs, name="prog.tile", **kw)
    e = info.value
    assert type(e) is cls, f"{type(e).__name__}: {e}"
    assert (e.span.line, e.span.col, e.span.length) == (line, col, len(text)), str(e)
    shown = str(e).splitlines()
    assert shown[0].startswith(f"prog.tile:{line}:{col}: {cls.kind}: ")
    assert shown[1] == "    " + src_line
    assert shown[2] == "    " + " " * (col - 1) + "^" + "~" * (len(text) - 1)
    assert e.hint and shown[-1] == f"hint: {e.hint}"
    return e


def prog(header: str, *stmts: str) -> str:
    return "\n".join([f"function {header} {{", *(f"  {s}" for s in stmts), "}"])


# ------------------------------------------------------------------------------ syntax
def test_syntax_error():
    e = fails(TileSyntaxError, prog("(A[N]) -> (O)", "O = A + .5;"), {"A": F3}, 2, 11, ".5")
    assert "0.5" in e.hint


# ------------------------------------------------------------------------------- names
def test_unknown_name_with_did_you_mean():
    e = fails(TileNameError, prog("(Input[N]) -> (O)", "O = Inptu * 2;"), {"Input": F3}, 2, 7, "Inptu")
    assert "'Inptu'" in e.message and "did you mean 'Input'" in e.hint


def test_name_used_before_its_definition():
    e = fails(TileNameError, prog("(A[N]) -> (O)", "O = A + X;", "X = A;"), {"A": F3}, 2, 11, "X")
    assert "'X'" in e.message and "line 3" in e.message


def test_unknown_name_in_a_contraction():
    e = fails(TileNameError, prog("(Input[N]) -> (O)", "O[i: N] = +(Inpt[i]);"), {"Input": F3}, 2, 15,
              "Inpt[i]")
    assert "did you mean 'Input'" in e.hint


def test_reused_name():
    src = prog("(A[N]) -> (O)", "X = A + 1;", "X = A;", "O = X;")
    e = fails(TileNameError, src, {"A": F3}, 3, 3, "X = A")
    assert "'X'" in e.message and "line 2" in e.message


def test_reused_input_name():
    fails(TileNameError, prog("(A[N]) -> (O)", "A[i: N] = +(A[i]);", "O = A;"), {"A": F3}, 2, 3, "A[i: N]")


def test_unknown_function_with_did_you_mean():
    e = fails(TileNameError, prog("(A[N]) -> (O)", "O = expp(A);"), {"A": F3}, 2, 7, "expp(A)")
    assert "'expp'" in e.message and "did you mean 'exp'" in e.hint


def test_output_never_computed():
    e = fails(TileNameError, prog("(A[N]) -> (O, P)", "O = A;"), {"A": F3}, 1, 24, "P")
    assert "'P'" in e.message and "never computed" in e.message


def test_output_that_is_an_input():
    e = fails(TileNameError, prog("(A[N]) -> (A)", "O = A;"), {"A": F3}, 1, 21, "A")
    assert "'A'" in e.message and "input" in e.message


# ------------------------------------------------------------------------ ranks, shapes
def test_rank_mismatch_in_a_contraction():
    e = fails(TileShapeError, prog("(A[N]) -> (O)", "O[i: N] = +(A[i, j]);"), {"A": F3}, 2, 15, "A[i, j]")
    assert "rank 1" in e.message and "2 index" in e.message


def test_rank_mismatch_between_declaration_and_array():
    e = fails(TileInputError, prog("(A[N, M]) -> (O)", "O = A;"), {"A": F3}, 1, 11, "A[N, M]")
    assert "2 dimension" in e.message and "(3,)" in e.message


def test_shared_dimension_with_different_sizes():
    e = fails(TileInputError, prog("(A[N], B[N]) -> (O)", "O = A + B;"), {"A": F3, "B": F4}, 1, 19, "N")
    assert "'N'" in e.message and "3" in e.message and "4" in e.message and "'B'" in e.message


def test_broadcasting_mismatch():
    e = fails(TileShapeError, prog("(A[N], B[M]) -> (O)", "O = A + B;"), {"A": F3, "B": F4}, 2, 7, "A + B")
    assert "broadcast" in e.message and "3" in e.message and "4" in e.message


def test_bad_reshape_count():
    e = fails(TileShapeError, prog("(A[N]) -> (O)", "O = reshape(A, 2, 2);"), {"A": F3}, 2, 7,
              "reshape(A, 2, 2)")
    assert "element count" in e.message


def test_missing_output_sizes():
    e = fails(TileShapeError, prog("(A[N]) -> (O)", "O[i] = +(A[i]);"), {"A": F3}, 2, 3, "O[i]")
    assert "size" in e.message and "O[i, j: M, N]" in e.hint


def test_negative_output_size():
    e = fails(TileShapeError, prog("(A[N]) -> (O)", "O[i: N - 5] = +(A[i]);"), {"A": F3}, 2, 8, "N - 5")
    assert "-2" in e.message and "negative" in e.message


# --------------------------------------------------------------------------------- types
def test_bit_op_on_float():
    e = fails(TileTypeError, prog("(A[N]) -> (O)", "O = A & 1;"), {"A": F3}, 2, 7, "A & 1")
    assert "float32" in e.message
    fails(TileTypeError, prog("(A[N]) -> (O)", "O = ~A;"), {"A": F3}, 2, 7, "~A")


def test_wrong_builtin_arity():
    e = fails(TileTypeError, prog("(A[N]) -> (O)", "O = exp(A, A);"), {"A": F3}, 2, 7, "exp(A, A)")
    assert "'exp'" in e.message and "1" in e.message and "2" in e.message
    e = fails(TileTypeError, prog("(A[N]) -> (O)", "O = as_int(A);"), {"A": F3}, 2, 7, "as_int(A)")
    assert "'as_int'" in e.message and "2" in e.message


# ------------------------------------------------------------------------- index spaces
def test_non_linear_index_polynomial():
    fails(TileIndexError, prog("(A[N]) -> (O)", "O[i: N] = +(A[i * j]);"), {"A": F3}, 2, 17, "i * j")


def test_unbounded_index():
    e = fails(TileIndexError, prog("(A[N], B[N]) -> (O)", "O[i: N] = +(A[i] * B[j - k]);"),
              {"A": F3, "B": F3}, 2, 24, "j - k")
    assert "'j'" in e.message and "unbounded" in e.message


def test_empty_contraction_by_a_constraint():
    e = fails(TileIndexError, prog("(A[N]) -> (O)", "O[i: N] = +(A[i]), i < 0;"), {"A": F3}, 2, 22, "i < 0")
    assert "i < 0" in e.message


def test_empty_contraction_tensor_never_in_range():
    e = fails(TileIndexError, prog("(A[N]) -> (O)", "O[i: N] = +(A[i + 5]);"), {"A": F3}, 2, 17, "i + 5")
    assert "'A'" in e.message and "size 3" in e.message


def test_index_only_in_a_constraint():
    e = fails(TileIndexError, prog("(A[N]) -> (O)", "O[i: N] = +(A[i]), j < 2;"), {"A": F3}, 2, 22, "j")
    assert "'j'" in e.message and "constraint" in e.message


# --------------------------------------------------------------------------- evaluation
def test_duplicate_assign_names_element_and_both_tuples():
    e = fails(TileRuntimeError, prog("(A[N, M]) -> (O)", "O[i: N] = =(A[i, j]);"),
              {"A": np.arange(6, dtype=np.float32).reshape(3, 2)}, 2, 3, "O[i: N] = =(A[i, j])")
    assert "`=` writes O[0] more than once: from (i=0, j=0) and (i=0, j=1)" in e.message


@pytest.mark.parametrize("chunk", [1 << 20, 1])
def test_duplicate_assign_on_a_later_element(monkeypatch, chunk):
    """With ``CHUNK = 1`` the two writers are found in different chunks of the enumeration."""
    monkeypatch.setattr(contraction, "CHUNK", chunk)
    a = np.arange(4, dtype=np.int32).reshape(2, 2)
    e = fails(TileRuntimeError, prog("(A[N, N]) -> (O)", "O[i + j: 3] = =(A[i, j]);"), {"A": a}, 2, 3,
              "O[i + j: 3] = =(A[i, j])")
    assert "`=` writes O[1] more than once: from (i=0, j=1) and (i=1, j=0)" in e.message


def test_index_space_over_max_points(monkeypatch):
    src = prog("(A[N]) -> (O)", "O[i, j, k: N, N, N] = +(A[i] * A[j]);")
    text = "O[i, j, k: N, N, N] = +(A[i] * A[j])"
    e = fails(TileRuntimeError, src, {"A": F3}, 2, 3, text, max_points=26)
    assert "27" in e.message and "26" in e.message
    monkeypatch.setenv("TILE_INTERP_MAX_POINTS", "20")
    e = fails(TileRuntimeError, src, {"A": F3}, 2, 3, text)
    assert "20" in e.message
    assert run(src, {"A": F3}, max_points=27)["O"].shape == (3, 3, 3)


# ------------------------------------------------------------------------------- inputs
def test_missing_input_array():
    e = fails(TileInputError, prog("(A[N], B[N]) -> (O)", "O = A;"), {"A": F3}, 1, 17, "B[N]")
    assert "'B" in e.message


def test_bad_input_dtype():
    c64 = np.zeros(3, np.complex64)
    e = fails(TileInputError, prog("(A[N]) -> (O)", "O = A;"), {"A": c64}, 1, 11, "A[N]")
    assert "complex64" in e.message


def test_extra_input_array():
    with pytest.raises(TileInputError) as info:
        run(prog("(A[N]) -> (O)", "O = A;"), {"A": F3, "Bogus": F3})
    e = info.value
    assert "'Bogus'" in e.message and e.hint and "A" in e.hint
    assert str(e).endswith(f"hint: {e.hint}")


def _cli(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "ref_interp", "run", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("kind", ["missing", "not_zip", "npy"])
def test_bad_npz_file(tmp_path, kind):
    tile = tmp_path / "p.tile"
    tile.write_text(prog("(A[N]) -> (O)", "O = A;"))
    path = tmp_path / "in.npz"
    if kind == "not_zip":
        path.write_text("this is not a zip archive\n")
        assert not zipfile.is_zipfile(path)
    elif kind == "npy":
        path = tmp_path / "in.npy"
        np.save(path, F3)
    r = _cli([str(tile), "--inputs", str(path)])
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert "input error:" in r.stderr and str(path) in r.stderr
    assert "hint: " in r.stderr
