"""``bench/report.py`` and ``python -m bench report`` on a small pytest-benchmark JSON built here."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report
from bench.__main__ import main

ROOT = Path(__file__).resolve().parent.parent


def _bench(case, size, target, rate, refs, compile_s=0.5, unit="GFLOP/s"):
    """One benchmark entry the way ``bench.cases.record`` leaves it."""
    primary = next(iter(refs))
    return {
        "name": f"test_target[{target}-{case}_{size}]",
        "params": {"target": target, "case": f"{case}_{size}"},
        "stats": {"min": 0.001},
        "extra_info": {
            "case": case,
            "size": size,
            "size_desc": "n (n×n times n×n)",
            "target": target,
            "rate": rate,
            "unit": unit,
            "reference": primary,
            "reference_rate": refs[primary],
            "ratio": rate / refs[primary],
            "references": refs,
            "compile_s": compile_s,
        },
    }


@pytest.fixture
def run_json(tmp_path):
    data = {
        "machine_info": {"node": "test"},
        "benchmarks": [
            _bench("matmul", 512, "llvm_cpu.0", 50.0, {"numpy": 100.0, "plaidml": 25.0}, compile_s=0.25),
            _bench("matmul", 128, "llvm_cpu.0", 20.0, {"numpy": 80.0}),
            _bench("matmul", 256, "opencl_cpu.0", 4.0, {"numpy": 2.0}),
            _bench("chain", 1024, "interp", 1.5, {"numpy": 6.0}, unit="GB/s"),
            # no recorded rate (another suite, an older run): not a row
            {"name": "test_other", "params": {}, "stats": {"min": 1.0}, "extra_info": {}},
        ],
    }
    path = tmp_path / "RUN.json"
    path.write_text(json.dumps(data))
    return path


def test_load_rows_one_per_reference_sorted(run_json):
    rows = report.load([run_json])
    got = [(r.case, r.size, r.target, r.reference) for r in rows]
    assert got == [
        ("chain", 1024, "interp", "numpy"),
        ("matmul", 128, "llvm_cpu.0", "numpy"),
        ("matmul", 512, "llvm_cpu.0", "numpy"),
        ("matmul", 512, "llvm_cpu.0", "plaidml"),
        ("matmul", 256, "opencl_cpu.0", "numpy"),
    ]
    plaid = rows[3]
    assert plaid.rate == 50.0 and plaid.reference_rate == 25.0
    assert plaid.ratio == pytest.approx(2.0)  # twice PlaidML's rate: takes half its time
    assert rows[2].ratio == pytest.approx(0.5)
    assert plaid.compile_s == 0.25 and plaid.run == "RUN"


def test_older_entries_without_references_dict(tmp_path):
    entry = _bench("matmul", 64, "llvm_cpu.0", 10.0, {"numpy": 40.0})
    del entry["extra_info"]["references"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"benchmarks": [entry]}))
    (row,) = report.load([path])
    assert (row.reference, row.reference_rate, row.ratio) == ("numpy", 40.0, 0.25)


def test_markdown_table_content(run_json):
    md = report.markdown(report.load([run_json]), [str(run_json)])
    lines = md.splitlines()
    assert lines[0] == f"Runs: `{run_json}`"
    header = "| case | size | target | rate | unit | reference | reference rate | ratio | compile s |"
    assert lines[2] == header
    assert lines[3].count("|") == 10
    assert "| matmul | 512 | llvm_cpu.0 | 50 | GFLOP/s | plaidml | 25 | 2 | 0.25 |" in lines
    assert "| matmul | 512 | llvm_cpu.0 | 50 | GFLOP/s | numpy | 100 | 0.5 | 0.25 |" in lines
    assert "| chain | 1024 | interp | 1.5 | GB/s | numpy | 6 | 0.25 | 0.5 |" in lines
    assert len(lines) == 4 + 5


def test_plain_table_columns_align(run_json):
    text = report.table(report.load([run_json]))
    lines = text.splitlines()
    assert lines[0].split() == [
        "case",
        "size",
        "target",
        "rate",
        "unit",
        "reference",
        "reference",
        "rate",
        "ratio",
        "compile",
        "s",
    ]
    assert set(lines[1]) == {"-", " "}
    assert len(lines) == 2 + 5
    # the numeric columns are right-aligned: every row's rate ends at the same column
    rate_end = lines[0].index("rate") + len("rate")
    for line in lines[2:]:
        assert line[rate_end - 1] != " "
        assert line[rate_end] == " "


def test_not_a_benchmark_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(report.ReportError, match="not a pytest-benchmark JSON"):
        report.load([bad])
    with pytest.raises(report.ReportError, match="cannot read"):
        report.load([tmp_path / "missing.json"])


def test_latest_run_picks_newest(tmp_path):
    with pytest.raises(report.ReportError, match="--benchmark-json"):
        report.latest_run(tmp_path)
    (tmp_path / "m").mkdir()
    old, new = tmp_path / "m" / "0001_a.json", tmp_path / "m" / "0002_b.json"
    old.write_text("{}")
    new.write_text("{}")
    os.utime(old, (1_000_000, 1_000_000))
    assert report.latest_run(tmp_path) == new


def test_plot_without_matplotlib_says_so(run_json, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(report.ReportError, match=r"needs matplotlib.*tile\[plot\]"):
        report.plot(report.load([run_json]), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib is not installed")
def test_plot_writes_png(run_json, tmp_path):
    out = report.plot(report.load([run_json]), tmp_path / "plot.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


def test_main_writes_markdown_and_prints_table(run_json, tmp_path, capsys):
    md = tmp_path / "out.md"
    assert main(["report", str(run_json), "--md", str(md)]) == 0
    printed = capsys.readouterr().out
    assert "opencl_cpu.0" in printed and f"wrote {md}" in printed
    assert md.read_text() == report.markdown(report.load([run_json]), [str(run_json)])


def test_main_errors_exit_2(tmp_path, capsys):
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"benchmarks": []}))
    assert main(["report", str(empty)]) == 2
    assert "recorded a rate" in capsys.readouterr().err


def test_python_dash_m_bench(run_json):
    done = subprocess.run(
        [sys.executable, "-m", "bench", "report", str(run_json)], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "plaidml" in done.stdout and "GFLOP/s" in done.stdout


def test_what_record_writes_is_what_report_reads(tmp_path, capsys):
    from types import SimpleNamespace

    from bench.cases import FAMILIES, Case, record

    matmul = next(f for f in FAMILIES if f.name == "matmul")
    case = Case(matmul, 64)
    inputs = case.inputs()
    bench = SimpleNamespace(extra_info={})
    # 2·64³ FLOP in 1 ms is 0.524288 GFLOP/s; numpy twice as fast, PlaidML half as fast
    record(bench, case, "llvm_cpu.0", inputs, 1e-3, 0.125, {"numpy": 5e-4, "plaidml": 2e-3}, {})
    assert "llvm_cpu.0 matmul_64: 0.524 GFLOP/s" in capsys.readouterr().out
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"benchmarks": [{"name": "t", "extra_info": bench.extra_info}]}))
    numpy_row, plaidml_row = report.load([path])
    assert (numpy_row.case, numpy_row.size, numpy_row.target) == ("matmul", 64, "llvm_cpu.0")
    assert numpy_row.rate == pytest.approx(0.524288)
    assert numpy_row.reference_rate == pytest.approx(1.048576)
    assert numpy_row.ratio == pytest.approx(0.5) and plaidml_row.ratio == pytest.approx(2.0)
    assert bench.extra_info["ratio"] == pytest.approx(0.5) and numpy_row.compile_s == 0.125
