"""Every seeded defect is real: on its witness the mutant differs from the interpreter (or fails),
the device it wraps agrees with it exactly, and the defect's rewrite changed what was compiled."""

from __future__ import annotations

import time

import pytest

import ref_interp
import tile
from backends import registry
from conformance import report
from conformance.mutants import MUTANTS

pytestmark = pytest.mark.filterwarnings("ignore::tile.errors.TileIndexWarning")


def _base_or_skip(device_id: str):
    try:
        return registry.get(device_id)
    except tile.TileError as e:
        pytest.skip(f"{device_id} is not available here: {e.message}")


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_witness(name):
    m = MUTANTS[name]
    _base_or_skip(m.base_id)
    w = m.witness
    want = ref_interp.run(w.source, w.inputs)
    real = tile.compile(w.source, m.base_id, w.settings or None)(w.inputs)
    assert report.compare(want, real, report.Tolerance()) is None, (
        f"{m.base_id} itself differs on the witness"
    )
    dev = registry.get(m.device_id)
    applied = dev.compiler.applied
    try:
        got = tile.compile(w.source, m.device_id, w.settings or None)(w.inputs)
    except Exception as e:  # noqa: BLE001 - a build the defect breaks is a difference too
        problem = f"raised {type(e).__name__}"
    else:
        problem = report.compare(want, got, report.Tolerance())
    assert dev.compiler.applied > applied, f"{name}: the rewrite found nothing to change in the witness"
    assert problem is not None, f"{name}: the mutant agrees with the interpreter on its witness"


def test_unknown_mutant_is_a_device_error():
    with pytest.raises(tile.TileError, match="no seeded defect 'nope'"):
        registry.get("mutant:nope")


def test_detection_notes_the_first_failing_example(tmp_path, monkeypatch):
    """``conformance.mutants.detect`` appends the running family and the time of the first failing
    example a child run writes, and nothing for the smaller ones shrinking finds after it."""
    from conformance.mutants import detect
    from conformance.mutants.run import first_detection
    from conformance.strategies import Case

    written = []
    monkeypatch.setattr(report, "write_failure", lambda case, *a, **k: written.append(case) or "dir")
    monkeypatch.setattr(report.STATS, "current", ("elementwise", "mutant:x"))
    note = tmp_path / "detected.log"
    monkeypatch.setenv("TILE_MUTANT_DETECT", str(note))
    assert first_detection(note) is None
    detect.pytest_configure(None)
    before = time.time()
    report.write_failure(Case("elementwise", "function (X) -> (O) { O = X; }", {}), "mutant:x")
    report.write_failure(Case("elementwise", "function (X) -> (O) { O = -X; }", {}), "mutant:x")
    family, when = first_detection(note)
    assert family == "elementwise" and before - 0.01 <= when <= time.time() + 0.01  # (kept to 1 ms)
    assert len(note.read_text().splitlines()) == 1 and len(written) == 2  # the writes still happen


def test_score_gives_the_kill_time_and_the_total_apart():
    from conformance.mutants.run import Result, line, score

    results = [
        Result("a", "stripe", "operator", "killed", "elementwise", 10.0, 70.0, True),
        Result("b", "llvm", "identity", "killed", "contractions", 20.0, 30.0, True),
        Result("c", "opencl", "store", "survived", None, 300.0, 300.0, True),
    ]
    text = score(results)
    assert text.startswith("killed 2/3 (67%)")
    assert "median 15.0 s, max 20.0 s" in text and "with shrinking median 50.0 s, max 70.0 s" in text
    assert line(results[0]).endswith("killed by elementwise (10.0 s, 70.0 s in all)")
    assert line(results[2]).endswith("survived (300.0 s)")
