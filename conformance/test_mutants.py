"""Every seeded defect is real: on its witness the mutant differs from the interpreter (or fails),
the device it wraps agrees with it exactly, and the defect's rewrite changed what was compiled."""

from __future__ import annotations

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
