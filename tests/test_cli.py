"""The command lines, as a user runs them: ``python -m ref_interp run`` and ``python -m tile check``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

MATMUL = """function (A[M, L], B[L, N]) -> (C) {
    C[i, j: M, N] = +(A[i, k] * B[k, j]);
}
"""
BROADCAST = """function (A[N, M], B[M], S[]) -> (O, PA, PB, PS) {
    O = A + B * S;
    PA = A; PB = B; PS = S;
}
"""


def cli(module: str, *args: str | Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TILE_INTERP_MAX_POINTS", None)
    cmd = [sys.executable, "-m", module, "run" if module == "ref_interp" else "check", *map(str, args)]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def write(tmp_path):
    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path
    return _write


def load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


# ----------------------------------------------------------------------- ref_interp run
def test_run_with_npz_inputs_and_output(tmp_path, write):
    a = np.arange(6, dtype=np.int32).reshape(2, 3) - 2
    b = np.array([[1, -2], [3, 4], [-5, 6]], dtype=np.int32)
    np.savez(tmp_path / "in.npz", A=a, B=b)
    r = cli("ref_interp", write("mm.tile", MATMUL), "--inputs", tmp_path / "in.npz",
            "--output", tmp_path / "out.npz")
    assert r.returncode == 0, r.stderr
    assert "C: int32[2, 2]" in r.stdout
    assert "made up" not in r.stdout
    got = load(tmp_path / "out.npz")
    assert set(got) == {"C"}
    assert got["C"].dtype == np.int32
    np.testing.assert_array_equal(got["C"], a @ b)


def test_run_makes_up_inputs_from_shapes_and_dims(tmp_path, write):
    prog = write("b.tile", BROADCAST)
    r = cli("ref_interp", prog, "--shape", "A=2x3:int8", "--output", tmp_path / "o0.npz")
    assert r.returncode == 0, r.stderr
    assert "input A: int8[2, 3] (made up, seed 0)" in r.stdout
    assert "input B: float32[3] (made up, seed 0)" in r.stdout  # M comes from A
    assert "input S: float32[] (made up, seed 0)" in r.stdout  # 0-D needs no shape
    got = load(tmp_path / "o0.npz")
    a, b, s = got["PA"], got["PB"], got["PS"]
    assert (a.dtype, a.shape, b.dtype, b.shape, s.dtype, s.shape) == (
        np.int8, (2, 3), np.float32, (3,), np.float32, ())
    for x in (a, b, s):
        assert np.all(x == np.round(x)) and np.all(np.abs(x) <= 3)  # small integers
    assert got["O"].dtype == np.float32  # int8 + float32
    np.testing.assert_array_equal(got["O"], a.astype(np.float32) + b * s)

    # the seed: the default is 0, the same seed gives the same inputs, another seed others
    r = cli("ref_interp", prog, "--shape", "A=2x3:int8", "--seed", "0", "--output", tmp_path / "o0b.npz")
    assert r.returncode == 0, r.stderr
    again = load(tmp_path / "o0b.npz")
    for k in got:
        np.testing.assert_array_equal(again[k], got[k])
    r = cli("ref_interp", prog, "--shape", "A=2x3:int8", "--seed", "7", "--output", tmp_path / "o7.npz")
    assert r.returncode == 0, r.stderr
    assert "(made up, seed 7)" in r.stdout
    other = load(tmp_path / "o7.npz")
    assert not all(np.array_equal(other[k], got[k]) for k in ("PA", "PB", "PS"))


def test_run_mixes_npz_inputs_and_made_up_ones(tmp_path, write):
    b = np.array([1.5, -2.0, 4.0], dtype=np.float64)
    np.savez(tmp_path / "in.npz", B=b, S=np.array(2.0, dtype=np.float64))
    r = cli("ref_interp", write("b.tile", BROADCAST), "--inputs", tmp_path / "in.npz",
            "--shape", "A=4x3:int16", "--output", tmp_path / "o.npz")
    assert r.returncode == 0, r.stderr
    assert "input A: int16[4, 3] (made up" in r.stdout and "input B" not in r.stdout
    got = load(tmp_path / "o.npz")
    np.testing.assert_array_equal(got["PB"], b)
    assert got["O"].dtype == np.float64
    np.testing.assert_array_equal(got["O"], got["PA"] + b * 2.0)


def test_run_exact_precision(tmp_path, write):
    a = np.array([1e16, 1.0, 1.0, -1e16, 0.1, 0.2], dtype=np.float64)
    np.savez(tmp_path / "in.npz", A=a)
    prog = write("sum.tile", "function (A[N]) -> (O) { O[] = +(A[i]); }\n")
    r = cli("ref_interp", prog, "--inputs", tmp_path / "in.npz", "--precision", "exact",
            "--output", tmp_path / "o.npz")
    assert r.returncode == 0, r.stderr
    assert "O: exact (object)[]" in r.stdout
    exact = sum(Fraction(float(x)) for x in a)
    assert load(tmp_path / "o.npz")["O"] == float(exact)
    assert float(exact) != ((((1e16 + 1.0) + 1.0) - 1e16) + 0.1) + 0.2  # a float sum would differ


def test_run_reports_errors(write):
    prog = write("bad.tile", "function (A[N]) -> (O) {\n    O = A + Bogus;\n}\n")
    r = cli("ref_interp", prog, "--shape", "A=3")
    assert r.returncode == 1
    assert f"{prog}:2:13: name error: unknown name 'Bogus'" in r.stderr
    assert "        O = A + Bogus;\n" in r.stderr and "            ^~~~~\n" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_run_max_points(write):
    prog = write("outer.tile", "function (A[N]) -> (O) {\n    O[i, j: N, N] = +(A[i] * A[j]);\n}\n")
    r = cli("ref_interp", prog, "--shape", "A=3", "--max-points", "8")
    assert r.returncode == 1
    assert f"{prog}:2:5: runtime error:" in r.stderr and "9 points" in r.stderr and "8" in r.stderr
    assert "hint:" in r.stderr


# -------------------------------------------------------------------------- tile check
def _lines(text: str) -> list[str]:
    return [re.sub(r"\s{2,}", " | ", line.strip()) for line in text.splitlines()]


def test_check_prints_symbolic_shapes(write):
    prog = write("conv.tile", "function (I[N, L, CI], K[LK, CI, CO]) -> (O) {\n"
                 "    T[n, x, co: N, L - LK + 1, CO] = +(I[n, x + k, ci] * K[k, ci, co]);\n"
                 "    O = T * 2;\n}\n")
    r = cli("tile", prog)
    assert r.returncode == 0, r.stderr
    lines = _lines(r.stdout)
    assert "I | float32[N, L, CI] | input" in lines
    assert "K | float32[LK, CI, CO] | input" in lines
    t = next(line for line in lines if line.startswith("T | "))
    assert re.fullmatch(r"T \| float32\[N, (L - LK \+ 1|-LK \+ L \+ 1), CO\]", t)
    assert any(re.fullmatch(r"O \| float32\[N, .*, CO\] \| output", line) for line in lines)
    assert lines[-1] == f"ok: {prog}"


def test_check_with_concrete_shapes(write):
    r = cli("tile", write("mm.tile", MATMUL), "--shape", "A=2x3:int8", "--shape", "B=3x4:int16")
    assert r.returncode == 0, r.stderr
    assert _lines(r.stdout)[:3] == ["A | int8[2, 3] | input", "B | int16[3, 4] | input",
                                    "C | int16[2, 4] | output"]


def test_check_with_some_shapes_given(write):
    r = cli("tile", write("mm.tile", MATMUL), "--shape", "A=2x3")
    assert r.returncode == 0, r.stderr
    assert _lines(r.stdout)[:3] == ["A | float32[2, 3] | input", "B | float32[3, N] | input",
                                    "C | float32[2, N] | output"]


def test_check_reports_errors(write):
    prog = write("bad.tile", "function (A[N]) -> (O) {\n    O[i: N] = +(A[i, j]);\n}\n")
    r = cli("tile", prog)
    assert r.returncode == 1
    assert f"{prog}:2:17: shape error: 'A' has rank 1" in r.stderr
    assert "                ^~~~~~~\n" in r.stderr and "hint:" in r.stderr
    assert "ok:" not in r.stdout
