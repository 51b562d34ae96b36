"""The regression corpus (``conformance/regressions/``, ``conformance.corpus``) replayed on every
target, counted in the summary as the family ``regressions``.

Each entry is compared with the interpreter as the families compare their examples
(``test_conformance.check``: the same tolerance rules, refusals alike, unsupported dtypes not run,
a crash a failure, the failing example written to ``conformance/failures/``); entries found by the
``optimized`` family replay every config's passes through the Stripe interpreter too. First, the
interpreter's answer must still be the one stored at promotion, so a change of the oracle is seen
(and refreshed on purpose: ``python -m conformance.promote --refresh NAME``).
"""

from __future__ import annotations

import functools

import pytest
from hypothesis.errors import UnsatisfiedAssumption

from conformance import corpus, report
from conformance.test_conformance import check, compiled

pytestmark = [
    pytest.mark.filterwarnings("ignore::tile.errors.TileIndexWarning"),
    # check() rejects an example with hypothesis.assume, here outside a property test
    pytest.mark.filterwarnings(
        "ignore:Using `assume` outside:hypothesis.errors.HypothesisDeprecationWarning"
    ),
]

ENTRIES = corpus.entries()


@functools.cache
def oracle_change(name: str) -> str | None:
    """Once per entry and session (the interpreter's answer does not depend on the target)."""
    return corpus.oracle_change(next(e for e in ENTRIES if e.name == name))


def replay(entry: corpus.Entry, device) -> None:
    """``entry`` on ``device`` through ``check``; a skip where the target lacks one of its dtypes."""
    key = report.STATS.current or ("regressions", getattr(device, "name", "?"))
    before = report.STATS.row(key).unsupported
    try:
        check(entry.case(), device, passes=entry.passes)
    except UnsatisfiedAssumption:  # refused alike by the interpreter and the target, or not runnable
        if report.STATS.row(key).unsupported > before:
            reasons = sorted(r for (t, r) in report.STATS.unsupported if t == key[1])
            pytest.skip(f"{key[1]} cannot run regression {entry.name}: {', '.join(reasons)}")


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_regressions(device, entry):
    why = oracle_change(entry.name)
    assert why is None, (
        f"the interpreter's answer to regression {entry.name} changed since it was promoted: {why}. "
        "If docs/semantics.md says it should, refresh the entry: "
        f"python -m conformance.promote --refresh {entry.name}"
    )
    if not entry.passes:
        compiled(device)
    replay(entry, device)
