"""Declared capabilities in the suite, and coverage made visible, as a backend team's CI sees them:
child pytests of the unchanged suite (``test_options.suite``) on a few examples of llvm_cpu.0 or a
plugin device built on the interpreter.

``refusing.0`` runs programs with the interpreter but refuses, as unsupported, every program
that calls ``max``: declaring nothing, it must fail ("an undeclared refusal"); declaring the
operations without ``max`` (and without ``add``, to make declared-unsupported examples certain),
it must pass with those examples counted as declared unsupported, never run.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conformance import coverage
from conformance.test_options import ROOT, needs_llvm, rows, suite, user_config
from tile.capabilities import OPERATIONS

REFUSING = """
from backends import registry
from backends.hal import Capabilities, ProgramDevice
from tile.capabilities import OPERATIONS, Declared
from tile.dtypes import DType
from tile.errors import TileDeviceError

DECLARE = {declare}


class Refusing(ProgramDevice):
    id = "refusing.0"
    description = "the interpreter, refusing max (a test fixture)"
    stage = "tile"

    def __init__(self):
        declared = Declared(operations=OPERATIONS - {{"max", "add"}}) if DECLARE else None
        self.capabilities = Capabilities(frozenset(DType), declared=declared)

    def execute(self, program, inputs, outputs):
        import ref_interp

        if "max(" in program:
            raise TileDeviceError("refusing.0: max is unsupported", None)
        return ref_interp.run(program, dict(inputs))


def pytest_configure(config):
    registry.devices()["refusing.0"] = Refusing()
