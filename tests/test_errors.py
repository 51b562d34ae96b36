"""One case per kind of user error (a row of ``LOCATED``, or a test of its own where the kind needs
more): each is a located ``TileError`` with the right class, a ``file:line:col`` header, the
source line, a caret under the offending text, and a hint."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ref_interp import run
from tile import tuples
from tile.errors import (
    TileError,
    TileIndexError,
    TileInputError,
    TileLimitError,
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


A3 = {"A": F3}
# name: (error class, program header, statements, inputs, line, col, the located text,
#        parts of the message, parts of the hint)
LOCATED = {
    # syntax
    "syntax_error": (TileSyntaxError, "(A[N]) -> (O)", ["O = A + .5;"], A3, 2, 11, ".5", [], ["0.5"]),
    # names
    "unknown_name_with_did_you_mean": (
        TileNameError, "(Input[N]) -> (O)", ["O = Inptu * 2;"], {"Input": F3}, 2, 7, "Inptu",
        ["'Inptu'"], ["did you mean 'Input'"],
    ),
    "name_used_before_its_definition": (
        TileNameError, "(A[N]) -> (O)", ["O = A + X;", "X = A;"], A3, 2, 11, "X", ["'X'", "line 3"], [],
    ),
    "unknown_name_in_a_contraction": (
        TileNameError, "(Input[N]) -> (O)", ["O[i: N] = +(Inpt[i]);"], {"Input": F3}, 2, 15, "Inpt[i]",
        [], ["did you mean 'Input'"],
    ),
    "reused_name": (
        TileNameError, "(A[N]) -> (O)", ["X = A + 1;", "X = A;", "O = X;"], A3, 3, 3, "X = A",
        ["'X'", "line 2"], [],
    ),
    "reused_input_name": (
        TileNameError, "(A[N]) -> (O)", ["A[i: N] = +(A[i]);", "O = A;"], A3, 2, 3, "A[i: N]", [], [],
    ),
    "unknown_function_with_did_you_mean": (
        TileNameError, "(A[N]) -> (O)", ["O = expp(A);"], A3, 2, 7, "expp(A)", ["'expp'"],
        ["did you mean 'exp'"],
    ),
    "output_never_computed": (
        TileNameError, "(A[N]) -> (O, P)", ["O = A;"], A3, 1, 24, "P", ["'P'", "never computed"], [],
    ),
    "output_that_is_an_input": (
        TileNameError, "(A[N]) -> (A)", ["O = A;"], A3, 1, 21, "A", ["'A'", "input"], [],
    ),
    # ranks, shapes
    "rank_mismatch_in_a_contraction": (
        TileShapeError, "(A[N]) -> (O)", ["O[i: N] = +(A[i, j]);"], A3, 2, 15, "A[i, j]",
        ["rank 1", "2 index"], [],
    ),
    "rank_mismatch_between_declaration_and_array": (
        TileInputError, "(A[N, M]) -> (O)", ["O = A;"], A3, 1, 11, "A[N, M]", ["2 dimension", "(3,)"], [],
    ),
    "shared_dimension_with_different_sizes": (
        TileInputError, "(A[N], B[N]) -> (O)", ["O = A + B;"], {"A": F3, "B": F4}, 1, 19, "N",
        ["'N'", "3", "4", "'B'"], [],
    ),
    "broadcasting_mismatch": (
        TileShapeError, "(A[N], B[M]) -> (O)", ["O = A + B;"], {"A": F3, "B": F4}, 2, 7, "A + B",
        ["broadcast", "3", "4"], [],
    ),
    "bad_reshape_count": (
        TileShapeError, "(A[N]) -> (O)", ["O = reshape(A, 2, 2);"], A3, 2, 7, "reshape(A, 2, 2)",
        ["element count"], [],
    ),
    "missing_output_sizes": (
        TileShapeError, "(A[N]) -> (O)", ["O[i] = +(A[i]);"], A3, 2, 3, "O[i]", ["size"], ["O[i, j: M, N]"],
    ),
    "negative_output_size": (
        TileShapeError, "(A[N]) -> (O)", ["O[i: N - 5] = +(A[i]);"], A3, 2, 8, "N - 5",
        ["-2", "negative"], [],
    ),
    # types
    "bit_op_on_float": (TileTypeError, "(A[N]) -> (O)", ["O = A & 1;"], A3, 2, 7, "A & 1", ["float32"], []),
    "bit_not_on_float": (TileTypeError, "(A[N]) -> (O)", ["O = ~A;"], A3, 2, 7, "~A", [], []),
    "wrong_builtin_arity": (
        TileTypeError, "(A[N]) -> (O)", ["O = exp(A, A);"], A3, 2, 7, "exp(A, A)", ["'exp'", "1", "2"], [],
    ),
    "builtin_without_its_parameter": (
        TileTypeError, "(A[N]) -> (O)", ["O = as_int(A);"], A3, 2, 7, "as_int(A)", ["'as_int'", "2"], [],
    ),
    # index spaces
    "non_linear_index_polynomial": (
        TileIndexError, "(A[N]) -> (O)", ["O[i: N] = +(A[i * j]);"], A3, 2, 17, "i * j", [], [],
    ),
    "unbounded_index": (
        TileIndexError, "(A[N], B[N]) -> (O)", ["O[i: N] = +(A[i] * B[j - k]);"], {"A": F3, "B": F3}, 2, 24,
        "j - k", ["'j'", "unbounded"], [],
    ),
    "empty_contraction_by_a_constraint": (
        TileIndexError, "(A[N]) -> (O)", ["O[i: N] = +(A[i]), i < 0;"], A3, 2, 22, "i < 0", ["i < 0"], [],
    ),
    "empty_contraction_tensor_never_in_range": (
        TileIndexError, "(A[N]) -> (O)", ["O[i: N] = +(A[i + 5]);"], A3, 2, 17, "i + 5",
        ["'A'", "size 3"], [],
    ),
    "index_only_in_a_constraint": (
        TileIndexError, "(A[N]) -> (O)", ["O[i: N] = +(A[i]), j < 2;"], A3, 2, 22, "j",
        ["'j'", "constraint"], [],
    ),
    # evaluation
    "duplicate_assign_names_element_and_both_tuples": (
        TileRuntimeError, "(A[N, M]) -> (O)", ["O[i: N] = =(A[i, j]);"],
        {"A": np.arange(6, dtype=np.float32).reshape(3, 2)}, 2, 3, "O[i: N] = =(A[i, j])",
        ["`=` writes O[0] more than once: from (i=0, j=0) and (i=0, j=1)"], [],
    ),
    # inputs
    "missing_input_array": (
        TileInputError, "(A[N], B[N]) -> (O)", ["O = A;"], A3, 1, 17, "B[N]", ["'B"], [],
    ),
    "bad_input_dtype": (
        TileInputError, "(A[N]) -> (O)", ["O = A;"], {"A": np.zeros(3, np.complex64)}, 1, 11, "A[N]",
        ["complex64"], [],
    ),
}


@pytest.mark.parametrize("name", LOCATED)
def test_located_error(name):
    cls, header, stmts, inputs, line, col, text, in_message, in_hint = LOCATED[name]
    e = fails(cls, prog(header, *stmts), inputs, line, col, text)
    for part in in_message:
        assert part in e.message, (part, e.message)
    for part in in_hint:
        assert part in e.hint, (part, e.hint)


# ------------------------------------------------------------------------ evaluation, inputs
@pytest.mark.parametrize("chunk", [1 << 20, 1])
def test_duplicate_assign_on_a_later_element(monkeypatch, chunk):
    """With ``CHUNK = 1`` the two writers are found in different chunks of the enumeration."""
    monkeypatch.setattr(tuples, "CHUNK", chunk)
    a = np.arange(4, dtype=np.int32).reshape(2, 2)
    e = fails(TileRuntimeError, prog("(A[N, N]) -> (O)", "O[i + j: 3] = =(A[i, j]);"), {"A": a}, 2, 3,
              "O[i + j: 3] = =(A[i, j])")
    assert "`=` writes O[1] more than once: from (i=0, j=1) and (i=1, j=0)" in e.message


def test_index_space_over_max_points(monkeypatch):
    src = prog("(A[N]) -> (O)", "O[i, j, k: N, N, N] = +(A[i] * A[j]);")
    text = "O[i, j, k: N, N, N] = +(A[i] * A[j])"
    # a TileRuntimeError subclass: the interpreter's bound, which compiled targets need not share
    e = fails(TileLimitError, src, {"A": F3}, 2, 3, text, max_points=26)
    assert issubclass(TileLimitError, TileRuntimeError)
    assert "27" in e.message and "26" in e.message
    monkeypatch.setenv("TILE_INTERP_MAX_POINTS", "20")
    e = fails(TileLimitError, src, {"A": F3}, 2, 3, text)
    assert "20" in e.message
    assert run(src, {"A": F3}, max_points=27)["O"].shape == (3, 3, 3)


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
