"""The reference interpreter on the small sizes of ``bench/cases.py``, as a ratio to numpy (and to
PlaidML 0.7 where it imports) measured in the same run.

The interpreter is an oracle, not a fast path; these numbers say how large a problem it answers in
reasonable time. Its "compile" time is parsing and binding the program to the input types.
Run: ``python -m pytest bench/ --benchmark-only``.
"""

from __future__ import annotations

import time

import pytest

import ref_interp
from bench.cases import add_plaidml_reference, best_of, cases, record, rounds_for
from tile.bind import bind
from tile.inputs import input_types
from tile.parser import parse

CASES = cases("interp")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_interpreter(benchmark, case):
    inputs = case.inputs()
    want = case.reference(inputs)
    src = case.family.source
    t0 = time.perf_counter()
    program = parse(src) if isinstance(src, str) else src
    bound = bind(program, input_types(program, inputs))
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref_interp.run(bound, inputs)
    once = time.perf_counter() - t0
    out = benchmark.pedantic(lambda: ref_interp.run(bound, inputs), rounds=rounds_for(once), warmup_rounds=1)
    (got,) = out.values()
    case.check(got, want, inputs)
    references = {"numpy": best_of(lambda: case.reference(inputs))}
    notes = {}
    add_plaidml_reference(case, inputs, references, notes)
    record(benchmark, case, "interp", inputs, benchmark.stats.stats.min, compile_s, references, notes)
