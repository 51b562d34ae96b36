"""ONNX's node tests through ``tile.onnx`` (``pytest conformance/ --onnx [--target ID]``).

``test_onnx_node`` is one test per node case and target (the interpreter is a target here: a
difference between ONNX's expected outputs and Tile's semantics shows there first). A case Tile
cannot express skips with the reason, a known difference is an xfail with its class and reason
(``onnx_nodes.KNOWN``), anything else that differs fails. Without ``--onnx`` nothing ONNX runs: one
placeholder test skips saying so (and, with ``--onnx`` but no ``onnx`` package, says that).
``--conformance-shard=I/N`` takes the cases whose name hashes to shard I: the N shards together run
every case once, and one shard is a sample (a target whose compiles take seconds, PoCL's, can be
measured on a share). The other tests here check the comparison rule and the summary, and need no
option.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from conformance import onnx_nodes, report
from conformance import targets as subjects


def _targets(config) -> list[str]:
    """``--target`` ids ('interp' included), or the interpreter and every device ('all' alike)."""
    from backends import registry

    asked = config.getoption("--target") or ["all"]
    found: list[str] = []
    for t in asked:
        found.extend(["interp", *registry.devices()] if t == "all" else [t])
    return list(dict.fromkeys(found))


def pytest_generate_tests(metafunc):
    if "onnx_case" not in metafunc.fixturenames:
        return
    config = metafunc.config
    why = None if config.getoption("--onnx") else "the ONNX node tests run with --onnx"
    why = why or onnx_nodes.unavailable()
    if why is not None:
        param = pytest.param(None, None, marks=pytest.mark.skip(reason=why))
        metafunc.parametrize("onnx_target,onnx_case", [param], ids=["onnx"])
        return
    mine = [n for n in onnx_nodes.names() if subjects.SHARD.takes(hashlib.sha1(n.encode()).hexdigest())]
    params = [(t, name) for t in _targets(config) for name in mine]
    metafunc.parametrize("onnx_target,onnx_case", params, ids=[f"{t}-{n}" for t, n in params])


def _device(target: str):
    """The HAL device of ``target`` (None for the interpreter); a device missing here skips."""
    from backends import registry
    from tile.errors import TileDeviceError

    if target == "interp":
        return None
    try:
        return registry.get(target)
    except TileDeviceError as e:
        pytest.skip(e.message)


def test_onnx_node(onnx_target, onnx_case):
    record = onnx_nodes.run(onnx_case, onnx_target, _device(onnx_target))
    report.STATS.onnx.append(record)
    if record.status == "unsupported":
        pytest.skip(f"unsupported: {record.reason}")
    if record.status == "expected":
        pytest.xfail(record.reason)
    if record.status == "failed":
        pytest.fail(f"{onnx_case} ({record.operator}, {record.dtype}) on {onnx_target}: {record.reason}",
                    pytrace=False)


# ------------------------------------------------------------- the rule and the summary


def test_differs_is_exact_for_integers_and_bool():
    assert onnx_nodes.differs(np.array([1, 2], np.int64), np.array([1, 2], np.int64), 0.5, 1.0) is None
    assert "1 of 2" in onnx_nodes.differs(np.array([1, 2], np.int64), np.array([1, 3], np.int64), 0.5, 1.0)
    assert onnx_nodes.differs(np.array([True]), np.array([False]), 1.0, 1.0) is not None


def test_differs_uses_the_cases_rtol_and_atol():
    want = np.array([100.0, 0.0, np.nan], np.float32)
    rtol, atol = 1e-3, 1e-7
    inside = np.array([100.0 + 0.09, 0.5e-7, np.nan], np.float32)  # within atol + rtol * |want|
    outside = np.array([100.0 + 0.2, 0.0, np.nan], np.float32)
    assert onnx_nodes.differs(want, inside, rtol, atol) is None
    assert "[0] expected" in onnx_nodes.differs(want, outside, rtol, atol)
    assert onnx_nodes.differs(want, np.array([0.0, 0.0, 0.0], np.float32), rtol, atol) is not None


def test_differs_checks_dtype_and_shape():
    f = np.zeros(3, np.float32)
    assert "float64" in onnx_nodes.differs(f, f.astype(np.float64), 1.0, 1.0)
    assert "[1, 3]" in onnx_nodes.differs(f, f.reshape(1, 3), 1.0, 1.0)


def _records() -> list:
    R = onnx_nodes.Record
    return [R("test_relu", "Relu", "float32", "interp", "passed"),
            R("test_relu", "Relu", "float32", "llvm_cpu.0", "failed", "Y: 1 of 60 elements differ"),
            R("test_cast_x", "Cast", "float8e4m3fn", "interp", "unsupported", "no Tile dtype"),
            R("test_abs", "Abs", "float32", "interp", "passed")]


def test_summary_counts_per_target_operator_and_dtype():
    data = onnx_nodes.summary(_records())
    by_target = {row["target"]: row for row in data["targets"]}
    assert (by_target["interp"]["passed"], by_target["interp"]["unsupported"]) == (2, 1)
    assert by_target["llvm_cpu.0"]["failed"] == 1
    relu = [r for r in data["operators"] if r["operator"] == "Relu" and r["target"] == "llvm_cpu.0"]
    assert relu == [{"operator": "Relu", "dtype": "float32", "target": "llvm_cpu.0", "passed": 0, "failed": 1,
                     "expected": 0, "unsupported": 0}]
    assert {c["case"] for c in data["cases"]} == {"test_relu", "test_cast_x"}
    text = "\n".join(onnx_nodes.lines(_records()))
    assert "onnx failed on llvm_cpu.0: test_relu (Relu, float32): Y: 1 of 60 elements differ" in text
    assert "66.7%" in text  # interp: 2 of 3 passed


def test_records_survive_the_xdist_merge():
    stats = report.Stats()
    stats.onnx.extend(_records())
    merged = report.Stats()
    merged.merge(stats.to_json())
    assert merged.onnx == _records()
    assert json.dumps(merged.summary("ci", "0/1", 1.0)["onnx"]) == json.dumps(onnx_nodes.summary(_records()))


@pytest.fixture
def onnx_cases():
    why = onnx_nodes.unavailable()
    if why is not None:
        pytest.skip(why)
    return onnx_nodes.cases()


def test_known_differences_name_real_cases(onnx_cases):
    assert set(onnx_nodes.KNOWN) <= set(onnx_cases)
    assert all(kind in ("difference", "bug") for kind, _ in onnx_nodes.KNOWN.values())


def test_cases_are_filed_by_operator_and_dtype(onnx_cases):
    assert onnx_nodes.operator(onnx_cases["test_relu"]) == "Relu"
    assert onnx_nodes.dtype_of(onnx_cases["test_relu"]) == "float32"
    expanded = next(n for n in onnx_cases if n.startswith("test_softmax") and n.endswith("_expanded"))
    assert onnx_nodes.operator(onnx_cases[expanded]) == "Softmax/expanded"
    assert "Tile has tensors only" in onnx_nodes.lacking(onnx_cases["test_identity_sequence"])


def test_given_optional_tensors_and_carried_types_are_expressible(onnx_cases):
    assert onnx_nodes.lacking(onnx_cases["test_optional_has_element_optional_input"]) is None
    empty = onnx_cases["test_optional_has_element_empty_optional_input"]
    assert "empty ONNX optional" in onnx_nodes.lacking(empty)
    assert onnx_nodes.lacking(onnx_cases["test_cast_FLOAT_to_FLOAT8E4M3FN"]) is None  # tile.onnx.carried
    assert "string" in onnx_nodes.lacking(onnx_cases["test_string_concat"])
    record = onnx_nodes.run("test_cast_FLOAT_to_FLOAT8E4M3FN", "interp")
    assert (record.status, record.dtype) == ("passed", "float32")


def test_a_case_runs_on_the_interpreter(onnx_cases):
    record = onnx_nodes.run("test_relu", "interp")
    assert (record.status, record.operator, record.reason) == ("passed", "Relu", "")


def test_narrow_floats_within_a_few_roundings_are_expected_differences():
    want = np.array([0.4470, 1.0], np.float16)
    two_ulps = np.array([np.float16(0.4470) + np.float16(2 * 2.0**-12), 1.0], np.float16)
    assert onnx_nodes.judge("y", want, want.copy(), 1e-3, 1e-7) is None
    status, why = onnx_nodes.judge("y", want, two_ulps, 1e-3, 1e-7)  # 1.1e-3 relative: over rtol
    assert status == "expected" and "float16" in why and "§13" in why
    far = np.array([0.46, 1.0], np.float16)  # 3% off: a failure, in any type
    assert onnx_nodes.judge("y", want, far, 1e-3, 1e-7)[0] == "failed"
    f32 = want.astype(np.float32)  # float32 has no such allowance
    assert onnx_nodes.judge("y", f32, two_ulps.astype(np.float32), 1e-3, 1e-7)[0] == "failed"