"""
FAMILIES = ("-k", "elementwise or contractions")


def test_an_undeclared_refusal_fails(tmp_path):
    args = ("--target", "refusing.0", "--conformance-examples=6", "--conformance-ops=max")
    args += ("-k", "elementwise", "--conformance-no-shrink")  # (shrinking a sweep took 90 s of 100)
    status, out, data = suite(tmp_path, *args, plugin=REFUSING.format(declare=False))
    assert status == 1, out
    assert "an undeclared refusal: refusing.0 declares nothing" in out, out
    assert data["rows"][0]["failed"] == 1
    folders = [p for p in (tmp_path / "failures").iterdir() if p.is_dir()]
    assert [f["folder"] for f in data["failures"]] == [str(folders[0])] and len(folders) == 1


def test_a_declared_subset_passes_and_counts_declared_unsupported(tmp_path):
    status, out, data = suite(tmp_path, "--target", "refusing.0", "--conformance-examples=8", *FAMILIES,
                              plugin=REFUSING.format(declare=True))
    assert status == 0, out
    assert sum(r["declared"] for r in data["rows"]) > 0 and sum(r["examples"] for r in data["rows"]) > 0
    reasons = {d["reason"] for d in data["declared_unsupported"]}
    assert reasons <= {"operation max", "operation add"} and reasons, reasons
    assert "declared unsupported on refusing.0:" in out
    cov = data["coverage"]["refusing.0"]
    reached = {r["name"] for r in cov["table"] if r["examples"]}
    assert not reached & {"max", "add"}  # never run, so never covered
    assert {"max", "add"} <= set(cov["unexercised"])


@pytest.fixture(scope="module")
def declared_run(tmp_path_factory):
    """llvm_cpu.0 with a config declaring every operation but max and agg_max, no float16."""
    tmp = tmp_path_factory.mktemp("declared")
    caps = {"operations": sorted(OPERATIONS - {"max", "agg_max"}),
            "dtypes": ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                       "float32", "float64", "bfloat16"]}
    config = user_config(tmp, "declared", capabilities=caps)
    status, out, data = suite(tmp, "--config", str(config), "--conformance-examples=8", *FAMILIES)
    return tmp, config, status, out, data


@needs_llvm
def test_a_config_declaration_narrows_the_run(declared_run):
    _, _, status, out, data = declared_run
    assert status == 0, out
    row = rows(data)[("contractions", "llvm_cpu.0+declared")]
    assert row["declared"] > 0 and row["examples"] > 0  # agg_max contractions are drawn, not run
    reasons = {d["reason"] for d in data["declared_unsupported"]}
    assert reasons and all(r in ("operation max", "operation agg_max", "dtype float16") for r in reasons)
    assert "declared unsupported" in out


@needs_llvm
def test_the_report_sheet(declared_run):
    tmp, config, status, _, data = declared_run
    summary = tmp / "summary.json"
    summary.write_text(json.dumps(data))
    mutants = tmp / "mutants.json"
    results = [{"name": "stripe_max_as_min", "status": "killed", "family": "elementwise"},
               {"name": "stripe_lt_as_le", "status": "survived", "family": None}]
    mutants.write_text(json.dumps({"score": "", "results": results}))
    cmd = [sys.executable, "-m", "conformance.report", "--target", "llvm_cpu.0", "--config", str(config),
           "--summary", str(summary), "--mutants", str(mutants)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    sheet = r.stdout
    for words in ("# Conformance sheet: llvm_cpu.0", "## Declared", "declared operations: ", "## Run",
                  "result: PASSED", "## Coverage", "operations distinguished", "unexercised (",
                  "## Mutation score", "killed 1/2 (50%)", "stripe_lt_as_le: survived"):
        assert words in sheet, (words, sheet)
    declared_ops = next(ln for ln in sheet.splitlines() if ln.startswith("declared operations: "))
    assert "agg_min" in declared_ops and " max," not in declared_ops and "agg_max" not in declared_ops
    dtypes = sheet.split("declared dtypes: ")[1].splitlines()[0].split(", ")
    assert "float16" not in dtypes and "bfloat16" in dtypes
    compared = sum(r["examples"] for r in data["rows"])
    assert f"{compared} examples compared" in sheet
    bad = subprocess.run([*cmd[:3], "--target", "no_such.0", "--summary", str(summary)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no_such.0" in bad.stderr


@needs_llvm
def test_conformance_ops_narrows_to_the_operations(tmp_path):
    status, out, data = suite(tmp_path, "--target", "llvm_cpu.0", "--conformance-examples=6",
                              "--conformance-ops=cmp_lt,agg_min", *FAMILIES)
    assert status == 0, out
    by = rows(data)
    table = {r["name"]: r for r in data["coverage"]["llvm_cpu.0"]["table"]}
    compared = sum(r["examples"] for r in by.values())
    assert compared > 0
    # every compared example uses one of them (steered there, or drawn so)
    assert table["cmp_lt"]["examples"] + table["agg_min"]["examples"] >= compared
    assert by[("contractions", "llvm_cpu.0")]["examples"] <= table["agg_min"]["examples"]
    assert "not in --conformance-ops" in out
    status, out, _ = suite(tmp_path, "--target", "llvm_cpu.0", "--conformance-ops=cmp_lf", *FAMILIES)
    assert status == 4 and "unknown operation 'cmp_lf'; did you mean 'cmp_lt'" in out


@needs_llvm
def test_coverage_merges_across_xdist_workers(tmp_path):
    args = ("--target", "llvm_cpu.0", "--conformance-examples=6", *FAMILIES)
    one = suite(tmp_path, *args)
    two = suite(tmp_path, *args, "-n", "2")
    for status, out, _ in (one, two):
        assert status == 0, out
    (_, _, a), (_, out, b) = one, two
    assert "coverage on llvm_cpu.0:" in out
    tables = [{(r["category"], r["name"]): r["examples"] for r in d["coverage"]["llvm_cpu.0"]["table"]}
              for d in (a, b)]
    assert tables[0] == tables[1] and sum(tables[0].values()) > 0  # every example counted once
    assert b["coverage"]["llvm_cpu.0"]["distinguished"]


def test_distinguishing_examples_by_mutation():
    import numpy as np

    import ref_interp
    import tile
    from tile.inputs import input_types

    def verdicts(src, **inputs):
        prog = tile.parse(src)
        bound = tile.bind(prog, input_types(prog, inputs), inputs)
        want = ref_interp.run(bound, inputs)
        return {s.op: coverage.distinguishes(prog, s, inputs, want, "native") for s in coverage.sites(prog)}

    src = "function (A[N], B[N]) -> (O) { O = A < B; }"
    apart = verdicts(src, A=np.array([1, 4], np.int32), B=np.array([2, 3], np.int32))
    assert apart == {"cmp_lt": False}  # no equal pair: cmp_le would have passed
    equal = verdicts(src, A=np.array([1, 3], np.int32), B=np.array([2, 3], np.int32))
    assert equal == {"cmp_lt": True}  # cmp_le and cmp_gt both change it
    agg = verdicts("function (A[N]) -> (O) { O[i: 1] = >(A[j]); }", A=np.array([1, 0, 1], np.int32))
    assert agg == {"agg_max": True}
    cast = verdicts("function (A[N]) -> (O) { O = as_int(A, 8); }", A=np.array([1, 2], np.int32))
    assert cast == {"as_int": False}  # no value wraps in 8 bits
    # a cast dropped, a comparison computed as a product: told apart where the values show it
    flag = verdicts("function (A[N]) -> (O) { O = as_bool(A); }", A=np.array([0, 2], np.int32))
    assert flag == {"as_bool": True}
    assert verdicts("function (A[N]) -> (O) { O = as_bool(A); }", A=np.array([0, 1], np.int32)) == {
        "as_bool": False
    }
    eq = "function (A[N], B[M]) -> (O) { O[i: N] = +(A[i] == B[j]); }"
    assert verdicts(eq, A=np.array([1, 2], np.int32), B=np.array([2, 3], np.int32))["comb_eq"]
