"""The suite draws the same examples in every process with the same seed, whatever else the
process imported (``conformance.reproducible``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
providers = pytest.importorskip("hypothesis.internal.conjecture.providers")
pytestmark = pytest.mark.skipif(
    not hasattr(providers, "_get_local_constants"),
    reason="this Hypothesis release draws no constants from local modules",
)
POOL = """
import sys
import conformance
import tile.ops, stripe.passes, backends.llvm  # modules full of literals
from hypothesis.internal.conjecture import providers
c = providers._get_local_constants()
print(len(c.integers) + len(c.floats) + len(c.strings))
"""
DRAW = """
import json, sys
for m in sys.argv[2:]:
    __import__(m)
import conformance
from hypothesis import given, settings
from conformance import strategies
drawn = []

@settings(max_examples=60, derandomize=True, database=None)
@given(getattr(strategies, sys.argv[1])())
def record(case):
    drawn.append(str(case))

record()
print(json.dumps(drawn))
"""


def run(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_no_constants_of_local_modules_reach_the_draws():
    assert run(POOL).strip() == "0"


@pytest.mark.parametrize("family", ["elementwise", "contractions"])
def test_draws_do_not_depend_on_what_the_process_imported(family):
    bare = json.loads(run(DRAW, family))
    loaded = json.loads(run(DRAW, family, "tile.ops", "stripe.passes", "ref_interp", "conformance.sweeps"))
    assert bare == loaded
    assert len(set(bare)) > 10  # real, varied examples
