"""CI's share of the mutation score: the default conformance run kills a varied handful of seeded
defects (``python -m conformance.mutants --fast``), each in its own child run; two of them by
default, all six with ``--long``."""

from __future__ import annotations

import pytest

from backends import registry
from conformance.mutants import MUTANTS
from conformance.mutants.run import FAST, run_one, score


def _available(device_id: str) -> bool:
    try:
        registry.get(device_id)
    except Exception:  # noqa: BLE001 - a missing device only skips its mutants
        return False
    return True


CI = 2  # of FAST run by default (one Stripe-level, one Stripe comparison); the rest with --long


@pytest.mark.parametrize(
    "name",
    [*FAST[:CI], *(pytest.param(n, marks=pytest.mark.long("a child conformance run")) for n in FAST[CI:])],
)
def test_fast_mutant_is_killed(name):
    m = MUTANTS[name]
    if not _available(m.base_id):
        pytest.skip(f"{m.base_id} is not available here: the mutant wraps it")
    r = run_one(name, timeout=300)
    assert r.status == "killed", f"{name} {r.status} ({score([r])}): {r.detail}"
    assert r.applied, f"{name}: the defect was never applied"
