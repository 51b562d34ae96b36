"""bench/attention.py's own checks: every dtype it names runs, and an unknown one is refused by
name (it used to fail each case with a bare ``KeyError: 'float32'``)."""

import sys

import pytest

pytest.importorskip("torch", reason="bench.attention compares with PyTorch")

from bench import attention  # noqa: E402


def test_an_unknown_dtype_is_refused_with_the_choices(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["attention", "llvm_cpu.0", "--dtypes", "float16,float8"])
    with pytest.raises(SystemExit) as e:
        attention.main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "float8 is not one of float16, bfloat16, float32" in err


def test_a_float32_case_runs_within_pytorchs_error():
    """A small float32 forward on llvm_cpu.0 (the bench's smoke test of itself on a CPU): errors
    against float64 no more than twice PyTorch's plus float32's unit roundoff times the length."""
    row = attention.case("llvm_cpu.0", 16, 8, "float32", True, 1)
    assert row["dtype"] == "float32" and row["tile_ms"] > 0
    assert row["tile_err"] <= 2 * row["torch_err"] + 16 * 2.0**-24 * 16
