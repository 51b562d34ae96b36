"""A pytest plugin for ``python -m conformance.mutants``' child runs (``-p
conformance.mutants.detect``): it notes when the run meets its first failing example.

A family that fails writes each failing example it meets (``conformance.report.write_failure``),
the first one as soon as the target's answer differs, then the smaller ones Hypothesis finds while
shrinking it. With ``TILE_MUTANT_DETECT=F`` in the environment, the first write appends
``FAMILY TIME`` to F (the running family's test, ``time.time()`` of the detection), so the runner
can report the time to detection apart from the time the run took to end (shrinking included;
``conformance.mutants.run.first_detection`` reads the note).
Nothing the run checks changes.
"""

from __future__ import annotations

import functools
import os
import time

_KEY = "TILE_MUTANT_DETECT"


def pytest_configure(config) -> None:
    path = os.environ.get(_KEY)
    if not path:
        return
    from conformance import report

    real = report.write_failure
    if getattr(real, "_detect_wrapped", False):
        return
    seen = [False]

    @functools.wraps(real)
    def write_failure(case, *args, **kwargs):
        if not seen[0]:
            seen[0] = True
            family = report.STATS.current[0] if report.STATS.current else case.family  # the test's
            with open(path, "a") as f:
                f.write(f"{family} {time.time():.3f}\n")
        return real(case, *args, **kwargs)

    write_failure._detect_wrapped = True  # type: ignore[attr-defined]
    report.write_failure = write_failure
